"""NvmlProbe against a scripted NVML: pynvml's own functions patched to return pynvml's own structures and raise its
own error classes, so the adapter's decisions are tested one by one, fast and without a GPU.

What patching cannot reach (pynvml's ctypes calls into ``libnvidia-ml.so.1``, the versioned symbols older drivers
lack, the versioned structs, NVML's return codes, events from ``nvmlEventSetWait``) is tested against the mock driver
library of each driver profile: ``tests/integration/test_nvml_mock.py`` and ``test_agent_nvml_mock.py``.

``NvmlWorld`` is also used by ``test_probe_contract.py``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from agent.gpus import nvml, probe
from common import errors

GiB = 1024**3
MiB = 1024**2
NO_INSTANCE = 0xFFFFFFFF
NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
ALL_HEALTH_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)
REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class WorldProcess:
    pid: int
    used_bytes: int | None
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE


@dataclasses.dataclass
class WorldGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GiB
    reserved: int = 512 * MiB
    used: int = 4 * MiB
    gpu_util: int = 37
    memory_util: int = 12
    temperature_c: int = 41
    power_mw: int = 123_456
    ecc_corrected: int = 2
    ecc_uncorrected: int = 0
    mig_mode: int = pynvml.NVML_DEVICE_MIG_DISABLE
    compute: list[WorldProcess] = dataclasses.field(default_factory=list)
    graphics: list[WorldProcess] = dataclasses.field(default_factory=list)
    supported_events: int = ALL_HEALTH_EVENTS


class NvmlWorld:
    """A scripted NVML behind pynvml's function names.

    Knobs: ``init_error`` (nvmlInit raises it), ``library_error`` (every call raises it), ``lost`` (device indexes
    whose calls raise NVMLError_GpuIsLost), ``fail(name, error, index)`` (one function raises), ``memory_v2``,
    ``temperature_v`` and ``process_v3`` (False: the driver lacks the newer query), ``events`` (what
    nvmlEventSetWait_v2 returns or raises, in order; NVMLError_Timeout once empty).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[WorldGpu]) -> None:
        self.gpus = gpus
        self.handles = [ctypes.cast(ctypes.c_void_p(0x1000 * (i + 1)), pynvml.c_nvmlDevice_t) for i in range(len(gpus))]
        self.driver_version = "580.65.06"
        self.init_error: pynvml.NVMLError | None = None
        self.library_error: pynvml.NVMLError | None = None
        self.lost: set[int] = set()
        self.failures: dict[tuple[str, int | None], pynvml.NVMLError] = {}
        self.memory_v2 = True
        self.temperature_v = True
        self.process_v3 = True
        self.event_set_supported = True
        self.events: list[Any] = []
        self.wait_timeouts: list[int] = []
        self.registered: dict[int, int] = {}
        self.calls: list[str] = []
        self.unpatched: list[str] = []
        self.refcount = 0
        self.freed_sets = 0
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, self._recorded(name, getattr(self, name)))

        def no_real_library(name: str) -> Any:
            self.unpatched.append(name)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", no_real_library)

    # --- scripting ---

    def fail(self, name: str, error: pynvml.NVMLError, index: int | None = None) -> None:
        self.failures[(name, index)] = error

    def xid(self, index: int, code: int) -> None:
        self.events.append(self.event(index, pynvml.nvmlEventTypeXidCriticalError, code))

    def event(self, index: int | None, event_type: int, data: int) -> Any:
        device = self.handles[index] if index is not None else pynvml.c_nvmlDevice_t()
        return pynvml.c_nvmlEventData_t(
            device=device,
            eventType=event_type,
            eventData=data,
            gpuInstanceId=NO_INSTANCE,
            computeInstanceId=NO_INSTANCE,
        )

    def count(self, name: str) -> int:
        return self.calls.count(name)

    # --- the patched library ---

    def _recorded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if name != "nvmlInit" and self.library_error is not None:
                raise self.library_error
            if args and isinstance(args[0], pynvml.c_nvmlDevice_t):
                index = self._index(args[0])
                if index in self.lost:
                    raise pynvml.NVMLError_GpuIsLost()
                failure = self.failures.get((name, index))
                if failure is not None:
                    raise failure
            failure = self.failures.get((name, None))
            if failure is not None:
                raise failure
            return fn(*args, **kwargs)

        return call

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return [ctypes.cast(h, ctypes.c_void_p).value for h in self.handles].index(address)

    def _gpu(self, handle: Any) -> WorldGpu:
        return self.gpus[self._index(handle)]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        if self.library_error is not None:
            raise self.library_error
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle)
        if version:
            if not self.memory_v2:
                raise pynvml.NVMLError_FunctionNotFound()
            free = max(0, gpu.total - gpu.reserved - gpu.used)
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=gpu.total, reserved=gpu.reserved, free=free, used=gpu.used
            )
        # v1 counts the driver's reservation as used.
        used = gpu.used + gpu.reserved
        return pynvml.c_nvmlMemory_t(total=gpu.total, free=max(0, gpu.total - used), used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.gpu_util, memory=gpu.memory_util)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        if not self.temperature_v:
            raise pynvml.NVMLError_FunctionNotFound()
        return self._gpu(handle).temperature_c

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle).temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle).power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        gpu = self._gpu(handle)
        return gpu.ecc_corrected if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        mode = self._gpu(handle).mig_mode
        return [mode, mode]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if not self.process_v3:
            raise pynvml.NVMLLibraryMismatchError("use a versioned function")
        return _friendly(self._gpu(handle).compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        if not self.process_v3:
            raise pynvml.NVMLLibraryMismatchError("use a versioned function")
        return _friendly(self._gpu(handle).graphics)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return _friendly(self._gpu(handle).compute)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return _friendly(self._gpu(handle).graphics)

    def nvmlEventSetCreate(self) -> Any:
        if not self.event_set_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlEventSet_t()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu(handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self.registered[self._index(handle)] = event_types

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.wait_timeouts.append(timeout_ms)
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        item = self.events.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed_sets += 1


def _friendly(processes: list[WorldProcess]) -> list[Any]:
    """What pynvml 13's process queries return: its own process structs as friendly objects, the driver's 'not
    available' turned into None."""
    out = []
    for process in processes:
        struct = pynvml.c_nvmlProcessInfo_v3_t(
            pid=process.pid,
            usedGpuMemory=NOT_AVAILABLE if process.used_bytes is None else process.used_bytes,
            gpuInstanceId=process.gpu_instance,
            computeInstanceId=process.compute_instance,
        )
        info = pynvml.nvmlStructToFriendlyObject(struct)
        if info.usedGpuMemory == NOT_AVAILABLE:
            info.usedGpuMemory = None
        out.append(info)
    return out


def two_gpus() -> list[WorldGpu]:
    return [
        WorldGpu(
            uuid="GPU-00000000-0000-0000-0000-000000000000",
            used=10 * GiB + 4 * MiB,
            compute=[WorldProcess(pid=4242, used_bytes=10 * GiB)],
        ),
        WorldGpu(
            uuid="GPU-11111111-1111-1111-1111-111111111111", name="NVIDIA A10", total=24 * GiB, reserved=256 * MiB
        ),
    ]


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[NvmlWorld]:
    world = NvmlWorld(monkeypatch, two_gpus())
    yield world
    # nvmlErrorString is what NVMLError.__str__ asks for codes it has no text for; anything else would be a real call.
    assert [name for name in world.unpatched if name != "nvmlErrorString"] == []


@pytest.fixture
def opened(world: NvmlWorld) -> Iterator[nvml.NvmlProbe]:
    nvml_probe = nvml.NvmlProbe(clock=lambda: 1_700_000_000_000_000_000)
    nvml_probe.open()
    yield nvml_probe
    nvml_probe.close()


# --- sampling ---


def test_a_sample_reports_every_device_in_bytes_percent_celsius_and_milliwatts(opened: nvml.NvmlProbe) -> None:
    sample = opened.sample()
    assert sample.ts_ns == 1_700_000_000_000_000_000
    assert sample.driver_version == "580.65.06"
    assert sample.devices[0] == probe.DeviceSample(
        index=0,
        uuid="GPU-00000000-0000-0000-0000-000000000000",
        model="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GiB,
        memory_reserved_bytes=512 * MiB,
        memory_used_bytes=10 * GiB + 4 * MiB,
        memory_free_bytes=80 * GiB - 512 * MiB - (10 * GiB + 4 * MiB),
        gpu_util_pct=37,
        memory_util_pct=12,
        temperature_c=41,
        power_mw=123_456,
        ecc_corrected=2,
        ecc_uncorrected=0,
        mig_mode=False,
        processes=(probe.ProcessSample(pid=4242, used_memory_bytes=10 * GiB),),
    )
    assert [d.index for d in sample.devices] == [0, 1]
    assert sample.devices[1].model == "NVIDIA A10"
    assert sample.devices[1].processes == ()


def test_identity_and_capabilities_are_read_at_open_not_at_every_sample(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    opened.sample()
    opened.sample()
    assert world.count("nvmlDeviceGetUUID") == 2
    assert world.count("nvmlDeviceGetName") == 2
    assert world.count("nvmlDeviceGetHandleByIndex") == 2
    assert world.count("nvmlSystemGetDriverVersion") == 1


def test_mig_mode_is_the_current_mode(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.gpus[1].mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    assert [d.mig_mode for d in opened.sample().devices] == [False, True]


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetMigMode",
    ],
)
def test_a_field_the_device_does_not_support_becomes_none(
    world: NvmlWorld, opened: nvml.NvmlProbe, function: str
) -> None:
    world.fail(function, pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), index=0)
    device = opened.sample().devices[0]
    fields = {
        "nvmlDeviceGetUtilizationRates": (device.gpu_util_pct, device.memory_util_pct),
        "nvmlDeviceGetTemperatureV": (device.temperature_c,),
        "nvmlDeviceGetPowerUsage": (device.power_mw,),
        "nvmlDeviceGetTotalEccErrors": (device.ecc_corrected, device.ecc_uncorrected),
        "nvmlDeviceGetMigMode": (device.mig_mode,),
    }
    assert set(fields[function]) == {None}
    assert opened.sample().devices[1].power_mw == 123_456


def test_a_process_list_the_driver_does_not_give_is_none_not_empty(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    not_supported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    world.fail("nvmlDeviceGetComputeRunningProcesses", not_supported, index=0)
    world.fail("nvmlDeviceGetGraphicsRunningProcesses", not_supported, index=0)
    assert opened.sample().devices[0].processes is None


def test_graphics_processes_still_count_where_compute_listing_is_not_supported(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    world.gpus[0].graphics = [WorldProcess(pid=77, used_bytes=GiB)]
    world.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), index=0)
    assert opened.sample().devices[0].processes == (probe.ProcessSample(pid=77, used_memory_bytes=GiB),)


@pytest.mark.parametrize(
    "missing_v2",
    [pynvml.NVMLError_FunctionNotFound(), pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)],
    ids=["function_not_found", "not_supported"],
)
def test_memory_falls_back_to_v1_with_nothing_reserved_when_the_driver_lacks_v2(
    monkeypatch: pytest.MonkeyPatch, missing_v2: pynvml.NVMLError
) -> None:
    world = NvmlWorld(monkeypatch, two_gpus())
    original = world.nvmlDeviceGetMemoryInfo

    def memory_info(handle: Any, version: int | None = None) -> Any:
        if version:
            raise missing_v2
        return original(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory_info)
    nvml_probe = nvml.NvmlProbe(clock=lambda: 0)
    nvml_probe.open()
    device = nvml_probe.sample().devices[0]
    assert device.memory_reserved_bytes == 0
    assert device.memory_used_bytes == 10 * GiB + 4 * MiB + 512 * MiB  # v1 counts the reservation as used
    assert device.memory_free_bytes == device.memory_total_bytes - device.memory_used_bytes


def test_memory_v2_is_used_where_the_driver_has_it(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    device = opened.sample().devices[0]
    assert device.memory_reserved_bytes == 512 * MiB
    assert device.memory_used_bytes == 10 * GiB + 4 * MiB


def test_temperature_falls_back_to_the_legacy_query_once(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.temperature_v = False
    assert [d.temperature_c for d in opened.sample().devices] == [41, 41]
    opened.sample()
    assert world.count("nvmlDeviceGetTemperatureV") == 1
    assert world.count("nvmlDeviceGetTemperature") == 4


def test_process_queries_fall_back_to_v2_when_the_driver_lacks_v3(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.process_v3 = False
    assert opened.sample().devices[0].processes == (probe.ProcessSample(pid=4242, used_memory_bytes=10 * GiB),)
    assert world.count("nvmlDeviceGetComputeRunningProcesses_v2") == 2


def test_a_process_with_compute_and_graphics_work_is_listed_once(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.gpus[0].compute = [WorldProcess(pid=9, used_bytes=3 * GiB), WorldProcess(pid=4242, used_bytes=10 * GiB)]
    world.gpus[0].graphics = [WorldProcess(pid=9, used_bytes=3 * GiB), WorldProcess(pid=5, used_bytes=MiB)]
    assert opened.sample().devices[0].processes == (
        probe.ProcessSample(pid=5, used_memory_bytes=MiB),
        probe.ProcessSample(pid=9, used_memory_bytes=3 * GiB),
        probe.ProcessSample(pid=4242, used_memory_bytes=10 * GiB),
    )


def test_a_process_in_several_mig_instances_holds_the_sum_of_them(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.gpus[0].compute = [
        WorldProcess(pid=9, used_bytes=3 * GiB, gpu_instance=1, compute_instance=0),
        WorldProcess(pid=9, used_bytes=2 * GiB, gpu_instance=2, compute_instance=0),
    ]
    assert opened.sample().devices[0].processes == (probe.ProcessSample(pid=9, used_memory_bytes=5 * GiB),)


def test_process_memory_the_driver_does_not_report_is_none(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.gpus[0].compute = [WorldProcess(pid=9, used_bytes=None)]
    assert opened.sample().devices[0].processes == (probe.ProcessSample(pid=9, used_memory_bytes=None),)


def test_the_raw_not_available_value_is_none_too(
    world: NvmlWorld, opened: nvml.NvmlProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pynvml releases before 11.5 passed NVML_VALUE_NOT_AVAILABLE through instead of None.
    raw = pynvml.nvmlStructToFriendlyObject(
        pynvml.c_nvmlProcessInfo_v3_t(pid=9, usedGpuMemory=NOT_AVAILABLE, gpuInstanceId=NO_INSTANCE)
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: [raw])
    assert opened.sample().devices[0].processes == (probe.ProcessSample(pid=9, used_memory_bytes=None),)


# --- errors ---


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "library_not_found"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver_not_loaded"),
        (pynvml.NVMLError_NoPermission(), "no_permission"),
        (pynvml.NVMLError_LibRmVersionMismatch(), "version_mismatch"),
        (pynvml.NVMLError_Uninitialized(), "uninitialized"),
        (pynvml.NVMLError_Unknown(), "unknown"),
    ],
)
def test_an_unusable_library_at_open_is_library_unavailable_of_its_kind(
    world: NvmlWorld, error: pynvml.NVMLError, kind: str
) -> None:
    world.init_error = error
    nvml_probe = nvml.NvmlProbe()
    with pytest.raises(errors.GpuLibraryUnavailable) as raised:
        nvml_probe.open()
    assert raised.value.kind == kind
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)
    assert world.count("nvmlShutdown") == 0


def test_a_failure_while_discovering_devices_shuts_nvml_down_and_leaves_the_probe_closed(world: NvmlWorld) -> None:
    world.fail("nvmlDeviceGetName", pynvml.NVMLError_Unknown(), index=1)
    nvml_probe = nvml.NvmlProbe()
    with pytest.raises(errors.GpuProbeError, match="Unknown Error"):
        nvml_probe.open()
    assert world.refcount == 0
    with pytest.raises(errors.GpuLibraryUnavailable) as raised:
        nvml_probe.sample()
    assert raised.value.kind == "uninitialized"
    world.failures.clear()
    nvml_probe.open()
    assert len(nvml_probe.sample().devices) == 2


def test_a_gpu_lost_at_open_is_gpu_lost_with_its_index(world: NvmlWorld) -> None:
    world.lost.add(1)
    with pytest.raises(errors.GpuLost) as raised:
        nvml.NvmlProbe().open()
    assert raised.value.index == 1
    assert world.refcount == 0


def test_a_gpu_lost_during_a_sample_is_gpu_lost_and_one_health_event(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.lost.add(1)
    for _ in range(2):
        with pytest.raises(errors.GpuLost) as raised:
            opened.sample()
        assert raised.value.index == 1
    assert opened.wait_health_events(0) == [
        probe.HealthEvent(
            kind=probe.HealthKind.GPU_LOST,
            gpu_index=1,
            gpu_uuid="GPU-11111111-1111-1111-1111-111111111111",
            code=None,
            message="GPU 1 stopped answering",
            critical=True,
        )
    ]
    assert opened.wait_health_events(0) == []


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pynvml.NVMLError_DriverNotLoaded(), "driver_not_loaded"),
        (pynvml.NVMLError_NoPermission(), "no_permission"),
        (pynvml.NVMLError_Uninitialized(), "uninitialized"),
    ],
)
def test_the_library_failing_after_open_fails_samples_and_waits_as_library_unavailable(
    world: NvmlWorld, opened: nvml.NvmlProbe, error: pynvml.NVMLError, kind: str
) -> None:
    world.library_error = error
    with pytest.raises(errors.GpuLibraryUnavailable) as sampled:
        opened.sample()
    with pytest.raises(errors.GpuLibraryUnavailable) as waited:
        opened.wait_health_events(0)
    assert sampled.value.kind == waited.value.kind == kind


def test_any_other_nvml_error_is_a_probe_error_carrying_nvml_text(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.fail("nvmlDeviceGetPowerUsage", pynvml.NVMLError_Unknown(), index=0)
    with pytest.raises(errors.GpuProbeError, match=r"sampling GPU 0.*Unknown Error"):
        opened.sample()


def test_an_error_on_a_required_query_is_never_mistaken_for_not_supported(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    world.fail("nvmlDeviceGetMemoryInfo", pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), index=0)
    with pytest.raises(errors.GpuProbeError, match="Not Supported"):
        opened.sample()


def test_sample_and_wait_on_a_probe_that_is_not_open_are_library_unavailable(world: NvmlWorld) -> None:
    nvml_probe = nvml.NvmlProbe()
    for call in (nvml_probe.sample, lambda: nvml_probe.wait_health_events(0)):
        with pytest.raises(errors.GpuLibraryUnavailable) as raised:
            call()
        assert raised.value.kind == "uninitialized"


def test_open_twice_initialises_once_and_close_is_idempotent(world: NvmlWorld) -> None:
    nvml_probe = nvml.NvmlProbe()
    nvml_probe.open()
    nvml_probe.open()
    assert world.count("nvmlInit") == 1
    nvml_probe.close()
    nvml_probe.close()
    assert world.count("nvmlShutdown") == 1
    assert world.freed_sets == 1
    assert world.refcount == 0


def test_errors_at_close_are_swallowed(world: NvmlWorld) -> None:
    nvml_probe = nvml.NvmlProbe()
    nvml_probe.open()
    world.fail("nvmlEventSetFree", pynvml.NVMLError_Unknown())
    world.fail("nvmlShutdown", pynvml.NVMLError_Unknown())
    nvml_probe.close()


# --- health events ---


def test_health_events_are_registered_for_the_types_each_device_supports(world: NvmlWorld) -> None:
    world.gpus[1].supported_events = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState
    nvml_probe = nvml.NvmlProbe()
    nvml_probe.open()
    assert world.registered == {
        0: pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError,
        1: pynvml.nvmlEventTypeXidCriticalError,
    }
    nvml_probe.close()


@pytest.mark.parametrize(("code", "critical"), [(79, True), (48, True), (95, True), (13, False), (31, False)])
def test_an_xid_event_is_a_health_event_for_its_device(
    world: NvmlWorld, opened: nvml.NvmlProbe, code: int, critical: bool
) -> None:
    world.xid(1, code)
    [event] = opened.wait_health_events(1000)
    assert event.kind is probe.HealthKind.XID
    assert (event.gpu_index, event.gpu_uuid, event.code, event.critical) == (
        1,
        "GPU-11111111-1111-1111-1111-111111111111",
        code,
        critical,
    )
    assert str(code) in event.message


def test_a_double_bit_ecc_event_is_a_critical_ecc_health_event(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.events.append(world.event(0, pynvml.nvmlEventTypeDoubleBitEccError, 0))
    assert opened.wait_health_events(1000) == [
        probe.ecc_event(gpu_index=0, gpu_uuid="GPU-00000000-0000-0000-0000-000000000000")
    ]


def test_an_event_from_an_unknown_device_has_no_index(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.events.append(world.event(None, pynvml.nvmlEventTypeXidCriticalError, 79))
    [event] = opened.wait_health_events(1000)
    assert (event.gpu_index, event.gpu_uuid, event.critical) == (None, None, True)


def test_an_event_wait_that_times_out_returns_nothing(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    assert opened.wait_health_events(250) == []
    assert world.wait_timeouts == [250]


def test_events_already_queued_are_collected_in_one_wait_without_waiting_again(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    world.xid(0, 79)
    world.xid(1, 13)
    assert [e.code for e in opened.wait_health_events(1000)] == [79, 13]
    assert world.wait_timeouts == [1000, 0, 0]


def test_a_failure_after_some_events_returns_those_and_surfaces_on_the_next_wait(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    world.xid(0, 79)
    world.events.append(pynvml.NVMLError_Unknown())
    assert [e.code for e in opened.wait_health_events(1000)] == [79]
    world.events.append(pynvml.NVMLError_Unknown())
    with pytest.raises(errors.GpuProbeError, match="waiting for health events"):
        opened.wait_health_events(1000)


def test_a_wait_that_finds_a_gpu_lost_reports_it_once_then_raises_gpu_lost(
    world: NvmlWorld, opened: nvml.NvmlProbe
) -> None:
    world.lost.add(0)
    world.events.extend([pynvml.NVMLError_GpuIsLost(), pynvml.NVMLError_GpuIsLost()])
    [event] = opened.wait_health_events(1000)
    assert (event.kind, event.gpu_index, event.critical) == (probe.HealthKind.GPU_LOST, 0, True)
    with pytest.raises(errors.GpuLost) as raised:
        opened.wait_health_events(1000)
    assert raised.value.index == 0


def test_a_lost_gpu_the_wait_cannot_find_is_a_probe_error(world: NvmlWorld, opened: nvml.NvmlProbe) -> None:
    world.events.append(pynvml.NVMLError_GpuIsLost())
    with pytest.raises(errors.GpuProbeError, match="every GPU answers"):
        opened.wait_health_events(1000)


def test_without_event_support_the_wait_returns_nothing_without_calling_nvml(world: NvmlWorld) -> None:
    world.event_set_supported = False
    nvml_probe = nvml.NvmlProbe()
    nvml_probe.open()
    assert nvml_probe.wait_health_events(0) == []
    assert world.wait_timeouts == []
    nvml_probe.close()


def test_an_event_set_no_device_joins_is_freed_at_open(world: NvmlWorld) -> None:
    for gpu in world.gpus:
        gpu.supported_events = pynvml.nvmlEventTypePState
    nvml_probe = nvml.NvmlProbe()
    nvml_probe.open()
    assert world.freed_sets == 1
    assert nvml_probe.wait_health_events(0) == []
    assert world.wait_timeouts == []
    nvml_probe.close()
    assert world.freed_sets == 1


# --- the house rule ---


def test_no_module_but_the_nvml_adapter_imports_pynvml() -> None:
    importers = sorted(
        str(path.relative_to(REPO))
        for package in ("common", "agent", "scheduler", "quotient")
        for path in (REPO / package).rglob("*.py")
        if "import pynvml" in path.read_text() or "from pynvml" in path.read_text()
    )
    assert importers == ["agent/gpus/nvml.py"]

"""One contract, two probes: FakeProbe and NvmlProbe over a scripted pynvml answer the same scene with the same types,
units and error classes, so what the agent learns against the fake holds against NVML.

The scene: GPU 0 (80 GiB, 512 MiB reserved) runs pid 100 with 10 GiB; GPU 1 (24 GiB, 256 MiB reserved) runs pid 200
with 30 GiB, more than it can hold, so its free memory must clamp at zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Protocol

import pynvml
import pytest

from agent.gpus import fake, nvml, probe
from common import errors
from tests.unit.test_nvml_probe import NvmlWorld, WorldGpu, WorldProcess

GiB = 1024**3
MiB = 1024**2
TS_NS = 1_700_000_000_000_000_000


@dataclasses.dataclass(frozen=True)
class SceneGpu:
    uuid: str
    total: int
    reserved: int
    pid: int
    process_bytes: int


SCENE = (
    SceneGpu(uuid="GPU-aaaa", total=80 * GiB, reserved=512 * MiB, pid=100, process_bytes=10 * GiB),
    SceneGpu(uuid="GPU-bbbb", total=24 * GiB, reserved=256 * MiB, pid=200, process_bytes=30 * GiB),
)


class Rig(Protocol):
    """A probe over the scene, and the levers to break it the same way for either implementation."""

    subject: probe.GpuProbe

    def fail_library(self, kind: probe.LibraryFailure) -> None: ...
    def lose_gpu(self, index: int) -> None: ...
    def inject_xid(self, index: int, code: int) -> None: ...


class FakeRig:
    def __init__(self) -> None:
        gpus = [
            fake.FakeGpu(
                index=i, uuid=g.uuid, model="NVIDIA H100", memory_total_bytes=g.total, memory_reserved_bytes=g.reserved
            )
            for i, g in enumerate(SCENE)
        ]
        processes = [
            fake.FakeProcess(pid=g.pid, gpu_index=i, memory=fake.MemoryScript.constant(g.process_bytes))
            for i, g in enumerate(SCENE)
        ]
        self.fake = fake.FakeProbe(gpus, clock=lambda: TS_NS, processes=processes)
        self.subject: probe.GpuProbe = self.fake

    def fail_library(self, kind: probe.LibraryFailure) -> None:
        self.fake.fail_library(kind)

    def lose_gpu(self, index: int) -> None:
        self.fake.lose_gpu(index)

    def inject_xid(self, index: int, code: int) -> None:
        self.fake.inject_xid(index, code)


NVML_ERRORS: dict[probe.LibraryFailure, Callable[[], pynvml.NVMLError]] = {
    probe.LibraryFailure.LIBRARY_NOT_FOUND: pynvml.NVMLError_LibraryNotFound,
    probe.LibraryFailure.DRIVER_NOT_LOADED: pynvml.NVMLError_DriverNotLoaded,
    probe.LibraryFailure.NO_PERMISSION: pynvml.NVMLError_NoPermission,
}


class NvmlRig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.world = NvmlWorld(
            monkeypatch,
            [
                WorldGpu(
                    uuid=g.uuid,
                    name="NVIDIA H100",
                    total=g.total,
                    reserved=g.reserved,
                    used=g.process_bytes + 4 * MiB,
                    compute=[WorldProcess(pid=g.pid, used_bytes=g.process_bytes)],
                )
                for g in SCENE
            ],
        )
        self.subject: probe.GpuProbe = nvml.NvmlProbe(clock=lambda: TS_NS)

    def fail_library(self, kind: probe.LibraryFailure) -> None:
        self.world.library_error = NVML_ERRORS[kind]()

    def lose_gpu(self, index: int) -> None:
        self.world.lost.add(index)

    def inject_xid(self, index: int, code: int) -> None:
        self.world.xid(index, code)


@pytest.fixture(params=["fake", "nvml"])
def rig(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    made: Rig = FakeRig() if request.param == "fake" else NvmlRig(monkeypatch)
    yield made
    made.subject.close()
    if isinstance(made, NvmlRig):  # nothing reached for the real library (nvmlErrorString is NVMLError.__str__'s)
        assert [name for name in made.world.unpatched if name != "nvmlErrorString"] == []


def opened(rig: Rig) -> probe.GpuProbe:
    rig.subject.open()
    return rig.subject


def test_a_sample_is_plain_values_of_the_declared_types(rig: Rig) -> None:
    sample = opened(rig).sample()
    assert type(sample) is probe.ProbeSample
    assert sample.ts_ns == TS_NS
    assert isinstance(sample.driver_version, str)
    assert [(d.index, d.uuid) for d in sample.devices] == [(0, "GPU-aaaa"), (1, "GPU-bbbb")]
    for device in sample.devices:
        assert type(device) is probe.DeviceSample
        for name in ("memory_total_bytes", "memory_reserved_bytes", "memory_used_bytes", "memory_free_bytes"):
            assert type(getattr(device, name)) is int, name
        for name in ("gpu_util_pct", "memory_util_pct", "temperature_c", "power_mw", "ecc_corrected"):
            assert type(getattr(device, name)) in (int, type(None)), name
        assert type(device.mig_mode) in (bool, type(None))
        assert isinstance(device.processes, tuple)
        assert all(type(p) is probe.ProcessSample for p in device.processes)


def test_units_are_bytes_percent_celsius_and_milliwatts(rig: Rig) -> None:
    for device, scene in zip(opened(rig).sample().devices, SCENE, strict=True):
        assert device.memory_total_bytes == scene.total
        assert device.memory_reserved_bytes == scene.reserved
        assert device.processes == (probe.ProcessSample(pid=scene.pid, used_memory_bytes=scene.process_bytes),)
        assert device.memory_used_bytes >= scene.process_bytes
        assert device.gpu_util_pct is None or 0 <= device.gpu_util_pct <= 100
        assert device.memory_util_pct is None or 0 <= device.memory_util_pct <= 100
        assert device.temperature_c is None or 0 < device.temperature_c < 120
        assert device.power_mw is None or 1_000 <= device.power_mw <= 2_000_000


def test_free_memory_is_total_minus_reserved_minus_used_clamped_at_zero(rig: Rig) -> None:
    roomy, overfull = opened(rig).sample().devices
    assert roomy.memory_free_bytes == roomy.memory_total_bytes - roomy.memory_reserved_bytes - roomy.memory_used_bytes
    assert overfull.memory_total_bytes - overfull.memory_reserved_bytes - overfull.memory_used_bytes < 0
    assert overfull.memory_free_bytes == 0


def test_sample_and_wait_before_open_are_library_unavailable_uninitialized(rig: Rig) -> None:
    for call in (rig.subject.sample, lambda: rig.subject.wait_health_events(0)):
        with pytest.raises(errors.GpuLibraryUnavailable) as raised:
            call()
        assert raised.value.kind == probe.LibraryFailure.UNINITIALIZED


def test_close_is_idempotent_and_open_after_close_works(rig: Rig) -> None:
    opened(rig).close()
    rig.subject.close()
    rig.subject.open()
    assert len(rig.subject.sample().devices) == 2


@pytest.mark.parametrize("kind", list(NVML_ERRORS))
def test_an_unusable_library_fails_open_with_the_same_kind(rig: Rig, kind: probe.LibraryFailure) -> None:
    rig.fail_library(kind)
    with pytest.raises(errors.GpuLibraryUnavailable) as raised:
        rig.subject.open()
    assert raised.value.kind == kind


@pytest.mark.parametrize("kind", list(NVML_ERRORS))
def test_a_library_failing_after_open_fails_sample_and_wait_with_the_same_kind(
    rig: Rig, kind: probe.LibraryFailure
) -> None:
    opened(rig)
    rig.fail_library(kind)
    for call in (rig.subject.sample, lambda: rig.subject.wait_health_events(0)):
        with pytest.raises(errors.GpuLibraryUnavailable) as raised:
            call()
        assert raised.value.kind == kind


def test_a_lost_gpu_fails_the_sample_with_its_index_and_is_reported_once(rig: Rig) -> None:
    opened(rig)
    rig.lose_gpu(1)
    for _ in range(2):
        with pytest.raises(errors.GpuLost) as raised:
            rig.subject.sample()
        assert raised.value.index == 1
    [event] = rig.subject.wait_health_events(0)
    assert (event.kind, event.gpu_index, event.gpu_uuid, event.code, event.critical) == (
        probe.HealthKind.GPU_LOST,
        1,
        "GPU-bbbb",
        None,
        True,
    )
    assert rig.subject.wait_health_events(0) == []


@pytest.mark.parametrize("code", [79, 13])
def test_an_xid_is_the_same_health_event_from_either_probe(rig: Rig, code: int) -> None:
    opened(rig)
    rig.inject_xid(0, code)
    assert list(rig.subject.wait_health_events(0)) == [probe.xid_event(gpu_index=0, gpu_uuid="GPU-aaaa", code=code)]


def test_a_wait_with_nothing_to_report_returns_nothing(rig: Rig) -> None:
    assert list(opened(rig).wait_health_events(0)) == []

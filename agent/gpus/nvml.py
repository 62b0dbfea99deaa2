"""``NvmlProbe``: the ``GpuProbe`` over NVIDIA's management library, and the only module that imports ``pynvml``.

Every pynvml exception is translated here into ``common.errors`` (see ``GpuProbe`` for the contract), so nothing above
this module ever sees ``NVMLError``. The shape follows from what NVML costs and what drivers in the field answer:

- Device handles and static facts (UUID, model name, which memory query the driver answers) are read once at
  ``open``; a sample then makes only the per-instant calls.
- Drivers differ in age, so three queries fall back to their older form: memory v2 (which reports driver-reserved
  memory separately, so it is never counted as free) falls back to v1 per device at ``open`` (reserved is then 0
  and v1's ``used`` includes it); ``nvmlDeviceGetTemperatureV`` falls back to the deprecated
  ``nvmlDeviceGetTemperature``; the v3 process queries fall back to v2. Each switch happens once, on the first
  "function not found" or "version mismatch", and sticks.
- A query the device does not support (utilisation on a MIG-enabled GPU, ECC counters with ECC off, power on some
  boards) yields None for that field, never an error. A process list NVML withholds yields None, never ().
- Health comes from an NVML event set (critical Xids and double-bit ECC errors) registered on every device that
  supports it; ``nvmlEventSetWait_v2`` blocks in the caller's thread for at most the timeout.

Why one module of more than 400 lines: it holds one responsibility, the NVML boundary. The import-linter contract
admits ``pynvml`` here and nowhere else, so every call into the library and its translation stay together (the
lifecycle, the sampling queries with their fallbacks, the health event set share the device handles, the locks and
the error mapping); what needs no pynvml, merging the process lists, is ``agent.gpus.processlists``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pynvml

from agent.gpus import probe, processlists
from common import errors

# The NVML return codes this module decides on, typed (pynvml itself is untyped).
_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
_ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

# NVML failures that make the library unusable as a whole, whenever they happen.
_LIBRARY_FAILURES: dict[int, probe.LibraryFailure] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: probe.LibraryFailure.LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: probe.LibraryFailure.DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_NO_PERMISSION: probe.LibraryFailure.NO_PERMISSION,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: probe.LibraryFailure.VERSION_MISMATCH,
    pynvml.NVML_ERROR_UNINITIALIZED: probe.LibraryFailure.UNINITIALIZED,
}
# Failures of nvmlInit that mean the same, though the same codes later on are ordinary probe errors.
_INIT_FAILURES: dict[int, probe.LibraryFailure] = {
    **_LIBRARY_FAILURES,
    _UNKNOWN: probe.LibraryFailure.UNKNOWN,
    _FUNCTION_NOT_FOUND: probe.LibraryFailure.VERSION_MISMATCH,
}
# An optional field is absent (None) on these; a driver that lacks the function does not support the query either.
_UNSUPPORTED = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
# A newer form of a query is not available from this driver: use the older form.
_OLDER_API = frozenset({_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH})

_HEALTH_EVENT_TYPES = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
# One wait returns at most this many events, so a storm of Xids cannot keep the caller inside NVML.
_MAX_EVENTS_PER_WAIT = 64
# What a process's usedGpuMemory holds where the driver does not say (pynvml 13 turns it into None itself, older
# releases did not).
_MEMORY_NOT_AVAILABLE = int(pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Device:
    index: int
    handle: Any  # pynvml's opaque c_nvmlDevice_t pointer, passed back to pynvml untouched
    uuid: str
    model: str
    memory_v2: bool


class NvmlProbe:
    """The GPUs of this node, read through NVML. See ``agent.gpus.probe.GpuProbe`` for the contract.

    ``clock`` gives each sample's ``ts_ns`` (wall-clock nanoseconds by default, as the wire expects).
    """

    def __init__(self, *, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._state_lock = threading.Lock()  # open and close
        self._wait_lock = threading.Lock()  # the event set is freed only while no thread waits inside NVML on it
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()  # set by close: ends a wait that has no event set to block on
        self._devices: tuple[_Device, ...] | None = None
        self._by_address: dict[int, _Device] = {}
        self._driver_version: str | None = None
        self._event_set: Any = None
        self._pending: list[probe.HealthEvent] = []
        self._lost_reported: set[int] = set()
        self._legacy_temperature = False
        self._legacy_processes = False

    # --- lifecycle ---

    def open(self) -> None:
        with self._state_lock:
            if self._devices is not None:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise _init_failure(exc) from exc
            try:
                with _nvml_errors(index=None, doing="reading the driver version"):
                    driver_version = _optional(pynvml.nvmlSystemGetDriverVersion)
                with _nvml_errors(index=None, doing="counting GPUs"):
                    count = int(pynvml.nvmlDeviceGetCount())
                devices = tuple(self._discover(index) for index in range(count))
                event_set = self._register_health_events(devices)
            except BaseException:
                _quietly(pynvml.nvmlShutdown)
                raise
            self._driver_version = None if driver_version is None else str(driver_version)
            self._by_address = {address: d for d in devices if (address := _address(d.handle)) is not None}
            self._event_set = event_set
            with self._pending_lock:
                self._pending.clear()
                self._lost_reported.clear()
            self._legacy_temperature = False
            self._legacy_processes = False
            self._wake.clear()
            self._devices = devices

    def close(self) -> None:
        with self._state_lock:
            if self._devices is None:
                return
            self._devices = None
            self._wake.set()
            with self._wait_lock:
                event_set, self._event_set = self._event_set, None
            # The library is being released: a failure to free or shut down changes nothing the caller can act on.
            if event_set is not None:
                _quietly(pynvml.nvmlEventSetFree, event_set)
            _quietly(pynvml.nvmlShutdown)

    # --- sampling ---

    def sample(self) -> probe.ProbeSample:
        devices = self._open_devices()
        ts_ns = self._clock()
        return probe.ProbeSample(
            ts_ns=ts_ns,
            driver_version=self._driver_version,
            devices=tuple(self._sample_device(device) for device in devices),
        )

    def _sample_device(self, device: _Device) -> probe.DeviceSample:
        handle = device.handle
        try:
            with _nvml_errors(index=device.index, doing=f"sampling GPU {device.index}"):
                total, reserved, used = self._memory(device)
                utilization = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
                temperature = self._temperature(handle)
                power = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
                corrected = _optional(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                )
                uncorrected = _optional(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                )
                mig = _optional(pynvml.nvmlDeviceGetMigMode, handle)
                processes = self._processes(handle)
        except errors.GpuLost:
            self._report_lost(device)
            raise
        return probe.DeviceSample(
            index=device.index,
            uuid=device.uuid,
            model=device.model,
            memory_total_bytes=total,
            memory_reserved_bytes=reserved,
            memory_used_bytes=used,
            memory_free_bytes=probe.memory_free_bytes(total_bytes=total, reserved_bytes=reserved, used_bytes=used),
            gpu_util_pct=None if utilization is None else int(utilization.gpu),
            memory_util_pct=None if utilization is None else int(utilization.memory),
            temperature_c=temperature,
            power_mw=_int_or_none(power),
            ecc_corrected=_int_or_none(corrected),
            ecc_uncorrected=_int_or_none(uncorrected),
            mig_mode=None if mig is None else int(mig[0]) == pynvml.NVML_DEVICE_MIG_ENABLE,
            processes=processes,
        )

    def _memory(self, device: _Device) -> tuple[int, int, int]:
        """(total, reserved, used) in bytes."""
        if device.memory_v2:
            info = pynvml.nvmlDeviceGetMemoryInfo(device.handle, version=pynvml.nvmlMemory_v2)
            return int(info.total), int(info.reserved), int(info.used)
        info = pynvml.nvmlDeviceGetMemoryInfo(device.handle)
        return int(info.total), 0, int(info.used)

    def _temperature(self, handle: Any) -> int | None:
        if not self._legacy_temperature:
            try:
                return int(pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU))
            except pynvml.NVMLError as exc:
                if _code(exc) == _NOT_SUPPORTED:
                    return None
                if _code(exc) not in _OLDER_API:
                    raise
                self._legacy_temperature = True
        return _int_or_none(_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU))

    def _processes(self, handle: Any) -> tuple[probe.ProcessSample, ...] | None:
        compute = self._process_list(handle, graphics=False)
        graphics = self._process_list(handle, graphics=True)
        if compute is None and graphics is None:
            return None
        return processlists.merge(_entry(info) for info in (*(compute or ()), *(graphics or ())))

    def _process_list(self, handle: Any, *, graphics: bool) -> list[Any] | None:
        if not self._legacy_processes:
            query = (
                pynvml.nvmlDeviceGetGraphicsRunningProcesses
                if graphics
                else pynvml.nvmlDeviceGetComputeRunningProcesses
            )
            try:
                found = _optional(query, handle, unsupported=frozenset({_NOT_SUPPORTED}))
                return None if found is None else list(found)
            except pynvml.NVMLLibraryMismatchError:
                # pynvml's unversioned wrapper says the driver lacks the v3 query.
                self._legacy_processes = True
            except pynvml.NVMLError as exc:
                if _code(exc) not in _OLDER_API:
                    raise
                self._legacy_processes = True
        legacy = (
            pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2
            if graphics
            else pynvml.nvmlDeviceGetComputeRunningProcesses_v2
        )
        found = _optional(legacy, handle)
        return None if found is None else list(found)

    # --- health ---

    def wait_health_events(self, timeout_ms: int) -> Sequence[probe.HealthEvent]:
        self._open_devices()
        pending = self._take_pending()
        if pending:
            return pending
        if self._event_set is None:
            # No device supports health events: honour the timeout (ended early by close) so callers do not spin.
            self._wake.wait(max(0, timeout_ms) / 1000)
            return self._take_pending()
        with self._wait_lock:
            event_set = self._event_set
            if event_set is None:  # closed while this thread waited for the lock
                return self._take_pending()
            events = self._wait(event_set, max(0, timeout_ms))
        return [*self._take_pending(), *events]

    def _wait(self, event_set: Any, timeout_ms: int) -> list[probe.HealthEvent]:
        events: list[probe.HealthEvent] = []
        wait_ms = timeout_ms
        for _ in range(_MAX_EVENTS_PER_WAIT):
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, wait_ms)
            except pynvml.NVMLError as exc:
                if _code(exc) == _TIMEOUT or events:
                    break  # nothing (more) to report now; a failure after some events surfaces on the next wait
                if _code(exc) == _GPU_IS_LOST:
                    self._on_lost_in_wait(exc)
                    break
                raise _translate(exc, index=None, doing="waiting for health events") from exc
            event = self._health_event(data)
            if event is not None:
                events.append(event)
            wait_ms = 0  # collect what is already queued, without waiting again
        return events

    def _on_lost_in_wait(self, exc: pynvml.NVMLError) -> None:
        """The event wait says a GPU is lost without saying which: find it. Returns (after queueing its gpu_lost
        event) the first time a device is found lost, raises ``GpuLost`` after that so callers back off."""
        device = next((d for d in self._open_devices() if _is_lost(d.handle)), None)
        if device is None:
            raise errors.GpuProbeError(
                f"NVML reported a lost GPU while waiting for events, but every GPU answers: {exc}"
            )
        if not self._report_lost(device):
            raise errors.GpuLost(device.index, f"GPU {device.index} ({device.uuid}) is lost: {exc}") from exc

    def _health_event(self, data: Any) -> probe.HealthEvent | None:
        address = _address(data.device)
        device = None if address is None else self._by_address.get(address)
        index = None if device is None else device.index
        uuid = None if device is None else device.uuid
        event_type = int(data.eventType)
        if event_type & pynvml.nvmlEventTypeXidCriticalError:
            return probe.xid_event(gpu_index=index, gpu_uuid=uuid, code=int(data.eventData))
        if event_type & pynvml.nvmlEventTypeDoubleBitEccError:
            return probe.ecc_event(gpu_index=index, gpu_uuid=uuid)
        return None  # only the two types above are registered

    def _register_health_events(self, devices: Sequence[_Device]) -> Any:
        """An event set holding every device that supports our health events, or None where none does."""
        with _nvml_errors(index=None, doing="creating the health event set"):
            event_set = _optional(pynvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        registered = 0
        try:
            for device in devices:
                with _nvml_errors(index=device.index, doing=f"registering health events on GPU {device.index}"):
                    supported = _int_or_none(_optional(pynvml.nvmlDeviceGetSupportedEventTypes, device.handle))
                    mask = (supported or 0) & _HEALTH_EVENT_TYPES
                    if mask and _register(device.handle, mask, event_set):
                        registered += 1
        except BaseException:
            _quietly(pynvml.nvmlEventSetFree, event_set)
            raise
        if registered == 0:
            _quietly(pynvml.nvmlEventSetFree, event_set)
            return None
        return event_set

    def _report_lost(self, device: _Device) -> bool:
        """Queue the one gpu_lost event for ``device``; False if it was already reported since ``open``."""
        with self._pending_lock:
            if device.index in self._lost_reported:
                return False
            self._lost_reported.add(device.index)
            self._pending.append(
                probe.gpu_lost_event(
                    gpu_index=device.index, gpu_uuid=device.uuid, message=f"GPU {device.index} stopped answering"
                )
            )
            return True

    def _take_pending(self) -> list[probe.HealthEvent]:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        return pending

    # --- discovery and errors ---

    def _discover(self, index: int) -> _Device:
        with _nvml_errors(index=index, doing=f"opening GPU {index}"):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            model = str(pynvml.nvmlDeviceGetName(handle))
            return _Device(index=index, handle=handle, uuid=uuid, model=model, memory_v2=_answers_memory_v2(handle))

    def _open_devices(self) -> tuple[_Device, ...]:
        devices = self._devices
        if devices is None:
            raise errors.GpuLibraryUnavailable(probe.LibraryFailure.UNINITIALIZED, "the GPU probe is not open")
        return devices


@contextlib.contextmanager
def _nvml_errors(*, index: int | None, doing: str) -> Iterator[None]:
    """Translate any NVMLError raised inside into our error tree."""
    try:
        yield
    except pynvml.NVMLError as exc:
        raise _translate(exc, index=index, doing=doing) from exc


def _translate(exc: pynvml.NVMLError, *, index: int | None, doing: str) -> errors.GpuError:
    code = _code(exc)
    failure = _LIBRARY_FAILURES.get(code)
    if failure is not None:
        return errors.GpuLibraryUnavailable(failure, f"NVML is unavailable ({failure}) while {doing}: {exc}")
    if code == _GPU_IS_LOST and index is not None:
        return errors.GpuLost(index, f"GPU {index} is lost while {doing}: {exc}")
    return errors.GpuProbeError(f"NVML failed while {doing}: {exc}")


def _optional(fn: Callable[..., Any], *args: Any, unsupported: frozenset[int] = _UNSUPPORTED) -> Any:
    """``fn(*args)``, or None where the device or driver does not support the query."""
    try:
        result = fn(*args)
    except pynvml.NVMLError as exc:
        if _code(exc) in unsupported:
            return None
        raise
    return result


def _init_failure(exc: pynvml.NVMLError) -> errors.GpuError:
    failure = _INIT_FAILURES.get(_code(exc))
    if failure is None:
        return errors.GpuProbeError(f"NVML failed to initialise: {exc}")
    return errors.GpuLibraryUnavailable(failure, f"NVML is unavailable ({failure}): {exc}")


def _register(handle: Any, mask: int, event_set: Any) -> bool:
    """Register ``mask`` events of one device; False where the device does not support them after all."""
    try:
        pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    except pynvml.NVMLError as exc:
        if _code(exc) in _UNSUPPORTED:
            return False
        raise
    return True


def _answers_memory_v2(handle: Any) -> bool:
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as exc:
        if _code(exc) in _OLDER_API or _code(exc) == _NOT_SUPPORTED:
            return False
        raise
    return True


def _is_lost(handle: Any) -> bool:
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as exc:
        return _code(exc) == _GPU_IS_LOST
    return False


def _entry(info: Any) -> processlists.ProcessEntry:
    """A plain copy of one of pynvml's process structures (v2 structures have no instance ids)."""
    return processlists.ProcessEntry(
        pid=int(info.pid),
        gpu_instance=int(getattr(info, "gpuInstanceId", processlists.NO_INSTANCE)),
        compute_instance=int(getattr(info, "computeInstanceId", processlists.NO_INSTANCE)),
        used_memory_bytes=_process_memory(info.usedGpuMemory),
    )


def _process_memory(value: Any) -> int | None:
    if value is None or int(value) == _MEMORY_NOT_AVAILABLE:
        return None
    return int(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _code(exc: pynvml.NVMLError) -> int:
    return int(getattr(exc, "value", _UNKNOWN))


def _address(handle: Any) -> int | None:
    """The address an opaque NVML handle points at: how an event's device is matched to a cached device."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    return None if address is None else int(address)


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(pynvml.NVMLError):
        fn(*args)

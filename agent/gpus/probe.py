"""What the agent asks of a GPU probe, and the plain values a probe answers with.

The agent samples GPUs through the ``GpuProbe`` Protocol only. ``agent.gpus.nvml.NvmlProbe`` is the real adapter and
the one module that imports ``pynvml``; ``agent.gpus.fake.FakeProbe`` is what emulated GPU nodes use. Both return the
values below, in the same units (bytes, milliwatts, percent, degrees Celsius, nanoseconds), and raise the same error
classes from ``common.errors`` for the same failures, so everything above them (sampling, publishing, metrics) is
written once and tested against the fake. A contract suite (``tests/unit/test_probe_contract.py``) runs against both
to keep the fake from drifting.

The Xid classification lives here rather than in the NVML adapter because the fake emits Xid events too, and a
critical Xid must mean the same thing whichever probe reported it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping, Sequence
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSample:
    """One process holding memory on one device. ``used_memory_bytes`` is None where the driver does not say."""

    pid: int
    used_memory_bytes: int | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample:
    """One device at one instant.

    Memory: ``total = reserved + used + free`` where ``free`` is clamped at zero. ``reserved`` is what the driver sets
    aside (NVML's v2 memory query; 0 where only v1 exists, and then ``used`` includes it), so it never counts as free.
    Every optional field is None where the device or driver does not support the query (utilisation on a MIG-enabled
    device, ECC counters with ECC off, power on some boards). ``processes`` is None where the driver cannot list them,
    which is not the same as an empty tuple (no process holds the device).
    """

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    gpu_util_pct: int | None
    memory_util_pct: int | None
    temperature_c: int | None
    power_mw: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    mig_mode: bool | None
    processes: tuple[ProcessSample, ...] | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSample:
    """Every device of the node at one instant, in index order; ``ts_ns`` is the probe clock's reading."""

    ts_ns: int
    driver_version: str | None
    devices: tuple[DeviceSample, ...]


class HealthKind(enum.StrEnum):
    """What a health event is about. Probes emit ``gpu_lost``, ``xid`` and ``ecc``; ``nvml_unreachable`` is built by
    the agent from a ``GpuLibraryUnavailable`` so that health has one value type."""

    NVML_UNREACHABLE = "nvml_unreachable"
    GPU_LOST = "gpu_lost"
    XID = "xid"
    ECC = "ecc"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthEvent:
    """Something went wrong with a device (or with NVML). ``critical`` means: stop placing work on the device until a
    person or a reset clears it. ``code`` is the Xid number for ``xid`` events, None otherwise."""

    kind: HealthKind
    gpu_index: int | None
    gpu_uuid: str | None
    code: int | None
    message: str
    critical: bool


class LibraryFailure(enum.StrEnum):
    """The ``kind`` carried by ``GpuLibraryUnavailable``: why NVML cannot be used at all."""

    LIBRARY_NOT_FOUND = "library_not_found"  # libnvidia-ml.so.1 is not in the container
    DRIVER_NOT_LOADED = "driver_not_loaded"  # the kernel module is absent
    NO_PERMISSION = "no_permission"  # the process may not open the device nodes
    VERSION_MISMATCH = "version_mismatch"  # library and kernel module differ (typically after a driver upgrade)
    UNINITIALIZED = "uninitialized"  # the probe is not open, or NVML was shut down under it
    UNKNOWN = "unknown"  # NVML failed to initialise without saying why


# Xids after which the device itself, not the application that hit them, must be reset (or the node rebooted, or the
# board replaced) before new work should land on it. Chosen from NVIDIA's Xid catalog
# (https://docs.nvidia.com/deploy/xid-errors/): the entries whose recommended immediate action is a GPU reset or a
# reboot. Every other Xid is reported with critical=False, notably the application-caused ones (13 graphics engine
# exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception, 109
# context switch timeout) that NVIDIA's k8s-device-plugin also treats as leaving the device healthy, and two memory
# events after which NVIDIA says the device keeps serving new work: 63 (a row remap was recorded; the page is offlined
# until the next reset) and 94 (a contained ECC error: only the affected application dies; see NVIDIA's "A100 GPU
# memory error management", https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/).
CRITICAL_XIDS: Mapping[int, str] = types.MappingProxyType(
    {
        48: "double-bit ECC error",
        62: "internal micro-controller halt",
        64: "ECC page retirement or row remapping failed",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        92: "high single-bit ECC error rate",
        95: "uncontained ECC error",
        119: "GSP RPC timeout",
        120: "GSP error",
        140: "unrecovered ECC error",
        154: "GPU recovery action changed: reset or reboot required",
    }
)


def xid_event(*, gpu_index: int | None, gpu_uuid: str | None, code: int) -> HealthEvent:
    """The health event for Xid ``code`` on a device, critical where ``CRITICAL_XIDS`` says so."""
    description = CRITICAL_XIDS.get(code)
    message = f"Xid {code}: {description}" if description is not None else f"Xid {code}"
    return HealthEvent(
        kind=HealthKind.XID,
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        code=code,
        message=message,
        critical=description is not None,
    )


def gpu_lost_event(*, gpu_index: int, gpu_uuid: str | None, message: str) -> HealthEvent:
    """The health event for a device that stopped answering (always critical)."""
    return HealthEvent(
        kind=HealthKind.GPU_LOST, gpu_index=gpu_index, gpu_uuid=gpu_uuid, code=None, message=message, critical=True
    )


def ecc_event(*, gpu_index: int | None, gpu_uuid: str | None) -> HealthEvent:
    """The health event for an uncorrectable (double-bit) ECC error: always critical, as Xid 48 is."""
    return HealthEvent(
        kind=HealthKind.ECC,
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        code=None,
        message="uncorrectable (double-bit) ECC error",
        critical=True,
    )


def memory_free_bytes(*, total_bytes: int, reserved_bytes: int, used_bytes: int) -> int:
    """Free memory as every probe reports it: what is neither reserved nor used, never below zero."""
    return max(0, total_bytes - reserved_bytes - used_bytes)


class GpuProbe(Protocol):
    """Reads the GPUs of one node.

    Every method blocks (NVML calls into the driver and may take milliseconds per device, or up to ``timeout_ms`` for
    the health wait), so async callers run them in a thread (``asyncio.to_thread``). ``sample`` and
    ``wait_health_events`` may run at the same time in two threads, and ``close`` may be called from another thread
    while they run: a wait in flight then returns (at once or when its timeout ends), and a sample in flight may fail
    with ``GpuLibraryUnavailable`` (``uninitialized``).

    Errors (all from ``common.errors``):
    - ``GpuLibraryUnavailable(kind, ...)``: NVML cannot be used at all; ``kind`` is a ``LibraryFailure`` value.
      Raised by ``open`` and, if the driver goes away later, by ``sample`` and ``wait_health_events``; also by
      ``sample`` and ``wait_health_events`` on a probe that is not open (kind ``uninitialized``).
    - ``GpuLost(index, ...)``: a device stopped answering. The probe also reports one ``gpu_lost`` health event per loss
      through ``wait_health_events``, not one per failed sample.
    - ``GpuProbeError``: any other NVML failure, with NVML's text.
    A query a device does not support is never an error: that field is None.
    """

    def open(self) -> None:
        """Initialise the library and discover the devices. A no-op on an open probe. On failure the probe stays
        closed and ``open`` may be called again (with backoff): raises ``GpuLibraryUnavailable``, ``GpuLost`` or
        ``GpuProbeError``."""
        ...

    def sample(self) -> ProbeSample:
        """Read every device once. Raises ``GpuLibraryUnavailable``, ``GpuLost`` or ``GpuProbeError``."""
        ...

    def wait_health_events(self, timeout_ms: int) -> Sequence[HealthEvent]:
        """Block until health events arrive or ``timeout_ms`` passes; return the events, or [] on timeout.

        Events already pending return at once. Never blocks much longer than ``timeout_ms``. Raises
        ``GpuLibraryUnavailable``, ``GpuLost`` or ``GpuProbeError`` when the wait itself fails.
        """
        ...

    def close(self) -> None:
        """Release the library. Idempotent; never raises. May wait for an in-flight ``wait_health_events``."""
        ...

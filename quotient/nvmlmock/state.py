"""The mock driver's state file: what its GPUs say, written here and read by ``mock_nvml.c``.

The mock reads the file named by ``$QUOTIENT_NVML_MOCK_STATE`` and re-reads it whenever it changes, so whoever owns
the file (a test, an emulated node) drives the "GPUs" of every process that loaded the mock on it. The format is
lines of tab-separated fields, chosen so the C side parses it with the standard library alone (no vendored JSON
parser) and a person can read it; ``-`` marks a value the device does not support (NVML answers
``NVML_ERROR_NOT_SUPPORTED`` for it):

    quotient-nvml-mock  1
    device   index uuid name total reserved used gpu_util mem_util temp_c power_mw ecc_corr ecc_uncorr mig lost
             event_types process_lists
    process  device pid used|- compute|graphics gpu_instance|- compute_instance|-
    error    call|* device|* code          # injected: the call answers this NVML return code
    event    id device xid|ecc data        # delivered through nvmlEventSetWait to sets made before it

Memory is as NVML's v2 query reports it: ``used`` does not include ``reserved``; the v1 query (all an R470 driver
has) answers ``used + reserved`` as used. An injected error names a symbol (``nvmlDeviceGetMemoryInfo_v2``), its
unversioned name (covering every version: ``nvmlDeviceGetMemoryInfo``), ``nvmlInit`` for initialisation, or ``*`` for
every call; a lost device answers ``NVML_ERROR_GPU_IS_LOST`` to everything, event waits included.

``write`` replaces the file atomically and makes its modification time strictly later than the previous one, so the
mock's "did it change" check (device, inode, size, modification time) cannot miss a write.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Final

STATE_ENV: Final = "QUOTIENT_NVML_MOCK_STATE"
"""The environment variable the mock reads its state file's path from (``STATE_ENV`` in ``mock_nvml.c``)."""

_MAGIC: Final = "quotient-nvml-mock\t1"
_MAX_DEVICES: Final = 64  # MAX_DEVICES in mock_nvml.c
_MAX_TEXT: Final = 95  # NVML's UUID and name buffers hold 96 bytes with the terminating NUL


class NvmlReturn(enum.IntEnum):
    """NVML's return codes that tests and emulated nodes inject (``nvmlReturn_t`` in ``nvml.h``)."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    LIB_RM_VERSION_MISMATCH = 18
    ARGUMENT_VERSION_MISMATCH = 25
    UNKNOWN = 999


class EventKind(enum.StrEnum):
    XID = "xid"  # nvmlEventTypeXidCriticalError; data is the Xid
    ECC = "ecc"  # nvmlEventTypeDoubleBitEccError; data is 0


# nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError: what a data-centre
# GPU supports among the health events.
DEFAULT_EVENT_TYPES: Final = 0x1 | 0x2 | 0x8


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MockProcess:
    """One entry of a device's compute (or graphics) process list; None memory: the driver does not say."""

    pid: int
    used_memory_bytes: int | None
    graphics: bool = False
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MockDevice:
    """One device. Every optional value None is a query the device does not support; ``processes`` None: the
    driver lists no processes for it (NOT_SUPPORTED), which is not the same as an empty tuple."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    memory_used_bytes: int
    gpu_util_pct: int | None = 0
    memory_util_pct: int | None = 0
    temperature_c: int | None = 30
    power_mw: int | None = 60_000
    ecc_corrected: int | None = 0
    ecc_uncorrected: int | None = 0
    mig_mode: bool | None = False
    lost: bool = False
    event_types: int | None = DEFAULT_EVENT_TYPES
    processes: tuple[MockProcess, ...] | None = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InjectedError:
    """``call`` (on ``device``, None for any) answers ``code``."""

    call: str
    code: NvmlReturn | int
    device: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MockEvent:
    id: int
    device: int
    kind: EventKind
    data: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MockState:
    devices: tuple[MockDevice, ...]
    errors: tuple[InjectedError, ...] = ()
    events: tuple[MockEvent, ...] = ()


def _opt(value: int | bool | None) -> str:
    if value is None:
        return "-"
    return str(int(value))


def _text(value: str, what: str) -> str:
    if not 0 < len(value.encode()) <= _MAX_TEXT or any(c in value for c in "\t\n\r"):
        raise ValueError(f"{what} {value!r} must be 1 to {_MAX_TEXT} bytes without tabs or newlines")
    return value


def _count(value: int | None, what: str, *, most: int = 2**64 - 1) -> None:
    if value is not None and not 0 <= value <= most:
        raise ValueError(f"{what} must be within 0..{most}, got {value}")


def _check_device(device: MockDevice, position: int) -> None:
    where = f"device {device.index}"
    if device.index != position:
        raise ValueError(f"devices must be listed by index from 0; position {position} holds {where}")
    for value, what in (
        (device.memory_total_bytes, "memory_total_bytes"),
        (device.memory_reserved_bytes, "memory_reserved_bytes"),
        (device.memory_used_bytes, "memory_used_bytes"),
        (device.ecc_corrected, "ecc_corrected"),
        (device.ecc_uncorrected, "ecc_uncorrected"),
        (device.event_types, "event_types"),
    ):
        _count(value, f"{where}: {what}")
    for value, what in ((device.gpu_util_pct, "gpu_util_pct"), (device.memory_util_pct, "memory_util_pct")):
        _count(value, f"{where}: {what}", most=100)
    _count(device.temperature_c, f"{where}: temperature_c", most=1000)
    _count(device.power_mw, f"{where}: power_mw", most=2**32 - 1)
    if (device.gpu_util_pct is None) != (device.memory_util_pct is None):
        raise ValueError(f"{where}: NVML reports both utilisations or neither")
    if (device.ecc_corrected is None) != (device.ecc_uncorrected is None):
        raise ValueError(f"{where}: NVML reports both ECC counts or neither")
    for process in device.processes or ():
        _count(process.pid, f"{where}: pid", most=2**32 - 1)
        _count(process.used_memory_bytes, f"{where}: pid {process.pid}: used_memory_bytes", most=2**64 - 2)


def render(state: MockState) -> str:
    """The state file's text; ``ValueError`` (saying what and where) for a state the mock would refuse."""
    if len(state.devices) > _MAX_DEVICES:
        raise ValueError(f"the mock holds at most {_MAX_DEVICES} devices, got {len(state.devices)}")
    lines = [_MAGIC]
    for position, device in enumerate(state.devices):
        _check_device(device, position)
        fields = (
            "device",
            str(device.index),
            _text(device.uuid, f"device {device.index}: uuid"),
            _text(device.name, f"device {device.index}: name"),
            str(device.memory_total_bytes),
            str(device.memory_reserved_bytes),
            str(device.memory_used_bytes),
            _opt(device.gpu_util_pct),
            _opt(device.memory_util_pct),
            _opt(device.temperature_c),
            _opt(device.power_mw),
            _opt(device.ecc_corrected),
            _opt(device.ecc_uncorrected),
            _opt(device.mig_mode),
            _opt(device.lost),
            _opt(device.event_types),
            "-" if device.processes is None else "1",
        )
        lines.append("\t".join(fields))
    for device in state.devices:
        for process in device.processes or ():
            lines.append(
                "\t".join(
                    (
                        "process",
                        str(device.index),
                        str(process.pid),
                        _opt(process.used_memory_bytes),
                        "graphics" if process.graphics else "compute",
                        _opt(process.gpu_instance),
                        _opt(process.compute_instance),
                    )
                )
            )
    for error in state.errors:
        if error.device is not None and not 0 <= error.device < _MAX_DEVICES:
            raise ValueError(f"injected error on {error.call}: no device {error.device}")
        if int(error.code) <= 0:
            raise ValueError(f"injected error on {error.call}: {error.code} is not an NVML error code")
        call = _text(error.call, "injected error: call")
        lines.append(
            "\t".join(("error", call, "*" if error.device is None else str(error.device), str(int(error.code))))
        )
    for earlier, later in itertools.pairwise(state.events):
        if later.id <= earlier.id:
            raise ValueError(f"event ids must increase: {earlier.id} then {later.id}")
    for event in state.events:
        if event.id <= 0 or not 0 <= event.device < len(state.devices):
            raise ValueError(f"event {event.id}: ids are positive and the device ({event.device}) must exist")
        _count(event.data, f"event {event.id}: data")
        lines.append("\t".join(("event", str(event.id), str(event.device), event.kind.value, str(event.data))))
    return "\n".join(lines) + "\n"


def write(path: Path, state: MockState | str) -> None:
    """Replace ``path`` with ``state`` (a state, or text already rendered) atomically, its modification time strictly
    later than the file it replaces."""
    text = state if isinstance(state, str) else render(state)
    try:
        previous_ns = path.stat().st_mtime_ns
    except FileNotFoundError:
        previous_ns = 0
    mtime_ns = max(time.time_ns(), previous_ns + 1_000)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(text)
    os.utime(temporary, ns=(mtime_ns, mtime_ns))
    temporary.replace(path)

"""An emulated node's fake GPUs written as the mock driver's state file, so its agent process reads them through NVML.

The emulated node keeps ``FakeProbe`` as its model (the kubelet's pods start and stop processes on it, memory follows
their ``quotient.dev/sim-gpu-memory`` scripts, the demo injects Xids into it), and ``FakeProbeMirror.sync`` renders
what that model says now into the file the mock re-reads: devices and their processes from a sample, queued Xid and
ECC events as mock events (ids that only grow), a lost device as ``lost``, a failed library as an error on every
call. The file is rewritten only when its text changes, so the mock re-reads it only then.

While a device is lost the fake refuses whole samples; the other devices keep their last values until it recovers.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from agent.gpus import probe
from agent.gpus.fake import FakeProbe
from common import errors
from quotient.nvmlmock import state

# How many events the file keeps: far more than an agent waiting on events every second can fall behind by.
_EVENTS_KEPT: Final = 256

_LIBRARY_CODES: Final[Mapping[probe.LibraryFailure, state.NvmlReturn]] = types.MappingProxyType(
    {
        probe.LibraryFailure.LIBRARY_NOT_FOUND: state.NvmlReturn.LIBRARY_NOT_FOUND,
        probe.LibraryFailure.DRIVER_NOT_LOADED: state.NvmlReturn.DRIVER_NOT_LOADED,
        probe.LibraryFailure.NO_PERMISSION: state.NvmlReturn.NO_PERMISSION,
        probe.LibraryFailure.VERSION_MISMATCH: state.NvmlReturn.LIB_RM_VERSION_MISMATCH,
        probe.LibraryFailure.UNINITIALIZED: state.NvmlReturn.UNINITIALIZED,
        probe.LibraryFailure.UNKNOWN: state.NvmlReturn.UNKNOWN,
    }
)


def mock_device(device: probe.DeviceSample, *, lost: bool = False) -> state.MockDevice:
    """A sampled device as the mock reports it (memory in v2's terms, as ``DeviceSample`` has it)."""
    return state.MockDevice(
        index=device.index,
        uuid=device.uuid,
        name=device.model,
        memory_total_bytes=device.memory_total_bytes,
        memory_reserved_bytes=device.memory_reserved_bytes,
        memory_used_bytes=device.memory_used_bytes,
        gpu_util_pct=device.gpu_util_pct,
        memory_util_pct=device.memory_util_pct,
        temperature_c=device.temperature_c,
        power_mw=device.power_mw,
        ecc_corrected=device.ecc_corrected,
        ecc_uncorrected=device.ecc_uncorrected,
        mig_mode=device.mig_mode,
        lost=lost,
        processes=None
        if device.processes is None
        else tuple(state.MockProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes) for p in device.processes),
    )


class FakeProbeMirror:
    """Keeps ``path`` in step with ``fake``. Not thread-safe: one task calls ``sync``. Opens ``fake``, and so owns it:
    nothing else may sample it or take its health events."""

    def __init__(self, fake: FakeProbe, path: Path) -> None:
        self._fake = fake
        self.path = path
        self._devices: dict[int, state.MockDevice] = {
            gpu.index: state.MockDevice(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.model,
                memory_total_bytes=gpu.memory_total_bytes,
                memory_reserved_bytes=gpu.memory_reserved_bytes,
                memory_used_bytes=0,
                gpu_util_pct=None if gpu.mig_mode else 0,
                memory_util_pct=None if gpu.mig_mode else 0,
                mig_mode=gpu.mig_mode,
            )
            for gpu in fake.gpus
        }
        self._lost: set[int] = set()
        self._errors: tuple[state.InjectedError, ...] = ()
        self._events: list[state.MockEvent] = []
        self._next_event_id = 1
        self._written: str | None = None

    def sync(self) -> bool:
        """Render the fake's present into the file; True when the file changed."""
        try:
            self._fake.open()
            self._take_events(self._fake.wait_health_events(0))
            sample = self._fake.sample()
        except errors.GpuLibraryUnavailable as exc:
            code = _LIBRARY_CODES.get(probe.LibraryFailure(exc.kind), state.NvmlReturn.UNKNOWN)
            self._errors = (state.InjectedError(call="*", code=code),)
        except errors.GpuLost as exc:
            self._errors = ()
            self._lost.add(exc.index)
        else:
            self._errors = ()
            self._lost.clear()
            self._devices.update({device.index: mock_device(device) for device in sample.devices})
        devices = tuple(
            dataclasses.replace(self._devices[index], lost=index in self._lost) for index in sorted(self._devices)
        )
        text = state.render(state.MockState(devices=devices, errors=self._errors, events=tuple(self._events)))
        if text == self._written:
            return False
        state.write(self.path, text)
        self._written = text
        return True

    def _take_events(self, events: Sequence[probe.HealthEvent]) -> None:
        for event in events:
            if event.gpu_index is None:
                continue
            if event.kind == probe.HealthKind.GPU_LOST:
                self._lost.add(event.gpu_index)
            elif event.kind == probe.HealthKind.XID and event.code is not None:
                self._event(event.gpu_index, state.EventKind.XID, event.code)
            elif event.kind == probe.HealthKind.ECC:
                self._event(event.gpu_index, state.EventKind.ECC, 0)
        del self._events[:-_EVENTS_KEPT]

    def _event(self, device: int, kind: state.EventKind, data: int) -> None:
        self._events.append(state.MockEvent(id=self._next_event_id, device=device, kind=kind, data=data))
        self._next_event_id += 1

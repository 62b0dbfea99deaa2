"""``FakeProbe``: the ``GpuProbe`` of emulated GPU nodes, driven by plain data and an injected clock.

Emulated nodes run the real agent over this probe, so it honours the same contract as ``NvmlProbe`` (same value
types, units and error classes; ``tests/unit/test_probe_contract.py`` runs one suite over both). It is fed plain
values (``FakeGpu``, ``FakeProcess``, ``MemoryScript``) rather than the cluster spec, so whoever reads a spec adapts it
here. Time comes only from the injected clock: a process's memory follows its script against that clock, so tests
and the emulator decide how fast time passes.

What a real GPU would measure and a script does not say is derived, deterministically, from memory use (integer
arithmetic only). With ``fill_pct`` = memory held by live processes as a percentage of the usable memory
(total - reserved, capped at 100):
- no live process: GPU and memory utilisation 0, ``IDLE_TEMPERATURE_C``, ``IDLE_POWER_MW``;
- otherwise ``gpu_util_pct = 40 + 60 * fill_pct / 100`` (a loaded device is busy, a fuller one busier),
  ``memory_util_pct = fill_pct / 2``, and temperature and power rise linearly with GPU utilisation up to
  ``FULL_LOAD_TEMPERATURE_C`` and ``FULL_LOAD_POWER_MW``.
On a MIG-enabled ``FakeGpu`` utilisation is None, as NVML reports it NOT_SUPPORTED there. These numbers are plausible,
not physical: nothing in placement may depend on them.

Used memory of a device = the sum of its live processes + ``DRIVER_OVERHEAD_BYTES``; free = total - reserved - used,
never below zero.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence

from agent.gpus import probe
from common import errors

MiB = 1024 * 1024

# What NVML's v2 memory query reports as reserved by the driver on current data-centre GPUs is a few hundred MiB;
# 512 MiB keeps the fake honest about reserved memory not being free. Override per GPU where a test needs another.
DEFAULT_RESERVED_BYTES = 512 * MiB
# Used memory with no process at all: nvidia-smi shows a few MiB on an idle data-centre GPU.
DRIVER_OVERHEAD_BYTES = 4 * MiB
DEFAULT_DRIVER_VERSION = "fake-1.0"
IDLE_TEMPERATURE_C = 30
FULL_LOAD_TEMPERATURE_C = 75
# A PCIe data-centre card idles around 60 W and is limited to about 350 W.
IDLE_POWER_MW = 60_000
FULL_LOAD_POWER_MW = 350_000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FakeGpu:
    """One emulated device. ``index`` is its NVML index on the node, ``model`` its NVML name."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_reserved_bytes: int = DEFAULT_RESERVED_BYTES
    mig_mode: bool = False

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"GPU index must be >= 0, got {self.index}")
        if self.memory_total_bytes <= 0:
            raise ValueError(f"GPU {self.index}: memory_total_bytes must be > 0, got {self.memory_total_bytes}")
        if not 0 <= self.memory_reserved_bytes <= self.memory_total_bytes:
            raise ValueError(
                f"GPU {self.index}: memory_reserved_bytes must be within [0, {self.memory_total_bytes}], "
                f"got {self.memory_reserved_bytes}"
            )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryScript:
    """The GPU memory of one process over time, as a step function of the time since the process started.

    ``steps`` are (offset_ns, bytes) pairs with strictly increasing offsets: the value holds from its offset until the
    next step's. Before the first step the process does not exist yet; from ``end_ns`` on (if given) it has exited.
    """

    steps: tuple[tuple[int, int], ...]
    end_ns: int | None = None

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a memory script needs at least one step")
        offsets = [offset for offset, _ in self.steps]
        if offsets[0] < 0 or any(later <= earlier for earlier, later in itertools.pairwise(offsets)):
            raise ValueError(f"memory script offsets must be >= 0 and strictly increasing, got {offsets}")
        if any(memory_bytes < 0 for _, memory_bytes in self.steps):
            raise ValueError(f"memory script values must be >= 0 bytes, got {self.steps}")
        if self.end_ns is not None and self.end_ns <= offsets[0]:
            raise ValueError(f"memory script end_ns ({self.end_ns}) must come after its first step ({offsets[0]})")

    @classmethod
    def constant(cls, memory_bytes: int, *, end_ns: int | None = None) -> MemoryScript:
        """A process holding ``memory_bytes`` from its start (until ``end_ns``, if given)."""
        return cls(steps=((0, memory_bytes),), end_ns=end_ns)

    def bytes_at(self, elapsed_ns: int) -> int | None:
        """The memory held ``elapsed_ns`` after the process started, or None where it does not exist then."""
        if self.end_ns is not None and elapsed_ns >= self.end_ns:
            return None
        position = bisect.bisect_right(self.steps, elapsed_ns, key=lambda step: step[0])
        return None if position == 0 else self.steps[position - 1][1]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FakeProcess:
    """A process on one device. Its script's offsets count from ``start_ns`` (a clock reading), or, where that is
    None, from the moment the probe was given the process. A process on several devices is one ``FakeProcess`` per
    device, with the same pid."""

    pid: int
    gpu_index: int
    memory: MemoryScript
    start_ns: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Running:
    process: FakeProcess
    start_ns: int


class FakeProbe:
    """Emulated GPUs. See ``agent.gpus.probe.GpuProbe`` for the contract and this module's docstring for the model.

    Every method is thread-safe: the emulator changes processes and injects faults from its own thread while the
    agent samples from another.
    """

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        clock: Callable[[], int],
        processes: Sequence[FakeProcess] = (),
        driver_version: str | None = DEFAULT_DRIVER_VERSION,
    ) -> None:
        ordered = tuple(sorted(gpus, key=lambda gpu: gpu.index))
        indexes = [gpu.index for gpu in ordered]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"GPU indexes must be unique, got {indexes}")
        uuids = [gpu.uuid for gpu in ordered]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"GPU UUIDs must be unique, got {uuids}")
        self._gpus = ordered
        self._by_index = {gpu.index: gpu for gpu in ordered}
        self._clock = clock
        self._driver_version = driver_version
        self._changed = threading.Condition()  # guards everything below; notified when events are queued or on close
        self._running: dict[tuple[int, int], _Running] = {}
        self._open = False
        self._library_failure: probe.LibraryFailure | None = None
        self._lost: set[int] = set()
        self._ecc_uncorrected: dict[int, int] = {}
        self._events: list[probe.HealthEvent] = []
        self.set_processes(processes)

    @property
    def gpus(self) -> tuple[FakeGpu, ...]:
        return self._gpus

    # --- GpuProbe ---

    def open(self) -> None:
        with self._changed:
            self._raise_if_library_failed()
            self._open = True

    def close(self) -> None:
        with self._changed:
            self._open = False
            self._changed.notify_all()

    def sample(self) -> probe.ProbeSample:
        with self._changed:
            self._raise_if_unusable()
            if self._lost:
                index = min(self._lost)
                raise errors.GpuLost(index, f"GPU {index} ({self._by_index[index].uuid}) is lost (injected)")
            now = self._clock()
            held: dict[int, list[probe.ProcessSample]] = {gpu.index: [] for gpu in self._gpus}
            for (pid, gpu_index), running in self._running.items():
                memory_bytes = running.process.memory.bytes_at(now - running.start_ns)
                if memory_bytes is not None:
                    held[gpu_index].append(probe.ProcessSample(pid=pid, used_memory_bytes=memory_bytes))
            devices = tuple(self._device_sample(gpu, held[gpu.index]) for gpu in self._gpus)
        return probe.ProbeSample(ts_ns=now, driver_version=self._driver_version, devices=devices)

    def wait_health_events(self, timeout_ms: int) -> Sequence[probe.HealthEvent]:
        """Queued events at once; otherwise block (really, in this thread) until an event is injected, the probe is
        closed, or ``timeout_ms`` passes. Tests with nothing queued pass 0."""
        with self._changed:
            self._raise_if_unusable()
            if not self._events and timeout_ms > 0:
                self._changed.wait_for(lambda: bool(self._events) or not self._open, timeout=timeout_ms / 1000)
            events, self._events = self._events, []
        return events

    # --- driving the emulated node ---

    def set_processes(self, processes: Iterable[FakeProcess]) -> None:
        """Make ``processes`` the whole set. A process already present unchanged (same pid, device and script) keeps
        its start; the others start now."""
        wanted = list(processes)
        with self._changed:
            now = self._clock()
            running: dict[tuple[int, int], _Running] = {}
            for process in wanted:
                key = self._key(process)
                if key in running:
                    raise ValueError(f"process {process.pid} is given twice on GPU {process.gpu_index}")
                previous = self._running.get(key)
                keep = previous is not None and previous.process == process
                running[key] = previous if keep and previous is not None else self._start(process, now)
            self._running = running

    def add_process(self, process: FakeProcess) -> None:
        with self._changed:
            key = self._key(process)
            if key in self._running:
                raise ValueError(f"process {process.pid} is already on GPU {process.gpu_index}")
            self._running[key] = self._start(process, self._clock())

    def remove_process(self, pid: int) -> None:
        """Remove ``pid`` from every device; a pid that is not there is ignored."""
        with self._changed:
            self._running = {key: running for key, running in self._running.items() if key[0] != pid}

    # --- fault injection ---

    def fail_library(self, kind: probe.LibraryFailure) -> None:
        """From now on ``open``, ``sample`` and ``wait_health_events`` raise ``GpuLibraryUnavailable(kind)``."""
        with self._changed:
            self._library_failure = kind

    def lose_gpu(self, index: int) -> None:
        """The device stops answering: ``sample`` raises ``GpuLost``, and one ``gpu_lost`` event is queued."""
        with self._changed:
            gpu = self._gpu(index)
            if index in self._lost:
                return
            self._lost.add(index)
            self._queue(
                probe.gpu_lost_event(gpu_index=index, gpu_uuid=gpu.uuid, message=f"GPU {index} stopped answering")
            )

    def inject_xid(self, index: int, code: int) -> None:
        with self._changed:
            gpu = self._gpu(index)
            self._queue(probe.xid_event(gpu_index=index, gpu_uuid=gpu.uuid, code=code))

    def inject_ecc_error(self, index: int) -> None:
        """One uncorrectable ECC error: the device's ``ecc_uncorrected`` count rises and an ``ecc`` event is queued."""
        with self._changed:
            gpu = self._gpu(index)
            self._ecc_uncorrected[index] = self._ecc_uncorrected.get(index, 0) + 1
            self._queue(probe.ecc_event(gpu_index=index, gpu_uuid=gpu.uuid))

    def recover(self) -> None:
        """The library works again and lost devices answer again. Events already queued stay queued."""
        with self._changed:
            self._library_failure = None
            self._lost.clear()

    # --- internals ---

    def _device_sample(self, gpu: FakeGpu, processes: list[probe.ProcessSample]) -> probe.DeviceSample:
        process_bytes = sum(p.used_memory_bytes or 0 for p in processes)
        used = process_bytes + DRIVER_OVERHEAD_BYTES
        usable = gpu.memory_total_bytes - gpu.memory_reserved_bytes
        fill_pct = min(100, process_bytes * 100 // usable) if usable > 0 else 100
        gpu_util = 40 + 60 * fill_pct // 100 if processes else 0
        memory_util = fill_pct // 2 if processes else 0
        return probe.DeviceSample(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            memory_total_bytes=gpu.memory_total_bytes,
            memory_reserved_bytes=gpu.memory_reserved_bytes,
            memory_used_bytes=used,
            memory_free_bytes=probe.memory_free_bytes(
                total_bytes=gpu.memory_total_bytes, reserved_bytes=gpu.memory_reserved_bytes, used_bytes=used
            ),
            gpu_util_pct=None if gpu.mig_mode else gpu_util,
            memory_util_pct=None if gpu.mig_mode else memory_util,
            temperature_c=IDLE_TEMPERATURE_C + (FULL_LOAD_TEMPERATURE_C - IDLE_TEMPERATURE_C) * gpu_util // 100,
            power_mw=IDLE_POWER_MW + (FULL_LOAD_POWER_MW - IDLE_POWER_MW) * gpu_util // 100,
            ecc_corrected=0,
            ecc_uncorrected=self._ecc_uncorrected.get(gpu.index, 0),
            mig_mode=gpu.mig_mode,
            processes=tuple(sorted(processes, key=lambda p: p.pid)),
        )

    def _start(self, process: FakeProcess, now: int) -> _Running:
        return _Running(process=process, start_ns=now if process.start_ns is None else process.start_ns)

    def _key(self, process: FakeProcess) -> tuple[int, int]:
        self._gpu(process.gpu_index)
        return (process.pid, process.gpu_index)

    def _gpu(self, index: int) -> FakeGpu:
        gpu = self._by_index.get(index)
        if gpu is None:
            raise ValueError(f"no GPU with index {index}; this probe has {sorted(self._by_index)}")
        return gpu

    def _queue(self, event: probe.HealthEvent) -> None:
        self._events.append(event)
        self._changed.notify_all()

    def _raise_if_library_failed(self) -> None:
        if self._library_failure is not None:
            kind = self._library_failure
            raise errors.GpuLibraryUnavailable(kind, f"NVML is unavailable ({kind}, injected)")

    def _raise_if_unusable(self) -> None:
        self._raise_if_library_failed()
        if not self._open:
            raise errors.GpuLibraryUnavailable(probe.LibraryFailure.UNINITIALIZED, "the GPU probe is not open")

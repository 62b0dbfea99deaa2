"""Turning probe readings into wire messages: pure functions and a pure health tracker.

No clock, no I/O: the agent's loop passes the probe's sample, the pid -> pod attribution it looked up, and the
time. Keeping this pure lets the tests state exactly what a sample becomes on the wire, and keeps the per-sample
CPU cost (budget: 2 ms) in one place to measure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from agent.gpus.probe import HealthEvent, HealthKind, ProbeSample, ProcessSample
from agent.podmap import PodRef
from common import wire

# How long a critical Xid or a new uncorrectable ECC error keeps the node "degraded" after it was last seen. NVIDIA's
# guidance for these is a reset or drain; the agent cannot know when that happened, so a problem that does not recur
# for this long is taken as cleared (a device that keeps failing keeps reporting).
DEFAULT_PROBLEM_HOLD_NS = 10 * 60 * 1_000_000_000


def build_telemetry(
    *,
    sample: ProbeSample,
    pods: Mapping[int, PodRef | None],
    node: str,
    boot: str,
    seq: int,
    interval_ms: int,
    max_processes_per_gpu: int = wire.MAX_PROCESSES_PER_GPU,
) -> wire.NodeTelemetry:
    """One ``NodeTelemetry`` from a probe sample; ``pods`` maps each pid to its pod (None: a process of no pod).

    Empty strings from a driver (a blank model name) become ``unknown``/None, since the schema requires non-empty
    strings; more than ``max_processes_per_gpu`` processes on a device keep the largest.
    """
    gpus = []
    for device in sample.devices:
        processes = []
        listed: Sequence[ProcessSample] = device.processes or ()
        if len(listed) > max_processes_per_gpu:
            # Keep the processes that hold the most memory: they are the ones placement and alerts care about.
            listed = sorted(listed, key=lambda p: (-(p.used_memory_bytes or 0), p.pid))[:max_processes_per_gpu]
        for process in listed:
            ref = pods.get(process.pid)
            processes.append(
                wire.ProcessReport(
                    pid=process.pid,
                    used_memory_bytes=process.used_memory_bytes,
                    pod_uid=ref.pod_uid if ref is not None else None,
                    container_id=ref.container_id if ref is not None else None,
                )
            )
        gpus.append(
            wire.GpuReport(
                index=device.index,
                uuid=device.uuid or f"unknown-{device.index}",
                model=device.model or "unknown",
                memory_total_bytes=device.memory_total_bytes,
                memory_reserved_bytes=device.memory_reserved_bytes,
                memory_used_bytes=device.memory_used_bytes,
                memory_free_bytes=device.memory_free_bytes,
                gpu_util_pct=device.gpu_util_pct,
                memory_util_pct=device.memory_util_pct,
                temperature_c=device.temperature_c,
                power_mw=device.power_mw,
                ecc_corrected=device.ecc_corrected,
                ecc_uncorrected=device.ecc_uncorrected,
                mig_mode=device.mig_mode,
                processes=tuple(processes),
            )
        )
    return wire.NodeTelemetry(
        v=1,
        node=node,
        boot=boot,
        seq=seq,
        ts_ns=sample.ts_ns,
        interval_ms=interval_ms,
        driver_version=sample.driver_version or None,
        gpus=tuple(gpus),
    )


def pids_of(sample: ProbeSample) -> list[int]:
    """Every pid the sample saw, in order, without duplicates (a process may use several devices)."""
    seen: dict[int, None] = {}
    for device in sample.devices:
        for process in device.processes or ():
            seen.setdefault(process.pid, None)
    return list(seen)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Held:
    problem: wire.HealthProblem
    last_seen_ns: int


_KIND_TO_PROBLEM = {
    HealthKind.NVML_UNREACHABLE: wire.ProblemKind.NVML_UNREACHABLE,
    HealthKind.GPU_LOST: wire.ProblemKind.GPU_LOST,
    HealthKind.XID: wire.ProblemKind.XID,
    HealthKind.ECC: wire.ProblemKind.ECC,
}


class HealthTracker:
    """The node's current GPU health, from probe outcomes; says when it changed so the agent publishes then.

    - NVML unreachable: status ``unavailable`` until a sample succeeds.
    - A lost device: a ``gpu_lost`` problem until a sample includes that device again; all lost -> ``unavailable``.
      The problem names the device's UUID as the last good sample (or the probe's event) gave it: a failed sample
      says only which index stopped answering.
    - A critical Xid, or a rise in a device's uncorrectable ECC count: a problem held for ``hold_ns`` after it was
      last seen. Non-critical Xids (application faults) are not problems of the node.
    """

    def __init__(self, *, hold_ns: int = DEFAULT_PROBLEM_HOLD_NS) -> None:
        self._hold_ns = hold_ns
        self._unreachable: wire.HealthProblem | None = None
        self._lost: dict[int, wire.HealthProblem] = {}
        self._held: dict[tuple[str, int | None, int | None], _Held] = {}
        self._ecc_seen: dict[int, int] = {}
        self._uuids: dict[int, str] = {}
        self._device_count = 0
        self._published: tuple[wire.HealthStatus, tuple[wire.HealthProblem, ...]] | None = None

    def library_unavailable(self, message: str) -> None:
        self._unreachable = wire.HealthProblem(kind=wire.ProblemKind.NVML_UNREACHABLE, message=message[:1000])

    def gpu_lost(self, index: int, message: str, uuid: str | None = None) -> None:
        self._lost[index] = wire.HealthProblem(
            kind=wire.ProblemKind.GPU_LOST,
            gpu_index=index,
            gpu_uuid=uuid or self._uuids.get(index),
            message=message[:1000],
        )

    def sample_ok(self, sample: ProbeSample) -> None:
        self._unreachable = None
        self._device_count = max(self._device_count, len(sample.devices))
        for device in sample.devices:
            self._lost.pop(device.index, None)
            if device.uuid:
                self._uuids[device.index] = device.uuid
            if device.ecc_uncorrected is None:
                continue
            before = self._ecc_seen.get(device.index)
            self._ecc_seen[device.index] = device.ecc_uncorrected
            if before is not None and device.ecc_uncorrected > before:
                self._hold(
                    wire.HealthProblem(
                        kind=wire.ProblemKind.ECC,
                        gpu_index=device.index,
                        gpu_uuid=device.uuid,
                        code=device.ecc_uncorrected,
                        message=f"uncorrectable ECC errors on gpu {device.index} rose from {before} to "
                        f"{device.ecc_uncorrected}",
                    ),
                    sample.ts_ns,
                )

    def events(self, events: Sequence[HealthEvent], now_ns: int) -> None:
        for event in events:
            if event.kind == HealthKind.GPU_LOST and event.gpu_index is not None:
                self.gpu_lost(event.gpu_index, event.message, event.gpu_uuid)
            elif event.kind == HealthKind.NVML_UNREACHABLE:
                self.library_unavailable(event.message)
            elif event.critical:
                self._hold(
                    wire.HealthProblem(
                        kind=_KIND_TO_PROBLEM[event.kind],
                        gpu_index=event.gpu_index,
                        gpu_uuid=event.gpu_uuid,
                        code=event.code,
                        message=event.message[:1000],
                    ),
                    now_ns,
                )

    def _hold(self, problem: wire.HealthProblem, now_ns: int) -> None:
        key = (problem.kind.value, problem.gpu_index, problem.code if problem.kind == wire.ProblemKind.XID else None)
        self._held[key] = _Held(problem=problem, last_seen_ns=now_ns)

    def current(self, now_ns: int) -> tuple[wire.HealthStatus, tuple[wire.HealthProblem, ...]]:
        for key in [k for k, held in self._held.items() if now_ns - held.last_seen_ns > self._hold_ns]:
            del self._held[key]
        problems: list[wire.HealthProblem] = []
        if self._unreachable is not None:
            problems.append(self._unreachable)
        problems += [self._lost[index] for index in sorted(self._lost)]
        problems += [self._held[key].problem for key in sorted(self._held, key=repr)]
        if self._unreachable is not None or (self._device_count and len(self._lost) >= self._device_count):
            status = wire.HealthStatus.UNAVAILABLE
        elif problems:
            status = wire.HealthStatus.DEGRADED
        else:
            status = wire.HealthStatus.HEALTHY
        return status, tuple(problems)

    def changed(self, now_ns: int) -> bool:
        """True when the health differs from what was last marked published (the first call is always a change)."""
        return self.current(now_ns) != self._published

    def mark_published(self, now_ns: int) -> None:
        self._published = self.current(now_ns)

    def message(self, *, node: str, boot: str, seq: int, now_ns: int) -> wire.NodeHealth:
        status, problems = self.current(now_ns)
        return wire.NodeHealth(v=1, node=node, boot=boot, seq=seq, ts_ns=now_ns, status=status, problems=problems)

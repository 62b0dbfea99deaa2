"""What a workload replay achieved, and how it is printed: utilisation over time, waits and fair share per queue.

``workload.run`` fills a ``WorkloadReport``: utilisation samples (allocated GPU and CPU in percent of capacity),
per queue the waits from arrival to first start and the time-averaged GPU allocation against the fair share the
engine computed, and Jain's fairness index of those ratios over the queues with a fair share: 1 when every queue got
the same proportion of what it deserved, 1/n when one queue got everything. ``report_json`` and ``print_report`` are
the two ways ``quotient simulate workload`` shows it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import IO, TypedDict


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    at_s: float
    gpu_percent: float
    cpu_percent: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueReport:
    name: str
    pods: int
    started: int
    waits_s: tuple[float, ...]
    """Arrival to first start, for every pod that started, in seconds."""
    allocated_gpus: float
    """Time-averaged GPUs held by the queue's pods."""
    fair_gpus: float
    """Time-averaged fair share of GPUs the engine computed for the queue."""

    @property
    def never_started(self) -> int:
        return self.pods - self.started

    @property
    def ratio(self) -> float | None:
        """Allocation over fair share; None without a fair share."""
        return self.allocated_gpus / self.fair_gpus if self.fair_gpus > 0 else None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadReport:
    source: str
    duration_s: float
    samples: tuple[Sample, ...]
    queues: tuple[QueueReport, ...]
    cycles: int
    evictions: int

    @property
    def jain_index(self) -> float | None:
        """Jain's index of the queues' allocation-to-fair-share ratios, or None with no queue to compare."""
        return jain([queue.ratio for queue in self.queues if queue.ratio is not None])


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1 for equal values, 1/n when one value holds everything."""
    if not values:
        return None
    squares = sum(value * value for value in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class _QueueJson(TypedDict):
    pods: int
    started: int
    never_started: int
    wait_mean_s: float | None
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_max_s: float | None
    allocated_gpus: float
    fair_share_gpus: float
    allocation_over_fair_share: float | None


class ReportJson(TypedDict):
    source: str
    duration_s: float
    cycles: int
    evictions: int
    jain_index: float | None
    utilisation: list[list[float]]
    queues: dict[str, _QueueJson]


def report_json(report: WorkloadReport) -> ReportJson:
    queues: dict[str, _QueueJson] = {}
    for queue in report.queues:
        waits = queue.waits_s
        queues[queue.name] = {
            "pods": queue.pods,
            "started": queue.started,
            "never_started": queue.never_started,
            "wait_mean_s": statistics.fmean(waits) if waits else None,
            "wait_p50_s": percentile(waits, 0.5) if waits else None,
            "wait_p95_s": percentile(waits, 0.95) if waits else None,
            "wait_max_s": max(waits) if waits else None,
            "allocated_gpus": round(queue.allocated_gpus, 4),
            "fair_share_gpus": round(queue.fair_gpus, 4),
            "allocation_over_fair_share": None if queue.ratio is None else round(queue.ratio, 4),
        }
    return {
        "source": report.source,
        "duration_s": report.duration_s,
        "cycles": report.cycles,
        "evictions": report.evictions,
        "jain_index": report.jain_index,
        "utilisation": [
            [sample.at_s, round(sample.gpu_percent, 3), round(sample.cpu_percent, 3)] for sample in report.samples
        ],
        "queues": queues,
    }


def print_report(report: WorkloadReport, *, out: IO[str]) -> None:
    out.write(
        f"{report.source}: {report.duration_s:.0f}s simulated, {report.cycles} cycles, {report.evictions} evictions\n\n"
    )
    out.write(f"{'time':>8} {'GPU %':>7} {'CPU %':>7}\n")
    for sample in report.samples:
        out.write(f"{sample.at_s:>7.0f}s {sample.gpu_percent:>7.1f} {sample.cpu_percent:>7.1f}\n")
    out.write(
        f"\n{'queue':<20} {'pods':>5} {'never':>6} {'wait mean':>10} {'p50':>8} {'p95':>8} {'max':>8}"
        f" {'GPUs':>7} {'fair':>7} {'ratio':>6}\n"
    )
    for queue in report.queues:
        waits = queue.waits_s

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f}s"

        out.write(
            f"{queue.name:<20} {queue.pods:>5} {queue.never_started:>6}"
            f" {seconds(statistics.fmean(waits) if waits else None):>10}"
            f" {seconds(percentile(waits, 0.5) if waits else None):>8}"
            f" {seconds(percentile(waits, 0.95) if waits else None):>8}"
            f" {seconds(max(waits) if waits else None):>8}"
            f" {queue.allocated_gpus:>7.2f} {queue.fair_gpus:>7.2f}"
            f" {'-' if queue.ratio is None else f'{queue.ratio:.2f}':>6}\n"
        )
    index = report.jain_index
    out.write(f"\nJain's index of allocation over fair share: {'-' if index is None else f'{index:.3f}'}\n")

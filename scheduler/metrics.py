"""The scheduler's Prometheus metrics (``quotient_`` prefix, base units, an explicit registry).

Per queue: fair share, quota, allocated, requested (GPU in devices, CPU in cores, memory in bytes); pending groups by
reason; cycle and binding latency; binds and evictions by outcome. Later parts add telemetry and alert series here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_RESOURCES = (("gpu", 1000), ("cpu", 1000), ("memory", 1))
"""Label and divisor: milli-GPU to devices, millicores to cores, bytes stay bytes."""


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "quotient_scheduling_cycle_duration_seconds",
            "Time of one scheduling cycle (snapshot and placement, without API calls)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.bind_seconds = Histogram(
            "quotient_binding_duration_seconds",
            "Time from the decision to the API's answer for one bind",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.binds = Counter("quotient_binds_total", "Binds by outcome", ["outcome"], registry=r)
        self.evictions = Counter("quotient_evictions_total", "Evictions by reason", ["reason"], registry=r)
        self.cycles = Counter("quotient_scheduling_cycles_total", "Scheduling cycles run", registry=r)
        self.pending_groups = Gauge(
            "quotient_pending_groups", "Pod groups left pending by the last cycle, by reason", ["reason"], registry=r
        )
        self.leader = Gauge("quotient_scheduler_leader", "1 while this replica leads", registry=r)
        self.rejected_pods = Gauge(
            "quotient_pods_rejected",
            "Pods left out of scheduling because their spec cannot be read",
            ["reason"],
            registry=r,
        )
        self.queue_fair_share = Gauge(
            "quotient_queue_fair_share", "Each queue's fair share", ["queue", "resource"], registry=r
        )
        self.queue_deserved = Gauge(
            "quotient_queue_deserved",
            "Each queue's deserved share (quota met first)",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_quota = Gauge(
            "quotient_queue_quota", "Each queue's quota (-1: unlimited)", ["queue", "resource"], registry=r
        )
        self.queue_allocated = Gauge(
            "quotient_queue_allocated", "Allocated to each queue's subtree", ["queue", "resource"], registry=r
        )
        self.queue_requested = Gauge(
            "quotient_queue_requested", "Requested by each queue's subtree", ["queue", "resource"], registry=r
        )
        self._reasons: set[str] = set()
        self._queues: set[str] = set()

    def set_pending(self, counts: Mapping[str, int]) -> None:
        for reason in self._reasons - set(counts):
            self.pending_groups.labels(reason).set(0)
        for reason, count in counts.items():
            self.pending_groups.labels(reason).set(count)
        self._reasons |= set(counts)

    def set_queue(
        self,
        queue: str,
        *,
        fair: tuple[int, int, int],
        deserved: tuple[int, int, int],
        quota: tuple[int, int, int],
        allocated: tuple[int, int, int],
        requested: tuple[int, int, int],
    ) -> None:
        self._queues.add(queue)
        for index, (resource, divisor) in enumerate(_RESOURCES):
            self.queue_fair_share.labels(queue, resource).set(fair[index] / divisor)
            self.queue_deserved.labels(queue, resource).set(deserved[index] / divisor)
            self.queue_quota.labels(queue, resource).set(quota[index] if quota[index] < 0 else quota[index] / divisor)
            self.queue_allocated.labels(queue, resource).set(allocated[index] / divisor)
            self.queue_requested.labels(queue, resource).set(requested[index] / divisor)

    def forget_queues(self, keep: set[str]) -> None:
        for queue in self._queues - keep:
            for resource, _ in _RESOURCES:
                for gauge in (
                    self.queue_fair_share,
                    self.queue_deserved,
                    self.queue_quota,
                    self.queue_allocated,
                    self.queue_requested,
                ):
                    with contextlib.suppress(KeyError):
                        gauge.remove(queue, resource)
        self._queues &= keep

    def render(self) -> bytes:
        return generate_latest(self.registry)

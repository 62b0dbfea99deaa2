"""The cycle: whenever the cluster state changed, a snapshot, the engine, and the plan handed to the dispatcher.

Cycles are event-driven, not periodic: every watch event, bind report and telemetry change marks the state dirty,
and the loop runs one cycle per burst (it waits ``debounce_s`` after the first mark, so a thousand pods created at
once are one cycle, not a thousand). Nothing runs before every watched kind has listed once, since the first cycle
must see the whole cluster. A cycle is synchronous and never waits for the API: the plan is assumed in the state at
once and carried out by the binder; its statuses go to the status reporter, which writes them when the API lets it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from common import logs, quantities
from scheduler.dispatch import Dispatcher
from scheduler.metrics import SchedulerMetrics
from scheduler.placement import engine, model, plan
from scheduler.state import snapshot

log = logs.get("scheduler")

_REJECTED_REASONS = ("InvalidGpuRequest", "InvalidPodSpec")


class Cycles:
    """Runs cycles while the state is dirty; ``run()`` until cancelled."""

    def __init__(
        self,
        builder: snapshot.SnapshotBuilder,
        dispatcher: Dispatcher,
        metrics: SchedulerMetrics,
        *,
        synced: Callable[[], bool],
        on_cycle: Callable[[snapshot.Built, plan.Plan], None],
        debounce_s: float,
    ) -> None:
        self._builder = builder
        self._engine = engine.Engine()
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._synced = synced
        self._on_cycle = on_cycle
        self._debounce_s = debounce_s
        self._dirty = asyncio.Event()
        self._counted_nodes: object = None
        self.count = 0
        self.ready = False
        """True once every watch has listed: the first cycle can see the whole cluster."""

    def mark(self) -> None:
        """Something changed: a cycle follows."""
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            if not self._synced():
                self._dirty.clear()
                continue
            self.ready = True
            await asyncio.sleep(self._debounce_s)
            self._dirty.clear()
            self.run_once()

    def run_once(self) -> plan.Plan:
        """One synchronous cycle: snapshot, engine, dispatch. Status is written after, by the reporter."""
        started = time.perf_counter()
        built = self._builder.build(time.time_ns())
        built_at = time.perf_counter()
        result = self._engine.run(built.snapshot)
        engine_at = time.perf_counter()
        self.count += 1
        self._dispatcher.dispatch(result, built.snapshot, cycle=self.count)
        self._metrics.cycles.inc()
        self._metrics.cycle_seconds.observe(time.perf_counter() - started)
        self._count(built, result)
        self._on_cycle(built, result)
        if result.placements or result.evictions:
            log.info(
                "cycle",
                cycle=self.count,
                placed=len(result.placements),
                evicted=len(result.evictions),
                pending=len(result.statuses),
                ms=round((time.perf_counter() - started) * 1000, 2),
                snapshot_ms=round((built_at - started) * 1000, 2),
                engine_ms=round((engine_at - built_at) * 1000, 2),
            )
        return result

    def _count(self, built: snapshot.Built, result: plan.Plan) -> None:
        """Pending groups by reason, pods refused by reason, GPUs total and allocated (recounted only when the nodes
        mapping changed), and per queue how long its oldest pending group has waited."""
        pending: dict[str, int] = {}
        for group_status in result.statuses.values():
            pending[group_status.reason.value] = pending.get(group_status.reason.value, 0) + 1
        self._metrics.set_pending(pending)
        rejected: dict[str, int] = {}
        for issue in built.pod_issues:
            rejected[issue.reason] = rejected.get(issue.reason, 0) + 1
        for reason in _REJECTED_REASONS:
            self._metrics.rejected_pods.labels(reason).set(rejected.get(reason, 0))
        snap = built.snapshot
        if snap.nodes is not self._counted_nodes:
            self._counted_nodes = snap.nodes
            total = allocated = 0
            for node in snap.nodes.values():
                total += len(node.devices) * model.MILLI_GPU_PER_DEVICE
                allocated += sum(device.allotted_milli_gpu for device in node.devices)
            self._metrics.set_cluster_gpus(total_milli=total, allocated_milli=allocated)
        oldest: dict[str, float] = dict.fromkeys((str(name) for name in snap.queues), 0.0)
        for group_id in result.statuses:
            group = snap.groups.get(group_id)
            if group is None:
                continue
            waited_s = max(0, snap.now_ns - group.created_ns) / quantities.NS_PER_S
            oldest[str(group.queue)] = max(oldest.get(str(group.queue), 0.0), waited_s)
        self._metrics.set_oldest_pending(oldest)

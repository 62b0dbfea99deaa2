"""The cycle: whenever the cluster state changed, a snapshot, the engine, and the plan handed to the dispatcher.

Cycles are event-driven, not periodic: every watch event, bind report and telemetry change marks the state dirty,
and the loop runs one cycle per burst (it waits ``debounce_s`` after the first mark, so a thousand pods created at
once are one cycle, not a thousand). Nothing runs before every watched kind has listed once, since the first cycle
must see the whole cluster. A cycle is synchronous and never waits for the API: the plan is assumed in the state at
once and carried out by the binder; its statuses go to the status reporter, which writes them when the API lets it.

A cycle that fails is contained (``containment``): the engine is replaced (its caches may be half-updated), the groups
it fails with are found and the cycle runs again without them; a group that fails three cycles in a row is
quarantined. Any other fault of a cycle is logged with the cycle's number, counted
(``quotient_internal_errors_total{where="cycle"}``) and the next cycle runs as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence

from common import logs, quantities
from scheduler import containment, gcpolicy
from scheduler.dispatch import Dispatcher
from scheduler.metrics import SchedulerMetrics
from scheduler.placement import engine, model, plan
from scheduler.state import snapshot

log = logs.get("scheduler")

RETRY_STRUCK_S = 1.0
"""How soon a cycle runs again after the engine failed with a group (so a failing group is quarantined in seconds)."""

_REJECTED_REASONS = ("InvalidGpuRequest", "InvalidPodSpec", "InvalidPodGroup")


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
        make_engine: Callable[[], containment.Planner] = engine.Engine,
    ) -> None:
        self._builder = builder
        self._make_engine = make_engine
        self._engine = make_engine()
        self._failures_logged: set[tuple[tuple[model.GroupId, ...], str]] = set()
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._synced = synced
        self._on_cycle = on_cycle
        self._debounce_s = debounce_s
        self._dirty = asyncio.Event()
        self._counted_nodes: object = None
        self.quarantine = containment.Quarantine(clock_s=time.monotonic, make_engine=make_engine)
        self._release_scheduled_s: float | None = None
        self._wake_scheduled_ns: int | None = None
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
            try:
                result = self.run_once()
                self._schedule_retries()
                self._schedule_wake(result)
            except Exception:
                # Caught at the cycle's boundary: the next change runs the next cycle, nothing else stops.
                log.exception("cycle_failed", cycle=self.count)
                self._metrics.internal_error("cycle")

    def _schedule_retries(self) -> None:
        """A group the engine failed with is tried again without waiting for a change of the cluster: soon while it
        has strikes (three and it is quarantined), and when its quarantine ends."""
        loop = asyncio.get_running_loop()
        if self.quarantine.struck():
            loop.call_later(RETRY_STRUCK_S, self.mark)
        release_s = self.quarantine.next_release_s()
        if release_s is not None and release_s != self._release_scheduled_s:
            self._release_scheduled_s = release_s
            loop.call_later(max(0.0, release_s - time.monotonic()) + 0.01, self.mark)

    def _schedule_wake(self, result: plan.Plan | None) -> None:
        """A plan that waited on the clock (a preemption delay, a stale gang's grace, a min-runtime) runs a cycle
        again when that wait ends, though nothing else changes."""
        wake_ns = result.wake_ns if result is not None else None
        if wake_ns is None or wake_ns == self._wake_scheduled_ns:
            return
        self._wake_scheduled_ns = wake_ns
        delay_s = max(0.0, (wake_ns - time.time_ns()) / quantities.NS_PER_S)
        asyncio.get_running_loop().call_later(delay_s + 0.01, self.mark)

    def run_once(self) -> plan.Plan | None:
        """One synchronous cycle: snapshot, engine, dispatch. Status is written after, by the reporter. None when
        the engine failed even without the groups it fails with (the failure is counted)."""
        started = time.perf_counter()
        built = self._builder.build(time.time_ns())
        built_at = time.perf_counter()
        self.count += 1
        admitted = self.quarantine.admit(built.snapshot)
        result = self._plan(admitted)
        self._metrics.quarantined_groups.set(len(self.quarantine.quarantined()))
        if result is None:
            return None
        engine_at = time.perf_counter()
        self._dispatcher.dispatch(result, admitted, cycle=self.count)
        self._metrics.cycles.inc()
        self._metrics.cycle_seconds.observe(time.perf_counter() - started)
        failing = self.quarantine.statuses()
        if failing:
            result = dataclasses.replace(result, statuses={**result.statuses, **failing})
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

    def _plan(self, admitted: model.Snapshot) -> plan.Plan | None:
        """The engine's plan; when it fails, the plan without the groups it fails with (they get a strike)."""
        try:
            with gcpolicy.cycle():
                result = self._engine.run(admitted)
        except Exception as exc:
            self._engine = self._make_engine()  # its caches may be half-updated: start clean
            self._metrics.internal_error("engine")
            culprits = self.quarantine.culprits(admitted)
            newly = self.quarantine.strike(culprits, exc)
            self._log_failure(exc, culprits, quarantined=len(newly))
            if not culprits:
                return None
            without = dataclasses.replace(
                admitted, groups={key: group for key, group in admitted.groups.items() if key not in set(culprits)}
            )
            try:
                with gcpolicy.cycle():
                    result = self._engine.run(without)
            except Exception as again:
                self._engine = self._make_engine()
                self._log_failure(again, (), quarantined=0)
                return None
            self.quarantine.succeeded(without, struck=culprits)
            return result
        self.quarantine.succeeded(admitted)
        return result

    def _log_failure(self, exc: Exception, culprits: Sequence[model.GroupId], *, quarantined: int) -> None:
        """The traceback once per (groups, error); a repeat is one line (a failing group repeats every cycle)."""
        key = (tuple(culprits), f"{type(exc).__name__}: {exc}")
        fields = {"cycle": self.count, "groups": ",".join(map(str, culprits)) or "(none)", "error": key[1]}
        if key in self._failures_logged:
            log.warning("engine_failed", quarantined=quarantined, **fields)
            return
        if len(self._failures_logged) >= 1000:
            self._failures_logged.clear()
        self._failures_logged.add(key)
        log.exception("engine_failed", quarantined=quarantined, **fields)  # called in the except block

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

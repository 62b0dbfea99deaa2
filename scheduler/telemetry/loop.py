"""The leader's telemetry loop: from the consumer's newest samples to alerts, evictions, metrics and cycles.

It wakes when the consumer has new samples (coalesced like cycles: at most once per ``debounce_s``) and on a timer,
so a node that went quiet becomes ``TelemetryStale`` within a fraction of the staleness threshold. Telemetry of a
node the cluster does not have (deleted, or a name nobody registered) is counted (``unknown_node``) and never
analysed: it would only raise alerts about nothing, ``TelemetryStale`` first; a node deleted from the cluster is
forgotten at once (its alerts resolve). What the analysis decides goes three ways: alerts to the alert sink (metric,
Event, NATS), pods over their allotment under the ``evict`` policy to the dispatcher (which owns evictions), and the
nodes whose measured headroom moved to the cycle (they are rebuilt and placement sees the new room).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from common import logs, names, quantities, wire
from scheduler.alerts import AlertSink
from scheduler.dispatch import Dispatcher
from scheduler.kube import events
from scheduler.metrics import SchedulerMetrics
from scheduler.objects.records import Problem
from scheduler.state import holdings
from scheduler.state.cache import ClusterState
from scheduler.telemetry import live, overuse
from scheduler.telemetry.feed.consumer import TelemetryConsumer

log = logs.get("scheduler")


class TelemetryLoop:
    """Drives ``live.LiveTelemetry`` from the consumer; ``run()`` until cancelled."""

    def __init__(
        self,
        consumer: TelemetryConsumer,
        telemetry: live.LiveTelemetry,
        state: ClusterState,
        *,
        alerts: AlertSink,
        dispatcher: Dispatcher,
        recorder: events.EventSink,
        metrics: SchedulerMetrics,
        on_headroom: Callable[[], None],
        debounce_s: float,
        on_error: Callable[[str, BaseException], None] = lambda where, exc: None,
    ) -> None:
        self._on_error = on_error
        self._consumer = consumer
        self._telemetry = telemetry
        self._state = state
        self._alerts = alerts
        self._dispatcher = dispatcher
        self._recorder = recorder
        self._metrics = metrics
        self._on_headroom = on_headroom
        self._debounce_s = debounce_s
        self._analysed: set[str] = set()
        """Nodes whose telemetry the analysis holds (forgotten there when they leave the cluster)."""
        self._cleared: dict[str, int | Problem] = {}
        """Per node with a health report, the operator's clearing time the report was last judged with."""
        # A node quiet because its messages are rejected (a clock that jumped, ...) says so in its TelemetryStale.
        telemetry.staleness.explain_with(consumer.why_rejected)

    async def run(self) -> None:
        consumer, telemetry = self._consumer, self._telemetry
        # A node is stale after max(3 x interval, floor): checking at a quarter of the floor (at most every second)
        # notices it within a fraction of the threshold.
        period_s = max(0.05, min(1.0, telemetry.settings.stale_floor_ns / quantities.NS_PER_S / 4))
        next_check = 0.0
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(consumer.changed.wait(), timeout=max(0.0, next_check - loop.time()))
            try:
                self.step(now_ns=time.time_ns(), sweep=loop.time() >= next_check)
            except Exception as exc:
                # A sample (or a state) that trips the analysis is logged and counted; the next samples go on.
                log.exception("telemetry_step_failed")
                self._on_error("telemetry", exc)
            if loop.time() >= next_check:
                next_check = loop.time() + period_s
            await asyncio.sleep(self._debounce_s)

    def step(self, *, now_ns: int, sweep: bool) -> None:
        """Apply what the consumer received since the last step; with ``sweep``, also the periodic checks."""
        consumer, telemetry = self._consumer, self._telemetry
        changes = consumer.take_changes()
        nodes = self._state.nodes
        unknown = {node for node in changes.telemetry if node not in nodes}
        vanished = {node for node in self._analysed if node not in nodes}
        self._analysed -= vanished | changes.forgotten
        if unknown:
            self._metrics.count_rejected("unknown_node", len(unknown))
        if changes.telemetry - unknown or changes.forgotten or vanished:
            latest = consumer.latest()
            samples = [
                overuse.NodeSample(telemetry=latest[node].telemetry, received_ns=latest[node].received_ns)
                for node in sorted(changes.telemetry - unknown)
                if node in latest
            ]
            self._analysed.update(sample.telemetry.node for sample in samples)
            self._act(telemetry.apply(samples, now_ns=now_ns, forgotten=changes.forgotten | vanished))
        self._health(changes.health, now_ns=now_ns, sweep=sweep)
        if sweep:
            self._act(telemetry.check(now_ns=now_ns))
            # Two live publishers claiming a node of the cluster: TelemetryConflict (feed.conflicts).
            self._alerts.send(consumer.check_conflicts(now_ns=now_ns, known=nodes))
            self._metrics.set_telemetry_ages(telemetry.ages_s(now_ns=now_ns))
            self._count()

    def _health(self, changed: frozenset[str], *, now_ns: int, sweep: bool) -> None:
        """Judge the health reports that changed, and (on a sweep) those whose node an operator cleared since."""
        reports = self._consumer.health()
        nodes = self._state.nodes
        candidates = set(changed) | (set(self._cleared) if sweep else set())
        for node in sorted(candidates):
            record, sample = nodes.get(node), reports.get(node)
            if record is None or sample is None:
                self._cleared.pop(node, None)
                continue
            cleared = record.health_cleared_ns
            if node not in changed and self._cleared.get(node) == cleared:
                continue
            if isinstance(cleared, Problem) and self._cleared.get(node) != cleared:
                log.warning("gpu_health_clear_invalid", node=node, message=cleared.message)
                self._recorder.record(
                    events.ObjectRef.of_record(record),
                    type=events.EventType.WARNING,
                    reason="InvalidAnnotation",
                    message=f"{cleared.field}: {cleared.message}",
                )
            self._cleared[node] = cleared
            result = self._telemetry.observe_health(
                node, sample.health, cleared_ns=cleared if isinstance(cleared, int) else 0, now_ns=now_ns
            )
            self._act(result)
            for transition in result.transitions:
                self._tell_pods(transition)

    def _tell_pods(self, transition: overuse.Transition) -> None:
        """A device out of placement (or back): an Event on each pod using it, besides the one on the node. A pod uses
        it when the scheduler gave it the device (its holding) or when the agent saw its processes there (a whole-GPU
        pod's device is the device plugin's choice, which the telemetry reports)."""
        index = transition.gpu_index
        seen: set[str] = set()
        latest = self._consumer.latest().get(transition.node)
        if latest is not None:
            for gpu in latest.telemetry.gpus:
                if index is None or gpu.index == index:
                    seen.update(process.pod_uid for process in gpu.processes if process.pod_uid)
        for pod in self._state.pods_on(transition.node):
            if pod.reservation is not None:
                continue
            holding = holdings.of(pod, self._state.assumed.get(pod.uid))
            held = bool(holding.devices) and (index is None or index in holding.devices)
            if not held and pod.uid not in seen:
                continue
            firing = transition.state is wire.AlertState.FIRING
            self._recorder.record(
                events.ObjectRef.of_record(pod),
                type=events.EventType.WARNING if firing else events.EventType.NORMAL,
                reason=transition.name.value if firing else f"{transition.name.value}Resolved",
                message=transition.message,
            )

    def _act(self, result: live.LiveResult) -> None:
        self._alerts.send(result.transitions)
        for node, rows in result.rows.items():
            self._metrics.set_node_rows(node, rows)
        for node in result.forgotten:
            self._metrics.forget_node(node)
        self._metrics.count_rejected("foreign_claim", result.foreign_claims)
        for problem in result.policy_problems:
            log.warning("overuse_policy_invalid", annotation=problem.annotation, message=problem.message)
        for eviction in result.evictions:
            self._evict(eviction)
        if result.headroom_changed:
            self._on_headroom()

    def _count(self) -> None:
        counters = self._consumer.counters
        rejected = {reason.value: count for reason, count in counters.rejected.items()}
        rejected["buffer_full"] = counters.dropped_buffer_full
        rejected["node_limit"] = counters.dropped_node_limit
        self._metrics.count_telemetry(
            accepted=counters.accepted_telemetry + counters.accepted_health, rejected=rejected
        )

    def _evict(self, eviction: overuse.Eviction) -> None:
        """A pod over its allotment past the evict grace under the ``evict`` policy: an Event now, a Decision when
        the API confirms. No beneficiary and no room to make: the scheduler ends the pod on its queue's policy."""
        pod = self._state.pods.get(eviction.pod_uid)
        if pod is None:
            return
        started = self._dispatcher.evict(
            pod,
            node=eviction.node,
            disruption=names.TERMINATION_BY_SCHEDULER,
            message=eviction.message,
            decision_reason=eviction.reason,
            metric=eviction.reason,
        )
        if not started:
            return
        self._recorder.record(
            events.ObjectRef.of_record(pod), type=events.EventType.WARNING, reason="Evict", message=eviction.message
        )
        log.warning("overuse_eviction", pod=f"{eviction.pod_namespace}/{eviction.pod_name}", message=eviction.message)

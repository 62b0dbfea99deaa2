"""From a cycle's plan to the API: assume each placement, hand binds and evictions to the binder, settle the reports.

The engine's plan is a set of decisions; carrying them out takes API calls that finish later, fail, or find the pod
gone. The dispatcher keeps one in-flight record per pod (what is being done to it, since when, for which cycle and
queue), so every report is settled against what was asked:

- a placement is *assumed* in the cluster state at once (the next cycle sees its room taken), then bound; a bind that
  does not happen (``lost``, ``gone``, ``failed``, ``not-reserved``) forgets the assumption so the pod is placed
  afresh, with a ``FailedBinding`` event; a share whose node could not hold a GPU for it quarantines that node;
- an eviction (the plan's reclaims, preemptions, consolidations and stale gangs, the telemetry's over-consumption
  policy, a share whose reservation vanished) is the dispatcher's alone: a pod is evicted once, and stays "being
  evicted" until the watch shows it deleted, whoever asked; once a pod evicted to make room (reclaim, preempt,
  consolidate: KAI stamps on its statement's evictions, not on stale gangs) is evicted, its PodGroup gets KAI's
  ``kai.scheduler/last-eviction-timestamp``, which re-arms the group's preemption delay (one write per group and
  second);
- every bind and eviction that happened is a ``Decision`` on NATS, with the reason it was made.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable

from common import logs, names, wire
from scheduler import audit
from scheduler.kube import binding, events, kubeapi
from scheduler.metrics import SchedulerMetrics
from scheduler.objects.records import PodRecord
from scheduler.placement import decisions, model, plan
from scheduler.state.cache import Assumption, ClusterState, GroupKey

log = logs.get("scheduler")

# The DisruptionTarget condition's reasons Kubernetes defines (k8s.io/api/core/v1: PodReasonPreemptionByScheduler, ...).
DISRUPTION_REASONS: dict[decisions.EvictionReason, str] = {
    decisions.EvictionReason.RECLAIM: names.PREEMPTION_BY_SCHEDULER,
    decisions.EvictionReason.PREEMPT: names.PREEMPTION_BY_SCHEDULER,
    decisions.EvictionReason.CONSOLIDATE: names.PREEMPTION_BY_SCHEDULER,
    decisions.EvictionReason.STALE_GANG: names.TERMINATION_BY_SCHEDULER,
    decisions.EvictionReason.OVERUSE: names.TERMINATION_BY_SCHEDULER,
}
QUARANTINE_MIN_S = 30.0
"""A node where a reservation pod got no GPU takes no new pods for at least this long (or the UUID timeout)."""
NOMINATION_TTL_S = 120.0
"""A nomination (``status.nominatedNodeName``) no plan has renewed for this long is cleared: longer than a victim's
usual termination grace (30 s), so a pipelined placement keeps its room."""
# The evictions after which KAI stamps the victim's PodGroup (its Statement's evictions: reclaim, preempt,
# consolidate; stale gangs are evicted outside a Statement and are not stamped).
_STAMPED_REASONS = frozenset(
    {decisions.EvictionReason.RECLAIM, decisions.EvictionReason.PREEMPT, decisions.EvictionReason.CONSOLIDATE}
)
_RESERVATION_FAILURES = ("ReservationTimeout", "ReservationFailed")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Bind:
    """A bind in flight: where to, and what its ``Decision`` will say."""

    node: str
    devices: tuple[int, ...]
    gpu_group: str | None
    queue: str | None
    cycle: int
    started_s: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Evict:
    """An eviction in flight (until the pod is deleted): the reason and GPU group its ``Decision`` will name."""

    reason: str
    gpu_group: str | None = None
    stamp: GroupKey | None = None
    """The PodGroup to stamp with ``kai.scheduler/last-eviction-timestamp`` once the eviction happened."""


@dataclasses.dataclass(slots=True, kw_only=True)
class InFlight:
    """What is being done to one pod."""

    pod: binding.PodRef
    bind: Bind | None = None
    evict: Evict | None = None


def pod_ref(pod: PodRecord) -> binding.PodRef:
    return binding.PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)


class Dispatcher:
    """Carries out plans through the binder and settles its reports. One per leader term."""

    def __init__(
        self,
        state: ClusterState,
        *,
        metrics: SchedulerMetrics,
        recorder: events.EventSink,
        decisions: audit.DecisionPublisher | None,
        quarantine: Callable[[str, float], None],
        reservation_timeout_s: float,
        on_change: Callable[[], None],
        clock_s: Callable[[], float] = time.perf_counter,
        wall_clock_s: Callable[[], float] = time.time,
        on_error: Callable[[str, BaseException], None] = lambda where, exc: None,
    ) -> None:
        self._on_error = on_error
        self._state = state
        self._metrics = metrics
        self._recorder = recorder
        self._decisions = decisions
        self._quarantine = quarantine
        self._quarantine_s = max(QUARANTINE_MIN_S, reservation_timeout_s)
        self._on_change = on_change
        self._clock_s = clock_s
        self._wall_clock_s = wall_clock_s
        self._stamped: dict[GroupKey, str] = {}
        """The last eviction time written on each PodGroup (RFC 3339), so a gang's evictions write it once."""
        self.binder: binding.Binder | None = None
        """Set by the composition once the binder (which reports back here) exists."""
        self.in_flight: dict[str, InFlight] = {}
        self._nominated_at_s: dict[str, float] = {}
        """When a plan last nominated each pod still nominated (monotonic seconds)."""
        self._next_nomination_sweep_s = 0.0
        self.cycle = 0
        """The number of the last cycle dispatched; decisions made outside a cycle carry it too."""

    def _binder(self) -> binding.Binder:
        assert self.binder is not None, "the dispatcher needs its binder"
        return self.binder

    async def cancel(self) -> None:
        """Stop every API call in flight (leadership ended)."""
        if self.binder is not None:
            await self.binder.cancel()

    def _record(self, pod: PodRecord) -> InFlight:
        record = self.in_flight.get(pod.uid)
        if record is None:
            record = self.in_flight[pod.uid] = InFlight(pod=pod_ref(pod))
        return record

    def _settle(self, uid: str, record: InFlight) -> None:
        if record.bind is None and record.evict is None:
            self.in_flight.pop(uid, None)

    # --- plans ---

    def dispatch(self, result: plan.Plan, snapshot: model.Snapshot, *, cycle: int) -> None:
        """Assume every placement and hand it to the binder; nominate; evict the victims. A decision that cannot be
        carried out (a fault) is logged with its pod, counted and skipped; the others go on."""
        self.cycle = cycle
        for placement in result.placements:
            self._contained(self._place, placement, snapshot, cycle, pod=placement.pod)
        for nomination in result.nominations:
            self._contained(self._nominate, nomination, pod=nomination.pod)
        for eviction in result.evictions:
            self._contained(self._evict_victim, eviction, pod=eviction.pod)
        now_s = self._clock_s()
        for nomination in result.nominations:
            self._nominated_at_s[str(nomination.pod)] = now_s
        if now_s >= self._next_nomination_sweep_s:
            self._next_nomination_sweep_s = now_s + NOMINATION_TTL_S / 4
            self._contained(self._expire_nominations, now_s, pod=model.PodUid("(nominations)"))

    def _expire_nominations(self, now_s: float) -> None:
        """Clear the nomination of a pod no plan has nominated for ``NOMINATION_TTL_S`` (the room it was made for went
        to no use, or a previous leader set it): a nominated group goes before every other, so a nomination left
        behind would keep it ahead of the fair-share order for good."""
        seen: dict[str, float] = {}
        for uid, pod in self._state.pods.items():
            nominated = self._state.nomination(pod)
            if nominated is None or pod.node or uid in self._state.assumed:
                continue
            since = self._nominated_at_s.get(uid, now_s)
            if now_s - since < NOMINATION_TTL_S:
                seen[uid] = since
                continue
            log.info("nomination_expired", pod=f"{pod.namespace}/{pod.name}", node=nominated)
            self._state.mark_nominating(uid, None)
            self._binder().submit_nomination(pod_ref(pod), None)
        self._nominated_at_s = seen

    def _contained(self, action: Callable[..., None], *args: object, pod: model.PodUid) -> None:
        try:
            action(*args)
        except Exception as exc:
            log.exception("dispatch_failed", pod=str(pod), action=action.__name__.strip("_"))
            self._on_error("dispatch", exc)

    def _place(self, placement: decisions.Placement, snapshot: model.Snapshot, cycle: int) -> None:
        state = self._state
        uid = str(placement.pod)
        pod = state.pods.get(uid)
        if pod is None or uid in state.assumed:
            return
        groups = tuple(binding.label_safe_group(str(group)) for group in placement.gpu_groups)
        share = placement.share_milli[0] if placement.share_milli else 0
        state.assume(
            uid,
            Assumption(node=str(placement.node), devices=placement.devices, share_milli=share, gpu_groups=groups),
        )
        group = snapshot.groups.get(placement.group)
        self._record(pod).bind = Bind(
            node=str(placement.node),
            devices=placement.devices,
            gpu_group=groups[0] if groups else None,
            queue=str(group.queue) if group is not None else None,
            cycle=cycle,
            started_s=self._clock_s(),
        )
        extra = {}
        if not pod.pod_group and uid in state.decided:
            extra[names.POD_GROUP_ANNOTATION] = state.decided[uid]
        self._binder().submit_bind(pod_ref(pod), placement, groups, extra, configmap=pod.configmap)

    def _nominate(self, nomination: decisions.Placement) -> None:
        state = self._state
        pod = state.pods.get(str(nomination.pod))
        if pod is not None and state.nomination(pod) != str(nomination.node):
            state.mark_nominating(pod.uid, str(nomination.node))
            self._binder().submit_nomination(pod_ref(pod), str(nomination.node))

    def _evict_victim(self, eviction: decisions.Eviction) -> None:
        pod = self._state.pods.get(str(eviction.pod))
        if pod is None:
            return
        evicting = self.evict(
            pod,
            node=str(eviction.node),
            disruption=DISRUPTION_REASONS.get(eviction.reason, names.PREEMPTION_BY_SCHEDULER),
            message=eviction.message,
            decision_reason="Evicted",
            metric=eviction.reason.value,
            stamp=self._state.group_of(pod) if eviction.reason in _STAMPED_REASONS else None,
        )
        if evicting:
            ref = events.ObjectRef.of_record(pod)
            self._recorder.record(ref, type=events.EventType.WARNING, reason="Evict", message=eviction.message)

    # --- evictions ---

    def is_evicting(self, uid: str) -> bool:
        record = self.in_flight.get(uid)
        return record is not None and record.evict is not None

    def evict(
        self,
        pod: PodRecord,
        *,
        node: str,
        disruption: str,
        message: str,
        decision_reason: str,
        metric: str,
        gpu_group: str | None = None,
        stamp: GroupKey | None = None,
    ) -> bool:
        """Evict ``pod`` unless it is being evicted already; whether this call started an eviction. ``disruption`` is
        the ``DisruptionTarget`` reason, ``decision_reason`` what its ``Decision`` says, ``metric`` the label of
        ``quotient_evictions_total``; ``stamp`` the PodGroup to stamp with the eviction's time once it happened."""
        if self.is_evicting(pod.uid):
            return False
        self._record(pod).evict = Evict(reason=decision_reason, gpu_group=gpu_group, stamp=stamp)
        self._state.mark_evicting(pod.uid, True)
        self._metrics.evictions.labels(metric).inc()
        self._binder().submit_evict(pod_ref(pod), node=node, disruption=disruption, message=message)
        return True

    def pod_deleted(self, uid: str) -> None:
        """The watch showed the pod deleted: whatever was in flight for it is over."""
        self.in_flight.pop(uid, None)

    # --- reports ---

    async def on_report(self, report: binding.Report) -> None:
        if report.operation is binding.Operation.EVICT:
            await self._evicted(report)
        else:
            await self._bound(report)

    async def _evicted(self, report: binding.Report) -> None:
        uid = report.pod.uid
        record = self.in_flight.get(uid)
        evict = record.evict if record is not None else None
        if report.outcome is binding.Outcome.EVICTED:
            if evict is not None and evict.stamp is not None:
                self._contained(self._stamp_eviction, evict.stamp, pod=model.PodUid(uid))
            await self._publish(
                report,
                action=wire.DecisionAction.EVICT,
                reason=evict.reason if evict is not None else "Evicted",
                gpu_group=evict.gpu_group if evict is not None else None,
            )
            return  # it stays "being evicted" until the watch shows it deleted
        if report.outcome is binding.Outcome.GONE:
            return
        log.warning("eviction_failed", pod=f"{report.pod.namespace}/{report.pod.name}", message=report.message)
        self._state.mark_evicting(uid, False)
        if record is not None:
            record.evict = None  # a later decision may try again
            self._settle(uid, record)

    def _stamp_eviction(self, key: GroupKey) -> None:
        """Write KAI's ``kai.scheduler/last-eviction-timestamp`` on the PodGroup (RFC 3339, whole seconds, as KAI
        writes it): once per group and second, never on a PodGroup that is gone or already stamped that late."""
        podgroup = self._state.podgroups.get(key)
        if podgroup is None:
            return
        now_s = int(self._wall_clock_s())
        text = kubeapi.rfc3339(datetime.datetime.fromtimestamp(now_s, datetime.UTC))
        if self._stamped.get(key) == text or podgroup.last_eviction_ns >= now_s * 1_000_000_000:
            return
        if len(self._stamped) > 2 * len(self._state.podgroups) + 1024:
            self._stamped = {group: value for group, value in self._stamped.items() if group in self._state.podgroups}
        self._stamped[key] = text
        self._binder().submit_podgroup_annotations(
            namespace=key[0], name=key[1], annotations={names.LAST_EVICTION_ANNOTATION: text}
        )

    async def _bound(self, report: binding.Report) -> None:
        uid = report.pod.uid
        record = self.in_flight.get(uid)
        bind = record.bind if record is not None else None
        if record is not None:
            record.bind = None
            self._settle(uid, record)
        if report.outcome is binding.Outcome.BOUND:
            await self._publish(
                report,
                action=wire.DecisionAction.BIND,
                reason="Scheduled",
                devices=bind.devices if bind is not None else (),
                gpu_group=bind.gpu_group if bind is not None else None,
                queue=bind.queue if bind is not None else None,
                cycle=bind.cycle if bind is not None else None,
            )
        self._metrics.binds.labels(report.outcome.value).inc()
        if bind is not None:
            self._metrics.bind_seconds.observe(self._clock_s() - bind.started_s)
        if report.outcome is binding.Outcome.BOUND:
            bound = self._state.pods.get(uid)
            if bound is not None:  # as kube-scheduler writes it (KAI's scheduler too, with its node pool)
                self._recorder.record(
                    events.ObjectRef.of_record(bound),
                    type=events.EventType.NORMAL,
                    reason="Scheduled",
                    message=f"Successfully assigned {report.pod.namespace}/{report.pod.name} to {report.node}",
                )
            return
        self._state.forget(uid)
        self._on_change()
        if report.outcome is binding.Outcome.NOT_RESERVED and report.node and report.reason in _RESERVATION_FAILURES:
            # The node could not hold a GPU for a share (its device plugin or NVML is failing): place elsewhere.
            self._quarantine(report.node, self._quarantine_s)
        pod = self._state.pods.get(uid)
        if report.outcome is not binding.Outcome.GONE and pod is not None:
            log.warning(
                "bind_failed",
                pod=f"{report.pod.namespace}/{report.pod.name}",
                outcome=report.outcome.value,
                message=report.message,
            )
            self._recorder.record(
                events.ObjectRef.of_record(pod),
                type=events.EventType.WARNING,
                reason="FailedBinding",
                message=report.message,
            )

    async def _publish(
        self,
        report: binding.Report,
        *,
        action: wire.DecisionAction,
        reason: str,
        devices: tuple[int, ...] = (),
        gpu_group: str | None = None,
        queue: str | None = None,
        cycle: int | None = None,
    ) -> None:
        if self._decisions is None:
            return
        await self._decisions.publish(
            action=action,
            namespace=report.pod.namespace,
            name=report.pod.name,
            uid=report.pod.uid,
            node=report.node,
            gpu_indices=devices,
            gpu_group=gpu_group,
            queue=queue,
            reason=reason,
            message=report.message,
            cycle=self.cycle if cycle is None else cycle,
        )

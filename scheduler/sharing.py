"""Keeping GPU groups and their reservation pods in line, for the leader (DESIGN.md, "Fractional GPUs").

The binder creates a group's reservation pod when a share opens the group (``scheduler.kube.reservations``); this
keeper does the rest of their life, every ``RECONCILE_S``: it reads the pods of every group from the cluster state
(``state.gpugroups.Sharers``: bound or being bound, not finished), asks the pure ``gpugroups.reconcile`` what is
out of line, and carries it out: drain a reservation whose last pod ended, delete one stuck without a UUID, reserve
again for a group whose reservation vanished before its pods started (then rewrite their ConfigMaps), and evict (or
report) a running share whose reservation vanished, since nothing holds its device any more. Each step of a
reservation is an Event on its pod, and its creation and deletion a ``Decision`` on NATS; the eviction of an orphaned
share goes through the dispatcher, which owns every eviction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from common import logs, names, tasks, wire
from scheduler.audit import DecisionPublisher
from scheduler.dispatch import Dispatcher
from scheduler.kube import binding, events, kubeapi, reservations
from scheduler.kube.errors import KubeError
from scheduler.objects.records import PodRecord, Reservation, ReservationPhase
from scheduler.state import gpugroups
from scheduler.state.cache import ClusterState

log = logs.get("scheduler.sharing")

RECONCILE_S = 0.5
"""How often reservations are reconciled with their groups (drains, timeouts, vanished reservations)."""


class GroupKeeper:
    """The reservation manager of the leader and the loop that keeps it in line with the cluster state."""

    def __init__(
        self,
        api: kubeapi.KubeApi,
        settings: reservations.Settings,
        state: ClusterState,
        recorder: events.EventSink,
        dispatcher: Dispatcher,
        *,
        decisions: DecisionPublisher | None,
        on_change: Callable[[], None],
        on_failure: tasks.OnFailure | None = None,
    ) -> None:
        self._api = api
        self._state = state
        self._recorder = recorder
        self._dispatcher = dispatcher
        self._decisions = decisions
        self._on_change = on_change
        self._on_failure = on_failure
        self._tasks = tasks.TaskSet("sharing", on_failure=on_failure)
        self._sharers = gpugroups.Sharers(state)
        self.manager = reservations.ReservationManager(api, settings, on_transition=self._step)

    def _step(self, reservation: Reservation, phase: ReservationPhase, reason: str, message: str) -> None:
        """Every step of a reservation's life: an Event on its pod and, for creation and deletion, a Decision."""
        ref = events.ObjectRef(
            api_version="v1", kind="Pod", name=reservation.name, namespace=reservation.namespace, uid=reservation.uid
        )
        warning = reason == "ReservationTimedOut" or reservation.failed is not None
        self._recorder.record(
            ref, type=events.EventType.WARNING if warning else events.EventType.NORMAL, reason=reason, message=message
        )
        self._on_change()
        if self._decisions is None or phase not in (ReservationPhase.CREATING, ReservationPhase.DELETED):
            return
        self._tasks.spawn(
            self._decisions.publish(
                action=wire.DecisionAction.RESERVE
                if phase is ReservationPhase.CREATING
                else wire.DecisionAction.UNRESERVE,
                namespace=reservation.namespace,
                name=reservation.name,
                uid=reservation.uid or "unknown",
                node=reservation.node or None,
                gpu_indices=(reservation.index,) if reservation.index is not None else (),
                gpu_group=reservation.group[:253],
                reason=reason,
                message=message,
                cycle=self._dispatcher.cycle,
            ),
            name=f"decision:{reservation.name}",
        )

    async def cancel(self) -> None:
        await self._tasks.cancel()

    def sharers(self) -> dict[str, tuple[gpugroups.Sharer, ...]]:
        return self._sharers.by_group()

    async def run(self, ready: Callable[[], bool]) -> None:
        """Reconcile every ``RECONCILE_S`` once the state is synced; an API fault skips a round, never the loop."""
        while True:
            await asyncio.sleep(RECONCILE_S)
            if not ready():
                continue
            try:
                await self.reconcile()
            except KubeError as exc:
                log.warning("reservation_reconcile_failed", error=str(exc))
            except Exception as exc:
                log.exception("reservation_reconcile_broke")
                if self._on_failure is not None:
                    self._on_failure("sharing", exc)

    async def reconcile(self) -> None:
        """One round: drain reservations without pods, expire stuck ones, handle pods whose reservation vanished."""
        for action in self.manager.plan(self.sharers()):
            kind = action.kind
            if kind in (gpugroups.ActionKind.DRAIN, gpugroups.ActionKind.EXPIRE):
                await self.manager.drain(action)
            elif kind is gpugroups.ActionKind.RE_RESERVE:
                self._tasks.spawn(self._re_reserve(action), name=f"re-reserve:{action.group}")
            elif action.sharer is not None:
                self._orphaned(action, action.sharer)

    async def _re_reserve(self, action: gpugroups.Action) -> None:
        self.manager.hold(action.group)
        try:
            held = await self.manager.reserve(action.group, action.node)
            for sharer in self.sharers().get(action.group, ()):
                pod = self._state.pods.get(sharer.uid)
                if pod is None:
                    continue
                ref = events.ObjectRef.of_record(pod)
                if isinstance(held, reservations.NotReserved):
                    self._recorder.record(
                        ref, type=events.EventType.WARNING, reason="GpuReservationLost", message=held.message
                    )
                    continue
                self._recorder.record(ref, type=events.EventType.NORMAL, reason="GpuReserved", message=action.message)
                await self._rewire(pod, action.group, held.uuid)
        finally:
            self.manager.release(action.group)

    async def _rewire(self, pod: PodRecord, group: str, uuid: str) -> None:
        """A pod not yet started gets its group's new device: ConfigMap and annotation (read when it starts)."""
        groups = pod.gpu_groups
        uuids = list(pod.gpu_uuids)
        uuids += [""] * (len(groups) - len(uuids))
        if group in groups:
            uuids[groups.index(group)] = uuid
        visible = ",".join(uuids) or uuid
        try:
            if pod.configmap:
                data: Mapping[str, str] = {
                    names.VISIBLE_DEVICES_ENV: visible,
                    names.GPU_PORTION_ENV: binding.portion_text(pod.share_milli),
                }
                await self._api.patch(kubeapi.CONFIG_MAPS, {"data": data}, name=pod.configmap, namespace=pod.namespace)
            await self._api.patch(
                kubeapi.PODS,
                {"metadata": {"annotations": {names.GPU_UUIDS_ANNOTATION: visible}}},
                name=pod.name,
                namespace=pod.namespace,
            )
        except KubeError as exc:
            log.warning("rewire_failed", pod=pod.display, error=str(exc))

    def _orphaned(self, action: gpugroups.Action, sharer: gpugroups.Sharer) -> None:
        pod = self._state.pods.get(sharer.uid)
        if pod is None or self._dispatcher.is_evicting(sharer.uid):
            return
        self._recorder.record(
            events.ObjectRef.of_record(pod),
            type=events.EventType.WARNING,
            reason="GpuReservationLost",
            message=action.message,
        )
        if action.kind is not gpugroups.ActionKind.EVICT_ORPHAN:
            return
        self._dispatcher.evict(
            pod,
            node=sharer.node,
            disruption=names.TERMINATION_BY_SCHEDULER,
            message=action.message,
            decision_reason="GpuReservationLost",
            metric="ReservationLost",
            gpu_group=action.group[:253],
        )

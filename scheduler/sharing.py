"""Keeping GPU groups and their reservation pods in line, for the leader (DESIGN.md, "Fractional GPUs").

The binder creates a group's reservation pod when a share opens the group (``scheduler.kube.reservations``); this
keeper does the rest of their life, every ``RECONCILE_S``: it lists the pods of every group from the cluster state
(bound or being bound, not finished), asks the pure ``reservations.reconcile`` what is out of line, and carries it
out: drain a reservation whose last pod ended, delete one stuck without a UUID, reserve again for a group whose
reservation vanished before its pods started (then rewrite their ConfigMaps), and evict (or report) a running share
whose reservation vanished, since nothing holds its device any more. Each step of a reservation is an Event on its
pod, and its creation and deletion a ``Decision`` on NATS.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from common import logs, wire
from scheduler.audit import DecisionPublisher
from scheduler.kube import binding, client, events, reservations, webhook
from scheduler.kube.errors import KubeError
from scheduler.metrics import SchedulerMetrics
from scheduler.state import objects
from scheduler.state.cache import Assumption, ClusterState

log = logs.get("scheduler.sharing")

RECONCILE_S = 0.5
"""How often reservations are reconciled with their groups (drains, timeouts, vanished reservations)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Reading:
    pod: Mapping[str, Any]
    assumption: Assumption | None
    found: tuple[reservations.Sharer, tuple[str, ...]] | None


def _read_sharer(
    uid: str, pod: Mapping[str, Any], assumption: Assumption | None
) -> tuple[reservations.Sharer, tuple[str, ...]] | None:
    """The pod as a member of its GPU groups, or None when it is in none, not placed, or finished."""
    groups = assumption.gpu_groups if assumption is not None else objects.pod_gpu_groups(pod)
    status = pod.get("status") or {}
    if not groups or status.get("phase") in ("Succeeded", "Failed"):
        return None
    node = assumption.node if assumption is not None else str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        return None
    meta = pod.get("metadata") or {}
    sharer = reservations.Sharer(
        uid=uid,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node=node,
        started=status.get("phase") == "Running",
    )
    return sharer, tuple(groups)


class GroupKeeper:
    """The reservation manager of the leader and the loop that keeps it in line with the cluster state."""

    def __init__(
        self,
        api: client.KubeApi,
        settings: reservations.Settings,
        state: ClusterState,
        recorder: events.EventRecorder,
        metrics: SchedulerMetrics,
        *,
        decisions: DecisionPublisher | None,
        evicting: set[str],
        cycle: Callable[[], int],
        on_change: Callable[[], None],
    ) -> None:
        self._api = api
        self._state = state
        self._recorder = recorder
        self._metrics = metrics
        self._decisions = decisions
        self._evicting = evicting
        self._cycle = cycle
        self._on_change = on_change
        self._background: set[asyncio.Task[None]] = set()
        self._readings: dict[str, _Reading] = {}
        self.manager = reservations.ReservationManager(api, settings, on_transition=self._step)

    def _step(
        self, reservation: reservations.Reservation, phase: reservations.Phase, reason: str, message: str
    ) -> None:
        """Every step of a reservation's life: an Event on its pod and, for creation and deletion, a Decision."""
        ref = events.ObjectRef(
            api_version="v1", kind="Pod", name=reservation.name, namespace=reservation.namespace, uid=reservation.uid
        )
        warning = reason == "ReservationTimedOut" or reservation.failed is not None
        self._recorder.record(
            ref, type=events.EventType.WARNING if warning else events.EventType.NORMAL, reason=reason, message=message
        )
        self._on_change()
        if self._decisions is None or phase not in (reservations.Phase.CREATING, reservations.Phase.DELETED):
            return
        self._spawn(
            self._decisions.publish(
                action=wire.DecisionAction.RESERVE
                if phase is reservations.Phase.CREATING
                else wire.DecisionAction.UNRESERVE,
                namespace=reservation.namespace,
                name=reservation.name,
                uid=reservation.uid or "unknown",
                node=reservation.node or None,
                gpu_indices=(reservation.index,) if reservation.index is not None else (),
                gpu_group=reservation.group[:253],
                reason=reason,
                message=message,
                cycle=self._cycle(),
            )
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def cancel(self) -> None:
        for task in list(self._background):
            task.cancel()

    def sharers(self) -> dict[str, tuple[reservations.Sharer, ...]]:
        """The pods of every GPU group: bound or being bound, not finished.

        Runs every round over every share of the cluster, so each pod's reading is kept while its object and its
        assumption stay the very same objects (the state replaces a pod's object on every change)."""
        found: dict[str, list[reservations.Sharer]] = {}
        state = self._state
        candidates = state.sharing_pods | {uid for uid, assumed in state.assumed.items() if assumed.gpu_groups}
        readings: dict[str, _Reading] = {}
        for uid in candidates:
            pod = state.pods.get(uid)
            if pod is None:
                continue
            assumption = state.assumed.get(uid)
            reading = self._readings.get(uid)
            if reading is None or reading.pod is not pod or reading.assumption is not assumption:
                reading = _Reading(pod=pod, assumption=assumption, found=_read_sharer(uid, pod, assumption))
            readings[uid] = reading
            if reading.found is not None:
                sharer, groups = reading.found
                for group in groups:
                    found.setdefault(group, []).append(sharer)
        self._readings = readings
        return {group: tuple(members) for group, members in found.items()}

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

    async def reconcile(self) -> None:
        """One round: drain reservations without pods, expire stuck ones, handle pods whose reservation vanished."""
        for action in self.manager.plan(self.sharers()):
            kind = action.kind
            if kind in (reservations.ActionKind.DRAIN, reservations.ActionKind.EXPIRE):
                await self.manager.drain(action)
            elif kind is reservations.ActionKind.RE_RESERVE:
                self._spawn(self._re_reserve(action))
            elif action.sharer is not None:
                await self._orphaned(action, action.sharer)

    async def _re_reserve(self, action: reservations.Action) -> None:
        self.manager.hold(action.group)
        try:
            held = await self.manager.reserve(action.group, action.node)
            for sharer in self.sharers().get(action.group, ()):
                pod = self._state.pods.get(sharer.uid)
                if pod is None:
                    continue
                ref = events.ObjectRef.of(pod)
                if isinstance(held, reservations.NotReserved):
                    self._recorder.record(
                        ref, type=events.EventType.WARNING, reason="GpuReservationLost", message=held.message
                    )
                    continue
                self._recorder.record(ref, type=events.EventType.NORMAL, reason="GpuReserved", message=action.message)
                await self._rewire(pod, sharer, action.group, held.uuid)
        finally:
            self.manager.release(action.group)

    async def _rewire(self, pod: Mapping[str, Any], sharer: reservations.Sharer, group: str, uuid: str) -> None:
        """A pod not yet started gets its group's new device: ConfigMap and annotation (read when it starts)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        groups = objects.pod_gpu_groups(pod)
        uuids = [part for part in str(annotations.get(binding.GPU_UUIDS_ANNOTATION) or "").split(",") if part]
        uuids += [""] * (len(groups) - len(uuids))
        if group in groups:
            uuids[groups.index(group)] = uuid
        visible = ",".join(uuids) or uuid
        share = str(annotations.get(objects.GPU_SHARE_ANNOTATION) or "0")
        try:
            configmap = annotations.get(webhook.CONFIGMAP_ANNOTATION)
            if configmap:
                portion = binding.portion_text(int(share) if share.isascii() and share.isdigit() else 0)
                await self._api.patch(
                    client.CONFIG_MAPS,
                    {"data": {binding.VISIBLE_DEVICES_KEY: visible, binding.GPU_PORTION_KEY: portion}},
                    name=str(configmap),
                    namespace=sharer.namespace,
                )
            await self._api.patch(
                client.PODS,
                {"metadata": {"annotations": {binding.GPU_UUIDS_ANNOTATION: visible}}},
                name=sharer.name,
                namespace=sharer.namespace,
            )
        except KubeError as exc:
            log.warning("rewire_failed", pod=f"{sharer.namespace}/{sharer.name}", error=str(exc))

    async def _orphaned(self, action: reservations.Action, sharer: reservations.Sharer) -> None:
        pod = self._state.pods.get(sharer.uid)
        if pod is None or sharer.uid in self._evicting:
            return
        self._recorder.record(
            events.ObjectRef.of(pod), type=events.EventType.WARNING, reason="GpuReservationLost", message=action.message
        )
        if action.kind is not reservations.ActionKind.EVICT_ORPHAN:
            return
        self._evicting.add(sharer.uid)
        self._metrics.evictions.labels("ReservationLost").inc()
        try:
            await self._api.evict_pod(
                namespace=sharer.namespace,
                name=sharer.name,
                uid=sharer.uid,
                reason="TerminationByScheduler",
                message=action.message,
            )
        except KubeError as exc:
            self._evicting.discard(sharer.uid)
            log.warning("orphan_eviction_failed", pod=f"{sharer.namespace}/{sharer.name}", error=str(exc))
            return
        if self._decisions is not None:
            await self._decisions.publish(
                action=wire.DecisionAction.EVICT,
                namespace=sharer.namespace,
                name=sharer.name,
                uid=sharer.uid,
                node=sharer.node,
                gpu_group=action.group[:253],
                reason="GpuReservationLost",
                message=action.message,
                cycle=self._cycle(),
            )

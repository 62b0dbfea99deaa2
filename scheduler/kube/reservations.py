"""Reservation pods: the pod that holds a shared GPU for every pod of its GPU group.

A fractional pod does not request ``nvidia.com/gpu`` (KAI-COMPAT.md, "GPU sharing"), so nothing on the node would
stop the device plugin from handing its device to a whole-GPU pod. The first share placed on a device therefore
opens a *GPU group* and the binder creates the group's reservation pod: ``spec.nodeName`` set (it skips scheduling),
``nvidia.com/gpu: 1``, runtime class ``nvidia``, in the reservation namespace. Its entry point (``quotient
reserve``) reads the UUID of the device it was given through NVML and writes it to its own annotation; only then
does the binder know which physical device the group shares, write the sharing pods' ConfigMaps
(``NVIDIA_VISIBLE_DEVICES=<uuid>``) and bind them.

Each reservation walks an explicit state machine, every step an Event on the reservation pod::

    creating -> waiting-for-uuid -> ready -> draining -> deleted
        \\______________\\___ (no UUID within the timeout, or the pod failed) -> draining -> deleted

The state is never kept only in memory: it is read back from the pod (its labels say the group and node, its
annotations the UUID, ``deletionTimestamp`` says draining), so a restarted scheduler rebuilds every reservation
from its pod watch. The name is a digest of the group, so a create repeated after a restart or a lost answer finds
the same pod (409) instead of a second reservation.

What to do about the groups (drain a reservation whose last sharing pod ended, delete one stuck without a UUID,
re-reserve for a sharing pod that has not started, evict or report a running one whose reservation vanished) is
decided by the pure ``scheduler.state.gpugroups.reconcile``; :class:`ReservationManager` holds the reservations the
pod watch shows (``scheduler.objects.pods`` reads each reservation pod into its ``Reservation``) and makes the API
calls that create and delete them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from common import logs, names
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeForbidden, KubeNotFound
from scheduler.objects import pods
from scheduler.objects.records import PodRecord, Reservation, ReservationPhase
from scheduler.state import gpugroups

log = logs.get("scheduler.reservations")

DEFAULT_IMAGE: Final = "ghcr.io/quotient-sched/quotient-scheduler:0.1.0"
RESERVE_COMMAND: Final = ("quotient", "reserve")
_NAME_MAX = 63  # pod names become hostnames: keep them DNS labels


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    namespace: str = names.RESERVATION_NAMESPACE
    image: str = DEFAULT_IMAGE
    uuid_timeout_s: float = 60.0
    """How long a reservation may wait for its UUID before it is deleted and the bind retried elsewhere."""
    drain_grace_s: float = 2.0
    """How long a reservation with no sharing pod is kept (a share being bound may be about to use it)."""
    evict_orphans: bool = True
    """A running sharing pod whose reservation pod is gone: deleted (KAI's behaviour) or only reported."""
    service_account: str = "quotient-reservation"
    priority_class: str | None = None

    @property
    def limits(self) -> gpugroups.Limits:
        return gpugroups.Limits(
            uuid_timeout_s=self.uuid_timeout_s, drain_grace_s=self.drain_grace_s, evict_orphans=self.evict_orphans
        )


def pod_name(node: str, group: str) -> str:
    """The reservation pod of ``group`` on ``node``: ``gpu-reservation-<node>-<digest of the group>``, a DNS label."""
    digest = hashlib.sha256(group.encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]", "-", node.lower()).strip("-") or "node"
    room = _NAME_MAX - len("gpu-reservation-") - len(digest) - 1
    return f"gpu-reservation-{stem[:room].rstrip('-')}-{digest}"


def manifest(settings: Settings, *, node: str, group: str) -> dict[str, Any]:
    """The reservation pod of ``group``: bound to ``node`` by ``spec.nodeName``, one whole GPU, the NVIDIA runtime,
    and the downward API telling its entry point who it is."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "runtimeClassName": names.NVIDIA_RUNTIME_CLASS,
        "restartPolicy": "Always",
        "serviceAccountName": settings.service_account,
        "terminationGracePeriodSeconds": 5,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "reserve",
                "image": settings.image,
                "command": list(RESERVE_COMMAND),
                "env": [
                    {"name": "QUOTIENT_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "QUOTIENT_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                ],
                "resources": {
                    "requests": {names.GPU_RESOURCE: "1", "cpu": "10m", "memory": "32Mi"},
                    "limits": {names.GPU_RESOURCE: "1", "memory": "128Mi"},
                },
            }
        ],
    }
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node, group),
            "namespace": settings.namespace,
            "labels": {
                names.RESERVATION_GROUP_LABEL: group,
                names.COMPONENT_LABEL: names.RESERVATION_COMPONENT,
                names.PART_OF_LABEL: names.PRODUCT,
            },
            "annotations": {names.RESERVATION_GROUP_ANNOTATION: group},
        },
        "spec": spec,
    }


# --- Carrying it out ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reserved:
    group: str
    uuid: str
    index: int | None
    created: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NotReserved:
    group: str
    node: str
    reason: str
    """A machine-readable code: ``ReservationTimeout``, ``ReservationFailed``, ``ReservationElsewhere``,
    ``ReservationDraining``, ``ApiError``."""
    message: str


Transition = Callable[[Reservation, ReservationPhase, str, str], None]
"""Called on every step: the reservation, its new phase, an event reason and a message."""


class ReservationManager:
    """The reservations of the cluster (from the pod watch) and the API calls that create and delete them.

    ``observe``/``removed`` are fed by the scheduler's pod watch; ``reserve`` is awaited by the binder; ``apply`` runs
    what ``gpugroups.reconcile`` decided. Every phase change goes to ``on_transition`` (events, decisions, logs).
    """

    def __init__(
        self,
        api: kubeapi.KubeApi,
        settings: Settings,
        *,
        on_transition: Transition | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.settings = settings
        self._on_transition = on_transition
        self._clock_s = clock_s
        self.reservations: dict[str, Reservation] = {}
        self.waiting_since_s: dict[str, float] = {}
        self.idle_since_s: dict[str, float] = {}
        self._ready: dict[str, asyncio.Future[Reservation]] = {}
        self._busy: dict[str, int] = {}
        self.created = 0
        self.deleted = 0

    # --- from the watch ---

    def observe(self, pod: PodRecord) -> None:
        reservation = pod.reservation
        if reservation is None:
            return
        old = self.reservations.get(reservation.group)
        self.reservations[reservation.group] = reservation
        if old is None or old.phase is not reservation.phase:
            if reservation.phase is ReservationPhase.WAITING_FOR_UUID:
                self.waiting_since_s.setdefault(reservation.group, self._clock_s())
                self._step(
                    reservation, "ReservationWaitingForUuid", f"waiting for the device UUID on {reservation.node}"
                )
            elif reservation.phase is ReservationPhase.READY:
                self.waiting_since_s.pop(reservation.group, None)
                self._step(
                    reservation,
                    "ReservationReady",
                    f"holds GPU {reservation.index if reservation.index is not None else '?'} ({reservation.uuid}) on "
                    f"{reservation.node} for GPU group {reservation.group}",
                )
            elif reservation.phase is ReservationPhase.DRAINING:
                self._step(reservation, "ReservationDraining", f"releasing the device of GPU group {reservation.group}")
        if reservation.phase is ReservationPhase.READY or reservation.failed is not None:
            waiter = self._ready.get(reservation.group)
            if waiter is not None and not waiter.done():
                waiter.set_result(reservation)

    def removed(self, pod: PodRecord) -> None:
        reservation = pod.reservation
        if reservation is None:
            return
        current = self.reservations.get(reservation.group)
        if current is not None and current.uid not in ("", reservation.uid):
            return  # an older pod of the group went; the current one stays
        self.reservations.pop(reservation.group, None)
        self.waiting_since_s.pop(reservation.group, None)
        self.idle_since_s.pop(reservation.group, None)
        self._step(
            dataclasses.replace(reservation, phase=ReservationPhase.DELETED), "ReservationDeleted", "the device is free"
        )

    def _step(self, reservation: Reservation, reason: str, message: str) -> None:
        log.info(
            "reservation",
            group=reservation.group,
            node=reservation.node,
            pod=reservation.name,
            phase=reservation.phase.value,
            reason=reason,
        )
        if self._on_transition is not None:
            try:
                self._on_transition(reservation, reservation.phase, reason, message)
            except Exception:  # a report must never stop a reservation
                log.exception("reservation_report_failed", group=reservation.group)

    # --- for the binder ---

    @property
    def busy(self) -> frozenset[str]:
        return frozenset(group for group, count in self._busy.items() if count > 0)

    def hold(self, group: str) -> None:
        """Keep reconciliation off ``group`` while a bind uses it (until :meth:`release`)."""
        self._busy[group] = self._busy.get(group, 0) + 1

    def release(self, group: str) -> None:
        left = self._busy.get(group, 0) - 1
        if left > 0:
            self._busy[group] = left
        else:
            self._busy.pop(group, None)

    async def reserve(self, group: str, node: str) -> Reserved | NotReserved:
        """The device of ``group`` on ``node``: the existing reservation's, or a new reservation's once its UUID
        arrives (within ``uuid_timeout_s``; else the reservation is deleted and the answer says why)."""
        current = self.reservations.get(group)
        if current is not None and current.node != node and current.phase is not ReservationPhase.DRAINING:
            return NotReserved(
                group=group,
                node=node,
                reason="ReservationElsewhere",
                message=f"GPU group {group} is held on {current.node}, not {node}",
            )
        if current is not None and current.phase is ReservationPhase.DRAINING:
            return NotReserved(
                group=group,
                node=node,
                reason="ReservationDraining",
                message=f"the reservation pod of GPU group {group} on {node} is being deleted",
            )
        if current is not None and current.phase is ReservationPhase.READY and current.uuid:
            return Reserved(group=group, uuid=current.uuid, index=current.index, created=False)
        created = False
        if current is None:
            body = manifest(self.settings, node=node, group=group)
            made: Mapping[str, Any] | None
            try:
                made = await self._api.create(kubeapi.PODS, body, namespace=self.settings.namespace)
                created = True
                self.created += 1
            except KubeAlreadyExists:
                made = await self._api.get(
                    kubeapi.PODS, name=body["metadata"]["name"], namespace=self.settings.namespace
                )
            except (KubeForbidden, KubeNotFound) as exc:
                # Only an operator fixes this: say what, not just the API's words.
                namespace = self.settings.namespace
                return NotReserved(
                    group=group,
                    node=node,
                    reason="ApiError",
                    message=f"creating the reservation pod in {namespace!r}: {exc}; the namespace or the scheduler's "
                    "Role in it is missing: apply the deploy manifests (kubectl apply -k deploy/base) or set "
                    "--reservation-namespace",
                )
            except KubeError as exc:
                return NotReserved(
                    group=group, node=node, reason="ApiError", message=f"creating the reservation pod: {exc}"
                )
            if made is not None:
                made_pod = pods.decode(made)
                made_reservation = made_pod.reservation if made_pod is not None else None
                if created and made_reservation is not None:
                    self._step(
                        dataclasses.replace(made_reservation, phase=ReservationPhase.CREATING),
                        "ReservationCreated",
                        f"reserving a GPU on {node} for GPU group {group}",
                    )
                # The watch may already have shown a newer state of this pod (its UUID, even) than the create's
                # answer: the answer only fills in a reservation the watch has not shown yet.
                if group not in self.reservations and made_pod is not None:
                    self.observe(made_pod)
        current = self.reservations.get(group)
        if current is not None and current.phase is ReservationPhase.READY and current.uuid:
            return Reserved(group=group, uuid=current.uuid, index=current.index, created=created)
        if current is not None and current.phase is ReservationPhase.DRAINING:
            return NotReserved(
                group=group,
                node=node,
                reason="ReservationDraining",
                message=f"the reservation pod of GPU group {group} on {node} is still being deleted",
            )
        waiter = self._ready.get(group)
        if waiter is None or waiter.done():
            waiter = asyncio.get_running_loop().create_future()
            self._ready[group] = waiter
        started = self.waiting_since_s.get(group, self._clock_s())
        left = max(0.0, self.settings.uuid_timeout_s - (self._clock_s() - started))
        try:
            reservation = await asyncio.wait_for(asyncio.shield(waiter), timeout=left)
        except TimeoutError:
            reservation = None
        finally:
            if self._ready.get(group) is waiter and waiter.done():
                self._ready.pop(group, None)
        if reservation is not None and reservation.phase is ReservationPhase.READY and reservation.uuid:
            return Reserved(group=group, uuid=reservation.uuid, index=reservation.index, created=created)
        stuck = self.reservations.get(group)
        why = (
            stuck.failed
            if stuck is not None and stuck.failed
            else f"no device UUID within {self.settings.uuid_timeout_s:g} s"
        )
        if stuck is not None:
            await self._delete(stuck, "ReservationTimedOut", f"deleted: {why}")
        return NotReserved(
            group=group,
            node=node,
            reason="ReservationFailed" if stuck is not None and stuck.failed else "ReservationTimeout",
            message=f"the reservation pod on {node} for GPU group {group} failed: {why}",
        )

    # --- reconciliation ---

    def note_sharers(self, sharers: Mapping[str, tuple[gpugroups.Sharer, ...]]) -> None:
        """Track since when each reservation has had no sharing pod (the drain grace counts from then)."""
        now = self._clock_s()
        for group in self.reservations:
            if sharers.get(group):
                self.idle_since_s.pop(group, None)
            else:
                self.idle_since_s.setdefault(group, now)

    def plan(self, sharers: Mapping[str, tuple[gpugroups.Sharer, ...]]) -> list[gpugroups.Action]:
        self.note_sharers(sharers)
        return gpugroups.reconcile(
            self.reservations,
            sharers,
            busy=self.busy,
            waiting_since_s=self.waiting_since_s,
            idle_since_s=self.idle_since_s,
            now_s=self._clock_s(),
            limits=self.settings.limits,
        )

    async def drain(self, action: gpugroups.Action) -> None:
        if action.reservation is not None:
            reason = "ReservationReleased" if action.kind is gpugroups.ActionKind.DRAIN else "ReservationTimedOut"
            await self._delete(action.reservation, reason, action.message)

    async def _delete(self, reservation: Reservation, reason: str, message: str) -> None:
        self._step(dataclasses.replace(reservation, phase=ReservationPhase.DRAINING), reason, message)
        try:
            await self._api.delete(
                kubeapi.PODS, name=reservation.name, namespace=reservation.namespace, uid=reservation.uid or None
            )
            self.deleted += 1
        except KubeNotFound:
            pass
        except KubeError as exc:
            log.warning("reservation_delete_failed", pod=reservation.name, error=str(exc))
            return
        current = self.reservations.get(reservation.group)
        if current is not None and current.uid == reservation.uid:
            self.reservations[reservation.group] = dataclasses.replace(current, phase=ReservationPhase.DRAINING)

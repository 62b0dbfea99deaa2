"""GPU groups as the cluster state shows them, and what to do when a group and its reservation pod are out of line.

A GPU group is one shared device: the sharing pods that were placed on it (its *sharers*: bound or being bound, not
finished) and the reservation pod that holds the device for them. :class:`Sharers` reads the sharers of every group
from the state (reusing each pod's reading while its record and assumption are the very same objects, since this
runs every half second over every share of the cluster); :func:`reconcile` decides, as plain values, what brings
reservations and groups back in line: drain a reservation whose last pod ended, delete one stuck without a UUID,
reserve again for a group whose reservation vanished before its pods started, and evict (or report) a running share
whose reservation vanished. ``scheduler.sharing`` carries the decisions out.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from scheduler.objects.records import Phase, PodRecord, Reservation, ReservationPhase
from scheduler.state import holdings
from scheduler.state.cache import Assumption, ClusterState


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sharer:
    """A pod of a GPU group as the scheduler's state shows it: bound (or being bound) and not finished."""

    uid: str
    namespace: str
    name: str
    node: str
    started: bool
    """Its containers run (phase Running): too late to hand it another device."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Reading:
    pod: PodRecord
    assumption: Assumption | None
    found: tuple[Sharer, tuple[str, ...]] | None


def _read(pod: PodRecord, assumption: Assumption | None) -> tuple[Sharer, tuple[str, ...]] | None:
    """The pod as a member of its GPU groups, or None when it is in none, not placed, or finished."""
    holding = holdings.of(pod, assumption)
    if not holding.gpu_groups or pod.terminated or not holding.node:
        return None
    sharer = Sharer(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node=holding.node,
        started=pod.phase is Phase.RUNNING,
    )
    return sharer, holding.gpu_groups


class Sharers:
    """The sharers of every GPU group, read from one ``ClusterState``."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._readings: dict[str, _Reading] = {}

    def by_group(self) -> dict[str, tuple[Sharer, ...]]:
        """The pods of every GPU group: bound or being bound, not finished."""
        found: dict[str, list[Sharer]] = {}
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
                reading = _Reading(pod=pod, assumption=assumption, found=_read(pod, assumption))
            readings[uid] = reading
            if reading.found is not None:
                sharer, groups = reading.found
                for group in groups:
                    found.setdefault(group, []).append(sharer)
        self._readings = readings
        return {group: tuple(members) for group, members in found.items()}


class ActionKind(enum.StrEnum):
    DRAIN = "drain"
    """No pod shares the group any more: delete the reservation pod."""
    EXPIRE = "expire"
    """No UUID within the timeout, or the pod failed: delete it (a waiting bind fails and is retried elsewhere)."""
    RE_RESERVE = "re-reserve"
    """The reservation vanished under a sharing pod that has not started: create it again."""
    EVICT_ORPHAN = "evict-orphan"
    """The reservation vanished under a running sharing pod: nothing holds its device any more."""
    REPORT_ORPHAN = "report-orphan"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    group: str
    node: str
    message: str
    reservation: Reservation | None = None
    sharer: Sharer | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How long a reservation may wait for its UUID, how long one without sharers is kept, and what a running share
    whose reservation vanished gets."""

    uuid_timeout_s: float = 60.0
    drain_grace_s: float = 2.0
    evict_orphans: bool = True


def reconcile(
    reservations: Mapping[str, Reservation],
    sharers: Mapping[str, tuple[Sharer, ...]],
    *,
    busy: frozenset[str],
    waiting_since_s: Mapping[str, float],
    idle_since_s: Mapping[str, float],
    now_s: float,
    limits: Limits,
) -> list[Action]:
    """The actions that bring reservations and their groups back in line.

    ``busy`` groups are being reserved or bound right now (the binder owns them until it is done);
    ``waiting_since_s`` says since when each reservation waits for its UUID, ``idle_since_s`` since when each has had
    no sharing pod (both in the caller's monotonic clock)."""
    actions: list[Action] = []
    for group, reservation in sorted(reservations.items()):
        if reservation.phase in (ReservationPhase.DRAINING, ReservationPhase.DELETED) or group in busy:
            continue
        if reservation.failed is not None:
            actions.append(_expire(reservation, reservation.failed))
            continue
        if reservation.phase is ReservationPhase.WAITING_FOR_UUID:
            since = waiting_since_s.get(group, now_s)
            if now_s - since >= limits.uuid_timeout_s:
                actions.append(
                    _expire(
                        reservation,
                        f"no device UUID after {now_s - since:.0f} s (timeout {limits.uuid_timeout_s:g} s)",
                    )
                )
                continue
        if not sharers.get(group):
            idle = idle_since_s.get(group, now_s)
            if now_s - idle >= limits.drain_grace_s:
                actions.append(
                    Action(
                        kind=ActionKind.DRAIN,
                        group=group,
                        node=reservation.node,
                        message=f"the last pod sharing GPU group {group} is gone: releasing the device",
                        reservation=reservation,
                    )
                )
    for group, members in sorted(sharers.items()):
        if group in busy or not members:
            continue
        held = reservations.get(group)
        if held is not None and held.phase is not ReservationPhase.DELETED:
            continue
        pending = [member for member in members if not member.started]
        if pending and len(pending) == len(members):
            actions.append(
                Action(
                    kind=ActionKind.RE_RESERVE,
                    group=group,
                    node=pending[0].node,
                    message=f"reservation of GPU group {group} vanished before its pods started: reserving anew",
                    sharer=pending[0],
                )
            )
            continue
        for member in members:
            if not member.started:
                continue  # it follows its running neighbours: the group's device is lost for all of them
            orphan_kind = ActionKind.EVICT_ORPHAN if limits.evict_orphans else ActionKind.REPORT_ORPHAN
            actions.append(
                Action(
                    kind=orphan_kind,
                    group=group,
                    node=member.node,
                    message=(
                        f"the reservation pod holding GPU group {group} on {member.node} is gone: nothing keeps its "
                        "device from being given to another pod"
                        + ("; deleting the pod" if limits.evict_orphans else "")
                    ),
                    sharer=member,
                )
            )
    return actions


def _expire(reservation: Reservation, why: str) -> Action:
    return Action(
        kind=ActionKind.EXPIRE,
        group=reservation.group,
        node=reservation.node,
        message=f"reservation {reservation.name} on {reservation.node} deleted: {why}",
        reservation=reservation,
    )

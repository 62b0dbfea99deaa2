"""Making room for a group by evicting: the one procedure reclaim, preemption and consolidation share.

A pending group's minimum did not fit; candidate victim units are taken in victim order (``victims``) and evicted
one after another until the minimum fits; the units that turned out unnecessary are then dropped again (each is
tried without, in order), so what stays evicted is a small set. Everything happens on the ``Draft`` under one
checkpoint, so a failed attempt leaves no trace. A successful one keeps the evictions and *reserves* the room for
the group (``plan.Kind.RESERVE``): no other group takes it for the rest of the cycle, the plan *nominates* the
group's pods to it (``Plan.nominations``, Kubernetes' ``nominatedNodeName``), and the next cycles place nominated
groups before any other, so a moved or reclaimed pod coming back cannot take the room again (without this, two
groups can trade the same room back and forth forever). With ``moves`` (consolidation) every evicted pod must be
placed again elsewhere in the same plan (``plan.Kind.MOVE``), or nothing is moved.

The search is bounded: victim units are sorted once per cycle (``Scene.candidates``), a unit is only evicted when it
would let a pod of the minimum fit on its node, at most ``_MAX_SCANNED`` candidates are looked at per group, and an
attempt that failed is not repeated for a group of the same shapes (and, for reclaim and preemption, the same queue
and priority) until some eviction changed the picture. Which units are candidates, and which of them are eligible,
is each action's business (``evictions``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from scheduler.placement import (
    decisions,
    devices,
    fairshare,
    gangs,
    model,
    nodework,
    ordering,
    plan,
    search,
    shapes,
    victims,
)

_MAX_UNITS = 64
"""At most this many victim units are evicted for one group: a bound on the work of one attempt."""
_MAX_MOVES = 8
"""Consolidation moves at most this many units for one group (KAI bounds its consolidation the same way)."""
_MAX_SCANNED = 1_000
"""At most this many candidate units are looked at for one group: on a large cluster the useful victims of a group
are among the first in victim order or nowhere, and a bound keeps a full cluster's cycle from growing with it."""


@dataclasses.dataclass(slots=True, kw_only=True)
class Scene:
    """What the room-making actions read and change during one cycle."""

    snapshot: model.Snapshot
    draft: plan.Draft
    searcher: search.Searcher
    pod_shapes: Mapping[model.PodUid, shapes.Shape]
    order: ordering.QueueOrder
    tree: fairshare.Tree
    running: Mapping[model.QueueName, Sequence[model.Group]]
    """Groups with running members, per leaf queue, in id order."""
    clock_matters: bool = False
    """Set when a decision depended on the time: a victim too young, a stale gang within its grace."""
    _sorted: dict[object, list[victims.Unit]] = dataclasses.field(default_factory=dict)
    _failures: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)

    def candidates(self, key: object, groups: Callable[[], list[model.Group]]) -> list[victims.Unit]:
        """The victim units of ``groups`` (preemptible ones only) in victim order, computed once per cycle.

        Units are cut before any eviction of this cycle; ``make_room`` skips pods evicted since.
        """
        found = self._sorted.get(key)
        if found is None:
            found = sorted(
                (unit for group in groups() if group.preemptible for unit in victims.units(group, ())),
                key=lambda unit: unit.order_key,
            )
            self._sorted[key] = found
        return found

    def failed_before(self, key: tuple[object, ...]) -> bool:
        """Did an attempt with this key fail with no eviction made since (so it would fail again)?"""
        return self._failures.get(key) == len(self.draft.evictions)

    def note_failure(self, key: tuple[object, ...]) -> None:
        self._failures[key] = len(self.draft.evictions)

    def old_enough(self, unit: victims.Unit, min_runtime_ns: int) -> bool:
        """The min-runtime check, noting that the answer depends on the time."""
        if min_runtime_ns <= 0:
            return True
        if victims.old_enough(unit, now_ns=self.snapshot.now_ns, min_runtime_ns=min_runtime_ns):
            return True
        self.clock_matters = True
        return False


def _useful(scene: Scene, minimum: Sequence[model.Pod]) -> Callable[[victims.Unit], bool]:
    """A unit is worth evicting when, on one of its nodes that the minimum may use, the room it leaves behind
    (with what is free there already) would hold at least one pod of the minimum."""
    searcher = scene.searcher
    cap = searcher.capacity
    wanted = list(dict.fromkeys(scene.pod_shapes[pod.uid] for pod in minimum))
    eligible = [frozenset(searcher.eligible(shape.constraints)) for shape in wanted]
    wants_gpu = any(shape.wants_gpu for shape in wanted)

    def check(unit: victims.Unit) -> bool:
        if wants_gpu and unit.amounts.milli_gpu == 0:
            return False
        freed: dict[model.NodeName, list[model.Pod]] = {}
        for pod in unit.pods:
            if pod.node is not None and pod.uid not in scene.draft.evicted:
                freed.setdefault(pod.node, []).append(pod)
        for name, pods in freed.items():
            work = cap.by_name.get(name)
            if work is None:
                continue
            for shape, classes in zip(wanted, eligible, strict=True):
                if work.cls in classes and _would_fit(work, pods, shape):
                    return True
        return False

    return check


def _would_fit(work: nodework.NodeWork, leaving: Sequence[model.Pod], shape: shapes.Shape) -> bool:
    """Would a pod of ``shape`` fit on the node once ``leaving`` are gone (by requests; a quick upper bound)?"""
    cpu = work.free_cpu + sum(pod.requests.milli_cpu for pod in leaving)
    memory = work.free_mem + sum(pod.requests.memory_bytes for pod in leaving)
    slots = work.free_pods + len(leaving)
    if cpu < shape.milli_cpu or memory < shape.memory_bytes or slots < shape.pods:
        return False
    room = list(work.dev_free)
    whole = list(work.dev_whole)
    for pod in leaving:
        for device in pod.devices:
            if device >= len(room):
                continue
            if pod.share is None:
                room[device], whole[device] = devices.FULL, True
            else:
                room[device] = min(devices.FULL, room[device] + pod.allotted_milli_gpu)
    if shape.whole_gpus:
        return sum(whole) >= shape.whole_gpus
    if shape.share is not None:
        per_device = work.share_on_each(shape.share)
        return sum(1 for device, free in enumerate(room) if free >= per_device[device]) >= shape.share.devices
    return True


def _evict_unit(scene: Scene, unit: victims.Unit, *, reason: decisions.EvictionReason, beneficiary: model.Group) -> int:
    """Evict the unit's pods not evicted yet; returns the GPU (milli) they held."""
    freed = 0
    message = f"{reason.value} for {beneficiary.id} (queue {beneficiary.queue}, priority {beneficiary.priority})"
    for pod in unit.pods:
        if pod.uid in scene.draft.evicted:
            continue
        scene.draft.evict(pod, unit.group, reason=reason, beneficiary=beneficiary.id, message=message)
        freed += plan.pod_amounts(pod).milli_gpu
    return freed


def make_room(
    scene: Scene,
    *,
    group: model.Group,
    minimum: Sequence[model.Pod],
    candidates: Iterable[victims.Unit],
    reason: decisions.EvictionReason,
    eligible: Callable[[victims.Unit], bool],
    budget: int | None = None,
    moves: bool = False,
) -> bool:
    """Evict units from ``candidates`` (in victim order) until ``minimum`` fits; see the module docstring.

    ``eligible`` is asked again before each eviction (earlier evictions change queues' standing). ``budget`` caps
    the GPU (milli) evicted. With ``moves`` every evicted pod must be placed again.
    """
    draft = scene.draft
    start = draft.checkpoint()
    useful = _useful(scene, minimum)
    limit = _MAX_MOVES if moves else _MAX_UNITS
    wanted = frozenset(collections.Counter(scene.pod_shapes[pod.uid] for pod in minimum).items())
    # Consolidation does not depend on the group's queue; reclaim and preemption do (standing, priority).
    memo = (reason, wanted) if moves else (reason, group.queue, group.priority, wanted)
    if scene.failed_before(memo):
        return False

    def attempt(chosen: Sequence[victims.Unit]) -> bool:
        draft.rollback(start)
        for unit in chosen:
            _evict_unit(scene, unit, reason=reason, beneficiary=group)
        if gangs.try_place(
            draft=draft,
            searcher=scene.searcher,
            group=group,
            pods=minimum,
            pod_shapes=scene.pod_shapes,
            kind=plan.Kind.RESERVE,
        ):
            return False
        return not moves or _replace_moved(scene, chosen)

    chosen: list[victims.Unit] = []
    freed = 0
    fitted = False
    for scanned, unit in enumerate(candidates):
        if len(chosen) >= limit or scanned >= _MAX_SCANNED:
            break
        if unit.group.id == group.id or all(pod.uid in draft.evicted for pod in unit.pods):
            continue
        if budget is not None and freed + unit.amounts.milli_gpu > budget:
            continue
        if not eligible(unit) or not useful(unit):
            continue
        freed += _evict_unit(scene, unit, reason=reason, beneficiary=group)
        chosen.append(unit)
        probe = draft.checkpoint()
        if gangs.try_place(
            draft=draft,
            searcher=scene.searcher,
            group=group,
            pods=minimum,
            pod_shapes=scene.pod_shapes,
            kind=plan.Kind.RESERVE,
        ) is None and (not moves or _replace_moved(scene, chosen)):
            fitted = True
            break
        draft.rollback(probe)
    if not fitted:
        draft.rollback(start)
        scene.note_failure(memo)
        return False
    # Drop the units that were not needed after all, in the order they were chosen.
    needed = list(chosen)
    last_ok = True
    for unit in chosen:
        trial = [other for other in needed if other is not unit]
        if attempt(trial):
            needed = trial
            last_ok = True
        else:
            last_ok = False
    if not last_ok and not attempt(needed):
        draft.rollback(start)
        return False
    return True


def _replace_moved(scene: Scene, chosen: Sequence[victims.Unit]) -> bool:
    """Place every pod of the moved units again (``Kind.MOVE``); False when one finds no room."""
    draft = scene.draft
    for unit in chosen:
        for pod in unit.pods:
            if pod.uid not in draft.evicted or pod.uid in draft.placed:
                continue
            shape = scene.pod_shapes.get(pod.uid) or shapes.shape_of(pod)
            choice = scene.searcher.find(shape)
            if choice is None:
                return False
            draft.place(pod, unit.group, choice, kind=plan.Kind.MOVE)
            draft.set_moved_to(pod.uid, choice.work.name)
    return True

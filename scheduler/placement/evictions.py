"""Making room by evicting: reclaim, preempt, consolidate, and stale-gang eviction.

All three room-making actions share one shape: a pending group's minimum did not fit; candidate victim units are
taken in victim order (``victims``) and evicted one after another until the minimum fits; the units that turned
out unnecessary are then dropped again (each is tried without, in order), so what stays evicted is a small set.
Everything happens on the ``Draft`` under one checkpoint, so a failed attempt leaves no trace. A successful one
keeps the evictions and *reserves* the room for the group (``plan.Kind.RESERVE``): no other group takes it for the
rest of the cycle, the plan *nominates* the group's pods to it (``Plan.nominations``, Kubernetes'
``nominatedNodeName``), and the next cycles place nominated groups before any other, so a moved or reclaimed pod
coming back cannot take the room again (without this, two groups can trade the same room back and forth forever).

The search is bounded: victim units are sorted once per cycle, a unit is only evicted when it would let a pod of the
minimum fit on its node, at most ``_MAX_SCANNED`` candidates are looked at per group, and an attempt that failed is
not repeated for a group of the same shapes (and, for reclaim and preemption, the same queue and priority) until
some eviction changed the picture.

- **reclaim**: the group's queue stays within its fair share with the minimum added; victims are preemptible units
  of other queues whose side of the tree (the child of the lowest common ancestor) holds more than its fair share;
  one reclaim never evicts more than ``reclaim_eviction_multiple`` times the GPU (or CPU) it frees for the group.
- **preempt**: inside the same leaf queue, preemptible units of strictly lower priority.
- **consolidate**: preemptible units of any queue, each of whose pods must be placed again elsewhere in the same
  plan (``plan.Kind.MOVE``); otherwise nothing is moved.
- **stale gangs**: a running gang below its minimum for longer than the grace period is evicted whole.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from scheduler.placement import (
    capacity,
    decisions,
    devices,
    fairshare,
    gangs,
    model,
    ordering,
    plan,
    search,
    status,
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
    shapes: Mapping[model.PodUid, search.Shape]
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
    shapes = list(dict.fromkeys(scene.shapes[pod.uid] for pod in minimum))
    eligible = [frozenset(searcher.eligible(shape.constraints)) for shape in shapes]
    wants_gpu = any(shape.wants_gpu for shape in shapes)

    def check(unit: victims.Unit) -> bool:
        if wants_gpu and unit.amounts[0] == 0:
            return False
        freed: dict[model.NodeName, list[model.Pod]] = {}
        for pod in unit.pods:
            if pod.node is not None and pod.uid not in scene.draft.evicted:
                freed.setdefault(pod.node, []).append(pod)
        for name, pods in freed.items():
            work = cap.by_name.get(name)
            if work is None:
                continue
            for shape, classes in zip(shapes, eligible, strict=True):
                if work.cls in classes and _would_fit(work, pods, shape):
                    return True
        return False

    return check


def _would_fit(work: capacity.NodeWork, leaving: Sequence[model.Pod], shape: search.Shape) -> bool:
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
        per_device = devices.share_on_each(shape.share, work)
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
        freed += plan.pod_amounts(pod)[0]
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
    shapes = frozenset(collections.Counter(scene.shapes[pod.uid] for pod in minimum).items())
    # Consolidation does not depend on the group's queue; reclaim and preemption do (standing, priority).
    memo = (reason, shapes) if moves else (reason, group.queue, group.priority, shapes)
    if scene.failed_before(memo):
        return False

    def attempt(chosen: Sequence[victims.Unit]) -> bool:
        draft.rollback(start)
        for unit in chosen:
            _evict_unit(scene, unit, reason=reason, beneficiary=group)
        if gangs.try_place(
            draft=draft, searcher=scene.searcher, group=group, pods=minimum, shapes=scene.shapes, kind=plan.Kind.RESERVE
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
        if budget is not None and freed + unit.amounts[0] > budget:
            continue
        if not eligible(unit) or not useful(unit):
            continue
        freed += _evict_unit(scene, unit, reason=reason, beneficiary=group)
        chosen.append(unit)
        probe = draft.checkpoint()
        if gangs.try_place(
            draft=draft, searcher=scene.searcher, group=group, pods=minimum, shapes=scene.shapes, kind=plan.Kind.RESERVE
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
            shape = scene.shapes.get(pod.uid) or search.shape_of(pod)
            choice = scene.searcher.find(shape)
            if choice is None:
                return False
            draft.place(pod, unit.group, choice, kind=plan.Kind.MOVE)
            draft.set_moved_to(pod.uid, choice.work.name)
    return True


# --- the three actions ---------------------------------------------------------------------------------------


def _everyone(scene: Scene) -> list[victims.Unit]:
    """Every preemptible running unit of every queue, in victim order."""
    return scene.candidates("all", lambda: [group for leaf in sorted(scene.running) for group in scene.running[leaf]])


def reclaim(scene: Scene, group: model.Group, minimum: Sequence[model.Pod], amounts: plan.Amounts) -> bool:
    """Take back room from queues over their fair share for a group whose queue stays within its own.

    Shares are compared where the two sides meet: below the lowest common ancestor of the reclaimer's queue and the
    victim's, the reclaimer's side must stay within its fair share with the minimum added, at every level, and the
    victim's side must hold more than its fair share.
    """
    tree = scene.tree
    mine = tree.ancestors(group.queue)
    queues = scene.snapshot.queues
    usage = scene.draft.usage
    config = scene.snapshot.config
    order = scene.order
    wants_gpu = amounts[0] > 0
    resource = 0 if wants_gpu else 1

    def within_fair_share(names: Sequence[model.QueueName]) -> bool:
        for name in names:
            held = usage.allocated[name]
            fair = order.fair(name)
            if any(amounts[i] > 0 and held[i] + amounts[i] > fair[i] for i in range(3)):
                return False
        return True

    if not within_fair_share(mine[:1]):
        return False

    def over_share(leaf: model.QueueName) -> bool:
        theirs = tree.ancestors(leaf)
        meet = next((index for index, name in enumerate(theirs) if name in mine), len(theirs))
        side = theirs[meet - 1]
        return usage.allocated[side][resource] > order.fair(side)[resource]

    # Only queues whose side holds more than its fair share can give anything back: look at no other.
    givers = {leaf for leaf in scene.running if leaf not in mine and over_share(leaf)}
    if not givers:
        return False
    candidates = (unit for unit in _everyone(scene) if unit.group.queue in givers)

    def eligible(unit: victims.Unit) -> bool:
        queue = queues.get(unit.group.queue)
        if queue is None or not scene.old_enough(unit, queue.reclaim_min_runtime_ns):
            return False
        theirs = tree.ancestors(unit.group.queue)
        meet = next((index for index, name in enumerate(theirs) if name in mine), len(theirs))
        side = theirs[meet - 1]
        below = mine[: mine.index(theirs[meet])] if meet < len(theirs) else mine
        if not within_fair_share(below):
            return False
        return usage.allocated[side][resource] > order.fair(side)[resource]

    budget = config.reclaim_eviction_multiple * amounts[resource] if wants_gpu else None
    return make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.RECLAIM,
        eligible=eligible,
        budget=budget,
    )


def preempt(scene: Scene, group: model.Group, minimum: Sequence[model.Pod]) -> bool:
    """Evict strictly lower-priority preemptible work of the same queue."""
    queue = scene.snapshot.queues.get(group.queue)
    if queue is None:
        return False
    same_queue = scene.candidates(("queue", group.queue), lambda: list(scene.running.get(group.queue, ())))
    candidates = (unit for unit in same_queue if unit.group.priority < group.priority)
    return make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.PREEMPT,
        eligible=lambda unit: scene.old_enough(unit, queue.preempt_min_runtime_ns),
    )


def consolidate(scene: Scene, group: model.Group, minimum: Sequence[model.Pod]) -> bool:
    """Move preemptible pods elsewhere so the group fits; only if every moved pod finds a new place."""
    candidates = _everyone(scene)
    queues = scene.snapshot.queues

    def eligible(unit: victims.Unit) -> bool:
        queue = queues.get(unit.group.queue)
        return queue is not None and scene.old_enough(unit, queue.preempt_min_runtime_ns)

    return make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.CONSOLIDATE,
        eligible=eligible,
        moves=True,
    )


def stale_gangs(scene: Scene, candidates: Sequence[model.Group]) -> None:
    """Evict whole every running gang that has been below its minimum for longer than the grace period."""
    now = scene.snapshot.now_ns
    grace = scene.snapshot.config.stale_gang_grace_ns
    for group in candidates:
        since = group.below_min_since_ns
        if since is None:
            continue
        if now - since < grace:
            scene.clock_matters = True
            continue
        satisfied = sum(
            1
            for pod in group.members
            if pod.phase is model.PodPhase.SUCCEEDED
            or (pod.phase is model.PodPhase.RUNNING and pod.uid not in scene.draft.evicted)
        )
        if satisfied >= group.min_member:
            continue
        scene.clock_matters = True  # the message counts the seconds
        seconds = (now - since) // 1_000_000_000
        message = (
            f"gang {group.id} has had {satisfied} of its {group.min_member} members for {seconds}s "
            f"(grace {grace // 1_000_000_000}s)"
        )
        for pod in sorted(group.members, key=lambda pod: pod.uid):
            if pod.phase is model.PodPhase.RUNNING and pod.uid not in scene.draft.evicted:
                scene.draft.evict(
                    pod, group, reason=decisions.EvictionReason.STALE_GANG, beneficiary=None, message=message
                )


def waiting_status(reason: decisions.EvictionReason, group: model.Group, draft: plan.Draft) -> status.Status:
    """The status of a group that evictions were issued for."""
    count = sum(1 for eviction in draft.evictions if eviction.beneficiary == group.id)
    code = {
        decisions.EvictionReason.RECLAIM: status.Reason.WAITING_FOR_RECLAIM,
        decisions.EvictionReason.PREEMPT: status.Reason.WAITING_FOR_PREEMPTION,
        decisions.EvictionReason.CONSOLIDATE: status.Reason.WAITING_FOR_CONSOLIDATION,
    }[reason]
    return status.waiting(code, f"{count} pod(s) are being evicted to make room ({reason.value}); placed once they go")

"""The room-making actions: reclaim, preempt, consolidate, and stale-gang eviction.

Reclaim, preempt and consolidate each choose which running units may go for a pending group whose minimum (or an
elastic pod beyond it) did not fit, and hand them to ``roommaking.make_room``, which accumulates victims per node
until a pod fits, moves the victims that fit elsewhere and evicts as few as it can:

- **reclaim**: KAI's two strategies over every resource the reclaimer asks for, and its saturation rule between
  departments (``reclaimable``); victims are preemptible units of other queues. Optionally one reclaim never evicts
  more than ``reclaim_eviction_multiple`` times the GPU (or CPU) it frees for the group (off by default, as in KAI).
- **preempt**: inside the same leaf queue, preemptible units of strictly lower priority.
- **consolidate**: for a preemptible group, preemptible units of any queue, each of whose pods must be placed again
  elsewhere in the same plan; otherwise nothing is moved (KAI consolidates for preemptible jobs only).
- **stale gangs**: a running gang below its minimum, or with a subgroup below its own, for longer than the grace
  period (the group's own, else the configured one; negative: never) is evicted whole.

A group within its preemption delay (``Group.evictions_from_ns``) evicts no one: the cycle does not ask these
actions for it.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterator, Sequence

from common.resources import Resources
from scheduler.placement import (
    decisions,
    gangs,
    model,
    plan,
    reclaimable,
    roommaking,
    roomscene,
    status,
    subgroups,
    victims,
)


def _all_groups(scene: roomscene.Scene) -> list[model.Group]:
    return [group for leaf in sorted(scene.running) for group in scene.running[leaf]]


def _everyone(scene: roomscene.Scene) -> Iterator[victims.Unit]:
    """Every preemptible running unit of every queue, in victim order (from the first not evicted yet)."""
    return scene.candidates("all", lambda: _all_groups(scene))


def reclaim(scene: roomscene.Scene, group: model.Group, pods: Sequence[model.Pod], amounts: Resources) -> str | None:
    """Take back room from other queues for ``pods`` (a minimum or an elastic pod); see ``reclaimable``.

    Returns None when room was made, else why not (in numbers, for the group's status).
    """
    tree = scene.tree
    draft = scene.draft
    rules = reclaimable.Reclaimer(
        tree=tree,
        shares=scene.shares,
        usage=draft.usage,
        group=group,
        amounts=amounts,
        version=lambda: draft.version,
    )
    if not rules.may_reclaim():
        return rules.refusal
    givers = rules.givers([leaf for leaf in scene.running if leaf != group.queue])
    if not givers:
        return rules.refusal
    queues = tree.queues

    def eligible(unit: victims.Unit) -> bool:
        queue = queues.get(unit.group.queue)
        if queue is None or not scene.old_enough(unit, queue.reclaim_min_runtime_ns):
            return False
        # A victim that would take its queue below its floor is one only if it can move (it keeps counting then).
        return rules.eligible(unit) and (
            rules.keeps_floor(unit, scene.draft.evicted) or roommaking.movable(scene, unit)
        )

    multiple = scene.snapshot.config.reclaim_eviction_multiple
    budget: int | None = None
    if multiple > 0 and amounts.milli_gpu > 0:
        budget = multiple * amounts.milli_gpu

    def floor_refused(unit: victims.Unit) -> bool:
        # What of ``eligible`` leaves a reason: the floor check, asked where ``eligible`` asks it.
        return (
            queues.get(unit.group.queue) is not None
            and rules.eligible(unit)
            and not rules.keeps_floor(unit, scene.draft.evicted)
        )

    def quiet(queue: model.QueueName, most: Resources) -> bool:
        # ``floor_refused`` of every unit of the queue holding no more than ``most`` is False (taking less of each
        # resource breaks no floor that taking more keeps).
        return queues.get(queue) is None or not rules.gives(queue) or not rules.breaks_floor(queue, most)

    kinds = scene.kinds

    def alike(unit: victims.Unit) -> Hashable:
        # What ``eligible`` reads of a unit (no min-runtime in play): its queue, what its live pods hold, their shapes;
        # as a small number per kind (``Scene.kind``: the searches hash it many times).
        live = victims.live_pods(unit, scene.draft.evicted)
        if live is unit.pods:
            key = kinds.get(id(unit))
            if key is None:
                key = kinds[id(unit)] = scene.kind(
                    (unit.group.queue, unit.amounts, tuple(scene.shape(pod) for pod in live))
                )
            return key
        return scene.kind(
            (unit.group.queue, victims.live_amounts(unit, scene.draft.evicted), tuple(scene.shape(p) for p in live))
        )

    units, start = scene.listed("all", lambda: _all_groups(scene))
    candidates = roomscene.Listed(
        key="all",
        units=units,
        start=start,
        queues=frozenset(givers),
        alike=alike,
        reasons=floor_refused,
        quiet=quiet,
    )
    # A min-runtime makes ``eligible`` note when a victim comes of age: only the walk asks it of every candidate.
    timed = any(queue.reclaim_min_runtime_ns > 0 for name in givers if (queue := queues.get(name)) is not None)
    done = roommaking.make_room(
        scene,
        group=group,
        minimum=pods,
        candidates=candidates.candidates() if timed else candidates,
        reason=decisions.EvictionReason.RECLAIM,
        eligible=eligible,
        budget=budget,
        validate=rules.validate,
    )
    if done:
        return None
    return rules.refusal or "evicting every victim the queues allow would not make room for it"


def preempt(scene: roomscene.Scene, group: model.Group, pods: Sequence[model.Pod]) -> str | None:
    """Evict strictly lower-priority preemptible work of the same queue; None when room was made."""
    queue = scene.tree.queues.get(group.queue)
    if queue is None:
        return "its queue does not exist"
    same_queue = scene.candidates(("queue", group.queue), lambda: list(scene.running.get(group.queue, ())))
    candidates = (unit for unit in same_queue if unit.group.priority < group.priority)
    done = roommaking.make_room(
        scene,
        group=group,
        minimum=pods,
        candidates=candidates,
        reason=decisions.EvictionReason.PREEMPT,
        eligible=lambda unit: scene.old_enough(unit, queue.preempt_min_runtime_ns),
    )
    return None if done else f"no lower-priority work of queue {group.queue} would make room"


def consolidate(scene: roomscene.Scene, group: model.Group, pods: Sequence[model.Pod]) -> str | None:
    """Move preemptible pods elsewhere so the group fits; only if every moved pod finds a new place."""
    if not group.preemptible:
        return "only preemptible groups consolidate"
    queues = scene.tree.queues

    def eligible(unit: victims.Unit) -> bool:
        queue = queues.get(unit.group.queue)
        return queue is not None and scene.old_enough(unit, queue.preempt_min_runtime_ns)

    units, start = scene.listed("all", lambda: _all_groups(scene))
    # As a list of every queue's units: the walk then skips the nodes its window cannot make ready, and without a
    # min-runtime (``eligible`` then reads the queue alone) its steps for one pod are found node by node.
    candidates = roomscene.Listed(
        key="all",
        units=units,
        start=start,
        queues=frozenset(scene.positions("all", units).by_queue),
        every_queue=True,
        static=not any(queue.preempt_min_runtime_ns > 0 for queue in queues.values()),
    )
    done = roommaking.make_room(
        scene,
        group=group,
        minimum=pods,
        candidates=candidates,
        reason=decisions.EvictionReason.CONSOLIDATE,
        eligible=eligible,
        moves=True,
    )
    return None if done else "moving pods elsewhere would not make room"


def move_leftovers(scene: roomscene.Scene) -> None:
    """At the end of a cycle, move every pod evicted to make room that fits somewhere after all.

    Later evictions may have freed room an earlier victim fits in; moving it then costs nobody anything. A gang
    evicted whole moves whole or not at all; an elastic pod moves on its own.
    """
    draft = scene.draft
    making_room = (
        decisions.EvictionReason.RECLAIM,
        decisions.EvictionReason.PREEMPT,
        decisions.EvictionReason.CONSOLIDATE,
    )
    waiting: dict[model.GroupId, list[model.PodUid]] = {}
    for eviction in draft.evictions:
        if eviction.reason in making_room and eviction.pod not in draft.placed:
            waiting.setdefault(eviction.group, []).append(eviction.pod)
    if not waiting:
        return
    groups = {group.id: group for leaf in scene.running.values() for group in leaf}
    for group_id in sorted(waiting):
        group = groups.get(group_id)
        if group is None:
            continue
        members = {pod.uid: pod for pod in group.members}
        pods = [members[uid] for uid in waiting[group_id] if uid in members]
        for batch in move_batches(group, pods, draft.evicted):
            roommaking.move(scene, group, batch)


def move_batches(
    group: model.Group, pods: Sequence[model.Pod], evicted: Container[model.PodUid]
) -> list[tuple[model.Pod, ...]]:
    """The evicted ``pods`` of ``group`` that can only move together: all of them when the gang fell below its
    minimum; else, for a subgroup tree, the pods of each leaf left below its own minimum (a replica evicted whole);
    else one by one."""
    if gangs.below_minimum(group, evicted):
        return [tuple(pods)]
    if not group.subgroups:
        return [(pod,) for pod in pods]
    shape = subgroups.of(group)
    left = subgroups.leaf_counts(shape, group.members, evicted)
    batches: list[tuple[model.Pod, ...]] = []
    by_leaf: dict[str, list[model.Pod]] = {}
    for pod in pods:
        leaf = pod.subgroup
        if leaf is not None and shape.is_leaf(leaf) and left.get(leaf, 0) < shape.nodes[leaf].required:
            by_leaf.setdefault(leaf, []).append(pod)
        else:
            batches.append((pod,))
    return [tuple(leaf_pods) for _, leaf_pods in sorted(by_leaf.items())] + batches


def stale_gangs(scene: roomscene.Scene, candidates: Sequence[model.Group]) -> None:
    """Evict whole every running gang that has been below its minimum (or with a subgroup below its own) for longer
    than the grace period."""
    now = scene.snapshot.now_ns
    for group in candidates:
        since = group.below_min_since_ns
        grace = scene.snapshot.config.stale_gang_grace_ns if group.stale_grace_ns is None else group.stale_grace_ns
        if since is None or grace < 0:
            continue  # a negative grace (KAI's per-group stalenessGracePeriod) means never
        if now - since < grace:
            scene.wake_at(since + grace)
            continue
        short = gangs.below_minimum(group, scene.draft.evicted)
        if short is None:
            continue
        scene.clock_matters = True  # the message counts the seconds
        seconds = (now - since) // 1_000_000_000
        message = f"gang {group.id} has had {short} for {seconds}s (grace {grace // 1_000_000_000}s)"
        for pod in sorted(group.members, key=lambda pod: pod.uid):
            if pod.phase is model.PodPhase.RUNNING and pod.uid not in scene.draft.evicted:
                scene.draft.evict(
                    pod, group, reason=decisions.EvictionReason.STALE_GANG, beneficiary=None, message=message
                )


def waiting_status(
    reason: decisions.EvictionReason, group: model.Group, draft: plan.Draft, *, since: int = 0
) -> status.Status:
    """The status of a group that evictions were issued for (``since``: where in the draft's evictions its own
    begin; every eviction for a group is made by its one successful attempt of the cycle)."""
    mine = [eviction for eviction in draft.evictions[since:] if eviction.beneficiary == group.id]
    moved = sum(1 for eviction in mine if eviction.pod in draft.placed)
    code = {
        decisions.EvictionReason.RECLAIM: status.Reason.WAITING_FOR_RECLAIM,
        decisions.EvictionReason.PREEMPT: status.Reason.WAITING_FOR_PREEMPTION,
        decisions.EvictionReason.CONSOLIDATE: status.Reason.WAITING_FOR_CONSOLIDATION,
    }[reason]
    moving = f" ({moved} of them move elsewhere)" if moved else ""
    return status.waiting(
        code,
        f"{len(mine)} pod(s) are being evicted to make room ({reason.value}){moving}; placed once they go",
    )

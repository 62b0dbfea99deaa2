"""The room-making actions: reclaim, preempt, consolidate, and stale-gang eviction.

Reclaim, preempt and consolidate each choose which running units may go for a pending group whose minimum did not
fit, and hand them to ``roommaking.make_room``, which evicts as few of them as it can:

- **reclaim**: the group's queue stays within its fair share with the minimum added; victims are preemptible units
  of other queues whose side of the tree (the child of the lowest common ancestor) holds more than its fair share;
  one reclaim never evicts more than ``reclaim_eviction_multiple`` times the GPU (or CPU) it frees for the group.
- **preempt**: inside the same leaf queue, preemptible units of strictly lower priority.
- **consolidate**: preemptible units of any queue, each of whose pods must be placed again elsewhere in the same
  plan; otherwise nothing is moved.
- **stale gangs**: a running gang below its minimum for longer than the grace period is evicted whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.resources import Resources
from scheduler.placement import decisions, fairshare, model, plan, roommaking, status, victims


def _everyone(scene: roommaking.Scene) -> list[victims.Unit]:
    """Every preemptible running unit of every queue, in victim order."""
    return scene.candidates("all", lambda: [group for leaf in sorted(scene.running) for group in scene.running[leaf]])


def reclaim(scene: roommaking.Scene, group: model.Group, minimum: Sequence[model.Pod], amounts: Resources) -> bool:
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
    wants_gpu = amounts.milli_gpu > 0
    # What decides who holds more than their share, and what the eviction budget counts: GPU, or CPU for CPU work.
    resource = fairshare.Kind.GPU if wants_gpu else fairshare.Kind.CPU

    def within_fair_share(names: Sequence[model.QueueName]) -> bool:
        for name in names:
            held = usage.allocated[name]
            fair = order.fair(name)
            for kind in fairshare.KINDS:
                want = fairshare.amount(amounts, kind)
                if want > 0 and fairshare.amount(held, kind) + want > fairshare.amount(fair, kind):
                    return False
        return True

    if not within_fair_share(mine[:1]):
        return False

    def over_share(leaf: model.QueueName) -> bool:
        theirs = tree.ancestors(leaf)
        meet = next((index for index, name in enumerate(theirs) if name in mine), len(theirs))
        side = theirs[meet - 1]
        return fairshare.amount(usage.allocated[side], resource) > fairshare.amount(order.fair(side), resource)

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
        return fairshare.amount(usage.allocated[side], resource) > fairshare.amount(order.fair(side), resource)

    budget = config.reclaim_eviction_multiple * fairshare.amount(amounts, resource) if wants_gpu else None
    return roommaking.make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.RECLAIM,
        eligible=eligible,
        budget=budget,
    )


def preempt(scene: roommaking.Scene, group: model.Group, minimum: Sequence[model.Pod]) -> bool:
    """Evict strictly lower-priority preemptible work of the same queue."""
    queue = scene.snapshot.queues.get(group.queue)
    if queue is None:
        return False
    same_queue = scene.candidates(("queue", group.queue), lambda: list(scene.running.get(group.queue, ())))
    candidates = (unit for unit in same_queue if unit.group.priority < group.priority)
    return roommaking.make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.PREEMPT,
        eligible=lambda unit: scene.old_enough(unit, queue.preempt_min_runtime_ns),
    )


def consolidate(scene: roommaking.Scene, group: model.Group, minimum: Sequence[model.Pod]) -> bool:
    """Move preemptible pods elsewhere so the group fits; only if every moved pod finds a new place."""
    candidates = _everyone(scene)
    queues = scene.snapshot.queues

    def eligible(unit: victims.Unit) -> bool:
        queue = queues.get(unit.group.queue)
        return queue is not None and scene.old_enough(unit, queue.preempt_min_runtime_ns)

    return roommaking.make_room(
        scene,
        group=group,
        minimum=minimum,
        candidates=candidates,
        reason=decisions.EvictionReason.CONSOLIDATE,
        eligible=eligible,
        moves=True,
    )


def stale_gangs(scene: roommaking.Scene, candidates: Sequence[model.Group]) -> None:
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

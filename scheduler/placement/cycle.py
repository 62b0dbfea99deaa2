"""The actions of one cycle, in the configured order, and the status of every group left pending.

``Cycle`` lives only while ``engine.Engine.run`` runs; it reads the engine's caches it is handed (the groups'
``roster.Roster``, the ``search.Searcher``), never the engine itself. Allocate serves leaf queues in fair-share
order (``ordering.QueueOrder``; the order is recomputed only after something was placed, since a failure changes no
queue's standing) and inside a queue groups by priority then age; each group's minimum is one transaction on the
``Draft``; elastic extras come after every minimum. Consolidate, reclaim and preempt then work on the groups whose
minimum did not fit (``evictions``); stale-gang eviction looks at running gangs below their minimum.

``clock_matters`` tells the engine whether the plan depended on the time (a victim too young for its min-runtime,
a stale gang still within its grace): if not, the same state at a later time gives the same plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from common.resources import Resources
from scheduler.placement import (
    decisions,
    diagnosis,
    evictions,
    fairshare,
    gangs,
    model,
    ordering,
    plan,
    roommaking,
    roster,
    search,
    shapes,
    status,
)


@dataclasses.dataclass(slots=True)
class Failed:
    """A group whose minimum did not fit in allocate: what the later actions and the status need."""

    group: model.Group
    minimum: tuple[model.Pod, ...]
    amounts: Resources
    failure: gangs.Failure


class Cycle:
    """The state of one cycle (lives only during ``Engine.run``)."""

    def __init__(
        self,
        *,
        snapshot: model.Snapshot,
        draft: plan.Draft,
        tree: fairshare.Tree,
        shares: Mapping[model.QueueName, fairshare.Share],
        groups: roster.Roster,
        searcher: search.Searcher,
        offered: Resources,
        never_key: tuple[int, int],
    ) -> None:
        """``offered`` is what the cluster offers our queues; ``never_key`` what a ``NeverFits`` verdict depends on
        (the nodes' and the queues' versions)."""
        self.snapshot = snapshot
        self.draft = draft
        self.tree = tree
        self.shares = shares
        self.roster = groups
        self.searcher = searcher
        self.statuses: dict[model.GroupId, status.Status] = {}
        self.failed: list[Failed] = []
        self.elastic_waiting: list[tuple[model.Group, model.Pod]] = []
        self.summaries: dict[shapes.Shape, tuple[str, bool]] = {}
        self.scene: roommaking.Scene | None = None
        self.pod_shapes: dict[model.PodUid, shapes.Shape] = {}
        pending = set(groups.pending_queues())
        self.leaves = [name for name in tree.depth_first() if tree.is_leaf(name) and name in pending]
        self.never_key = never_key
        self.reference = groups.reference_memory
        self.order = ordering.QueueOrder(
            queue_tree=tree, shares=shares, usage=draft.usage, capacity=offered, leaves=self.leaves
        )
        self.explained: dict[shapes.Shape, tuple[status.Reason, str]] = {}

    def run(self) -> plan.Plan:
        self._reject_homeless()
        actions = self.snapshot.config.actions
        for action in actions:
            if action is model.Action.ALLOCATE:
                self._allocate()
            elif action is model.Action.STALE_GANG:
                self._stale_gangs()
            else:
                self._make_room(action)
        self._finish_statuses()
        return self.draft.finish(self.statuses, self.shares)

    @property
    def clock_matters(self) -> bool:
        return self.scene is not None and self.scene.clock_matters

    # --- allocate -----------------------------------------------------------------------------------------------

    def _reject_homeless(self) -> None:
        """Groups whose queue does not exist, or is not a leaf, get their status and are not tried."""
        for queue in self.roster.pending_queues():
            if queue in self.tree.queues and self.tree.is_leaf(queue):
                continue
            for group in self.roster.pending_groups(queue):
                if queue not in self.tree.queues:
                    message = f"queue {queue} does not exist"
                else:
                    message = f"queue {queue} is a parent queue; only leaf queues take workloads"
                self.statuses[group.id] = status.unschedulable(status.Reason.QUEUE_DOES_NOT_EXIST, message)

    def _shape(self, pod: model.Pod) -> shapes.Shape:
        found = self.pod_shapes.get(pod.uid)
        if found is None:
            found = self.roster.shape(pod)
            self.pod_shapes[pod.uid] = found
        return found

    def _allocate(self) -> None:
        groups = self.roster
        order = self.order
        pointers = dict.fromkeys(self.leaves, 0)
        extras: list[tuple[model.Group, tuple[model.Pod, ...]]] = []
        # Room made by evictions in earlier cycles goes to the groups it was made for, before anybody else.
        first = [group for group in groups.nominated_groups() if group.queue in pointers]
        for group in first:
            self._allocate_group(group, extras)
        done = {group.id for group in first}
        leaf = order.next()
        while leaf is not None:
            waiting = groups.pending_groups(leaf)
            position = pointers[leaf]
            while position < len(waiting):
                group = waiting[position]
                position += 1
                if group.id not in done and self._allocate_group(group, extras):
                    break
            pointers[leaf] = position
            if position >= len(waiting):
                order.exhausted(leaf)
            leaf = order.next()
        self._place_extras(extras)

    def _allocate_group(self, group: model.Group, extras: list[tuple[model.Group, tuple[model.Pod, ...]]]) -> bool:
        """Try a group's minimum; True when something was placed (the queue order may have changed)."""
        needs = gangs.needs(group)
        if needs.missing:
            pods = len(group.members)
            self.statuses[group.id] = status.unschedulable(
                status.Reason.NOT_ENOUGH_PODS,
                f"gang {group.id} needs {group.min_member} pods (and every subgroup its minimum); "
                f"{pods} exist, {needs.missing} more must be created",
            )
            return False
        if not needs.minimum:
            if needs.extras:
                extras.append((group, needs.extras))
            return False
        minimum = needs.minimum
        pod_shapes = {pod.uid: self._shape(pod) for pod in minimum}
        amounts = gangs.total(minimum, self.reference)
        chain = self.tree.ancestors(group.queue)
        never = self.roster.never.get(group.id)
        if never is not None and never.group is group and never.key == self.never_key:
            self.statuses[group.id] = never.status
            return False
        verdict = gangs.never_fits(
            group=group,
            minimum=minimum,
            amounts=amounts,
            chain=chain,
            queues=self.tree.queues,
            searcher=self.searcher,
            pod_shapes=pod_shapes,
        )
        if verdict is not None:
            self.roster.never[group.id] = roster.NeverFits(group=group, key=self.never_key, status=verdict)
            self.statuses[group.id] = verdict
            return False
        checked = gangs.queue_check(
            group=group, amounts=amounts, chain=chain, queues=self.tree.queues, usage=self.draft.usage
        )
        if checked is not None:
            self.statuses[group.id] = checked
            return False
        failure = self._place_within_limits(group, minimum, amounts, chain)
        if isinstance(failure, status.Status):
            self.statuses[group.id] = failure
            return False
        if failure is None:
            if needs.extras:
                extras.append((group, needs.extras))
            return True
        self.failed.append(Failed(group=group, minimum=minimum, amounts=amounts, failure=failure))
        return False

    def _place_within_limits(
        self,
        group: model.Group,
        pods: Sequence[model.Pod],
        amounts: Resources,
        chain: Sequence[model.QueueName],
    ) -> gangs.Failure | status.Status | None:
        """Place ``pods`` as one transaction; a gpu-memory share is checked against the limits once its device, and
        so its real share, is known (the check before placement estimated it on the largest device)."""
        draft = self.draft
        for pod in pods:
            self._shape(pod)
        start = draft.checkpoint()
        failure = gangs.try_place(
            draft=draft, searcher=self.searcher, group=group, pods=pods, pod_shapes=self.pod_shapes
        )
        if failure is not None or not any(pod.share is not None and pod.share.memory_bytes for pod in pods):
            return failure
        actual = sum(
            sum(placement.share_milli) or len(placement.devices) * model.MILLI_GPU_PER_DEVICE
            for placement in draft.placements[start.placements :]
        )
        if actual <= amounts.milli_gpu:
            return None
        draft.rollback(start)
        real = dataclasses.replace(amounts, milli_gpu=actual)
        checked = gangs.queue_check(group=group, amounts=real, chain=chain, queues=self.tree.queues, usage=draft.usage)
        if checked is not None:
            return checked
        return gangs.try_place(draft=draft, searcher=self.searcher, group=group, pods=pods, pod_shapes=self.pod_shapes)

    def _place_extras(self, extras: Sequence[tuple[model.Group, tuple[model.Pod, ...]]]) -> None:
        """Elastic members beyond the minimum, after every minimum, each on its own."""
        for group, pods in extras:
            chain = self.tree.ancestors(group.queue)
            for pod in pods:
                amounts = gangs.total((pod,), self.reference)
                checked = gangs.queue_check(
                    group=group, amounts=amounts, chain=chain, queues=self.tree.queues, usage=self.draft.usage
                )
                if checked is not None:
                    self.statuses.setdefault(group.id, checked)
                    break
                placed = self._place_within_limits(group, (pod,), amounts, chain)
                if isinstance(placed, status.Status):
                    self.statuses.setdefault(group.id, placed)
                    break
                if placed is not None:
                    self.elastic_waiting.append((group, pod))
                    break

    # --- consolidate, reclaim, preempt ---------------------------------------------------------------------------

    def _scene(self) -> roommaking.Scene:
        if self.scene is not None:
            return self.scene
        self.scene = roommaking.Scene(
            snapshot=self.snapshot,
            draft=self.draft,
            searcher=self.searcher,
            pod_shapes=self.pod_shapes,
            order=self.order,
            tree=self.tree,
            running=self.roster.running_groups(),
        )
        return self.scene

    def _make_room(self, action: model.Action) -> None:
        if not self.failed:
            return
        scene = self._scene()
        reason = {
            model.Action.CONSOLIDATE: decisions.EvictionReason.CONSOLIDATE,
            model.Action.RECLAIM: decisions.EvictionReason.RECLAIM,
            model.Action.PREEMPT: decisions.EvictionReason.PREEMPT,
        }[action]
        for failed in self.failed:
            group = failed.group
            if group.id in self.statuses:
                continue
            # The minimum may have become placeable through evictions made for an earlier group: never mind then.
            if action is model.Action.CONSOLIDATE:
                done = evictions.consolidate(scene, group, failed.minimum)
            elif action is model.Action.RECLAIM:
                done = evictions.reclaim(scene, group, failed.minimum, failed.amounts)
            else:
                done = evictions.preempt(scene, group, failed.minimum)
            if done:
                self.statuses[group.id] = evictions.waiting_status(reason, group, self.draft)

    def _stale_gangs(self) -> None:
        stale = self.roster.stale_groups()
        if stale:
            evictions.stale_gangs(self._scene(), stale)

    # --- statuses -----------------------------------------------------------------------------------------------

    def _explain(self, pod: model.Pod) -> tuple[status.Reason, str]:
        shape = self._shape(pod)
        found = self.explained.get(shape)
        if found is None:
            found = diagnosis.explain(self.searcher, shape)
            self.explained[shape] = found
        return found

    def _summary(self, shape: shapes.Shape) -> tuple[str, bool]:
        """What is free for a pod of this shape in all, and whether one such pod alone would fit (end of cycle)."""
        found = self.summaries.get(shape)
        if found is None:
            found = (diagnosis.free_summary(self.searcher, shape), self.searcher.find(shape) is not None)
            self.summaries[shape] = found
        return found

    def _failure_status(self, failed: Failed) -> status.Status:
        """The status of a group whose minimum did not fit, from the state the plan leaves behind.

        It depends only on that end state and the group, never on how far the attempt got: the message describes
        what a person can change now.
        """
        group = failed.group
        blocker = next((pod for pod in failed.minimum if not self._summary(self._shape(pod))[1]), failed.minimum[0])
        shape = self._shape(blocker)
        reason, text = self._explain(blocker)
        pod_text = diagnosis.describe_pod(blocker) + diagnosis.gpu_model_hint(shape)
        usage = self.draft.usage.allocated
        held = usage[group.queue]
        fair = self.order.fair(group.queue)
        everyone = sum((usage[root] for root in self.tree.roots), model.ZERO)
        # Over quota only means something when others hold part of the cluster: alone, the queue is just short.
        over = [
            kind
            for kind in fairshare.KINDS
            if fairshare.amount(failed.amounts, kind) > 0
            and fairshare.amount(held, kind) >= fairshare.amount(fair, kind)
            and fairshare.amount(everyone, kind) > fairshare.amount(held, kind)
            and reason is not status.Reason.NO_NODE_FITS
        ]
        if over:
            kind = over[0]
            return status.unschedulable(
                status.Reason.OVER_QUOTA,
                f"queue {group.queue} holds {status.amount_text(kind, fairshare.amount(held, kind))} of "
                f"{kind.value}, at or over its fair share of "
                f"{status.amount_text(kind, fairshare.amount(fair, kind))}: it runs on spare room only, and there "
                f"is none for {pod_text}: {text}",
            )
        if len(failed.minimum) > 1:
            summary, alone = self._summary(shape)
            detail = summary if alone else f"{summary}; {pod_text}: {text}"
            gpu = failed.amounts.milli_gpu
            needs = f", {status.amount_text(fairshare.Kind.GPU, gpu)} in all" if gpu > 0 else ""
            return status.unschedulable(
                status.Reason.GANG_DOES_NOT_FIT,
                f"gang of {len(failed.minimum)} pods must start together (minMember {group.min_member}{needs}), "
                f"and they do not all fit at once: {detail}",
            )
        return status.unschedulable(reason, f"{pod_text}: {text}")

    def _finish_statuses(self) -> None:
        for failed in self.failed:
            group = failed.group
            if group.id in self.statuses:
                continue
            self.statuses[group.id] = self._failure_status(failed)
        for group, pod in self.elastic_waiting:
            reason, text = self._explain(pod)
            self.statuses.setdefault(
                group.id, status.unschedulable(reason, f"elastic pod {pod.name} beyond the minimum waits: {text}")
            )

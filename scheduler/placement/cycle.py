"""The actions of one cycle, in the configured order, and the status of every group left pending.

``Cycle`` lives only while ``engine.Engine.run`` runs; it reads the engine's caches it is handed (the groups'
``roster.Roster``, the ``search.Searcher``), never the engine itself. Allocate serves leaf queues in fair-share
order with the job each would run next (``ordering.QueueOrder``, asked again after every group tried) and inside a
queue groups by priority then age; each group's minimum is one transaction on the ``Draft``. Elastic extras come
after every minimum: queues in their order, the groups of a queue in turn, one pod at a time. Consolidate, reclaim
and preempt then work on the groups whose minimum did not fit, and after them on the elastic pods that did not
(``evictions``); stale-gang eviction looks at running gangs below their minimum. At the end, every pod evicted to
make room that fits somewhere after all is moved instead (``evictions.move_leftovers``); the statuses of the groups
left pending come from ``pending``.

Groups of a queue that does not exist (``orphans``: deleted, or never created) are not tried: they wait with
``QueueDoesNotExist``, while their running pods count for an orphan leaf with nothing deserved, which any queue
within its fair share may reclaim from.

``clock_matters`` tells the engine whether the plan depended on the time (a victim too young for its min-runtime,
a stale gang still within its grace, a preemption delay not over): if not, the same state at a later time gives the
same plan; ``Plan.wake_ns`` says when the earliest of those ends, so the scheduler runs a cycle then even if nothing
else changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from common.resources import Resources
from scheduler.placement import (
    decisions,
    elastic,
    evictions,
    fairshare,
    gangs,
    model,
    ordering,
    pending,
    plan,
    roomscene,
    roster,
    search,
    shapes,
    signatures,
    status,
    victims,
    walk,
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
        orphans: frozenset[model.QueueName] = frozenset(),
        victim_units: victims.UnitCache | None = None,
    ) -> None:
        """``offered`` is what the cluster offers our queues; ``never_key`` what a ``NeverFits`` verdict depends on
        (the nodes' and the queues' versions); ``orphans`` the queues that groups name but that do not exist (in
        ``tree`` as roots with nothing deserved: their pods may be reclaimed, new ones wait); ``victim_units`` the
        engine's cache of running groups' eviction units (a fresh one when not given)."""
        self.snapshot = snapshot
        self.draft = draft
        self.tree = tree
        self.shares = shares
        self.roster = groups
        self.searcher = searcher
        self.statuses: dict[model.GroupId, status.Status] = {}
        self.failed: list[Failed] = []
        self.elastic_waiting: list[tuple[model.Group, gangs.Step]] = []
        self.scene: roomscene.Scene | None = None
        self._leaving: dict[model.NodeName, list[tuple[model.Group, model.Pod]]] | None = None
        """Running pods already leaving, by node (built on first use)."""
        self._unnominated: set[model.GroupId] = set()
        """Groups with no pod nominated to a node (``_leaving_for``: the snapshot's groups do not change in a cycle)."""
        self._released: set[model.NodeName] = set()
        """Nodes whose leaving pods a nominated group's held room counted as gone this cycle (then blocked)."""
        self.pod_shapes: dict[model.PodUid, shapes.Shape] = {}
        self._signatures: dict[int, signatures.Signature] = {}
        """Per pods room is made for (by id: ``failed`` and ``elastic_waiting`` keep them for the cycle), their
        scheduling signature, read by each room-making action."""
        self.orphans = orphans
        self.victim_units = victim_units or victims.UnitCache()
        pending = set(groups.pending_queues())
        self.leaves = [
            name for name in tree.depth_first() if tree.is_leaf(name) and name in pending and name not in orphans
        ]
        self.never_key = never_key
        self.reference = groups.reference_memory
        self.offered = offered
        self.walk = walk.Walk(groups, self.leaves)
        # The order asks the walk, never the cycle: no reference cycle keeps a cycle's garbage for the collector.
        self.order = ordering.QueueOrder(
            queue_tree=tree,
            shares=shares,
            usage=draft.usage,
            capacity=offered,
            leaves=self.leaves,
            job=self.walk.next_job,
        )
        self.refusals: dict[model.GroupId, str] = {}
        """Why reclaim did not act for a group, in numbers (added to its status)."""

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
        if self.scene is not None:
            evictions.move_leftovers(self.scene)
        self._finish_statuses()
        shares = self.shares
        if self.orphans:
            shares = {name: share for name, share in shares.items() if name not in self.orphans}
        return self.draft.finish(self.statuses, shares, wake_ns=self.scene.wake_ns if self.scene else None)

    @property
    def clock_matters(self) -> bool:
        return self.scene is not None and self.scene.clock_matters

    # --- allocate -----------------------------------------------------------------------------------------------

    def _reject_homeless(self) -> None:
        """Groups whose queue does not exist, or is not a leaf, get their status and are not tried."""
        for queue in self.roster.pending_queues():
            if queue in self.tree.queues and self.tree.is_leaf(queue) and queue not in self.orphans:
                continue
            for group in self.roster.pending_groups(queue):
                if queue not in self.tree.queues or queue in self.orphans:
                    message = f"queue {queue} does not exist; the group waits until it is created"
                else:
                    message = f"queue {queue} is a parent queue; only leaf queues take workloads"
                self.statuses[group.id] = status.unschedulable(status.Reason.QUEUE_DOES_NOT_EXIST, message)

    def _chain(self, queue: model.QueueName) -> tuple[model.QueueName, ...]:
        return self.draft.usage.chains.get(queue) or self.tree.ancestors(queue)

    def _shape(self, pod: model.Pod) -> shapes.Shape:
        found = self.pod_shapes.get(pod.uid)
        if found is None:
            found = self.roster.shape(pod)
            self.pod_shapes[pod.uid] = found
        return found

    def _allocate(self) -> None:
        groups = self.roster
        order = self.order
        walking = self.walk
        pointers = walking.pointers
        extras: list[tuple[model.Group, tuple[gangs.Step, ...]]] = []
        # Room made by evictions in earlier cycles goes to the groups it was made for, before anybody else.
        first = [group for group in groups.nominated_groups() if group.queue in pointers]
        for group in first:
            mine: list[tuple[model.Group, tuple[gangs.Step, ...]]] = []
            self._allocate_group(group, mine)
            if self.failed and self.failed[-1].group is group:
                self._hold_nominated_room(group)
            for owner, steps in mine:
                # Elastic pods the room was made for go now too; the others wait for every minimum as usual.
                nominated = [step for step in steps if any(pod.nominated_node is not None for pod in step)]
                rest = tuple(step for step in steps if all(pod.nominated_node is None for pod in step))
                if all(self._place_extra(owner, step) for step in nominated) and rest:
                    extras.append((owner, rest))
        walking.done.update(group.id for group in first)
        for queue in {group.queue for group in first}:
            order.touched(queue)
        leaf = order.next()
        while leaf is not None:
            waiting = groups.pending_groups(leaf)
            position = walking.skip_done(leaf)
            if position < len(waiting):
                self._allocate_group(waiting[position], extras)
                pointers[leaf] = position + 1
            if walking.skip_done(leaf) >= len(waiting):
                order.exhausted(leaf)
            else:
                order.touched(leaf)
            leaf = order.next()
        self._place_extras(extras)

    def _allocate_group(self, group: model.Group, extras: list[tuple[model.Group, tuple[gangs.Step, ...]]]) -> bool:
        """Try a group's minimum; True when something was placed (the queue order may have changed)."""
        needs, amounts = self.walk.needs(group)
        if needs.missing:
            pods = len(group.members)
            self.statuses[group.id] = status.unschedulable(
                status.Reason.NOT_ENOUGH_PODS,
                f"gang {group.id} needs {gangs.requirement(group)}: {pods} pods exist, {needs.missing} more "
                "must be created",
            )
            return False
        if not needs.minimum:
            if needs.extras:
                extras.append((group, needs.extras))
            return False
        minimum = needs.minimum
        pod_shapes = {pod.uid: self._shape(pod) for pod in minimum}
        chain = self._chain(group.queue)
        never = self.roster.never.get(group.id)
        if never is not None and never.group is group and never.key == self.never_key:
            verdict = never.status
        else:
            verdict = gangs.never_fits(
                group=group,
                minimum=minimum,
                amounts=amounts,
                chain=chain,
                queues=self.tree.queues,
                searcher=self.searcher,
                pod_shapes=pod_shapes,
            )
            self.roster.never[group.id] = roster.NeverFits(group=group, key=self.never_key, status=verdict)
        if verdict is not None:
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
        for pod in pods:
            self._shape(pod)
        return gangs.place_within_limits(
            draft=self.draft,
            searcher=self.searcher,
            group=group,
            pods=pods,
            pod_shapes=self.pod_shapes,
            amounts=amounts,
            chain=chain,
            queues=self.tree.queues,
        )

    def _place_extras(self, extras: Sequence[tuple[model.Group, tuple[gangs.Step, ...]]]) -> None:
        elastic.hand_out(
            extras,
            order=lambda leaves, job: ordering.QueueOrder(
                queue_tree=self.tree,
                shares=self.shares,
                usage=self.draft.usage,
                capacity=self.offered,
                leaves=leaves,
                job=job,
            ),
            reference_memory=self.reference,
            place=self._place_extra,
        )

    def _place_extra(self, group: model.Group, step: gangs.Step) -> bool:
        """One elastic step (a pod, or a subgroup's own minimum at once); True when placed (a step that does not fit
        waits, and its group's later steps too)."""
        chain = self._chain(group.queue)
        amounts = gangs.total(step, self.reference)
        checked = gangs.queue_check(
            group=group, amounts=amounts, chain=chain, queues=self.tree.queues, usage=self.draft.usage
        )
        if checked is not None:
            self.statuses.setdefault(group.id, checked)
            return False
        placed = self._place_within_limits(group, step, amounts, chain)
        if isinstance(placed, status.Status):
            self.statuses.setdefault(group.id, placed)
            return False
        if placed is not None:
            self.elastic_waiting.append((group, step))
            return False
        return True

    # --- consolidate, reclaim, preempt ---------------------------------------------------------------------------

    def _scene(self) -> roomscene.Scene:
        if self.scene is not None:
            return self.scene
        self.scene = roomscene.Scene(
            snapshot=self.snapshot,
            draft=self.draft,
            searcher=self.searcher,
            pod_shapes=self.pod_shapes,
            order=self.order,
            tree=self.tree,
            shares=self.shares,
            running=self.roster.running_groups(),
            units=self.victim_units,
        )
        return self.scene

    def _make_room(self, action: model.Action) -> None:
        """Consolidate, reclaim or preempt for every group whose minimum did not fit, then (every minimum served
        first) for every elastic pod that did not."""
        if not self.failed and not self.elastic_waiting:
            return
        scene = self._scene()
        reason = {
            model.Action.CONSOLIDATE: decisions.EvictionReason.CONSOLIDATE,
            model.Action.RECLAIM: decisions.EvictionReason.RECLAIM,
            model.Action.PREEMPT: decisions.EvictionReason.PREEMPT,
        }[action]
        wanted: list[tuple[model.Group, tuple[model.Pod, ...], Resources]] = [
            (failed.group, failed.minimum, failed.amounts) for failed in self.failed
        ]
        wanted += [(group, step, gangs.total(step, self.reference)) for group, step in self.elastic_waiting]
        now = self.snapshot.now_ns
        # KAI's scheduling signatures: after a failure, a later attempt of the queue that is not easier is pointless.
        failures = signatures.FailedAttempts(by_priority=action is model.Action.PREEMPT)
        for group, pods, amounts in wanted:
            if group.id in self.statuses:
                continue
            if group.evictions_from_ns is not None and now < group.evictions_from_ns:
                scene.wake_at(group.evictions_from_ns)  # KAI's preemption delay: no evictions for it yet
                seconds = -(-(group.evictions_from_ns - now) // 1_000_000_000)
                self.refusals[group.id] = f"its preemption delay lets it evict others in {seconds}s"
                continue
            leaving = self._leaving_for(group)
            if leaving is not None:
                self.statuses[group.id] = leaving  # room made for it in an earlier cycle is still being vacated
                continue
            signature = self._signatures.get(id(pods))
            if signature is None:
                signature = self._signatures[id(pods)] = signatures.of(
                    group, [self._shape(pod) for pod in pods], self.reference
                )
            pointless, why = failures.skip(signature)
            if pointless:
                if why is not None and action is model.Action.RECLAIM:
                    self.refusals[group.id] = why
                continue
            # The pods may have become placeable through evictions made for an earlier group: never mind then.
            since = len(self.draft.evictions)
            if action is model.Action.CONSOLIDATE:
                refused = evictions.consolidate(scene, group, pods)
            elif action is model.Action.RECLAIM:
                refused = evictions.reclaim(scene, group, pods, amounts)
                if refused is not None:
                    self.refusals[group.id] = refused
            else:
                refused = evictions.preempt(scene, group, pods)
            if refused is None:
                self.statuses[group.id] = evictions.waiting_status(reason, group, self.draft, since=since)
            else:
                failures.failed(signature, refused if action is model.Action.RECLAIM else None)

    def _hold_nominated_room(self, group: model.Group) -> None:
        """KAI's pipelining: while the victims evicted for a group are still leaving, the room the ones already gone
        left on its nominated nodes is held for it (``plan.Kind.RESERVE``: nominated again, bound by no one else this
        cycle), so other groups' pods, such as the victims' own recreated ones, cannot take it before the rest has
        gone. A node still short of room for its pod is held whole, its leaving pods counted as gone (KAI pipelines
        a pod onto room being released the same way), so no one takes the part already free. A gang waiting for
        hundreds of victims then starts once they are gone instead of being robbed of its room node by node and
        reclaiming again. Nothing is held once no victim is leaving: the group then fits, or room-making judges it
        afresh."""
        if self._leaving_for(group) is None:
            return
        leaving = self._leaving or {}
        draft = self.draft
        released: list[model.NodeName] = []
        for pod in group.members:
            node = pod.nominated_node
            if node is None or pod.phase is not model.PodPhase.PENDING or pod.uid in draft.placed:
                continue
            shape = self._shape(pod)
            choice = self.searcher.find_on(shape, node)
            if choice is None and node not in self._released and leaving.get(node):
                mark = draft.checkpoint()
                for owner, gone in leaving[node]:
                    draft.release(gone, owner)
                choice = self.searcher.find_on(shape, node)
                if choice is None:
                    draft.rollback(mark)
                else:
                    self._released.add(node)
                    released.append(node)
            if choice is not None:
                draft.place(pod, group, choice, kind=plan.Kind.RESERVE)
        for node in released:
            draft.block(node)  # the rest of its room is not free yet: no one else is placed there this cycle

    def _leaving_for(self, group: model.Group) -> status.Status | None:
        """A group nominated to nodes where evicted pods are still leaving waits for them (KAI's pipelining: the room
        being released is its), and makes no room again; None when it is not such a group."""
        if group.id in self._unnominated:
            return None  # asked for every failed group by each room-making action
        nominated = {pod.nominated_node for pod in group.members if pod.nominated_node is not None}
        if not nominated:
            self._unnominated.add(group.id)
            return None
        if self._leaving is None:
            self._leaving = {}
            for other in self.snapshot.groups.values():
                for pod in other.members:
                    if pod.leaving and pod.node is not None:
                        self._leaving.setdefault(pod.node, []).append((other, pod))
        there = [(owner.queue, pod) for node in sorted(nominated) for owner, pod in self._leaving.get(node, ())]
        if not there:
            return None
        reason = (
            status.Reason.WAITING_FOR_PREEMPTION
            if all(queue == group.queue for queue, _ in there)
            else status.Reason.WAITING_FOR_RECLAIM
        )
        names = ", ".join(f"{pod.namespace}/{pod.name}" for _, pod in there[:5])
        more = f" and {len(there) - 5} more" if len(there) > 5 else ""
        return status.waiting(
            reason,
            f"gang {group.id} waits for {len(there)} evicted pod(s) to leave its nominated node(s) "
            f"{', '.join(sorted(nominated))}: {names}{more}",
        )

    def _stale_gangs(self) -> None:
        stale = self.roster.stale_groups()
        if stale:
            evictions.stale_gangs(self._scene(), stale)

    # --- statuses -----------------------------------------------------------------------------------------------

    def _finish_statuses(self) -> None:
        explainer = pending.Explainer(self.searcher)
        usage = self.draft.usage.allocated
        everyone = sum((usage[root] for root in self.tree.roots), model.ZERO)
        for failed in self.failed:
            group = failed.group
            if group.id in self.statuses:
                continue
            self.statuses[group.id] = pending.failure_status(
                explainer,
                group=group,
                minimum=failed.minimum,
                pod_shapes=[self._shape(pod) for pod in failed.minimum],
                amounts=failed.amounts,
                held=usage[group.queue],
                fair=self.order.fair(group.queue),
                everyone=everyone,
                refusal=self.refusals.get(group.id),
            )
        for group, step in self.elastic_waiting:
            if group.id not in self.statuses:
                self.statuses[group.id] = pending.elastic_status(
                    explainer, step, [self._shape(pod) for pod in step], self.refusals.get(group.id)
                )

"""One scheduling cycle: a snapshot in, a plan out, through the configured actions in order.

``Engine.run(snapshot)`` is a pure function of the snapshot: the engine only keeps caches and indexes between
cycles (the capacity indexes, filter verdicts, score memo, per-group aggregates, the verdicts of groups that could
not be placed), and every cache is keyed so that it can only ever give the answer a fresh engine would give. The
caches make a cycle cost what changed: a cycle after a change that touches nothing pending (a telemetry sample, a
bound pod elsewhere) re-reads nothing it has seen.

Stages, in order:

1. bring the capacity index and the per-queue aggregates in step with the snapshot (only changed objects);
2. fair share per queue and resource (``fairshare``), recomputed only when requests, capacity or queues change;
3. the actions of ``Config.actions``: allocate (queues in fair-share order, groups by priority then age, each
   group's minimum as one transaction, then elastic extras), consolidate, reclaim, preempt (for groups whose
   minimum did not fit), stale-gang eviction;
4. a ``Status`` for every group left pending.

When nothing the engine can see changed since the last cycle (no node's free capacity, devices, class or
telemetry that matters, no group, no queue, the same config, and the time only where the last plan did not depend
on it), the last plan is the answer and nothing runs: a telemetry sample from a busy GPU, a label nobody selects on,
a heartbeat, cost one pass over the changed objects. Any visible change runs the whole cycle again: a shortcut
that skipped only "unaffected" groups would not be exact, since a group that newly fails frees room for another.
A group that can never fit (``NeverFits``) is not checked again until nodes or queues change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from scheduler.placement import capacity, cycle, fairshare, gangs, model, ordering, plan, search, status

_ZERO3 = (0, 0, 0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Contribution:
    """What one group adds to its queue's aggregates (pending and running requests, running holdings)."""

    requested: plan.Amounts
    allocated: plan.Amounts
    nonpreemptible: plan.Amounts
    pending: bool
    running: bool
    stale: bool
    share_sizes: tuple[int, ...]
    label_keys: frozenset[str]
    nominated: bool


def _contribution(group: model.Group, reference_memory: int) -> _Contribution:
    req = [0, 0, 0]
    held = [0, 0, 0]
    pending = running = nominated = False
    sizes: list[int] = []
    keys: set[str] = set()
    for pod in group.members:
        if pod.phase is model.PodPhase.PENDING:
            pending = True
            nominated = nominated or pod.nominated_node is not None
            if pod.node_selector or pod.affinity:
                keys.update(key for key, _ in pod.node_selector)
                keys.update(requirement.key for term in pod.affinity for requirement in term.expressions)
            gpu = gangs.pending_gpu(pod, reference_memory)
            amounts: plan.Amounts = (gpu, pod.requests.milli_cpu, pod.requests.memory_bytes)
            if pod.share is not None and pod.share.milli_gpu:
                sizes.append(pod.share.milli_gpu)
        elif pod.phase is model.PodPhase.RUNNING:
            running = True
            amounts = plan.pod_amounts(pod)
            held[0] += amounts[0]
            held[1] += amounts[1]
            held[2] += amounts[2]
        else:
            continue
        req[0] += amounts[0]
        req[1] += amounts[1]
        req[2] += amounts[2]
    allocated = (held[0], held[1], held[2])
    return _Contribution(
        requested=(req[0], req[1], req[2]),
        allocated=allocated,
        nonpreemptible=_ZERO3 if group.preemptible else allocated,
        pending=pending,
        running=running,
        stale=group.below_min_since_ns is not None,
        share_sizes=tuple(sizes),
        label_keys=frozenset(keys),
        nominated=nominated,
    )


def _add(target: dict[model.QueueName, list[int]], queue: model.QueueName, amounts: plan.Amounts, sign: int) -> None:
    totals = target.setdefault(queue, [0, 0, 0])
    totals[0] += sign * amounts[0]
    totals[1] += sign * amounts[1]
    totals[2] += sign * amounts[2]


class Engine:
    """Runs cycles; keeps only caches between them (see the module docstring)."""

    def __init__(self) -> None:
        self._capacity = capacity.Capacity()
        self.searcher = search.Searcher(self._capacity)
        self._seen: dict[model.GroupId, model.Group] = {}
        self._contrib: dict[model.GroupId, _Contribution] = {}
        self._requested: dict[model.QueueName, list[int]] = {}
        self._allocated: dict[model.QueueName, list[int]] = {}
        self._nonpreemptible: dict[model.QueueName, list[int]] = {}
        self._pending: dict[model.QueueName, dict[model.GroupId, model.Group]] = {}
        self._running: dict[model.QueueName, dict[model.GroupId, model.Group]] = {}
        self._stale: dict[model.GroupId, model.Group] = {}
        self._nominated: dict[model.GroupId, model.Group] = {}
        self._sizes: dict[int, int] = {}
        self._sorted_pending: dict[model.QueueName, list[model.Group]] = {}
        self._sorted_running: dict[model.QueueName, list[model.Group]] = {}
        self._dirty_pending: set[model.QueueName] = set()
        self._dirty_running: set[model.QueueName] = set()
        self._reference_memory = -1
        self._label_keys: frozenset[str] = frozenset()
        self._groups_mapping: Mapping[model.GroupId, model.Group] | None = None
        self._queues: Mapping[model.QueueName, model.Queue] | None = None
        self._queue_version = 0
        self._tree: fairshare.Tree | None = None
        self._chains: dict[model.QueueName, tuple[model.QueueName, ...]] = {}
        self._shares_key: tuple[object, ...] | None = None
        self._shares: dict[model.QueueName, fairshare.Share] = {}
        self._offered: plan.Amounts = (0, 0, 0)
        self._shapes: dict[model.PodUid, tuple[model.Pod, search.Shape]] = {}
        self._groups_version = 0
        self._last: tuple[tuple[object, ...], int | None, plan.Plan] | None = None
        """The last cycle's inputs, its time if the plan depended on the time (else None), and its plan."""
        self.never: dict[model.GroupId, tuple[model.Group, tuple[int, int], status.Status]] = {}
        """Groups that can never fit: the group, the (nodes, queues) versions then, and its status."""

    # --- public -------------------------------------------------------------------------------------------------

    def run(self, snapshot: model.Snapshot) -> plan.Plan:
        """Run one cycle over ``snapshot`` and return its plan."""
        config = snapshot.config
        cap = self._capacity
        self._sync_groups(snapshot.groups)
        cap.sync(snapshot.nodes, margin_bytes=config.headroom_margin_bytes, label_keys=self._label_keys)
        if cap.max_device_memory != self._reference_memory:
            self._sync_groups(snapshot.groups)
        self._sync_queues(snapshot.queues)
        last = self._last
        if last is not None and last[0] == self._inputs(snapshot) and last[1] in (None, snapshot.now_ns):
            return last[2]  # nothing the plan depends on changed: the same plan, without running anything
        tree = self._tree
        assert tree is not None
        shares = self._fair_shares()
        self.searcher.configure(config, tuple(sorted(size for size, count in self._sizes.items() if count > 0)))
        usage = plan.Usage(self._chains)
        for leaf, totals in self._allocated.items():
            usage.add(leaf, (totals[0], totals[1], totals[2]), nonpreemptible=False)
        for leaf, totals in self._nonpreemptible.items():
            for name in self._chains.get(leaf, ()):
                fixed = usage.nonpreemptible[name]
                fixed[0] += totals[0]
                fixed[1] += totals[1]
                fixed[2] += totals[2]
        draft = plan.Draft(cap, usage)
        work = cycle.Cycle(self, snapshot, draft, tree, shares)
        result = work.run()
        self._last = (self._inputs(snapshot), snapshot.now_ns if work.clock_matters else None, result)
        return result

    def _inputs(self, snapshot: model.Snapshot) -> tuple[object, ...]:
        """What a plan depends on besides the time: versions bumped on every change the engine can see."""
        return (
            self._capacity.state_version,
            self._groups_version,
            self._queue_version,
            snapshot.config,
            len(snapshot.queues),
        )

    # --- keeping in step ----------------------------------------------------------------------------------------

    def _sync_queues(self, queues: Mapping[model.QueueName, model.Queue]) -> None:
        if queues is self._queues:
            return
        if self._queues is not None and dict(queues) == dict(self._queues):
            self._queues = queues
            return
        self._queues = queues
        self._queue_version += 1
        self._tree = fairshare.tree(queues)
        self._chains = {name: self._tree.ancestors(name) for name in self._tree.depth_first()}
        self._shares_key = None
        self.never.clear()

    def _sync_groups(self, groups: Mapping[model.GroupId, model.Group]) -> None:
        reference = self._capacity.max_device_memory
        if reference != self._reference_memory:
            # gpu-memory shares are counted against the largest device: a new largest device changes every count
            self._reference_memory = reference
            for group in list(self._seen.values()):
                self._forget(group)
            self._groups_mapping = None
        if groups is self._groups_mapping:
            return  # the same mapping as last cycle: snapshots are never mutated, so nothing changed
        self._groups_mapping = groups
        seen = self._seen
        changed = [group for key, group in groups.items() if seen.get(key) is not group]
        if not changed and len(groups) == len(seen):
            return
        new = sum(1 for group in changed if group.id not in seen)
        if len(seen) + new != len(groups):
            for key in [key for key in seen if key not in groups]:
                self._forget(seen[key])
        self._groups_version += 1
        for group in changed:
            old = seen.get(group.id)
            if old is not None:
                self._forget(old)
            self._remember(group)

    def _remember(self, group: model.Group) -> None:
        contribution = _contribution(group, self._reference_memory)
        self._seen[group.id] = group
        self._contrib[group.id] = contribution
        queue = group.queue
        _add(self._requested, queue, contribution.requested, 1)
        _add(self._allocated, queue, contribution.allocated, 1)
        _add(self._nonpreemptible, queue, contribution.nonpreemptible, 1)
        if contribution.pending:
            self._pending.setdefault(queue, {})[group.id] = group
            self._dirty_pending.add(queue)
        if contribution.running:
            self._running.setdefault(queue, {})[group.id] = group
            self._dirty_running.add(queue)
        if contribution.stale:
            self._stale[group.id] = group
        if contribution.nominated:
            self._nominated[group.id] = group
        for size in contribution.share_sizes:
            self._sizes[size] = self._sizes.get(size, 0) + 1
        if not contribution.label_keys <= self._label_keys:
            self._label_keys = self._label_keys | contribution.label_keys

    def _forget(self, group: model.Group) -> None:
        contribution = self._contrib.pop(group.id)
        del self._seen[group.id]
        self.never.pop(group.id, None)
        for pod in group.members:
            self._shapes.pop(pod.uid, None)
        queue = group.queue
        _add(self._requested, queue, contribution.requested, -1)
        _add(self._allocated, queue, contribution.allocated, -1)
        _add(self._nonpreemptible, queue, contribution.nonpreemptible, -1)
        if contribution.pending:
            del self._pending[queue][group.id]
            self._dirty_pending.add(queue)
        if contribution.running:
            del self._running[queue][group.id]
            self._dirty_running.add(queue)
        if contribution.stale:
            del self._stale[group.id]
        if contribution.nominated:
            del self._nominated[group.id]
        for size in contribution.share_sizes:
            self._sizes[size] -= 1

    def _fair_shares(self) -> dict[model.QueueName, fairshare.Share]:
        tree = self._tree
        assert tree is not None
        cap = self._capacity
        ours = [0, 0, 0]
        for totals in self._allocated.values():
            ours[0] += totals[0]
            ours[1] += totals[1]
            ours[2] += totals[2]
        offered = (
            max(0, cap.offered[0] - cap.used[0] + ours[0]),
            max(0, cap.offered[1] - cap.used[1] + ours[1]),
            max(0, cap.offered[2] - cap.used[2] + ours[2]),
        )
        requested = tuple(
            (name, tuple(totals)) for name, totals in sorted(self._requested.items()) if name in tree.queues
        )
        key = (self._queue_version, offered, requested)
        if key != self._shares_key:
            self._shares_key = key
            self._offered = offered
            self._shares = fairshare.divide(
                queue_tree=tree,
                requested={
                    name: fairshare.resources_of(
                        {
                            fairshare.Kind.GPU: amounts[0],
                            fairshare.Kind.CPU: amounts[1],
                            fairshare.Kind.MEMORY: amounts[2],
                        }
                    )
                    for name, amounts in requested
                },
                capacity=fairshare.resources_of(
                    {fairshare.Kind.GPU: offered[0], fairshare.Kind.CPU: offered[1], fairshare.Kind.MEMORY: offered[2]}
                ),
            )
        return self._shares

    # --- cached views used by the cycle's actions -----------------------------------------------------------------

    @property
    def offered(self) -> plan.Amounts:
        """What the cluster offers to our queues: ready nodes minus what other schedulers' pods hold."""
        return self._offered

    @property
    def reference_memory(self) -> int:
        """The largest device memory: gpu-memory shares are counted against it before placement."""
        return self._reference_memory

    def never_key(self) -> tuple[int, int]:
        """What a NeverFits verdict depends on: the nodes and the queues."""
        return (self._capacity.structure_version, self._queue_version)

    def pending_queues(self) -> list[model.QueueName]:
        """Queues (existing or not) that have pending groups, sorted."""
        return sorted(queue for queue, groups in self._pending.items() if groups)

    def nominated_groups(self) -> list[model.Group]:
        """Pending groups with a pod nominated to room made for it earlier, by priority then age."""
        return sorted(self._nominated.values(), key=ordering.group_key)

    def stale_groups(self) -> list[model.Group]:
        """Running groups marked below their minimum, by id."""
        return sorted(self._stale.values(), key=lambda group: group.id)

    def pending_groups(self, queue: model.QueueName) -> list[model.Group]:
        if queue in self._dirty_pending or queue not in self._sorted_pending:
            self._sorted_pending[queue] = sorted(self._pending.get(queue, {}).values(), key=ordering.group_key)
            self._dirty_pending.discard(queue)
        return self._sorted_pending[queue]

    def running_groups(self) -> dict[model.QueueName, Sequence[model.Group]]:
        for queue in sorted(self._dirty_running):
            self._sorted_running[queue] = sorted(self._running.get(queue, {}).values(), key=lambda group: group.id)
        self._dirty_running.clear()
        return {queue: groups for queue, groups in sorted(self._sorted_running.items()) if groups}

    def shape(self, pod: model.Pod) -> search.Shape:
        cached = self._shapes.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        found = search.shape_of(pod)
        self._shapes[pod.uid] = (pod, found)
        return found


def run(snapshot: model.Snapshot) -> plan.Plan:
    """One cycle with a fresh engine (no caches): what tests and one-off tools call."""
    return Engine().run(snapshot)

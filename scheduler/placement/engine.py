"""One scheduling cycle: a snapshot in, a plan out, through the configured actions in order.

``Engine.run(snapshot)`` is a pure function of the snapshot: the engine only keeps caches and indexes between
cycles (the capacity indexes, filter verdicts, score memo, per-group aggregates, the verdicts of groups that could
not be placed), and every cache is keyed so that it can only ever give the answer a fresh engine would give. The
caches make a cycle cost what changed: a cycle after a change that touches nothing pending (a telemetry sample, a
bound pod elsewhere) re-reads nothing it has seen.

Stages, in order:

1. bring the capacity index (``capacity``) and the groups' per-queue aggregates (``roster``) in step with the
   snapshot, reading only changed objects;
2. fair share per queue and resource (``fairshare``), recomputed only when requests, capacity or queues change;
3. the actions of ``Config.actions`` (``cycle``): allocate (queues in fair-share order, groups by priority then
   age, each group's minimum as one transaction, then elastic extras), consolidate, reclaim, preempt (for groups
   whose minimum did not fit), stale-gang eviction;
4. a ``Status`` for every group left pending.

When nothing the engine can see changed since the last cycle (no node's free capacity, devices, class or
telemetry that matters, no group, no queue, the same config, and the time only where the last plan did not depend
on it), the last plan is the answer and nothing runs: a telemetry sample from a busy GPU, a label nobody selects on,
a heartbeat, cost one pass over the changed objects. Any visible change runs the whole cycle again: a shortcut
that skipped only "unaffected" groups would not be exact, since a group that newly fails frees room for another.
A group that can never fit (``NeverFits``) is not checked again until nodes or queues change.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.resources import Resources
from scheduler.placement import capacity, cycle, fairshare, learning, model, plan, roster, search, victims


class Engine:
    """Runs cycles; keeps caches between them (see the module docstring), and the workload the fragmentation
    strategy learns (``learning``): the one thing a plan depends on besides the snapshot."""

    def __init__(self, *, learner: learning.Learner | None = None) -> None:
        self.learner = learner or learning.Learner()
        """The pod shapes seen so far; a fresh engine learns them again from the first snapshot's pods."""
        self._capacity = capacity.Capacity()
        self.searcher = search.Searcher(self._capacity)
        self._roster = roster.Roster()
        self._victim_units = victims.UnitCache()
        self._queues: tuple[Mapping[model.QueueName, model.Queue], frozenset[model.QueueName]] | None = None
        self._orphans: frozenset[model.QueueName] = frozenset()
        self._queue_version = 0
        self._tree: fairshare.Tree | None = None
        self._chains: dict[model.QueueName, tuple[model.QueueName, ...]] = {}
        self._shares_key: tuple[object, ...] | None = None
        self._shares: dict[model.QueueName, fairshare.Share] = {}
        self._offered = model.ZERO
        """What the cluster offers to our queues: ready nodes minus what other schedulers' pods hold."""
        self._last: tuple[tuple[object, ...], int | None, plan.Plan] | None = None
        """The last cycle's inputs, its time if the plan depended on the time (else None), and its plan."""

    def run(self, snapshot: model.Snapshot) -> plan.Plan:
        """Run one cycle over ``snapshot`` and return its plan."""
        config = snapshot.config
        cap = self._capacity
        groups = self._roster
        groups.sync(snapshot.groups, reference_memory=cap.max_device_memory)
        cap.sync(snapshot.nodes, margin_bytes=config.headroom_margin_bytes, label_keys=groups.label_keys)
        if cap.max_device_memory != groups.reference_memory:
            groups.sync(snapshot.groups, reference_memory=cap.max_device_memory)
        self._sync_queues(snapshot.queues, groups.queue_names())
        arrivals = groups.take_arrivals()
        if arrivals:
            self.learner.observe(arrivals, reference_memory_bytes=cap.max_device_memory)
        learned = self.learner.scorer() if config.gpu_strategy is model.Strategy.FRAGMENTATION else None
        last = self._last
        if last is not None and last[0] == self._inputs(snapshot, learned) and last[1] in (None, snapshot.now_ns):
            return last[2]  # nothing the plan depends on changed: the same plan, without running anything
        tree = self._tree
        assert tree is not None
        shares = self._fair_shares()
        self.searcher.configure(config, groups.demanded_shares(), learned)
        usage = plan.Usage(self._chains)
        for leaf, held in groups.allocated.items():
            usage.hold(leaf, allocated=held, nonpreemptible=groups.nonpreemptible[leaf])
        work = cycle.Cycle(
            snapshot=snapshot,
            draft=plan.Draft(cap, usage),
            tree=tree,
            shares=shares,
            groups=groups,
            searcher=self.searcher,
            offered=self._offered,
            never_key=(cap.structure_version, self._queue_version),
            orphans=self._orphans,
            victim_units=self._victim_units,
        )
        result = work.run()
        self._last = (self._inputs(snapshot, learned), snapshot.now_ns if work.clock_matters else None, result)
        return result

    def _inputs(self, snapshot: model.Snapshot, learned: object) -> tuple[object, ...]:
        """What a plan depends on besides the time: versions bumped on every change the engine can see, and the
        learned scorer in use (replaced, never changed, when the learned workload drifted)."""
        return (
            self._capacity.state_version,
            self._roster.version,
            self._queue_version,
            snapshot.config,
            len(snapshot.queues),
            learned,
        )

    def _sync_queues(self, queues: Mapping[model.QueueName, model.Queue], named: frozenset[model.QueueName]) -> None:
        """Bring the queue tree in step: the snapshot's queues, and an orphan leaf for every queue that groups name
        but that does not exist (``orphan``)."""
        last = self._queues
        if last is not None and last[0] is queues and last[1] is named:
            return
        orphans = frozenset(name for name in named if name not in queues)
        if last is not None and orphans == self._orphans and (last[0] is queues or dict(queues) == dict(last[0])):
            self._queues = (queues, named)
            return
        self._queues = (queues, named)
        self._orphans = orphans
        self._queue_version += 1
        everything = dict(queues)
        everything.update((name, orphan(name)) for name in sorted(orphans))
        self._tree = fairshare.tree(everything)
        self._chains = {name: self._tree.ancestors(name) for name in self._tree.depth_first()}
        self._shares_key = None
        self._roster.never.clear()

    def _fair_shares(self) -> dict[model.QueueName, fairshare.Share]:
        tree = self._tree
        assert tree is not None
        cap = self._capacity
        groups = self._roster
        ours = sum(groups.allocated.values(), model.ZERO)
        offered = Resources(
            milli_gpu=max(0, cap.offered.milli_gpu - cap.used.milli_gpu + ours.milli_gpu),
            milli_cpu=max(0, cap.offered.milli_cpu - cap.used.milli_cpu + ours.milli_cpu),
            memory_bytes=max(0, cap.offered.memory_bytes - cap.used.memory_bytes + ours.memory_bytes),
        )
        requested = tuple((name, groups.requested[name]) for name in sorted(groups.requested) if name in tree.queues)
        key = (self._queue_version, offered, requested)
        if key != self._shares_key:
            self._shares_key = key
            self._offered = offered
            self._shares = fairshare.divide(queue_tree=tree, requested=dict(requested), capacity=offered)
        return self._shares


NOTHING = model.QueueResource(quota=0, limit=model.UNLIMITED, over_quota_weight=0)
"""An orphan's settings: nothing deserved, no share of the spare, no limit."""


def orphan(name: model.QueueName) -> model.Queue:
    """The stand-in for a queue that groups name but that does not exist (deleted, or never created).

    KAI keeps such pods running; so do we, counting them as a leaf under the root with nothing deserved: every pod
    they hold is over their fair share of zero, so any queue within its own may reclaim from them, and they count
    against no limit. New groups of the queue are not placed (``QueueDoesNotExist``).
    """
    return model.Queue(name=name, priority=0, gpu=NOTHING, cpu=NOTHING, memory=NOTHING)

"""The order in which queues are served and groups are tried.

Queues, as KAI's proportion plugin orders them *with the job each would run next*: under fair share before over it;
then a queue whose next job keeps it within its deserved quota (allocated plus the job, in every resource) before one
the job would take over it; then higher priority; then smaller dominant share (DRF: the largest of (allocated plus
the job) / capacity over the resources); then older; then name. The order is hierarchical: at each level of the tree
the best sibling (among those with work left in their subtree) is chosen, then the best of its children, down to a
leaf; a parent is judged with the job its best leaf would run next, as KAI judges a department by its best job.

A queue's standing changes as the cycle places work and as its next job changes, so the cycle reports every leaf it
touched (``touched``) and only the keys on that leaf's path are computed again; the rest are kept.

Inside a queue, groups go by priority (highest first), then creation time, then id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from common.resources import Resources
from scheduler.placement import fairshare, model, plan

_DRF_SCALE = 1_000_000_000
"""Dominant shares are compared as integers in parts per billion of the cluster (exact enough to order queues)."""

QueueKey = tuple[bool, bool, int, int, int, str]


def group_key(group: model.Group) -> tuple[int, int, str]:
    return (-group.priority, group.created_ns, group.id)


def _below(allocated: Resources, share: Resources, requested: Resources) -> bool:
    """True when, for every resource the queue still wants more of (requests more than it holds), it holds less
    than ``share``."""
    return (
        (requested.milli_gpu <= allocated.milli_gpu or allocated.milli_gpu < share.milli_gpu)
        and (requested.milli_cpu <= allocated.milli_cpu or allocated.milli_cpu < share.milli_cpu)
        and (requested.memory_bytes <= allocated.memory_bytes or allocated.memory_bytes < share.memory_bytes)
    )


class QueueOrder:
    """Picks the next leaf queue to serve; see the module docstring.

    ``job(leaf)`` is what the leaf would run next (its next group's minimum, or its next elastic pod), asked for
    leaves with work only.
    """

    def __init__(
        self,
        *,
        queue_tree: fairshare.Tree,
        shares: Mapping[model.QueueName, fairshare.Share],
        usage: plan.Usage,
        capacity: Resources,
        leaves: Sequence[model.QueueName],
        job: Callable[[model.QueueName], Resources] | None = None,
    ) -> None:
        self._tree = queue_tree
        self._usage = usage
        # Dominant shares divide by these: at least 1, so a resource the cluster lacks counts for nothing.
        self._capacity_gpu = max(1, capacity.milli_gpu)
        self._capacity_cpu = max(1, capacity.milli_cpu)
        self._capacity_memory = max(1, capacity.memory_bytes)
        self._shares = shares
        self._job = job or (lambda leaf: model.ZERO)
        self._chains = usage.chains
        self._active: dict[model.QueueName, int] = {}
        """Per queue, how many of its subtree's leaves still have work."""
        for leaf in leaves:
            for name in self._chain(leaf):
                self._active[name] = self._active.get(name, 0) + 1
        self._entries: dict[model.QueueName, tuple[QueueKey, model.QueueName]] = {}
        """Per queue with work: its key (with its best leaf's next job) and that leaf; dropped when it changes."""

    def key(self, name: model.QueueName, job: Resources = model.ZERO) -> QueueKey:
        """The queue's place in the order if it ran ``job`` next."""
        queue = self._tree.queues[name]
        allocated = self._usage.allocated[name]
        share = self._shares[name]
        deserved = share.deserved
        # Summed in plain integers: this runs for every group tried.
        gpu = allocated.milli_gpu + job.milli_gpu
        cpu = allocated.milli_cpu + job.milli_cpu
        memory = allocated.memory_bytes + job.memory_bytes
        dominant = max(
            gpu * _DRF_SCALE // self._capacity_gpu,
            cpu * _DRF_SCALE // self._capacity_cpu,
            memory * _DRF_SCALE // self._capacity_memory,
        )
        within = gpu <= deserved.milli_gpu and cpu <= deserved.milli_cpu and memory <= deserved.memory_bytes
        return (
            not _below(allocated, share.fair, share.requested),
            not within,
            -queue.priority,
            dominant,
            queue.created_ns,
            name,
        )

    def _entry(self, name: model.QueueName) -> tuple[QueueKey, model.QueueName]:
        found = self._entries.get(name)
        if found is not None:
            return found
        leaf = name
        best: tuple[QueueKey, model.QueueName] | None = None
        entries = self._entries
        active = self._active
        for child in self._tree.children.get(name, ()):
            if active.get(child, 0) > 0:
                entry = entries.get(child) or self._entry(child)  # most are kept: asked after every group tried
                if best is None or entry[0] < best[0]:
                    best = entry
        if best is not None:
            leaf = best[1]
        found = self._entries[name] = (self.key(name, self._job(leaf)), leaf)
        return found

    def next(self) -> model.QueueName | None:
        """The leaf to serve next, or None when no leaf has work left."""
        best: tuple[QueueKey, model.QueueName] | None = None
        entries = self._entries
        active = self._active
        for name in self._tree.roots:
            if active.get(name, 0) > 0:
                entry = entries.get(name) or self._entry(name)
                if best is None or entry[0] < best[0]:
                    best = entry
        return None if best is None else best[1]

    def _chain(self, leaf: model.QueueName) -> tuple[model.QueueName, ...]:
        return self._chains.get(leaf) or self._tree.ancestors(leaf)

    def touched(self, leaf: model.QueueName) -> None:
        """Something was placed in ``leaf``, or its next job changed: its path's keys are computed again."""
        for name in self._chain(leaf):
            self._entries.pop(name, None)

    def exhausted(self, leaf: model.QueueName) -> None:
        """``leaf`` has no work left this pass."""
        for name in self._chain(leaf):
            self._active[name] -= 1
            self._entries.pop(name, None)

    def fair(self, name: model.QueueName) -> Resources:
        return self._shares[name].fair

"""The order in which queues are served and groups are tried.

Queues, as KAI-COMPAT.md says: under fair share before over it, under quota (deserved) before over it, higher
priority, smaller dominant share (DRF: the largest of allocated / capacity over the resources), older, then name.
The order is hierarchical: at each level of the tree the best sibling (among those with work left in their
subtree) is chosen, then the best of its children, down to a leaf. A queue's standing changes as the cycle places
work, so the walk is redone for every group, recomputing only the keys along the path that just changed.

Inside a queue, groups go by priority (highest first), then creation time, then id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    """Picks the next leaf queue to serve; see the module docstring."""

    def __init__(
        self,
        *,
        queue_tree: fairshare.Tree,
        shares: Mapping[model.QueueName, fairshare.Share],
        usage: plan.Usage,
        capacity: Resources,
        leaves: Sequence[model.QueueName],
    ) -> None:
        self._tree = queue_tree
        self._usage = usage
        # Dominant shares divide by these: at least 1, so a resource the cluster lacks counts for nothing.
        self._capacity_gpu = max(1, capacity.milli_gpu)
        self._capacity_cpu = max(1, capacity.milli_cpu)
        self._capacity_memory = max(1, capacity.memory_bytes)
        self._shares = shares
        self._active: dict[model.QueueName, int] = {}
        """Per queue, how many of its subtree's leaves still have work."""
        for leaf in leaves:
            for name in queue_tree.ancestors(leaf):
                self._active[name] = self._active.get(name, 0) + 1

    def key(self, name: model.QueueName) -> QueueKey:
        queue = self._tree.queues[name]
        allocated = self._usage.allocated[name]
        share = self._shares[name]
        dominant = max(
            allocated.milli_gpu * _DRF_SCALE // self._capacity_gpu,
            allocated.milli_cpu * _DRF_SCALE // self._capacity_cpu,
            allocated.memory_bytes * _DRF_SCALE // self._capacity_memory,
        )
        return (
            not _below(allocated, share.fair, share.requested),
            not _below(allocated, share.deserved, share.requested),
            -queue.priority,
            dominant,
            queue.created_ns,
            name,
        )

    def next(self) -> model.QueueName | None:
        """The leaf to serve next, or None when no leaf has work left."""
        level: Sequence[model.QueueName] = self._tree.roots
        chosen: model.QueueName | None = None
        while True:
            candidates = [name for name in level if self._active.get(name, 0) > 0]
            if not candidates:
                return chosen
            chosen = min(candidates, key=self.key)
            level = self._tree.children.get(chosen, ())

    def exhausted(self, leaf: model.QueueName) -> None:
        """``leaf`` has no work left this pass."""
        for name in self._tree.ancestors(leaf):
            self._active[name] -= 1

    def fair(self, name: model.QueueName) -> Resources:
        return self._shares[name].fair

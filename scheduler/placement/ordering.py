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


def _below(allocated: Sequence[int], share: plan.Amounts, wanting: Sequence[bool]) -> bool:
    """True when, for every resource the queue still wants more of, it holds less than ``share``."""
    return all(allocated[i] < share[i] for i in range(3) if wanting[i])


def amounts(resources: Resources) -> plan.Amounts:
    return (resources.milli_gpu, resources.milli_cpu, resources.memory_bytes)


class QueueOrder:
    """Picks the next leaf queue to serve; see the module docstring."""

    def __init__(
        self,
        *,
        queue_tree: fairshare.Tree,
        shares: Mapping[model.QueueName, fairshare.Share],
        usage: plan.Usage,
        capacity: plan.Amounts,
        leaves: Sequence[model.QueueName],
    ) -> None:
        self._tree = queue_tree
        self._usage = usage
        self._capacity = tuple(max(1, value) for value in capacity)
        self._fair = {name: amounts(share.fair) for name, share in shares.items()}
        self._deserved = {name: amounts(share.deserved) for name, share in shares.items()}
        self._requested = {name: amounts(share.requested) for name, share in shares.items()}
        self._active: dict[model.QueueName, int] = {}
        """Per queue, how many of its subtree's leaves still have work."""
        self._parent = queue_tree.parent_of
        for leaf in leaves:
            for name in queue_tree.ancestors(leaf):
                self._active[name] = self._active.get(name, 0) + 1

    def key(self, name: model.QueueName) -> QueueKey:
        queue = self._tree.queues[name]
        allocated = self._usage.allocated[name]
        requested = self._requested[name]
        wanting = [requested[i] > allocated[i] for i in range(3)]
        dominant = max(allocated[i] * _DRF_SCALE // self._capacity[i] for i in range(3))
        return (
            not _below(allocated, self._fair[name], wanting),
            not _below(allocated, self._deserved[name], wanting),
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

    def is_over_fair_share(self, name: model.QueueName, extra: plan.Amounts) -> bool:
        """Would the queue, or an ancestor, hold more than its fair share with ``extra`` more?"""
        for queue in self._tree.ancestors(name):
            allocated = self._usage.allocated[queue]
            fair = self._fair[queue]
            if any(extra[i] > 0 and allocated[i] + extra[i] > fair[i] for i in range(3)):
                return True
        return False

    def fair(self, name: model.QueueName) -> plan.Amounts:
        return self._fair[name]

"""Allocate's walk over each leaf queue's pending groups: where it stands, and what the group it runs next needs.

The queue order (``ordering``) asks for each leaf's next job (KAI orders queues with the job they would run next);
allocate asks for the group at the leaf's position and moves it on. A group's needs are kept for the group each leaf
runs next only: a cycle tries thousands of groups, and keeping them all would only feed the garbage collector. The
order holds this walk, never the cycle, so no reference cycle keeps a cycle's objects alive after it ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.resources import Resources
from scheduler.placement import gangs, model, roster


class Walk:
    """Where allocate stands in each leaf's pending groups, and what the group it runs next needs (what the queue
    order asks for: KAI orders queues with the job)."""

    def __init__(self, groups: roster.Roster, leaves: Sequence[model.QueueName]) -> None:
        self._roster = groups
        self.pointers = dict.fromkeys(leaves, 0)
        """Per leaf, the position of its next pending group (allocate walks each leaf's groups once)."""
        self.done: set[model.GroupId] = set()
        self._heads: dict[model.QueueName, tuple[model.Group, gangs.Needs, Resources]] = {}
        """Per leaf, the needs of the group it runs next (kept for that group only: a cycle tries thousands)."""

    def needs(self, group: model.Group) -> tuple[gangs.Needs, Resources]:
        """The group's minimum and extras now, and what the minimum will take."""
        head = self._heads.get(group.queue)
        if head is not None and head[0] is group:
            return head[1], head[2]
        needs = gangs.needs(group)
        amounts = gangs.total(needs.minimum, self._roster.reference_memory)
        self._heads[group.queue] = (group, needs, amounts)
        return needs, amounts

    def skip_done(self, leaf: model.QueueName) -> int:
        """The position of the leaf's next group not placed already (a nominated group goes first)."""
        waiting = self._roster.pending_groups(leaf)
        position = self.pointers[leaf]
        while position < len(waiting) and waiting[position].id in self.done:
            position += 1
        self.pointers[leaf] = position
        return position

    def next_job(self, leaf: model.QueueName) -> Resources:
        """What ``leaf`` would run next: its next group's minimum."""
        waiting = self._roster.pending_groups(leaf)
        position = self.skip_done(leaf)
        return self.needs(waiting[position])[1] if position < len(waiting) else model.ZERO

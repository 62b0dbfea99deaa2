"""Handing out elastic pods: the members of running or placed gangs beyond their minimum.

They come after every gang's minimum, as in KAI, where a job with pods left is put back in line after each
allocation: queues in their order (with the step each would run next, ``ordering``), and the groups of one queue in
turn, one step at a time, so two elastic jobs of a queue grow side by side instead of one taking everything. A step
is one pod, or a whole subgroup that needs its own minimum at once (``gangs.Needs.extras``). A step that does not
fit ends its group's turn for the cycle (its later steps would not fit either, or would jump the line); the cycle
may then make room for it (``evictions``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from common.resources import Resources
from scheduler.placement import gangs, model, ordering

Extras = Sequence[tuple[model.Group, tuple[gangs.Step, ...]]]
OrderFactory = Callable[[list[model.QueueName], Callable[[model.QueueName], Resources]], ordering.QueueOrder]


def hand_out(
    extras: Extras,
    *,
    order: OrderFactory,
    reference_memory: int,
    place: Callable[[model.Group, gangs.Step], bool],
) -> None:
    """Offer every elastic step of ``extras`` to ``place`` (True when placed) in the order the module describes.

    ``order(leaves, job)`` makes the queue order over the leaves with extras, ``job(leaf)`` being what the step the
    leaf would place next takes.
    """
    if not extras:
        return
    rings: dict[model.QueueName, collections.deque[tuple[model.Group, tuple[gangs.Step, ...], int]]] = {}
    for group, steps in sorted(extras, key=lambda entry: ordering.group_key(entry[0])):
        rings.setdefault(group.queue, collections.deque()).append((group, steps, 0))

    def job(leaf: model.QueueName) -> Resources:
        _, steps, index = rings[leaf][0]
        return gangs.total(steps[index], reference_memory)

    queues = order(list(rings), job)
    leaf = queues.next()
    while leaf is not None:
        ring = rings[leaf]
        group, steps, index = ring.popleft()
        if place(group, steps[index]) and index + 1 < len(steps):
            ring.append((group, steps, index + 1))
        if ring:
            queues.touched(leaf)
        else:
            queues.exhausted(leaf)
        leaf = queues.next()

"""Hierarchical fair share: how the cluster's capacity is divided among queues, per resource, down the tree.

The rule is KAI's with one deliberate change (see KAI-COMPAT.md "Fair share"):

1. Each child of a parent first gets its *deserved* amount ``min(quota, requested, limit)`` out of what the parent
   has left, children taken by priority (highest first), then creation time, then name; quota ``-1`` means "as much
   as it requests". KAI lets every ``-1`` sibling take up to the parent's whole share here; we hand out from what is
   left, so siblings never sum to more than their parent: the set quotas first (an operator's guarantee), then the
   ``-1`` ones from what the set quotas left, so a ``-1`` sibling never takes what a set quota guarantees (as in
   KAI, where a queue's quota is its own whatever its ``-1`` siblings ask).
2. What is left is spare: divided among the children that still want more, priority bucket by priority bucket
   (highest first), in proportion to ``over_quota_weight``, each capped by its request and limit, repeated until
   nothing is left or everybody is capped. A weight of 0 takes no spare.
3. Each child's share is then divided among its own children the same way.

Everything is integral (milli-GPU, millicores, bytes). Proportional division rounds down and hands the remainder
out one unit at a time in the children's order, so a division is exact and deterministic. The result satisfies,
for every parent and resource: the children's shares sum to ``min(parent share, sum of their capped demands)``,
where a child's capped demand is ``min(requested, limit)``, or only its deserved amount if its weight is 0.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from common.resources import Resources
from scheduler.placement import model


class Kind(enum.StrEnum):
    """The three resources KAI queues account."""

    GPU = "gpu"
    CPU = "cpu"
    MEMORY = "memory"


KINDS = (Kind.GPU, Kind.CPU, Kind.MEMORY)


def amount(resources: Resources, kind: Kind) -> int:
    """The component of ``resources`` a queue setting of ``kind`` speaks about."""
    if kind is Kind.GPU:
        return resources.milli_gpu
    if kind is Kind.CPU:
        return resources.milli_cpu
    return resources.memory_bytes


def setting(queue: model.Queue, kind: Kind) -> model.QueueResource:
    if kind is Kind.GPU:
        return queue.gpu
    if kind is Kind.CPU:
        return queue.cpu
    return queue.memory


def limit_of(resource: model.QueueResource, requested: int) -> int:
    """The cap a limit sets: requested-or-more for -1 (no cap), else the limit (0: nothing)."""
    return requested if resource.limit == model.UNLIMITED else resource.limit


def deserved_want(resource: model.QueueResource, requested: int) -> int:
    """``min(quota, requested, limit)`` with KAI's -1 meaning unlimited for quota and limit."""
    quota = requested if resource.quota == model.UNLIMITED else resource.quota
    return max(0, min(quota, requested, limit_of(resource, requested)))


def capped_demand(resource: model.QueueResource, requested: int) -> int:
    """The most a queue can ever be given: its request under its limit, or only its deserved amount at weight 0."""
    if resource.over_quota_weight <= 0:
        return deserved_want(resource, requested)
    return max(0, min(requested, limit_of(resource, requested)))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Share:
    """One queue's outcome: what it deserves (step 1) and its fair share (steps 1 and 2), and its subtree request."""

    deserved: Resources
    fair: Resources
    requested: Resources


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tree:
    """The queue tree in a fixed order: children per parent sorted by (priority desc, creation, name).

    ``roots`` are the queues without a parent, or whose parent is missing (KAI's Orphan condition), or that sit on a
    cycle of parents (broken input: such queues are cut at the first repeat and become roots).
    """

    queues: Mapping[model.QueueName, model.Queue]
    roots: tuple[model.QueueName, ...]
    children: Mapping[model.QueueName, tuple[model.QueueName, ...]]
    parents: Mapping[model.QueueName, model.QueueName] = dataclasses.field(default_factory=dict)
    """Each child's parent (``tree`` fills it; computed from ``children`` when left empty)."""

    def is_leaf(self, name: model.QueueName) -> bool:
        return not self.children.get(name)

    def ancestors(self, name: model.QueueName) -> tuple[model.QueueName, ...]:
        """The queue itself and its ancestors up to its root, nearest first."""
        chain = [name]
        parents = self.parent_of
        while (parent := parents.get(chain[-1])) is not None:
            chain.append(parent)
        return tuple(chain)

    @property
    def parent_of(self) -> Mapping[model.QueueName, model.QueueName]:
        if self.parents or not self.children:
            return self.parents
        return {child: parent for parent, kids in self.children.items() for child in kids}

    def depth_first(self) -> tuple[model.QueueName, ...]:
        """Every queue, parents before their children, siblings in order."""
        order: list[model.QueueName] = []
        stack = list(reversed(self.roots))
        while stack:
            name = stack.pop()
            order.append(name)
            stack.extend(reversed(self.children.get(name, ())))
        return tuple(order)


def _sibling_key(queue: model.Queue) -> tuple[int, int, str]:
    return (-queue.priority, queue.created_ns, queue.name)


def tree(queues: Mapping[model.QueueName, model.Queue]) -> Tree:
    """Arrange ``queues`` as a tree (see ``Tree`` for orphans and cycles)."""
    parent: dict[model.QueueName, model.QueueName] = {}
    for name in sorted(queues):
        candidate = queues[name].parent
        if candidate is None or candidate not in queues:
            continue
        # Walk up from the candidate parent: if we come back to ``name``, linking would close a cycle.
        seen = {name}
        cursor: model.QueueName | None = candidate
        while cursor is not None and cursor not in seen:
            seen.add(cursor)
            cursor = parent.get(cursor)
        if cursor is None:
            parent[name] = candidate
    kids: dict[model.QueueName, list[model.QueueName]] = {}
    roots: list[model.QueueName] = []
    for name in sorted(queues):
        if name in parent:
            kids.setdefault(parent[name], []).append(name)
        else:
            roots.append(name)
    order = {name: _sibling_key(queue) for name, queue in queues.items()}
    return Tree(
        queues=queues,
        roots=tuple(sorted(roots, key=order.__getitem__)),
        children={name: tuple(sorted(group, key=order.__getitem__)) for name, group in sorted(kids.items())},
        parents=parent,
    )


def subtree_requests(queue_tree: Tree, direct: Mapping[model.QueueName, Resources]) -> dict[model.QueueName, Resources]:
    """Each queue's request plus its descendants' (KAI's ``status.requested``)."""
    totals: dict[model.QueueName, Resources] = {}
    for name in reversed(queue_tree.depth_first()):
        total = direct.get(name, model.ZERO)
        for child in queue_tree.children.get(name, ()):
            total = total + totals[child]
        totals[name] = total
    return totals


def divide(
    *,
    queue_tree: Tree,
    requested: Mapping[model.QueueName, Resources],
    capacity: Resources,
) -> dict[model.QueueName, Share]:
    """The deserved and fair share of every queue, per resource.

    ``requested`` holds each queue's own request (its groups' pending and running pods); subtree sums are taken
    here. ``capacity`` is what the cluster offers to all root queues together.
    """
    totals = subtree_requests(queue_tree, requested)
    gpu = _Division(queue_tree, totals=totals, kind=Kind.GPU, available=capacity.milli_gpu)
    cpu = _Division(queue_tree, totals=totals, kind=Kind.CPU, available=capacity.milli_cpu)
    memory = _Division(queue_tree, totals=totals, kind=Kind.MEMORY, available=capacity.memory_bytes)
    return {
        name: Share(
            deserved=Resources(
                milli_gpu=gpu.deserved[name], milli_cpu=cpu.deserved[name], memory_bytes=memory.deserved[name]
            ),
            fair=Resources(milli_gpu=gpu.fair[name], milli_cpu=cpu.fair[name], memory_bytes=memory.fair[name]),
            requested=totals[name],
        )
        for name in queue_tree.queues
    }


class _Division:
    """One resource divided down the whole tree: each queue's deserved amount and fair share of it."""

    def __init__(
        self, queue_tree: Tree, *, totals: Mapping[model.QueueName, Resources], kind: Kind, available: int
    ) -> None:
        self._tree = queue_tree
        self._totals = totals
        self._kind = kind
        self.deserved: dict[model.QueueName, int] = {}
        self.fair: dict[model.QueueName, int] = {}
        self._level(queue_tree.roots, available)

    def _level(self, siblings: Sequence[model.QueueName], available: int) -> None:
        queues = self._tree.queues
        kind = self._kind
        requests = [amount(self._totals[name], kind) for name in siblings]
        settings = [setting(queues[name], kind) for name in siblings]
        shares = split(
            available=available,
            wants=[deserved_want(s, r) for s, r in zip(settings, requests, strict=True)],
            caps=[capped_demand(s, r) for s, r in zip(settings, requests, strict=True)],
            priorities=[queues[name].priority for name in siblings],
            weights=[s.over_quota_weight for s in settings],
            guaranteed=[s.quota != model.UNLIMITED for s in settings],
        )
        for name, (given, share) in zip(siblings, shares, strict=True):
            self.deserved[name] = given
            self.fair[name] = share
            children = self._tree.children.get(name, ())
            if children:
                self._level(children, share)


def split(
    *,
    available: int,
    wants: Sequence[int],
    caps: Sequence[int],
    priorities: Sequence[int],
    weights: Sequence[int],
    guaranteed: Sequence[bool] | None = None,
) -> list[tuple[int, int]]:
    """Divide ``available`` among siblings given in their order; returns (deserved, fair) per sibling.

    Deserved amounts are handed out in order from what is left, the ``guaranteed`` ones (a set quota) first, then
    the others (quota -1) from what those left (all count as guaranteed when not given). The spare is then divided
    bucket by bucket of equal priority (highest first; siblings arrive sorted by priority already) by weight, capped
    at ``caps``, until nothing is left or every sibling is capped. ``caps`` must be at least ``wants``.
    """
    left = available
    given = [0] * len(wants)
    if guaranteed is None:
        guaranteed = [True] * len(wants)
    for first in (True, False):
        for index, want in enumerate(wants):
            if guaranteed[index] is first:
                take = min(want, left)
                given[index] = take
                left -= take
    shares = list(given)
    start = 0
    while start < len(shares) and left > 0:
        end = start
        while end < len(shares) and priorities[end] == priorities[start]:
            end += 1
        left = _water_fill(shares, caps, weights, range(start, end), left)
        start = end
    return list(zip(given, shares, strict=True))


def _water_fill(shares: list[int], caps: Sequence[int], weights: Sequence[int], members: range, left: int) -> int:
    """Give ``left`` to ``members`` by weight under their caps; return what nobody could take."""
    while left > 0:
        hungry = [i for i in members if weights[i] > 0 and shares[i] < caps[i]]
        if not hungry:
            return left
        total_weight = sum(weights[i] for i in hungry)
        handed = 0
        for i in hungry:
            portion = min(left * weights[i] // total_weight, caps[i] - shares[i])
            shares[i] += portion
            handed += portion
        left -= handed
        if handed == 0:
            # Rounding left less than one unit per weight: hand it out one unit at a time, in order.
            for i in hungry:
                if left == 0:
                    break
                if shares[i] < caps[i]:
                    shares[i] += 1
                    left -= 1
    return left

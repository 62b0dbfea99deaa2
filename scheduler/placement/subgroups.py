"""A gang's subgroup tree (KAI's ``spec.subGroups`` with ``minMember`` and ``minSubGroup``): whether its minimum
holds, which pending pods bring it there, the elastic steps after it, and which running pods it can do without.

KAI's meaning (its ``subgroup_info`` and ``podgroup_info`` packages): a *leaf* holds pods and is satisfied when
``minMember`` of them run or completed; a subgroup with children, and the group itself over its top-level
subgroups, is satisfied when ``minSubGroup`` of its direct children are (all of them when unset).

- **The minimum** (allocate's gang phase, KAI's ``GetTasksToAllocate``): for a node that is not satisfied, the pods
  that satisfy as many more of its children as it lacks, each leaf its missing pods in task order. KAI takes the
  children in its subgroup order, where unsatisfied children are alike and go by name; Quotient takes the children
  that the existing pods can complete before those they cannot, then by name, so an optional replica short of pods
  does not hold the others back.
- **The elastic steps** (KAI's elastic phase), once the minimum holds, one allocation at a time: from the group down
  through the child first in KAI's subgroup order (an unsatisfied child first, then a required one before an
  optional one, then the lowest ratio of satisfied to required members, then name), one pod of a satisfied leaf, or
  a whole unsatisfied child placed as one gang.
- **What a running group can do without** (KAI's ``GetTasksToEvict``): a pod whose leaf keeps its minimum, or a
  whole subgroup whose parent keeps its own (``keeps``): never so that the group falls below its minimum, or a
  subgroup that was satisfied is left running below its own (a broken replica, which KAI never leaves either).

Pods that name no leaf of the tree (KAI refuses them; the snapshot reports pending ones) belong to no subgroup and
are extras. Pure functions over ``model`` values; a tree is compiled once per distinct ``subgroups`` value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Container, Mapping, Sequence

from scheduler.placement import model

ROOT = ""
"""The group itself, as the root of its tree (a subgroup always has a name)."""

Step = tuple[model.Pod, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One node of a tree: the group (``ROOT``), a mid-level subgroup or a leaf."""

    name: str
    required: int
    """A leaf: pods it needs; otherwise satisfied children it needs."""
    children: tuple[str, ...] = ()
    """Direct children by name (KAI's order among equals); empty for a leaf."""

    @property
    def leaf(self) -> bool:
        return not self.children and self.name != ROOT


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tree:
    nodes: Mapping[str, Node]
    parents: Mapping[str, str]
    """Each subgroup's parent (``ROOT`` for a top-level one)."""
    order: tuple[str, ...]
    """Every node, children before their parent (the root last)."""
    leaves: Mapping[str, tuple[str, ...]]
    """The leaves at or below each node."""

    def is_leaf(self, name: str | None) -> bool:
        node = self.nodes.get(name) if name is not None else None
        return node is not None and node.leaf


@functools.lru_cache(maxsize=4096)
def tree(subgroups: tuple[model.SubGroup, ...], min_subgroup: int | None) -> Tree:
    """The tree of ``subgroups`` under a group that needs ``min_subgroup`` of its top-level subgroups (None: all).

    A parent that is not a subgroup, or a chain of parents that loops, reads as the group itself: the PodGroup's
    decoder reports such a tree, and the pods already running in it still count somewhere."""
    by_name = {sub.name: sub for sub in subgroups}
    parents: dict[str, str] = {}
    for sub in subgroups:
        parent, seen = sub.parent, {sub.name}
        while parent is not None and parent in by_name and parent not in seen:
            seen.add(parent)
            parent = by_name[parent].parent
        looped = parent == sub.name  # its own ancestor: the loop hangs under the group
        parents[sub.name] = sub.parent if sub.parent is not None and sub.parent in by_name and not looped else ROOT
    children: dict[str, list[str]] = {}
    for name, parent in parents.items():
        children.setdefault(parent, []).append(name)
    nodes: dict[str, Node] = {}
    for sub in subgroups:
        kids = tuple(sorted(children.get(sub.name, ())))
        needed = len(kids) if sub.min_subgroup is None else sub.min_subgroup
        required = needed if kids else max(0, sub.min_member)
        nodes[sub.name] = Node(name=sub.name, required=required, children=kids)
    top = tuple(sorted(children.get(ROOT, ())))
    nodes[ROOT] = Node(name=ROOT, required=len(top) if min_subgroup is None else min_subgroup, children=top)
    order: list[str] = []
    leaves: dict[str, tuple[str, ...]] = {}

    def visit(name: str) -> None:
        node = nodes[name]
        for child in node.children:
            visit(child)
        order.append(name)
        leaves[name] = (name,) if node.leaf else tuple(leaf for child in node.children for leaf in leaves[child])

    visit(ROOT)
    return Tree(nodes=nodes, parents=parents, order=tuple(order), leaves=leaves)


def of(group: model.Group) -> Tree:
    return tree(group.subgroups, group.min_subgroup)


def satisfied(pod: model.Pod, evicted: Container[model.PodUid]) -> bool:
    """Running (and not evicted in this plan) or completed: the pod counts for its gang."""
    if pod.phase is model.PodPhase.SUCCEEDED:
        return True
    return pod.phase is model.PodPhase.RUNNING and pod.uid not in evicted


def leaf_counts(shape: Tree, members: Sequence[model.Pod], evicted: Container[model.PodUid] = ()) -> dict[str, int]:
    """Per leaf, its satisfied pods."""
    counts: dict[str, int] = {}
    for pod in members:
        if pod.subgroup is not None and shape.is_leaf(pod.subgroup) and satisfied(pod, evicted):
            counts[pod.subgroup] = counts.get(pod.subgroup, 0) + 1
    return counts


def evaluate(shape: Tree, counts: Mapping[str, int]) -> dict[str, int]:
    """Each node's satisfied members: a leaf's pods, another node's satisfied children."""
    have: dict[str, int] = {}
    nodes = shape.nodes
    for name in shape.order:
        node = nodes[name]
        if node.leaf:
            have[name] = counts.get(name, 0)
        else:
            have[name] = sum(1 for child in node.children if have[child] >= nodes[child].required)
    return have


def holds(shape: Tree, counts: Mapping[str, int]) -> bool:
    """Is the group's tree satisfied with these leaf counts?"""
    return evaluate(shape, counts)[ROOT] >= shape.nodes[ROOT].required


def shortfall(shape: Tree, counts: Mapping[str, int]) -> str | None:
    """How the tree falls short, as a phrase for messages (the first unsatisfied node from the top, by name); None
    when it holds."""
    have = evaluate(shape, counts)
    name = ROOT
    while True:
        node = shape.nodes[name]
        if have[name] >= node.required:
            return None
        if node.leaf:
            return f"{have[name]} of the {node.required} members subgroup {name} needs"
        short = [child for child in node.children if have[child] < shape.nodes[child].required]
        if not short or node.required < len(node.children):
            where = "its top-level subgroups" if name == ROOT else f"the child subgroups {name} needs"
            return f"{have[name]} satisfied of the {node.required} of {where}"
        name = short[0]  # every child is needed: say which one falls short


# --- allocation ------------------------------------------------------------------------------------------------


def _gang(
    shape: Tree, name: str, have: Mapping[str, int], pending: Mapping[str, Sequence[model.Pod]]
) -> tuple[list[model.Pod], int]:
    """The pending pods that would satisfy node ``name`` (in task order, each leaf's first), and how many pods that
    needs that do not exist; nothing when it is satisfied."""
    node = shape.nodes[name]
    if have[name] >= node.required:
        return [], 0
    if node.leaf:
        want = node.required - have[name]
        chosen = list(pending.get(name, ())[:want])
        return chosen, want - len(chosen)
    options = [
        (*_gang(shape, child, have, pending), child)
        for child in node.children
        if have[child] < shape.nodes[child].required
    ]
    lacking = node.required - have[name]
    # Children the existing pods complete first (KAI: any unsatisfied child, by name), then by name.
    options.sort(key=lambda option: (option[1] > 0, option[2]))
    pods: list[model.Pod] = []
    missing = 0
    for chosen, short, _ in options[:lacking]:
        pods += chosen
        missing += short
    if len(options) < lacking:
        missing += 1  # more children needed than there are (minSubGroup above the children: never satisfied)
    return pods, missing


def _pending_by_leaf(shape: Tree, pods: Sequence[model.Pod]) -> tuple[dict[str, list[model.Pod]], list[model.Pod]]:
    """Pending pods (in the order given) per leaf, and those that name no leaf."""
    by_leaf: dict[str, list[model.Pod]] = {}
    loose: list[model.Pod] = []
    for pod in pods:
        if pod.subgroup is not None and shape.is_leaf(pod.subgroup):
            by_leaf.setdefault(pod.subgroup, []).append(pod)
        else:
            loose.append(pod)
    return by_leaf, loose


def split(
    shape: Tree, members: Sequence[model.Pod], pending: Sequence[model.Pod], evicted: Container[model.PodUid] = ()
) -> tuple[list[model.Pod], list[Step], list[model.Pod], int]:
    """The tree's minimum (``pending`` in task order), the elastic steps after it, the pods that name no leaf, and
    how many pods the minimum needs that do not exist."""
    counts = leaf_counts(shape, members, evicted)
    by_leaf, loose = _pending_by_leaf(shape, pending)
    minimum, missing = _gang(shape, ROOT, evaluate(shape, counts), by_leaf)
    if missing:
        return minimum, [], loose, missing
    taken = {pod.uid for pod in minimum}
    for pod in minimum:
        counts[str(pod.subgroup)] = counts.get(str(pod.subgroup), 0) + 1
    left = {leaf: [pod for pod in pods if pod.uid not in taken] for leaf, pods in by_leaf.items()}
    steps: list[Step] = []
    while True:
        step = _elastic(shape, ROOT, evaluate(shape, counts), left)
        if not step:
            break
        steps.append(tuple(step))
        for pod in step:
            leaf = str(pod.subgroup)
            counts[leaf] = counts.get(leaf, 0) + 1
            left[leaf].remove(pod)
    return minimum, steps, loose, 0


def _elastic(
    shape: Tree, name: str, have: Mapping[str, int], pending: Mapping[str, list[model.Pod]]
) -> list[model.Pod]:
    """The next allocation below a satisfied node (KAI's elastic phase), or nothing."""
    node = shape.nodes[name]
    if node.leaf:
        waiting = pending.get(name)
        return [waiting[0]] if waiting else []
    for child in sorted(node.children, key=lambda child: _order_key(shape.nodes[child], have[child])):
        if have[child] < shape.nodes[child].required:
            gang, missing = _gang(shape, child, have, pending)
            if gang and not missing:
                return gang
            continue
        step = _elastic(shape, child, have, pending)
        if step:
            return step
    return []


class _Ratio:
    """KAI's subgroup order among satisfied children: required before optional, fewer members first among optional
    ones, then the lower ratio of satisfied to required members (compared in integers, so 1/2 equals 2/4)."""

    __slots__ = ("have", "required")

    def __init__(self, have: int, required: int) -> None:
        self.have = have
        self.required = required

    def _key(self, other: _Ratio) -> tuple[int, int]:
        if (self.required == 0) != (other.required == 0):
            return (int(self.required == 0), int(other.required == 0))
        if self.required == 0:
            return (self.have, other.have)
        return (self.have * other.required, other.have * self.required)

    def __lt__(self, other: _Ratio) -> bool:
        mine, theirs = self._key(other)
        return mine < theirs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Ratio):
            return NotImplemented
        mine, theirs = self._key(other)
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]


_UNSATISFIED = _Ratio(0, 1)
"""Every unsatisfied child sorts alike (KAI), then by name."""


def _order_key(node: Node, have: int) -> tuple[bool, _Ratio, str]:
    satisfied_now = have >= node.required
    return (satisfied_now, _Ratio(have, node.required) if satisfied_now else _UNSATISFIED, node.name)


# --- eviction --------------------------------------------------------------------------------------------------


def keeps(shape: Tree, before: Mapping[str, int], after: Mapping[str, int]) -> bool:
    """May the group go from leaf counts ``before`` to ``after`` (some of its pods evicted)? Only when its tree
    still holds and no subgroup that was satisfied is left with members yet below its own minimum."""
    was, now = evaluate(shape, before), evaluate(shape, after)
    nodes = shape.nodes
    if now[ROOT] < nodes[ROOT].required:
        return False
    for name in shape.order:
        required = nodes[name].required
        if was[name] >= required > now[name] and any(after.get(leaf, 0) for leaf in shape.leaves[name]):
            return False  # satisfied before, and left running some of its pods without its minimum
    return True

"""Victims: what may be evicted as one unit, and in which order, so that evictions disturb the least.

A running gang can lose the pods beyond its minimum (its elastic *extras*), but evicting any member of its minimum
breaks the gang, so the rest of it goes with that member: the unit is then the whole running group. Which pods are
the extras is not fixed in advance: every running pod the gang could do without is offered as a one-pod unit, so
room-making takes the ones that run where room is needed (KAI splits a victim job into its elastic tasks and its
core the same way). With a subgroup tree (``subgroups``), a pod its leaf can do without is such a unit, and so is a
whole subgroup its parent can do without (a replica beyond ``minSubGroup``: KAI evicts it whole, never leaving it
running below its own minimum). ``can_take`` checks, at the moment of eviction, that the gang still keeps its
minimum without the unit: a gang of minimum 2 running 4 pods gives up at most 2 of them as extras.

Units are tried lowest priority first (KAI takes its victims in reverse job order, lowest priority first), then
fewest pods, then in reverse task order (KAI evicts a job's elastic pods that way: an unlabelled pod before a
labelled one, a lower ``kai.scheduler/task-priority`` before a higher one), then least GPU, then youngest (most
recently started), then by group id and pod uid, so the choice is deterministic.

Min-runtimes protect young pods: a pod that has run less than its queue's ``reclaimMinRuntime`` (for reclaim) or
``preemptMinRuntime`` (for preemption and consolidation) is not a victim yet.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Container, Hashable, Iterable, Sequence

from common.resources import Resources
from scheduler.placement import model, plan, subgroups


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """Pods that are evicted together."""

    group: model.Group
    pods: tuple[model.Pod, ...]
    amounts: Resources
    """What the pods hold, as queues count it."""
    youngest_started_ns: int
    extra: bool = False
    """A part the gang keeps running without (one elastic pod, or a whole subgroup beyond its parent's minimum):
    checked again by ``can_take``."""
    order_key: tuple[int, int, int, int, int, str, str]
    """Where the unit stands in victim order (``_order_key``), computed once: a full cluster sorts its units often."""


def started(pod: model.Pod) -> int:
    return pod.started_ns if pod.started_ns is not None else pod.created_ns


def _unit(group: model.Group, pods: Sequence[model.Pod], *, extra: bool) -> Unit:
    amounts = sum((plan.pod_amounts(pod) for pod in pods), model.ZERO)
    youngest = max(started(pod) for pod in pods)
    return Unit(
        group=group,
        pods=tuple(pods),
        amounts=amounts,
        youngest_started_ns=youngest,
        extra=extra,
        order_key=_order_key(group, pods, amounts, youngest),
    )


def _order_key(
    group: model.Group, pods: Sequence[model.Pod], amounts: Resources, youngest_started_ns: int
) -> tuple[int, int, int, int, int, str, str]:
    # Reverse task order for a one-pod unit; a larger unit is a part of the gang or all of it, where no one
    # pod's task priority speaks for the rest.
    task = -pods[0].task_order if len(pods) == 1 else -model.UNLABELLED_TASK
    return (group.priority, len(pods), task, amounts.milli_gpu, -youngest_started_ns, group.id, pods[0].uid)


_ORDER = operator.attrgetter("order_key")


class UnitCache:
    """Each running group's eviction units before any eviction (``units(group, ())``), kept from cycle to cycle while
    the group's object stays the same: a full cluster's room-making sorts the units of thousands of running groups
    every cycle, and few of them changed since the last.

    The engine keeps one for its life; a cycle calls ``new_cycle`` first, which forgets the groups no cycle asked
    about since the one before (gone, or no longer running), so it holds about what runs. It also keeps the actions'
    victim lists in order (``ordered``), so that a cycle sorts only the units of the groups that changed."""

    def __init__(self) -> None:
        self._known: dict[model.GroupId, tuple[model.Group, tuple[Unit, ...]]] = {}
        self._asked: dict[model.GroupId, int] = {}
        """The cycle that last asked about each group: a number apart, so that asking again allocates nothing the
        garbage collector must walk (a busy cycle asks about every running group)."""
        self._cycle = 0
        self._lists: dict[Hashable, tuple[dict[model.GroupId, model.Group], list[Unit], int]] = {}
        """Per list (``ordered``'s key), the groups it was made of, their units in victim order, and the cycle that
        asked for it last (a list no cycle asked for since the one before is forgotten)."""

    def new_cycle(self) -> None:
        self._cycle += 1
        recent = self._cycle - 2
        if any(entry[2] < recent for entry in self._lists.values()):
            self._lists = {key: entry for key, entry in self._lists.items() if entry[2] >= recent}
        if len(self._known) > 1024:
            recent = self._cycle - 2
            self._asked = {key: cycle for key, cycle in self._asked.items() if cycle >= recent}
            self._known = {key: self._known[key] for key in self._asked}

    def units(self, group: model.Group) -> tuple[Unit, ...]:
        """``units(group, ())``, from the cache while ``group`` is the object it was computed for."""
        self._asked[group.id] = self._cycle
        known = self._known.get(group.id)
        if known is not None and known[0] is group:
            return known[1]
        found = tuple(units(group, ()))
        self._known[group.id] = (group, found)
        return found

    def ordered(self, key: Hashable, groups: Iterable[model.Group]) -> list[Unit]:
        """The units of the preemptible ``groups`` in victim order, kept per ``key`` (an action's list) from cycle to
        cycle: a busy cycle's list holds some 30,000 units of which a few thousand changed, so the units of the groups
        that are the same objects as last time keep their place and only the others' are sorted in. The order is
        total (``order_key`` ends with the group id and the first pod's uid), so this is the list a full sort gives."""
        cycle = self._cycle
        asked = self._asked
        now: dict[model.GroupId, model.Group] = {}
        for group in groups:
            if group.preemptible:
                now[group.id] = group
                asked[group.id] = cycle
        known = self._lists.get(key)
        if known is None:
            found = [unit for group in now.values() for unit in self.units(group)]
        else:
            before, previous, _ = known
            found = [unit for unit in previous if now.get(unit.group.id) is unit.group]
            found += [unit for gid, group in now.items() if before.get(gid) is not group for unit in self.units(group)]
        found.sort(key=_ORDER)  # two sorted runs where the list was kept: merged in one pass
        self._lists[key] = (now, found, cycle)
        return found


def units(group: model.Group, evicted: Container[model.PodUid]) -> list[Unit]:
    """The eviction units of a running group: each pod it could do without, each subgroup it could do without,
    then the whole group."""
    # A pod already leaving (its eviction under way) frees its room by itself: it is no victim.
    running = [
        pod
        for pod in group.members
        if pod.phase is model.PodPhase.RUNNING and not pod.leaving and pod.uid not in evicted
    ]
    if not running:
        return []
    found: list[Unit] = []
    satisfied = sum(1 for pod in group.members if subgroups.satisfied(pod, evicted))
    if len(running) > 1 and satisfied > group.min_member:
        youngest_first = sorted(running, key=lambda pod: (-started(pod), pod.uid))
        if not group.subgroups:
            found += [_unit(group, (pod,), extra=True) for pod in youngest_first]
        else:
            shape = subgroups.of(group)
            before = subgroups.leaf_counts(shape, group.members, evicted)
            for pod in youngest_first:
                after = dict(before)
                if pod.subgroup in after:
                    after[pod.subgroup] -= 1
                if subgroups.keeps(shape, before, after):
                    found.append(_unit(group, (pod,), extra=True))
            for name in shape.order:
                leaves = shape.leaves[name]
                part = [pod for pod in running if pod.subgroup in leaves]
                if 1 < len(part) < len(running) and spare(group, part, evicted):
                    found.append(_unit(group, sorted(part, key=lambda pod: pod.uid), extra=True))
    found.append(_unit(group, sorted(running, key=lambda pod: pod.uid), extra=False))
    return found


def spare(group: model.Group, pods: Sequence[model.Pod], evicted: Container[model.PodUid]) -> bool:
    """Would the gang keep its minimum (and every satisfied subgroup its own, or none of its pods) without ``pods``,
    besides the pods already ``evicted``?"""
    gone = {pod.uid for pod in pods}
    members = group.members
    left = sum(1 for pod in members if pod.uid not in gone and subgroups.satisfied(pod, evicted))
    if left < group.min_member:
        return False
    if not group.subgroups:
        return True
    shape = subgroups.of(group)
    before = subgroups.leaf_counts(shape, members, evicted)
    after = dict(before)
    for pod in pods:
        if pod.subgroup in after and subgroups.satisfied(pod, evicted):
            after[pod.subgroup] -= 1
    return subgroups.keeps(shape, before, after)


def can_take(unit: Unit, evicted: Container[model.PodUid]) -> bool:
    """May ``unit`` be evicted now, given the pods already evicted? An extra only while its gang keeps its minimum."""
    if not unit.extra:
        return True
    live = live_pods(unit, evicted)
    return bool(live) and spare(unit.group, live, evicted)


def live_pods(unit: Unit, evicted: Container[model.PodUid]) -> tuple[model.Pod, ...]:
    """The unit's pods not evicted yet (the unit's own tuple while none is: asked for every candidate of every
    room-making attempt, and most units are one pod)."""
    pods = unit.pods
    if len(pods) == 1:
        return () if pods[0].uid in evicted else pods
    live = tuple(pod for pod in pods if pod.uid not in evicted)
    return pods if len(live) == len(pods) else live


def live_amounts(unit: Unit, evicted: Container[model.PodUid]) -> Resources:
    """What the unit's pods not evicted yet hold, as queues count it."""
    live = live_pods(unit, evicted)
    if live is unit.pods:
        return unit.amounts
    return sum((plan.pod_amounts(pod) for pod in live), model.ZERO)


def old_enough(unit: Unit, *, now_ns: int, min_runtime_ns: int) -> bool:
    """True when every pod of the unit has run at least ``min_runtime_ns``."""
    return all(now_ns - started(pod) >= min_runtime_ns for pod in unit.pods)

"""Victims: what may be evicted as one unit, and in which order, so that evictions disturb the least.

A running gang can lose pods beyond its minimum (its elastic *extras*) one at a time, but evicting any member of its
minimum breaks the gang, so the rest of it goes with that member: the unit is then the whole running group. Which
pods are the extras is not fixed in advance: every running pod the gang (and the pod's subgroup) could do without is
offered as a one-pod unit, so room-making takes the ones that run where room is needed (KAI splits a victim job into
its elastic tasks and its core the same way). ``can_take`` checks, at the moment of eviction, that the gang still
keeps its minimum without the pod: a gang of minimum 2 running 4 pods gives up at most 2 of them as extras.

Units are tried lowest priority first (KAI takes its victims in reverse job order, lowest priority first), then
fewest pods, then least GPU, then youngest (most recently started), then by group id and pod uid, so the choice is
deterministic.

Min-runtimes protect young pods: a pod that has run less than its queue's ``reclaimMinRuntime`` (for reclaim) or
``preemptMinRuntime`` (for preemption and consolidation) is not a victim yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container

from common.resources import Resources
from scheduler.placement import model, plan


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unit:
    """Pods that are evicted together."""

    group: model.Group
    pods: tuple[model.Pod, ...]
    amounts: Resources
    """What the pods hold, as queues count it."""
    youngest_started_ns: int
    extra: bool = False
    """One pod beyond the gang's minimum: the gang keeps running without it (checked again by ``can_take``)."""

    @property
    def order_key(self) -> tuple[int, int, int, int, str, str]:
        return (
            self.group.priority,
            len(self.pods),
            self.amounts.milli_gpu,
            -self.youngest_started_ns,
            self.group.id,
            self.pods[0].uid,
        )


def started(pod: model.Pod) -> int:
    return pod.started_ns if pod.started_ns is not None else pod.created_ns


def _satisfied(pod: model.Pod, evicted: Container[model.PodUid]) -> bool:
    if pod.phase is model.PodPhase.SUCCEEDED:
        return True
    return pod.phase is model.PodPhase.RUNNING and pod.uid not in evicted


def units(group: model.Group, evicted: Container[model.PodUid]) -> list[Unit]:
    """The eviction units of a running group: each pod it could do without, then the whole group."""
    running = [pod for pod in group.members if pod.phase is model.PodPhase.RUNNING and pod.uid not in evicted]
    if not running:
        return []
    found: list[Unit] = []
    satisfied = sum(1 for pod in group.members if _satisfied(pod, evicted))
    if len(running) > 1 and satisfied > group.min_member:
        minimums = {sub.name: sub.min_member for sub in group.subgroups}
        per_subgroup: dict[str, int] = {}
        for pod in group.members:
            if pod.subgroup is not None and _satisfied(pod, evicted):
                per_subgroup[pod.subgroup] = per_subgroup.get(pod.subgroup, 0) + 1
        for pod in sorted(running, key=lambda pod: (-started(pod), pod.uid)):
            if pod.subgroup is not None and per_subgroup[pod.subgroup] <= minimums.get(pod.subgroup, 0):
                continue
            found.append(
                Unit(
                    group=group,
                    pods=(pod,),
                    amounts=plan.pod_amounts(pod),
                    youngest_started_ns=started(pod),
                    extra=True,
                )
            )
    ordered = tuple(sorted(running, key=lambda pod: pod.uid))
    found.append(
        Unit(
            group=group,
            pods=ordered,
            amounts=sum((plan.pod_amounts(pod) for pod in running), model.ZERO),
            youngest_started_ns=max(started(pod) for pod in running),
        )
    )
    return found


def _spare(group: model.Group, pod: model.Pod, evicted: Container[model.PodUid]) -> bool:
    """Would the gang, and the pod's subgroup, still have its minimum without ``pod``?"""
    satisfied = sum(1 for member in group.members if _satisfied(member, evicted))
    if satisfied - 1 < group.min_member:
        return False
    if pod.subgroup is None:
        return True
    minimum = next((sub.min_member for sub in group.subgroups if sub.name == pod.subgroup), 0)
    in_subgroup = sum(1 for member in group.members if member.subgroup == pod.subgroup and _satisfied(member, evicted))
    return in_subgroup - 1 >= minimum


def can_take(unit: Unit, evicted: Container[model.PodUid]) -> bool:
    """May ``unit`` be evicted now, given the pods already evicted? An extra only while its gang keeps its minimum."""
    if not unit.extra:
        return True
    pod = unit.pods[0]
    return pod.uid not in evicted and _spare(unit.group, pod, evicted)


def live_pods(unit: Unit, evicted: Container[model.PodUid]) -> tuple[model.Pod, ...]:
    """The unit's pods not evicted yet."""
    return tuple(pod for pod in unit.pods if pod.uid not in evicted)


def old_enough(unit: Unit, *, now_ns: int, min_runtime_ns: int) -> bool:
    """True when every pod of the unit has run at least ``min_runtime_ns``."""
    return all(now_ns - started(pod) >= min_runtime_ns for pod in unit.pods)

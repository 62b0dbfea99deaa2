"""Victims: what may be evicted as one unit, and in which order, so that evictions disturb the least.

A running gang can lose its elastic extras one at a time (youngest first), but evicting any member of its minimum
breaks the gang, so the rest of it goes with that member: the unit is then the whole running group. Units are
tried fewest pods first, then least GPU, then youngest (most recently started), then by group id and pod uid, so
the choice is deterministic.

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

    @property
    def order_key(self) -> tuple[int, int, int, str, str]:
        return (len(self.pods), self.amounts.milli_gpu, -self.youngest_started_ns, self.group.id, self.pods[0].uid)


def started(pod: model.Pod) -> int:
    return pod.started_ns if pod.started_ns is not None else pod.created_ns


def units(group: model.Group, evicted: Container[model.PodUid]) -> list[Unit]:
    """The eviction units of a running group: its elastic extras one by one, then the whole group."""
    running = [pod for pod in group.members if pod.phase is model.PodPhase.RUNNING and pod.uid not in evicted]
    if not running:
        return []
    satisfied = len(running) + sum(1 for pod in group.members if pod.phase is model.PodPhase.SUCCEEDED)
    spare = satisfied - group.min_member
    minimums = {sub.name: sub.min_member for sub in group.subgroups}
    per_subgroup: dict[str | None, int] = {}
    for pod in running:
        per_subgroup[pod.subgroup] = per_subgroup.get(pod.subgroup, 0) + 1
    found: list[Unit] = []
    for pod in sorted(running, key=lambda pod: (-started(pod), pod.uid)):
        if spare <= 0:
            break
        if pod.subgroup is not None and per_subgroup[pod.subgroup] <= minimums.get(pod.subgroup, 0):
            continue
        per_subgroup[pod.subgroup] -= 1
        spare -= 1
        found.append(Unit(group=group, pods=(pod,), amounts=plan.pod_amounts(pod), youngest_started_ns=started(pod)))
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


def old_enough(unit: Unit, *, now_ns: int, min_runtime_ns: int) -> bool:
    """True when every pod of the unit has run at least ``min_runtime_ns``."""
    return all(now_ns - started(pod) >= min_runtime_ns for pod in unit.pods)

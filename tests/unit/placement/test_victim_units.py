"""The engine's cache of running groups' eviction units (``victims.UnitCache``): the units a fresh computation gives,
kept while the group is the same object, and forgotten once no cycle asks about the group."""

from __future__ import annotations

import dataclasses
import random

from scheduler.placement import model, victims
from tests.unit.placement import builders


def _running(gid: str, pods: int = 2) -> model.Group:
    members = tuple(
        dataclasses.replace(
            builders.pod(f"{gid}-{index}", gpus=1),
            phase=model.PodPhase.RUNNING,
            node=model.NodeName("n0"),
            started_ns=index,
        )
        for index in range(pods)
    )
    return builders.group(gid, *members, min_member=1)


def test_the_cache_gives_the_units_a_fresh_computation_gives_and_keeps_them_while_the_group_is_the_same() -> None:
    cache = victims.UnitCache()
    cache.new_cycle()
    group = _running("g")
    first = cache.units(group)
    assert first == tuple(victims.units(group, ()))
    cache.new_cycle()
    assert cache.units(group) is first  # kept: the same group object
    changed = dataclasses.replace(group, priority=group.priority + 1)
    again = cache.units(changed)
    assert again is not first and again == tuple(victims.units(changed, ()))


def test_a_group_no_cycle_asks_about_is_forgotten_and_one_asked_about_every_cycle_is_kept() -> None:
    cache = victims.UnitCache()
    asked = _running("asked")
    others = [_running(f"other-{index}", pods=1) for index in range(1100)]  # past the size it starts pruning at
    cache.new_cycle()
    kept = cache.units(asked)
    first = {group.id: cache.units(group) for group in others}
    for _ in range(4):
        cache.new_cycle()
        assert cache.units(asked) is kept
    for group in others:
        found = cache.units(group)
        assert found == first[group.id]
        assert found is not first[group.id]  # computed again: it had been forgotten


def test_the_ordered_list_kept_from_cycle_to_cycle_is_the_list_a_full_sort_gives() -> None:
    """Groups come, go, and change (a new object: another priority, fewer pods) from cycle to cycle; the kept list
    always equals the units of the cycle's preemptible groups sorted afresh."""
    rng = random.Random(7)
    cache = victims.UnitCache()
    groups: dict[str, model.Group] = {}
    serial = 0
    for _ in range(12):
        cache.new_cycle()
        for gid in rng.sample(sorted(groups), k=min(len(groups), rng.randint(0, 4))):
            del groups[gid]
        for gid in rng.sample(sorted(groups), k=min(len(groups), rng.randint(0, 4))):
            group = groups[gid]
            groups[gid] = dataclasses.replace(group, priority=rng.choice([50, 60, 125]), members=group.members[:1])
        for _ in range(rng.randint(1, 6)):
            serial += 1
            group = _running(f"g{serial:03d}", pods=rng.randint(1, 3))
            groups[group.id] = dataclasses.replace(group, priority=rng.choice([50, 60, 125]))
        running = list(groups.values())
        rng.shuffle(running)
        found = cache.ordered("all", running)
        fresh = sorted(
            (unit for group in running if group.preemptible for unit in victims.units(group, ())),
            key=lambda unit: unit.order_key,
        )
        assert [(unit.group.id, [pod.uid for pod in unit.pods]) for unit in found] == [
            (unit.group.id, [pod.uid for pod in unit.pods]) for unit in fresh
        ]
        assert all(unit.group is groups[unit.group.id] for unit in found)


def test_a_list_no_cycle_asks_for_is_forgotten() -> None:
    cache = victims.UnitCache()
    cache.new_cycle()
    group = _running("g")
    first = cache.ordered(("queue", "q"), [group])
    cache.new_cycle()
    assert cache.ordered(("queue", "q"), [group]) == first
    for _ in range(3):
        cache.new_cycle()
    assert ("queue", "q") not in cache._lists

"""The engine's cache of running groups' eviction units (``victims.UnitCache``): the units a fresh computation gives,
kept while the group is the same object, and forgotten once no cycle asks about the group."""

from __future__ import annotations

import dataclasses

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

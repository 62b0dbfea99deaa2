"""Containment of a failing cycle: the group the engine fails with is found, struck, quarantined, and let back.

The engine here is the real one, wrapped so that it raises whenever a snapshot holds the "poison" group: the
stand-in for a bug in the placement core that one group's shape trips (the real core has none known, which is why
it must be injected).
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler import containment
from scheduler.placement import engine, model, plan, status
from tests.unit.placement import builders as b

POISON = model.GroupId("poison")


class TrippedEngine:
    """The real engine, failing like a bug would on any snapshot that holds the poison group."""

    def __init__(self) -> None:
        self._engine = engine.Engine()

    def run(self, snapshot: model.Snapshot) -> plan.Plan:
        if POISON in snapshot.groups:
            raise ZeroDivisionError("division by zero in a share of poison")
        return self._engine.run(snapshot)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def cluster(*extra: model.Group) -> model.Snapshot:
    groups = [b.group(f"g{i}", b.pod(f"p{i}", gpus=1)) for i in range(7)]
    groups.insert(3, b.group(str(POISON), b.pod("poison-0", fraction=500)))
    return model.snapshot(
        nodes=[b.node("n1", gpus=8), b.node("n2", gpus=8)],
        queues=b.open_queues(),
        groups=[*groups, *extra],
        now_ns=0,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def quarantine(clock: Clock) -> containment.Quarantine:
    return containment.Quarantine(clock_s=clock, make_engine=TrippedEngine)


def test_the_culprit_is_found_among_eight_groups(quarantine: containment.Quarantine) -> None:
    assert quarantine.culprits(cluster()) == [POISON]


def test_a_failure_without_any_group_has_no_culprit() -> None:
    class Broken:
        def run(self, snapshot: model.Snapshot) -> plan.Plan:
            raise RuntimeError("broken on every snapshot")

    assert containment.Quarantine(clock_s=Clock(), make_engine=Broken).culprits(cluster()) == []


def test_three_strikes_quarantine_a_group_with_its_error_and_it_comes_back_after_the_period(
    quarantine: containment.Quarantine, clock: Clock
) -> None:
    snapshot = cluster()
    error = ZeroDivisionError("division by zero in a share of poison")
    for strike in (1, 2):
        assert quarantine.strike([POISON], error) == []
        [retrying] = quarantine.statuses().values()
        assert retrying.reason is status.Reason.SCHEDULING_ERROR and f"{strike} of 3" in retrying.message
        assert quarantine.struck()
        assert quarantine.admit(snapshot) is snapshot, "a struck group is still tried"
    assert quarantine.strike([POISON], error) == [POISON]
    assert not quarantine.struck()
    [left_out] = quarantine.statuses().values()
    assert "left out of scheduling for 60 s" in left_out.message and "ZeroDivisionError" in left_out.message
    admitted = quarantine.admit(snapshot)
    assert POISON not in admitted.groups and len(admitted.groups) == 7
    assert quarantine.admit(snapshot).groups is admitted.groups, "same mapping while nothing changed"
    TrippedEngine().run(admitted)  # the rest of the cluster plans
    clock.now_s += 61
    assert quarantine.admit(snapshot) is snapshot and quarantine.statuses() == {}
    for _ in range(3):
        newly = quarantine.strike([POISON], error)
    assert newly == [POISON]
    [again] = quarantine.statuses().values()
    assert "for 120 s" in again.message, "the period doubles while the group keeps failing"


def test_a_cycle_that_succeeds_with_the_group_clears_its_strikes(quarantine: containment.Quarantine) -> None:
    snapshot = cluster()
    quarantine.strike([POISON], ValueError("x"))
    quarantine.strike([POISON], ValueError("x"))
    quarantine.succeeded(snapshot)
    assert quarantine.statuses() == {} and not quarantine.struck()


def test_the_groups_just_struck_keep_their_strikes_when_the_rerun_without_them_succeeds(
    quarantine: containment.Quarantine,
) -> None:
    snapshot = cluster()
    without = dataclasses.replace(snapshot, groups={k: v for k, v in snapshot.groups.items() if k != POISON})
    quarantine.strike([POISON], ValueError("x"))
    quarantine.succeeded(without, struck=[POISON])
    assert quarantine.struck()


def test_the_next_release_is_when_the_earliest_quarantine_ends(
    quarantine: containment.Quarantine, clock: Clock
) -> None:
    assert quarantine.next_release_s() is None
    for _ in range(3):
        quarantine.strike([POISON], ValueError("x"))
    assert quarantine.next_release_s() == clock.now_s + containment.FIRST_QUARANTINE_S
    clock.now_s += containment.FIRST_QUARANTINE_S
    assert quarantine.next_release_s() is None

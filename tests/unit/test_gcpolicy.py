"""The scheduler's garbage collection (``scheduler.gcpolicy``): none inside a cycle, the one due at its end.

Each test runs under the scheduler's thresholds and leaves the process's collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from scheduler import gcpolicy


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations collected while the test runs, in order (the collector on, the scheduler's thresholds)."""
    seen: list[int] = []

    def noted(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    was_enabled = gc.isenabled()
    gc.enable()
    gc.collect()  # start from an empty young generation
    gc.callbacks.append(noted)
    try:
        with gcpolicy.applied():
            yield seen
    finally:
        gc.callbacks.remove(noted)
        if not was_enabled:
            gc.disable()


def _allocate(count: int) -> list[list[int]]:
    """``count`` container objects the collector tracks, kept alive."""
    return [[index] for index in range(count)]


def test_no_collection_runs_inside_a_cycle_and_the_one_due_runs_at_its_end(collections: list[int]) -> None:
    with gcpolicy.cycle():
        assert not gc.isenabled()
        kept = _allocate(gcpolicy.THRESHOLDS[0] + 50_000)  # past the threshold: a collection would have run here
        assert collections == []
    assert gc.isenabled()
    assert collections == [0]  # the young generation, at the end
    assert gc.get_count()[0] < gcpolicy.YOUNG_AT_CYCLE_END
    del kept


def test_a_cycle_that_leaves_little_behind_collects_nothing(collections: list[int]) -> None:
    with gcpolicy.cycle():
        garbage = _allocate(gcpolicy.THRESHOLDS[0] + 50_000)
        del garbage  # freed by reference counting: the young generation is nearly empty again
        kept = _allocate(1_000)
    assert collections == []
    assert gc.get_count()[0] < gcpolicy.YOUNG_AT_CYCLE_END
    del kept


def test_the_older_generations_are_collected_when_their_turn_comes(collections: list[int]) -> None:
    middle = gcpolicy.THRESHOLDS[1]
    kept = []
    # CPython collects the middle generation once more young collections than its threshold have run since its last.
    for _ in range(middle + 2):
        with gcpolicy.cycle():
            kept.append(_allocate(gcpolicy.YOUNG_AT_CYCLE_END))
    assert collections == [0] * (middle + 1) + [1]
    assert gc.get_count()[1] == 0
    del kept


def test_a_failing_cycle_still_turns_the_collector_back_on(collections: list[int]) -> None:
    with pytest.raises(RuntimeError), gcpolicy.cycle():
        raise RuntimeError("the engine failed")
    assert gc.isenabled()


def test_with_the_collector_off_a_cycle_leaves_it_off_and_collects_nothing(collections: list[int]) -> None:
    gc.disable()
    try:
        with gcpolicy.cycle():
            kept = _allocate(gcpolicy.YOUNG_AT_CYCLE_END + 10_000)
        assert not gc.isenabled()
        assert collections == []
    finally:
        gc.enable()
    del kept

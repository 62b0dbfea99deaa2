"""The scheduler's garbage collection (``scheduler.gcpolicy``): none inside a cycle, what it keeps frozen at its
end until a full collection.

Each test runs under the scheduler's thresholds and leaves the process's collector as it found it (nothing frozen)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from scheduler import gcpolicy


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The generations collected while the test runs, in order (the collector on, the scheduler's thresholds, no
    freeze counted towards a full collection yet)."""
    seen: list[int] = []
    monkeypatch.setattr(gcpolicy, "_frozen_since_full", 0)

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
        gc.unfreeze()
        if not was_enabled:
            gc.disable()


def _allocate(count: int) -> list[list[int]]:
    """``count`` container objects the collector tracks, kept alive."""
    return [[index] for index in range(count)]


def test_no_collection_runs_inside_a_cycle_and_what_it_kept_is_frozen_at_its_end(collections: list[int]) -> None:
    with gcpolicy.cycle():
        assert not gc.isenabled()
        kept = _allocate(gcpolicy.THRESHOLDS[0] + 50_000)  # past the threshold: a collection would have run here
        assert collections == []
    assert gc.isenabled()
    assert collections == [], "nothing collected: what a cycle keeps is not garbage"
    assert gc.get_count()[0] < gcpolicy.YOUNG_AT_CYCLE_END
    assert gc.get_freeze_count() >= len(kept), "what the cycle kept is frozen"
    del kept


def test_a_cycle_that_leaves_little_behind_collects_nothing(collections: list[int]) -> None:
    with gcpolicy.cycle():
        garbage = _allocate(gcpolicy.THRESHOLDS[0] + 50_000)
        del garbage  # freed by reference counting: the young generation is nearly empty again
        kept = _allocate(1_000)
    assert collections == []
    assert gc.get_count()[0] < gcpolicy.YOUNG_AT_CYCLE_END
    del kept


class _Cyclic:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_busy_cycles_never_make_the_older_generations_collect(collections: list[int]) -> None:
    kept = []
    frozen = []
    for _ in range(gcpolicy.THRESHOLDS[1] + 5):  # past the count at which CPython collects the middle generation
        with gcpolicy.cycle():
            kept.append(_allocate(gcpolicy.YOUNG_AT_CYCLE_END))
        frozen.append(gc.get_freeze_count())
    assert collections == []
    assert frozen == sorted(frozen) and frozen[-1] - frozen[0] >= len(kept[0]) * (len(kept) - 1)
    del kept


def test_cyclic_garbage_frozen_at_a_cycles_end_is_freed_by_the_next_full_collection(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gcpolicy, "FULL_EVERY", 3)
    cyclic = _Cyclic()
    gone = weakref.ref(cyclic)
    with gcpolicy.cycle():
        kept = _allocate(gcpolicy.YOUNG_AT_CYCLE_END)
    del cyclic  # garbage now, but frozen: young collections leave it
    with gcpolicy.cycle():
        kept += _allocate(gcpolicy.YOUNG_AT_CYCLE_END)
    assert gone() is not None
    with gcpolicy.cycle():
        kept += _allocate(gcpolicy.YOUNG_AT_CYCLE_END)
    assert collections == [2]
    assert gone() is None, "the full collection unfroze and freed it"
    assert gc.get_freeze_count() >= len(kept), "and froze what survived again"
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

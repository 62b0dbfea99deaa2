"""A cycle leaves no cyclic garbage: the scheduler freezes what a busy cycle keeps instead of collecting it
(``scheduler.gcpolicy``), so a reference cycle among a cycle's objects (a cache holding a closure over the scene that
holds the cache, say) would keep every cycle's working state alive until the next full collection."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator

import pytest

from scheduler.placement import engine
from tests.unit.placement import clusters

NS = clusters.NS


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The collector off while the test runs (nothing collected behind its back), as it found it after."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def test_cycles_that_make_room_leave_no_cyclic_garbage(collector_off: None) -> None:
    snapshot = clusters.awaiting_consolidation()  # consolidation, reclaim and preemption all look
    gc.collect()
    warm = engine.Engine()
    for second in range(3):
        result = warm.run(dataclasses.replace(snapshot, now_ns=(10 + second) * NS))
        assert result.evictions, "room was made (the cycle went through the room-making actions)"
    del result
    assert gc.collect() == 0, "a cycle's objects were left in reference cycles"

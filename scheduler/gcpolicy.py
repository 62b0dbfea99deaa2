"""The scheduler process's garbage collection: rarely, and between cycles rather than in the middle of one.

A busy cycle makes millions of short-lived container objects (candidate lists, tuples, the draft's records), nearly
all freed by reference counting as soon as they are dropped; the engine's own structures avoid reference cycles
(``placement.walk``), so they never need the cyclic collector. Two settings follow.

**Thresholds** (``THRESHOLDS``, set at start by ``apply``). CPython's defaults (700, 10, 10) run the cyclic collector
every 700 net allocations and a full collection, which walks every live object of the scheduler's state, every 100
young ones: measured on ``bench engine --nodes 5000 --pods 45000``, 10,218 young and 33 full collections took 14.5 s
of a 59 s run (up to 0.72 s each), a quarter of the time. With 100,000 the same run collected 158 times in 2.5 s;
with 400,000, 125 times in 1.0 s, the same resident memory. Between cycles (the watches, the dispatcher) these
thresholds hold as they are.

**No collection inside a cycle** (``cycle``, around every ``Engine.run``). A young collection walks every object the
young generation holds when it runs, and in the middle of a busy cycle that is the cycle's own working objects:
measured at cd4a558, each of the busy cycles' young collections walked 500,000 to 630,000 objects, none of them
garbage, for 0.2 to 0.3 s, in the slowest cycles of the run. At the end of the cycle those objects are gone and only
what it keeps remains (30,000 to 130,000 objects in a busy cycle: the plan, the statuses, the caches it updated, the
snapshot's new objects), and none of that is garbage either: measured at 35e73d4, every young collection made at a
busy cycle's end (0.04-0.09 s each) found nothing to free.

**What a cycle keeps is frozen, not collected** (``gc.freeze`` once the young generation holds
``YOUNG_AT_CYCLE_END`` objects at a cycle's end). Frozen objects are left out of every collection but are freed by
reference counting as usual: only cyclic garbage among them (an exception's traceback, say; the engine makes no
reference cycles, and a test holds it to that: ``tests/unit/placement/test_engine_garbage.py``) waits, for a full
collection of everything (``gc.unfreeze`` first) after ``FULL_EVERY`` such cycles, the cadence at which CPython's
thresholds would make one. Without the freeze the survivors would pile up in the middle generation, whose collection
(every 20 young ones) walked up to two million objects, 0.3-0.5 s in one cycle. The full collection belongs to the
cycle that makes it: it is timed with it, in the scheduler's cycle histogram and in ``bench engine``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

THRESHOLDS = (400_000, 20, 10)
"""``gc.set_threshold``'s three values for the scheduler process."""

YOUNG_AT_CYCLE_END = 20_000
"""A cycle ends with a freeze once the young generation holds this many objects: a busy cycle keeps 30,000 to
130,000, a quiet one a few thousand (left to the collector's own thresholds)."""

FULL_EVERY = THRESHOLDS[1] * THRESHOLDS[2]
"""Cycles ending with a freeze between two full collections (the frozen objects unfrozen first): CPython's thresholds
would collect the oldest generation after this many young collections."""

_frozen_since_full = 0
"""Cycles ended with a freeze since the last full collection (one collector per process: so is this count)."""


def apply() -> None:
    """Set the scheduler's thresholds for this process (the scheduler does at start; ``bench engine``, which stands
    for it, while it runs: ``applied``)."""
    gc.set_threshold(*THRESHOLDS)


@contextlib.contextmanager
def applied() -> Iterator[None]:
    """The scheduler's thresholds while the block runs, the process's own again after it (a bench run in a test)."""
    before = gc.get_threshold()
    apply()
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextlib.contextmanager
def cycle() -> Iterator[None]:
    """Run the block (one scheduling cycle) with the cyclic collector off, then make the collection that is due
    (``collect_due``). Where the collector was off already (a test, a profiler), it stays off and nothing runs."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        collect_due()  # before the collector is on again: its own trigger would choose at the first allocation
        gc.enable()


def collect_due() -> int | None:
    """What a cycle's end owes the collector: nothing while the young generation holds fewer than
    ``YOUNG_AT_CYCLE_END`` objects; else a freeze of everything it tracks, after a full collection once ``FULL_EVERY``
    cycles have frozen since the last. Returns the generation collected (2), or None."""
    global _frozen_since_full
    if gc.get_count()[0] < YOUNG_AT_CYCLE_END:
        return None
    _frozen_since_full += 1
    generation = None
    if _frozen_since_full >= FULL_EVERY:
        _frozen_since_full = 0
        gc.unfreeze()
        gc.collect(2)
        generation = 2
    gc.freeze()
    return generation

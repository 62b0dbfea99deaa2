"""The scheduler process's garbage-collector thresholds: collect cycles of garbage rarely, not every 700 objects.

A busy cycle makes millions of short-lived container objects (candidate lists, tuples, the draft's records), nearly
all freed by reference counting as soon as they are dropped. CPython's default thresholds (700, 10, 10) still run
the cyclic collector every 700 net allocations and a full collection, which walks every live object of the
scheduler's state, every 100 young ones: measured on ``bench engine --nodes 5000 --pods 45000``, 10,218 young and 33
full collections took 14.5 s of a 59 s run (up to 0.72 s each), a quarter of the time. With the thresholds below the
same run collected 39 times in 1.9 s, with the same resident memory. A young collection walks every object the young
generation holds when it runs, so a larger one finds more of them already freed: at 100,000 the same run (a later,
faster engine) spent 2.5 s in 158 collections, the longest 0.46 s; at 400,000, 1.0 s in 125, the longest 0.32 s,
the same resident memory.

Collections still run: the young generation every 400,000 net allocations (at most some tens of megabytes of
cyclic garbage wait for it), a full one after 200 of those (and only when, as CPython requires, a quarter of the
old objects are new), so cyclic garbage (asyncio tracebacks, mostly) is still found; the scheduler's own structures
avoid reference cycles (``placement.walk``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

THRESHOLDS = (400_000, 20, 10)
"""``gc.set_threshold``'s three values for the scheduler process."""


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

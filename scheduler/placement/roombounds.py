"""The bounds of one room-making attempt: how much it may evict and look at, and when trying the minimum is pointless.

A room-making attempt (``roommaking``) walks victim candidates in victim order and tries the group's minimum again
each time a node's pool of victims gives the node room. What it looks at grows with what the group asks for; what it
evicts does not:

- ``limits``: at most ``max(64, one per GPU asked)`` victim units evicted, and ``max(1,000, 16 per GPU asked)``
  candidates looked at (a share or a CPU-only pod counts as one GPU asked). The eviction bound grows with the
  group because a group waiting for its victims keeps the room they leave from others while the rest leave (KAI's
  pipelining, ``cycle.Cycle._hold_nominated_room``): before that, a gang whose hundreds of victims left over several
  cycles saw the over-share queue's recreated pods take the room first, and reclaim evicted again, cycle after
  cycle (measured: 21,680 evictions for one 400-GPU gang that never started), so the bound was a fixed 64 and
  KAI's 2,000-GPU "very large job" waited for ever;
- ``VictimLists``: each action's victim units, sorted once per cycle; an attempt starts after the units the cycle
  has already evicted whole, so the hundredth group of a cycle does not walk the first ninety-nine's victims again;
- ``Candidates``: the candidates, drawn lazily from the action's iterator up to that bound (an attempt that succeeds
  with the first candidate looks at no other), with an index per node for the look-ahead of "one later unit alone
  would do" (``roommaking``), built once per attempt on first use;
- ``FitBound``: for a minimum of several pods, an upper bound by requests (``freeing.pods_that_fit``) of how many
  of its pods of each shape the cluster holds now, kept up to date node by node as victims go. While it is short
  of the minimum, trying to place the minimum cannot succeed, so the attempt does not: a gang of n pods is not
  tried n times over n pools. It is a necessary condition only, so the attempt evicts exactly what it would without
  it.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

from scheduler.placement import decisions, freeing, model, nodework, plan, search, shapes, victims

UNITS = 64
"""Victim units one attempt may evict at least; a group asking for more GPUs may evict one per GPU asked."""
MIN_SCANNED = 1_000
"""Candidates one attempt may look at, at least: on a large cluster the useful victims of a small group are among the
first in victim order or nowhere, and a bound keeps a full cluster's cycle from growing with it."""
SCANNED_PER_GPU = 16
"""Candidates looked at per GPU asked: a gang's victims are spread over the cluster (victim order is by age, not by
node), so freeing whole nodes may need most of the candidates."""


def gpus_asked(wanted: Iterable[shapes.Shape]) -> int:
    """The GPUs the pods ask for, each pod at least one (a share counts its devices, a CPU-only pod one)."""
    total = 0
    for shape in wanted:
        devices = shape.share.devices if shape.share is not None else shape.whole_gpus
        total += max(1, devices)
    return total


def limits(wanted: Sequence[shapes.Shape]) -> tuple[int, int]:
    """The most victim units evicted and the most candidates looked at for a minimum of ``wanted`` shapes."""
    gpus = gpus_asked(wanted)
    return max(UNITS, gpus), max(MIN_SCANNED, SCANNED_PER_GPU * gpus)


class VictimLists:
    """Victim units per key (an action's candidates), sorted once per cycle, each walked from its first live unit."""

    def __init__(self, draft: plan.Draft, units: victims.UnitCache) -> None:
        self._draft = draft
        self._units = units
        units.new_cycle()
        self._sorted: dict[object, list[victims.Unit]] = {}
        self._live_from: dict[object, tuple[int, int, decisions.Eviction | None]] = {}

    def live(self, key: object, groups: Callable[[], list[model.Group]]) -> Iterator[victims.Unit]:
        """The units of ``groups`` (preemptible ones, cut before any eviction of this cycle) in victim order, from
        the first with a pod not evicted."""
        found, start = self.listed(key, groups)
        return itertools.islice(found, start, None)

    def listed(self, key: object, groups: Callable[[], list[model.Group]]) -> tuple[Sequence[victims.Unit], int]:
        """The units of ``groups`` in victim order (the same list all cycle) and the position of the first one with
        a pod not evicted: ``live`` is the list from there."""
        found = self._sorted.get(key)
        if found is None:
            found = self._sorted[key] = self._units.ordered(key, groups())
        return found, self._first_live(key, found)

    def _first_live(self, key: object, units: Sequence[victims.Unit]) -> int:
        """The units before the one found last time stay evicted as long as the draft's evictions up to the last one
        counted then are still there (the draft only appends, and rolls back by truncating): walk on from there."""
        evictions = self._draft.evictions
        start = 0
        known = self._live_from.get(key)
        if known is not None:
            index, count, last = known
            if count <= len(evictions) and (count == 0 or evictions[count - 1] is last):
                start = index
        evicted = self._draft.evicted
        while start < len(units) and all(pod.uid in evicted for pod in units[start].pods):
            start += 1
        self._live_from[key] = (start, len(evictions), evictions[-1] if evictions else None)
        return start


class Candidates:
    """Victim candidates in victim order, drawn lazily from ``source`` up to ``limit``."""

    def __init__(self, source: Iterable[victims.Unit], limit: int) -> None:
        self._source = iter(source)
        self._limit = limit
        self.seen: list[victims.Unit] = []
        self._by_node: dict[model.NodeName, list[int]] | None = None

    def get(self, index: int) -> victims.Unit | None:
        """The candidate at ``index``, None past the last one (or the bound)."""
        seen = self.seen
        while len(seen) <= index:
            if len(seen) >= self._limit:
                return None
            unit = next(self._source, None)
            if unit is None:
                self._limit = len(seen)
                return None
            seen.append(unit)
        return seen[index]

    def __iter__(self) -> Iterator[tuple[int, victims.Unit]]:
        index = 0
        while (unit := self.get(index)) is not None:
            yield index, unit
            index += 1

    def drawn(self) -> Sequence[victims.Unit]:
        """Every candidate within the bound, in order (drawing the rest now)."""
        while self.get(len(self.seen)) is not None:
            pass
        return self.seen

    def on_node_after(self, node: model.NodeName, index: int) -> Iterator[victims.Unit]:
        """The candidates after ``index`` with a pod on ``node``, in order (every candidate is drawn once, then an
        index per node serves every later call)."""
        if self._by_node is None:
            self.drawn()
            by_node: dict[model.NodeName, list[int]] = {}
            for position, unit in enumerate(self.seen):
                for name in dict.fromkeys(pod.node for pod in unit.pods if pod.node is not None):
                    by_node.setdefault(name, []).append(position)
            self._by_node = by_node
        positions = self._by_node.get(node, [])
        return (self.seen[position] for position in positions[bisect.bisect_right(positions, index) :])


class FitBound:
    """An upper bound, by requests, of how many pods of each shape of a minimum the cluster holds now."""

    def __init__(self, searcher: search.Searcher, wanted: Sequence[shapes.Shape]) -> None:
        self._capacity = searcher.capacity
        self._wanted = list(collections.Counter(wanted).items())
        self._eligible = [frozenset(searcher.eligible(shape.constraints)) for shape, _ in self._wanted]
        self._per_node: dict[model.NodeName, tuple[int, ...]] = {}
        self._totals = [0] * len(self._wanted)
        capacity = self._capacity
        for cls in sorted(frozenset().union(*self._eligible)):
            for order in capacity.classes[cls].members:
                work = capacity.by_order[order]
                counts = self._count(work)
                self._per_node[work.name] = counts
                for index, count in enumerate(counts):
                    self._totals[index] += count

    def _count(self, work: nodework.NodeWork) -> tuple[int, ...]:
        free = freeing.free_after(work, ())
        return tuple(
            freeing.pods_that_fit(work, free, shape, needed) if work.cls in classes else 0
            for (shape, needed), classes in zip(self._wanted, self._eligible, strict=True)
        )

    def changed(self, nodes: Iterable[model.NodeName]) -> None:
        """Count ``nodes`` again (room was freed or taken there)."""
        for name in dict.fromkeys(nodes):
            old = self._per_node.get(name)
            work = self._capacity.by_name.get(name)
            if old is None or work is None:
                continue
            new = self._count(work)
            self._per_node[name] = new
            for index, (before, after) in enumerate(zip(old, new, strict=True)):
                self._totals[index] += after - before

    def may_fit(self) -> bool:
        """Could the minimum fit now? False only when it surely cannot."""
        return all(total >= needed for total, (_, needed) in zip(self._totals, self._wanted, strict=True))

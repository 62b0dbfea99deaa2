"""Where victims first give a node room: the answer of room-making's walk, found node by node.

Room-making (``roommaking``) walks an action's candidate victims in victim order, pools each eligible one on the
nodes it runs on, and acts on the first node whose pool gives it room for a pod of the minimum. On a full cluster
that first node comes after hundreds of candidates (mostly shares: a GPU comes free for a whole-GPU pod only once
every share on it is pooled), and every attempt of the cycle walked them again: a 5,000-node backlog spent most of
its cycles there.

The walk's answer depends on each node alone: a node's pool holds candidates that run on it, so the node is ready
at the first position (in the cycle's victim list) at which its own pool gives it room. The walk stops at the
smallest such position over all nodes. This module keeps, per minimum shapes and set of queues, for the rest of the
cycle, a lower bound of that position for every node (``Earliest``): the position at which *every* live unit on the
node up to there, of the queues the action takes from, would give it room, whether or not the action may take that
unit. Room only grows with what leaves (``freeing.free_after``), and an attempt's pool on a node is some of those
units, so no attempt's node can be ready before its bound. An attempt then looks at nodes in order of their bounds,
walks each one's own candidates exactly as the walk would (``roommaking``), and stops once the next bound is past
the best node found: the same node and position as the walk, after looking at a few nodes instead of every
candidate before them.

The bounds are kept up to date with the cycle's changes (``capacity.Capacity.changes``: each node placed on,
evicted from or rolled back is looked at again) and found lazily, in victim order, as far as attempts ask.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Collection, Iterator, Sequence

from common.resources import Resources
from scheduler.placement import capacity, freeing, model, victims

_SWEEP = 64
"""Units of the action's queues looked at per step when the bounds are found further along the victim list."""


class Positions:
    """The cycle's victim list (every action's candidates come from it, in order), indexed by node and by queue."""

    def __init__(self, units: Sequence[victims.Unit]) -> None:
        self.units = units
        by_node: dict[model.NodeName, list[int]] = {}
        by_queue: dict[model.QueueName, list[int]] = {}
        for position, unit in enumerate(units):
            by_queue.setdefault(unit.group.queue, []).append(position)
            pods = unit.pods
            if len(pods) == 1:
                node = pods[0].node
                if node is not None:
                    by_node.setdefault(node, []).append(position)
                continue
            for name in dict.fromkeys(pod.node for pod in pods if pod.node is not None):
                by_node.setdefault(name, []).append(position)
        self.by_node = by_node
        """Per node, the positions of the units with a pod on it, ascending."""
        self.by_queue = by_queue
        self._largest: dict[model.QueueName, Resources] = {}

    def largest(self, queue: model.QueueName) -> Resources:
        """The most of each resource one unit of ``queue`` in the list holds (each resource's own maximum; found
        once per list): no unit of the queue, evictions or not, holds more of any."""
        found = self._largest.get(queue)
        if found is None:
            amounts = [self.units[position].amounts for position in self.by_queue.get(queue, ())]
            found = self._largest[queue] = Resources(
                milli_cpu=max((held.milli_cpu for held in amounts), default=0),
                memory_bytes=max((held.memory_bytes for held in amounts), default=0),
                milli_gpu=max((held.milli_gpu for held in amounts), default=0),
                pods=max((held.pods for held in amounts), default=0),
            )
        return found

    def backwards(self, queues: Collection[model.QueueName], start: int, end: int) -> Iterator[int]:
        """The positions of the units of ``queues`` from ``end`` (excluded) back to ``start``, descending."""
        spans = []
        for queue in queues:
            found = self.by_queue.get(queue)
            if found:
                low, high = bisect.bisect_left(found, start), bisect.bisect_left(found, end)
                if low < high:
                    spans.append((found, low, high))
        if len(spans) == 1:
            return _descending(*spans[0])
        return heapq.merge(*(_descending(*span) for span in spans), reverse=True)

    def window_end(self, start: int, queues: Collection[model.QueueName], count: int) -> int:
        """The position just past the ``count``-th unit of ``queues`` from ``start`` on (the list's end when there
        are no more): the candidates an attempt that looks at ``count`` of them sees lie before it."""
        lists = [self.by_queue[queue] for queue in queues if queue in self.by_queue]
        firsts = [bisect.bisect_left(positions, start) for positions in lists]
        if sum(len(positions) for positions in lists) - sum(firsts) < count:
            return len(self.units)
        low, high = start, len(self.units)
        while low < high:
            middle = (low + high) // 2
            seen = sum(bisect.bisect_left(positions, middle) for positions in lists) - sum(firsts)
            if seen >= count:
                high = middle
            else:
                low = middle + 1
        return low


def _descending(found: list[int], low: int, high: int) -> Iterator[int]:
    """``found[low:high]`` from its end back, without a copy."""
    for index in range(high - 1, low - 1, -1):
        yield found[index]


class Earliest:
    """For one minimum's shapes and the units of some queues: per node, the first position at which every live unit of
    those queues on it up to there would give it room for one more pod of the minimum (``ready``, in order), kept up
    to date during the cycle."""

    def __init__(
        self,
        positions: Positions,
        room: freeing.Room,
        cap: capacity.Capacity,
        evicted: Collection[model.PodUid],
        queues: Collection[model.QueueName],
        start: int = 0,
        *,
        never: Callable[[model.NodeName], bool] | None = None,
    ) -> None:
        """``queues``: only their units count (an action's candidates: the tighter the bound, the fewer nodes an
        attempt looks at). ``start``: the units before it have every pod evicted (an attempt's first live unit), so
        the sweep starts there; a node changed since (an eviction rolled back, say) is looked at again from its first
        unit."""
        self.positions = positions
        self._queues = queues
        self._room = room
        self._capacity = cap
        self._evicted = evicted
        self.ready: list[tuple[int, model.NodeName]] = []
        """(position, node) for each node found ready, ascending: every node whose bound is below ``frontier``."""
        self._at: dict[model.NodeName, int] = {}
        self._leaving: dict[model.NodeName, freeing.Leaving] = {}
        """Per node not ready yet, what it has free once the live pods of the units before ``frontier`` on it are
        gone."""
        self.frontier = start
        """The units before this position have been looked at."""
        self._every = all(queue in queues for queue in positions.by_queue)
        """Every unit of the list is of one of ``queues`` (consolidation's candidates): a sweep reads them in turn."""
        self._on_node: dict[model.NodeName, list[int]] = {}
        self._never = never
        """True for a node no attempt using these bounds can find ready (an attempt's window whose every unit on the
        node gone would not give it room): such a node gets no bound, whatever its units (asked once per node while
        it stays as it is)."""
        self._hopeless: dict[model.NodeName, bool] = {}
        self._epoch = cap.changes_epoch
        self._seen = len(cap.changes)

    def on_node(self, name: model.NodeName) -> list[int]:
        """The positions of the units of ``queues`` with a pod on the node, ascending (found once per node: an attempt
        walks a node's own candidates, and most units on a node may be other queues')."""
        found = self._on_node.get(name)
        if found is None:
            every = self.positions.by_node.get(name, [])
            if self._every:
                found = every
            else:
                units = self.positions.units
                queues = self._queues
                found = [position for position in every if units[position].group.queue in queues]
            self._on_node[name] = found
        return found

    def sync(self) -> None:
        """Look again at every node changed since the last call."""
        cap = self._capacity
        if cap.changes_epoch != self._epoch:
            self._epoch, self._seen = cap.changes_epoch, len(cap.changes)
            self.ready, self._at, self._leaving, self.frontier = [], {}, {}, 0
            return
        changes = cap.changes
        if self._seen == len(changes):
            return
        by_order = cap.by_order
        names = dict.fromkeys(by_order[order].name for order in changes[self._seen :])
        self._seen = len(changes)
        for name in names:
            self._redo(name)

    def _redo(self, name: model.NodeName) -> None:
        old = self._at.pop(name, None)
        if old is not None:
            del self.ready[bisect.bisect_left(self.ready, (old, name))]
        self._leaving.pop(name, None)
        self._hopeless.pop(name, None)
        if not self._room.usable(name) or self._passed(name):
            return
        frontier = self.frontier
        units = self.positions.units
        queues = self._queues
        for position in self.positions.by_node.get(name, ()):
            if position >= frontier:
                return
            if units[position].group.queue in queues and self._add(
                name, position, victims.live_pods(units[position], self._evicted)
            ):
                return

    def sweep(self, until: int) -> None:
        """Look at the next units not looked at yet, up to ``until`` and at most ``_SWEEP`` of the action's queues
        (only theirs: most of the list may be other queues' units)."""
        stop = min(len(self.positions.units), until)
        if self.frontier >= stop:
            return
        taken: Sequence[int]
        if self._every:
            taken = range(self.frontier, min(stop, self.frontier + _SWEEP))
            self.frontier = taken[-1] + 1
        else:
            by_queue = self.positions.by_queue
            spans = []
            for queue in self._queues:
                found = by_queue.get(queue)
                if found:
                    low = bisect.bisect_left(found, self.frontier)
                    if low < len(found) and found[low] < stop:
                        spans.append(found[low : low + _SWEEP])
            # The first _SWEEP positions of the queues from the frontier on, before ``stop``: where fewer, all of them.
            merged = heapq.merge(*spans) if len(spans) > 1 else spans[0] if spans else []
            taken = list(itertools.islice(itertools.takewhile(stop.__gt__, merged), _SWEEP))
            self.frontier = taken[-1] + 1 if len(taken) == _SWEEP else stop
        units = self.positions.units
        evicted = self._evicted
        room = self._room
        at = self._at
        for position in taken:
            live = victims.live_pods(units[position], evicted)
            if not live:
                continue
            for name in room.nodes_of(live):
                if name not in at and not self._passed(name):
                    self._add(name, position, live)

    def _passed(self, name: model.NodeName) -> bool:
        """Is the node one ``never`` says no attempt can find ready?"""
        never = self._never
        if never is None:
            return False
        known = self._hopeless.get(name)
        if known is None:
            known = self._hopeless[name] = never(name)
        return known

    def done(self) -> bool:
        return self.frontier >= len(self.positions.units)

    def _add(self, name: model.NodeName, position: int, live: Sequence[model.Pod]) -> bool:
        """The unit at ``position`` (``live``: its pods not evicted) joins the node's leaving pods; True when the node
        is ready with it."""
        leaving = self._leaving.get(name)
        if leaving is None:
            leaving = self._leaving[name] = freeing.Leaving(self._capacity.by_name[name])
        added = False
        for pod in live:
            if pod.node == name and leaving.add(pod):
                added = True
        if not added or not self._room.gains_with(name, leaving.free):
            return False
        del self._leaving[name]
        self._at[name] = position
        bisect.insort(self.ready, (position, name))
        return True

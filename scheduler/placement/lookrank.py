"""The looks ranked by score, per pod shape, so the scored search reads the best look instead of every look.

A scored search (``search``) scores each distinct look of the eligible node classes once and keeps the answer on
the look (``Look.best``); what it still paid for was the walk over every look, for every pod: about a thousand looks
on a 5,000-node cluster of mixed shares, most of a pod's placement time under the fragmentation strategy. A look's
score for a shape never changes while the scorer stays the same (the look *is* the node state the scorer reads), so
each shape keeps a heap of its looks by score and a search pops the best live ones.

What keeps a heap true:

- a look enters the live set (a node moves into a state no live node had) only through ``Capacity._index``, which
  writes it into ``Capacity.look_log``; each heap reads the log from where it stopped, so it sees every look that
  came (back) since;
- a look that lost its nodes stays in the heap until it reaches the top, where it is dropped (it is pushed again
  from the log if it comes back; while its entry is still there, that entry serves again, its answer being the same),
  or until ``best`` passes many such entries tied with the best, when every one is dropped at once;
- a new scorer (the searcher's epoch), a change in the node classes or a fresh log voids every heap.

Ties keep the search's rule: every live look with the best score is returned, and the search gives the pod to the
lowest node among them (or draws one).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from scheduler.placement import capacity

# Heap entries kept over all shapes before every heap starts afresh (a workload whose pods are all of different
# shapes would otherwise keep a heap per pod).
_ENTRY_LIMIT = 2_000_000

_GONE_TIED = 32
"""Entries of gone looks tied with the best that one ``best`` may pass before the heap drops every gone look."""

Scored = Callable[[capacity.Look], capacity.LookBest | None]
"""A look's answer for the shape being searched (None: the shape fits none of its device choices)."""

Candidate = tuple[int, Sequence[int], capacity.LookBest]
"""One tied look: its first node, its nodes in node order, its answer."""


class Ranking:
    __slots__ = ("cursor", "entries", "present")

    def __init__(self, cursor: int) -> None:
        self.entries: list[tuple[int, int, capacity.Look, capacity.LookBest]] = []
        """(minus the score, a sequence number that keeps looks from being compared, the look, its answer)."""
        self.cursor = cursor
        """How far into ``Capacity.look_log`` this heap has read."""
        self.present: set[int] = set()
        """The looks (by id) with an entry: a look that comes back while its old entry is still there keeps that one
        (its answer is the same), so a busy cluster's heap does not fill with copies."""


class LookRanks:
    """Per shape id, the looks of the shape's eligible classes ordered by score; see the module docstring."""

    def __init__(self) -> None:
        self._heaps: dict[int, Ranking] = {}
        self._valid_for: tuple[int, ...] = ()
        self._entries = 0
        self._seq = 0

    def heap(
        self,
        cap: capacity.Capacity,
        shape_id: int,
        eligible: tuple[int, ...],
        scored: Scored,
        *,
        epoch: int,
    ) -> Ranking:
        """The shape's ranking, to ask ``best`` or ``any`` of. ``scored`` must give the same answer for a look for as
        long as ``epoch``, the classes and the log stay. Brought up to date with the looks that came since it was last
        read."""
        valid_for = (epoch, cap.structure_version, cap.look_generation)
        if valid_for != self._valid_for or self._entries > _ENTRY_LIMIT:
            self._heaps.clear()
            self._entries = 0
            self._valid_for = valid_for
        log = cap.look_log
        heap = self._heaps.get(shape_id)
        if heap is None:
            heap = self._heaps[shape_id] = Ranking(len(log))
            classes = cap.classes
            for cls in eligible:
                for look in classes[cls].looks.values():
                    self._push(heap, look, scored)
            heapq.heapify(heap.entries)
        elif heap.cursor < len(log):
            wanted = set(eligible)
            entries = heap.entries
            present = heap.present
            for look in log[heap.cursor :]:
                if look.cls in wanted and look.members and id(look) not in present:
                    found = scored(look)
                    if found is not None:
                        self._seq += 1
                        self._entries += 1
                        present.add(id(look))
                        heapq.heappush(entries, (-found[0], self._seq, look, found))
            heap.cursor = len(log)
        return heap

    def _push(self, heap: Ranking, look: capacity.Look, scored: Scored) -> None:
        if id(look) in heap.present:
            return
        found = scored(look)
        if found is not None:
            self._seq += 1
            self._entries += 1
            heap.present.add(id(look))
            heap.entries.append((-found[0], self._seq, look, found))

    def any(self, heap: Ranking) -> bool:
        """Does some live look take the shape (``best`` is not empty)? Gone looks are dropped from the top first."""
        entries = heap.entries
        while entries and not entries[0][2].members:
            heap.present.discard(id(heapq.heappop(entries)[2]))
            self._entries -= 1
        return bool(entries)

    def _drop_gone(self, heap: Ranking) -> None:
        """Drop every entry of a look gone (it is pushed again from the log if it comes back)."""
        live = [entry for entry in heap.entries if entry[2].members]
        self._entries -= len(heap.entries) - len(live)
        heapq.heapify(live)
        heap.entries = live
        heap.present = {id(entry[2]) for entry in live}

    def best(self, heap: Ranking, *, every: bool = True) -> list[Candidate]:
        """Every live look with the best score (empty when none takes the shape): gone looks are dropped from the
        top until a live one is there, then every entry with its score is found without popping (in a heap they form
        a subtree around the root). Without ``every``, only the one whose first node comes first (the search's pick
        when no tie is drawn)."""
        if not self.any(heap):
            return []
        entries = heap.entries
        best = entries[0][0]
        top: list[Candidate] = []
        first: capacity.Look | None = None
        live = 0
        gone = 0
        size = len(entries)
        stack = [0]
        while stack:
            index = stack.pop()
            entry = entries[index]
            if entry[0] != best:
                continue
            look = entry[2]
            members = look.members
            if not members:
                gone += 1
            elif every:
                top.append((members[0], members, entry[3]))
            else:
                live += 1
                if first is None or members[0] < first.members[0]:
                    first, found = look, entry[3]
            child = 2 * index + 1
            if child < size:
                stack.append(child)
                if child + 1 < size:
                    stack.append(child + 1)
        if first is not None:
            top.append((first.members[0], first.members, found))
        else:
            live = len(top)
        if gone > _GONE_TIED and gone > live:
            # Looks come and go on a busy cluster, and the gone ones tied with the best stay below the top: the
            # walk above passed more of them than of live ones. Drop them all once (linear, like one such walk in
            # a few dozen).
            self._drop_gone(heap)
        return top

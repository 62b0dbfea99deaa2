"""The looks ranked by score, per pod shape, so the scored search reads the best look instead of every look.

A scored search (``search``) scores each distinct look of the eligible node classes once and keeps the answer on
the look (``Look.best``); what it still paid for was the walk over every look, for every pod: about a thousand looks
on a 5,000-node cluster of mixed shares, most of a pod's placement time under the fragmentation strategy. A look's
score for a shape never changes while the scorer stays the same (the look *is* the node state the scorer reads), so
each shape keeps a heap of its looks by score and a search pops the best live ones.

Each entry is keyed by the look's score, then by its first node: the top of a heap is the search's pick when no tie
is drawn (the lowest first node among the best), read without walking the looks tied with it (a busy cluster's
heaps hold a hundred such looks at the top, many of them gone). What keeps a heap true:

- a look enters the live set (a node moves into a state no live node had), or its first node comes earlier (a node
  before its others joins it), only through ``Capacity._index``, which writes it into ``Capacity.look_log``; each heap
  reads the log from where it stopped, so it sees every look that came (back) since (the log's looks that had no
  nodes left when first read are read by no heap: gone, they need no entry, and back, they are logged again), and a
  look whose first node is
  no longer the one its entry is keyed by gets an entry keyed by the new one (the old entry is then stale: it is
  dropped when it reaches the top, or passed by a walk);
- so no entry is keyed by a first node later than its look's: a look whose first node left has an entry keyed too
  early, which is keyed again when it reaches the top;
- a look that lost its nodes stays in the heap until it reaches the top, where it is dropped (it is pushed again
  from the log if it comes back; while its entry is still there, that entry serves again, its answer being the same),
  or until ``best`` passes many such entries tied with the best, when every one is dropped at once;
- a new scorer (the searcher's epoch), a change in the node classes or a fresh log voids every heap.

Ties keep the search's rule: every live look with the best score is returned when a tie is drawn, and the search
gives the pod to the lowest node among them (or draws one).
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

Entry = tuple[int, int, int, capacity.Look, capacity.LookBest]
"""A heap entry: (minus the score, the first node it is keyed by, a sequence number, the look, its answer)."""


class Ranking:
    __slots__ = ("cursor", "entries", "present")

    def __init__(self, cursor: int) -> None:
        self.entries: list[Entry] = []
        """(minus the score, the first node it is keyed by, a sequence number that keeps looks from being compared,
        the look, its answer)."""
        self.cursor = cursor
        """How far into the looks of the log (``LookRanks._log``) this heap has read."""
        self.present: dict[int, Entry] = {}
        """Per look (by id) with an entry, its current entry: a look that comes back while that entry is still there
        keeps it (its answer is the same; keyed again if its first node changed), so a busy cluster's heap does not
        fill with copies. Other entries of the look are stale."""


class LookRanks:
    """Per shape id, the looks of the shape's eligible classes ordered by score; see the module docstring."""

    def __init__(self) -> None:
        self._heaps: dict[int, Ranking] = {}
        self._valid_for: tuple[int, ...] = ()
        self._entries = 0
        self._seq = 0
        self._log: list[capacity.Look] = []
        """The looks of ``Capacity.look_log`` that still had nodes when first read, in order: what the heaps read (a
        busy cycle's log is mostly looks gone again, a node's state within an attempt later undone: read once here
        instead of once per shape). A look that comes back is in the capacity's log again."""
        self._copied = 0
        """How far into ``Capacity.look_log`` ``_log`` has read."""

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
            if valid_for[1:] != self._valid_for[1:]:
                self._log, self._copied = [], len(cap.look_log)  # a fresh log or other classes: read from here on
            self._heaps.clear()
            self._entries = 0
            self._valid_for = valid_for
        log = self._read_log(cap)
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
                members = look.members
                if look.cls not in wanted or not members:
                    continue
                entry = present.get(id(look))
                if entry is None:
                    found = scored(look)
                    if found is not None:
                        heapq.heappush(entries, self._entry(heap, -found[0], look, found))
                elif entry[1] != members[0]:
                    heapq.heappush(entries, self._entry(heap, entry[0], look, entry[4]))
            heap.cursor = len(log)
        return heap

    def _read_log(self, cap: capacity.Capacity) -> list[capacity.Look]:
        """``_log`` brought up to date with the capacity's log."""
        source = cap.look_log
        if self._copied < len(source):
            log = self._log
            for look in source[self._copied :]:
                if look.members:
                    log.append(look)
            self._copied = len(source)
        return self._log

    def _entry(self, heap: Ranking, key: int, look: capacity.Look, found: capacity.LookBest) -> Entry:
        """A new entry for ``look``, keyed by ``key`` (minus its score) and its first node now: the look's current
        one (``Ranking.present``). The caller puts it in the heap."""
        self._seq += 1
        self._entries += 1
        entry = (key, look.members[0], self._seq, look, found)
        heap.present[id(look)] = entry
        return entry

    def _push(self, heap: Ranking, look: capacity.Look, scored: Scored) -> None:
        if id(look) in heap.present:
            return
        found = scored(look)
        if found is not None:
            heap.entries.append(self._entry(heap, -found[0], look, found))

    def _top(self, heap: Ranking) -> Entry | None:
        """The top entry once it is its live look's current entry, keyed by its first node now (gone looks and
        stale entries are dropped, an entry keyed too early is keyed again); None when no live look is left."""
        entries = heap.entries
        present = heap.present
        while entries:
            top = entries[0]
            look = top[3]
            members = look.members
            if present.get(id(look)) is not top:
                heapq.heappop(entries)  # stale: the look has a newer entry
            elif not members:
                heapq.heappop(entries)
                del present[id(look)]
            elif members[0] != top[1]:
                heapq.heapreplace(entries, self._entry(heap, top[0], look, top[4]))  # keyed by its first node now
            else:
                return top
            self._entries -= 1
        return None

    def any(self, heap: Ranking) -> bool:
        """Does some live look take the shape (``best`` is not empty)?"""
        return self._top(heap) is not None

    def _drop_gone(self, heap: Ranking) -> None:
        """Drop every entry of a look gone and every stale one (a look is pushed again from the log if it comes
        back), and key the rest by their first nodes now."""
        present = heap.present
        live: list[Entry] = []
        for entry in heap.entries:
            look = entry[3]
            if not look.members or present.get(id(look)) is not entry:
                continue
            if entry[1] != look.members[0]:
                self._entries -= 1
                entry = self._entry(heap, entry[0], look, entry[4])
            live.append(entry)
        self._entries -= len(heap.entries) - len(live)
        heapq.heapify(live)
        heap.entries = live
        heap.present = {id(entry[3]): entry for entry in live}

    def best(self, heap: Ranking, *, every: bool = True) -> list[Candidate]:
        """Every live look with the best score (empty when none takes the shape). Without ``every``, only the one
        whose first node comes first (the search's pick when no tie is drawn): the top of the heap. With it, every
        entry with the best score is found without popping (in a heap they form a subtree around the root)."""
        top_entry = self._top(heap)
        if top_entry is None:
            return []
        if not every:
            members = top_entry[3].members
            return [(members[0], members, top_entry[4])]
        entries = heap.entries
        present = heap.present
        best = top_entry[0]
        top: list[Candidate] = []
        gone = 0
        size = len(entries)
        stack = [0]
        while stack:
            index = stack.pop()
            entry = entries[index]
            if entry[0] != best:
                continue
            look = entry[3]
            members = look.members
            if not members or present.get(id(look)) is not entry:
                gone += 1
            else:
                top.append((members[0], members, entry[4]))
            child = 2 * index + 1
            if child < size:
                stack.append(child)
                if child + 1 < size:
                    stack.append(child + 1)
        if gone > _GONE_TIED and gone > len(top):
            # Looks come and go on a busy cluster, and the gone ones tied with the best stay below the top: the
            # walk above passed more of them than of live ones. Drop them all once (linear, like one such walk in
            # a few dozen).
            self._drop_gone(heap)
        return top

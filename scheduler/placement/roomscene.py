"""What room-making reads and keeps during one cycle (``Scene``), and where an action's candidates come from
(``Listed``): the state ``roommaking``'s attempts share, from the victim lists sorted once per cycle to the bounds
and per-node answers kept for the rest of it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Container, Hashable, Iterator, Mapping, Sequence

from common.resources import Resources
from scheduler.placement import (
    capacity,
    earliest,
    fairshare,
    freeing,
    model,
    ordering,
    plan,
    roombounds,
    search,
    shapes,
    victims,
)
from scheduler.placement.earliest import Positions


@dataclasses.dataclass(slots=True, kw_only=True)
class Scene:
    """What the room-making actions read and change during one cycle."""

    snapshot: model.Snapshot
    draft: plan.Draft
    searcher: search.Searcher
    pod_shapes: Mapping[model.PodUid, shapes.Shape]
    order: ordering.QueueOrder
    tree: fairshare.Tree
    shares: Mapping[model.QueueName, fairshare.Share]
    running: Mapping[model.QueueName, Sequence[model.Group]]
    """Groups with running members, per leaf queue, in id order."""
    units: victims.UnitCache
    """The engine's cache of running groups' eviction units (kept across cycles)."""
    clock_matters: bool = False
    """Set when a decision depended on the time: a victim too young, a stale gang within its grace."""
    wake_ns: int | None = None
    """The earliest time at which such a decision would go the other way (``wake_at``); None: none known."""
    _victims: roombounds.VictimLists = dataclasses.field(init=False)
    _failures: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)
    _failed_shapes: set[tuple[object, ...]] = dataclasses.field(default_factory=set)
    movable_known: dict[tuple[shapes.Shape, ...], bool] = dataclasses.field(default_factory=dict)
    """``movable``'s answers per victim shapes, valid while the draft's version is ``movable_at``."""
    movable_at: int = -1
    kinds: dict[int, Hashable] = dataclasses.field(default_factory=dict)
    """An action's ``Listed.alike`` key per unit (by id) with no pod evicted, kept for the cycle."""
    _kind_numbers: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    _window_free: WindowFreeCache = dataclasses.field(default_factory=dict)
    _positions: dict[object, earliest.Positions] = dataclasses.field(default_factory=dict)
    _earliest: dict[tuple[object, ...], earliest.Earliest] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._victims = roombounds.VictimLists(self.draft, self.units)

    def candidates(self, key: object, groups: Callable[[], list[model.Group]]) -> Iterator[victims.Unit]:
        """The victim units of ``groups`` (preemptible ones only) in victim order, sorted once per cycle, from the
        first one with a pod not evicted yet (``roombounds.VictimLists``); ``make_room`` skips pods evicted since."""
        return self._victims.live(key, groups)

    def listed(self, key: object, groups: Callable[[], list[model.Group]]) -> tuple[Sequence[victims.Unit], int]:
        """The same units as ``candidates``: the whole list and the position ``candidates`` starts from."""
        return self._victims.listed(key, groups)

    def earliest(
        self,
        key: object,
        units: Sequence[victims.Unit],
        wanted: frozenset[tuple[shapes.Shape, int]],
        queues: frozenset[model.QueueName],
        room: freeing.Room,
        start: int,
        window_end: int | None = None,
    ) -> earliest.Earliest:
        """The bounds of ``earliest`` for the list ``key`` (``units``), the units of ``queues`` and a minimum of
        ``wanted`` shapes, kept for the rest of the cycle and brought up to date with its changes; ``start``: the
        asking attempt's first live unit. With ``window_end``, bounds for the attempts whose window is ``start`` to
        ``window_end`` only, which pass the nodes no pool of that window could make ready (``Earliest``'s
        ``never``)."""
        positions = self.positions(key, units)
        cache_key: tuple[object, ...] = (key, wanted, queues)
        never: Callable[[model.NodeName], bool] | None = None
        if window_end is not None:
            cache_key = (key, wanted, queues, start, window_end)
            listed = Listed(key=key, units=units, start=start, queues=queues)
            # What the bounds keep must not reach back to the scene (it holds them): no reference cycle outlives a
            # cycle (the scheduler freezes what a cycle leaves instead of collecting it: ``scheduler.gcpolicy``).
            cap, evicted, known = self.searcher.capacity, self.draft.evicted, self._window_free

            def never(name: model.NodeName) -> bool:
                free = _window_free(cap, positions, evicted, known, listed, window_end, name)
                return room.short(name) and not room.gains_with(name, free)

        found = self._earliest.get(cache_key)
        if found is None:
            found = self._earliest[cache_key] = earliest.Earliest(
                positions, room, self.searcher.capacity, self.draft.evicted, queues, start, never=never
            )
        else:
            found.sync()
        return found

    def positions(self, key: object, units: Sequence[victims.Unit]) -> Positions:
        """The victim list ``key`` (``units``) indexed by node and queue, built once per cycle."""
        positions = self._positions.get(key)
        if positions is None or positions.units is not units:
            positions = self._positions[key] = earliest.Positions(units)
        return positions

    def window_free(self, listed: Listed, end: int, name: model.NodeName) -> freeing.Free:
        """What the node would have free once every live candidate of ``listed`` before ``end`` with a pod on it left
        (``freeing.free_after``): no pool of those candidates frees more. Kept per node while the node, the list's
        start and ``end`` stay as they are (an eviction or placement there files the node under another look)."""
        return _window_free(
            self.searcher.capacity,
            self.positions(listed.key, listed.units),
            self.draft.evicted,
            self._window_free,
            listed,
            end,
            name,
        )

    def kind(self, key: Hashable) -> int:
        """A number for ``key``, the same for equal keys for the rest of the cycle (cheap to hash and compare)."""
        return self._kind_numbers.setdefault(key, len(self._kind_numbers))

    def failed_before(self, key: tuple[object, ...]) -> bool:
        """Did an attempt with this key fail with no eviction made since (so it would fail again)?"""
        return self._failures.get(key) == len(self.draft.evictions)

    def note_failure(self, key: tuple[object, ...], shapes_key: tuple[object, ...]) -> None:
        self._failures[key] = len(self.draft.evictions)
        self._failed_shapes.add(shapes_key)

    def shapes_failed(self, shapes_key: tuple[object, ...]) -> bool:
        """Did an attempt of this action for these shapes fail earlier in the cycle, for any group?"""
        return shapes_key in self._failed_shapes

    def old_enough(self, unit: victims.Unit, min_runtime_ns: int) -> bool:
        """The min-runtime check, noting that the answer depends on the time (and when it changes)."""
        if min_runtime_ns <= 0:
            return True
        if victims.old_enough(unit, now_ns=self.snapshot.now_ns, min_runtime_ns=min_runtime_ns):
            return True
        self.wake_at(unit.youngest_started_ns + min_runtime_ns)
        return False

    def wake_at(self, moment_ns: int) -> None:
        """A decision depended on the time and goes the other way at ``moment_ns``."""
        self.clock_matters = True
        self.wake_ns = moment_ns if self.wake_ns is None else min(self.wake_ns, moment_ns)

    def shape(self, pod: model.Pod) -> shapes.Shape:
        return self.pod_shapes.get(pod.uid) or shapes.shape_of(pod)


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """Where an action's candidates come from, so that the walk's first step can be found node by node
    (``earliest``): the units of the cycle's victim list ``key`` from position ``start`` on whose queue is one of
    ``queues``. Only for an action whose ``eligible`` leaves no trace on the scene (no min-runtime in play: the walk
    asks it of every candidate it passes, the node-by-node search of fewer)."""

    key: object
    units: Sequence[victims.Unit]
    start: int
    queues: frozenset[model.QueueName]
    alike: Callable[[victims.Unit], Hashable] | None = None
    """Units with the same key get the same answer from ``eligible`` (and ``reasons``) while the draft stays as it is
    (before the first eviction of an attempt): the node-by-node search asks once per key. None: once per unit."""
    reasons: Callable[[victims.Unit], bool] | None = None
    """Asks of a unit, as ``eligible`` would, only the checks that leave a reason with the action (for its status);
    True when one did. For an attempt that finds no node ready, the walk's last such reason is then found from the
    end of its window instead of asking ``eligible`` of every candidate; without it, every candidate is asked."""
    every_queue: bool = False
    """``queues`` holds the queue of every unit of the list (consolidation's candidates): none is passed."""
    static: bool = False
    """``eligible`` answers the same for a unit however the draft changes, and gives no reason (consolidation's,
    no min-runtime in play): the walk's steps past a failed try of the minimum are found node by node too, and a
    walk that finds no node ready leaves nothing to find."""
    quiet: Callable[[model.QueueName, Resources], bool] | None = None
    """With ``reasons``: True when no unit of the queue that holds at most the given amounts (each resource's own
    maximum) would leave a reason now, so that the search for the last reason passes the queue's units unread."""

    def candidates(self) -> Iterator[victims.Unit]:
        """The candidates, in victim order."""
        queues = self.queues
        return (unit for unit in itertools.islice(self.units, self.start, None) if unit.group.queue in queues)


WindowFreeCache = dict[model.NodeName, tuple[object, tuple[object, ...], freeing.Free]]
"""Per node, ``Scene.window_free``'s last answer and what it depends on (the node's look, its free pod slots, the
list, its queues, start and end)."""


def _window_free(
    cap: capacity.Capacity,
    positions: Positions,
    evicted: Container[model.PodUid],
    known: WindowFreeCache,
    listed: Listed,
    end: int,
    name: model.NodeName,
) -> freeing.Free:
    """``Scene.window_free``, from what it reads (kept in ``known``)."""
    work = cap.by_name[name]
    look = cap.look_of[work.order]
    found = known.get(name)
    if (
        found is not None
        and found[0] is look
        and found[1] == (work.free_pods, listed.key, listed.queues, listed.start, end)
        and look is not None
    ):
        return found[2]
    on_node = positions.by_node.get(name, [])
    units = listed.units
    queues = listed.queues
    leaving = [
        pod
        for position in on_node[bisect.bisect_left(on_node, listed.start) : bisect.bisect_left(on_node, end)]
        if units[position].group.queue in queues
        for pod in victims.live_pods(units[position], evicted)
        if pod.node == name
    ]
    free = freeing.free_after(work, leaving)
    known[name] = (look, (work.free_pods, listed.key, queues, listed.start, end), free)
    return free

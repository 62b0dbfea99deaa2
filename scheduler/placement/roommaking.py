"""Making room for a group by evicting and moving: the one procedure reclaim, preemption and consolidation share.

A pending group's minimum (or one elastic pod) did not fit. Candidate victim units come in victim order
(``victims``); each unit an action finds eligible joins the *pool* of every node it runs on where it frees something
the node is short of for the minimum, and as soon as the pool of a node would give it room for one more pod of the
minimum (``freeing``), that pool is evicted and the minimum is tried again. So victims are accumulated per node,
cheapest first, until the minimum fits: two 1-GPU pods make room for a 2-GPU pod, the last shares of a GPU leaving
make the GPU whole again, a CPU-only pod is never evicted for GPU room. Where one later candidate alone would give
the node the same room with fewer pods and no more GPU, it goes instead of the pool (two half-GPU shares are not
evicted where one 1-GPU pod will do). Once the minimum fits, the units that turned out unnecessary are dropped again
(each is tried without, in order), so what stays evicted is a small set. Everything happens on the ``Draft`` under
one checkpoint, so a failed attempt leaves no trace.

A successful attempt keeps the evictions and *reserves* the room for the group (``plan.Kind.RESERVE``, KAI's
pipelining): no other group takes it for the rest of the cycle, the plan *nominates* the group's pods to it
(``Plan.nominations``, Kubernetes' ``nominatedNodeName``), and the next cycles place nominated groups before any
other, once the victims are gone; if they do not go, the group simply does not fit and the cycle decides afresh.

Victims that fit elsewhere are *moved*, not evicted (KAI's consolidating reclaim): each evicted unit is placed again
(``plan.Kind.MOVE``) where the room left allows, all its pods or none, and a moved pod keeps counting for its queue.
Consolidation (``moves``) requires every victim to move, or nothing happens; reclaim and preemption move what they
can and evict the rest, so one plan may both move and evict. ``validate`` (reclaim's queue rules) judges the whole
scenario once the minimum and the moves are in place.

The search is bounded by what the group asks for (``roombounds``: victim units evicted and candidates looked at per
GPU asked; each attempt starts after the victims the cycle already took; a gang's minimum is tried again only once
an upper bound says it may fit), and an attempt that failed is not repeated for a group of the same shapes (and, for
reclaim and preemption, the same queue and priority) until some eviction changed the picture; and once an attempt
for some shapes failed in the cycle, a later attempt for the same shapes (another queue's group, or after evictions)
first asks whether any node could gain room with every candidate gone (``_Search.could_gain``), which answers a
cluster with no room for them without the scan. Which units are candidates, and which of them are eligible, is each
action's business (``evictions``).

For one pod (most reclaims on a busy cluster), the walk's first step is found node by node instead (``earliest``):
which node the walk finds ready first depends on each node's own candidates only, so the nodes are looked at in order
of a lower bound kept for the whole cycle, each walked alone, until no node can come before the best one found. It
ends where the walk's first step ends (the same pool evicted, the same reservation), or finds that no node would be
ready (the walk fails, and the reason it would leave is left: the action's last refusal in the window, ``Listed``);
where the walk would go on past its first step, it walks from the start, but for an action whose ``eligible`` never
changes its answer (``Listed.static``: consolidation without a min-runtime), whose later steps are found node by node
too while each evicts only groups that run on its node alone. The precheck above is not asked then: the bounds
answer a cluster without room as fast.

A walk whose candidates are ``Listed`` pools none on a node that would not gain room even with every candidate of
its window on it gone (``_Search._hopeless``): such a pool would never be used, and on a full cluster most nodes a
window touches are such nodes. The state attempts share for the cycle (victim lists, bounds, what a window frees per
node) is the ``roomscene.Scene``.
"""

from __future__ import annotations

import bisect
import collections
import functools
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence

from scheduler.placement import (
    decisions,
    earliest,
    fairshare,
    freeing,
    gangs,
    model,
    plan,
    roombounds,
    shapes,
    status,
    victims,
)
from scheduler.placement.roomscene import Listed, Scene

_SETTLES_BEFORE_BOUND = 2
"""Failed tries of a gang's minimum after which it is tried again only where ``roombounds.FitBound`` says it may fit."""


def justification(
    scene: Scene, *, reason: decisions.EvictionReason, beneficiary: model.Group, minimum: Sequence[model.Pod]
) -> str:
    """Why pods are evicted for ``beneficiary``, for each eviction's message: who gains, and how much (its queue's
    standing as the attempt began, for reclaim). It starts ``reason for group (queue q, priority p)``."""
    wants = gangs.total(minimum, scene.searcher.capacity.max_device_memory)
    kind = next((kind for kind in fairshare.KINDS if fairshare.amount(wants, kind) > 0), fairshare.Kind.GPU)
    gains = status.amount_text(kind, fairshare.amount(wants, kind))
    head = f"{reason.value} for {beneficiary.id} (queue {beneficiary.queue}, priority {beneficiary.priority})"
    if reason is decisions.EvictionReason.RECLAIM:
        held = fairshare.amount(scene.draft.usage.allocated.get(beneficiary.queue, model.ZERO), kind)
        share = scene.shares.get(beneficiary.queue)
        fair = fairshare.amount(share.fair, kind) if share is not None else 0
        return (
            f"{head}: queue {beneficiary.queue} gains {gains}; it held {status.amount_text(kind, held)} against a "
            f"fair share of {status.amount_text(kind, fair)}"
        )
    if reason is decisions.EvictionReason.PREEMPT:
        return f"{head}: priority {beneficiary.priority} gains {gains} from lower-priority work of its queue"
    return f"{head}: moved so that {gains} fit together; every moved pod is placed again"


def _evict_unit(
    scene: Scene, unit: victims.Unit, *, reason: decisions.EvictionReason, beneficiary: model.Group, message: str
) -> int:
    """Evict the unit's pods not evicted yet; returns the GPU (milli) they held."""
    freed = 0
    for pod in unit.pods:
        if pod.uid in scene.draft.evicted:
            continue
        scene.draft.evict(pod, unit.group, reason=reason, beneficiary=beneficiary.id, message=message)
        freed += plan.pod_amounts(pod).milli_gpu
    return freed


def move(scene: Scene, group: model.Group, pods: Sequence[model.Pod]) -> bool:
    """Place evicted ``pods`` of ``group`` again where room is left, all or none (``plan.Kind.MOVE``)."""
    draft = scene.draft
    mark = draft.checkpoint()
    for pod in pods:
        if pod.uid in draft.placed:
            continue
        choice = scene.searcher.find(scene.shape(pod))
        if choice is None:
            draft.rollback(mark)
            return False
        draft.place(pod, group, choice, kind=plan.Kind.MOVE)
    return True


def movable(scene: Scene, unit: victims.Unit) -> bool:
    """Would the unit's live pods fit elsewhere together, in the room the draft has now (nothing is kept)?

    Asked of most candidates of a reclaim in a full cluster, where the answer is nearly always no: it depends only
    on the pods' shapes and the room, so it is kept per shapes while the draft stays as it is."""
    draft = scene.draft
    pods = victims.live_pods(unit, draft.evicted)
    if not pods:
        return True
    if scene.movable_at != draft.version:
        scene.movable_known.clear()
        scene.movable_at = draft.version
    key = tuple(scene.shape(pod) for pod in pods)
    known = scene.movable_known.get(key)
    if known is None:
        known = scene.movable_known[key] = _movable(scene, unit.group, pods)
    return known


def _movable(scene: Scene, group: model.Group, pods: Sequence[model.Pod]) -> bool:
    draft = scene.draft
    mark = draft.checkpoint()
    try:
        for pod in pods[:-1]:
            choice = scene.searcher.find(scene.shape(pod))
            if choice is None:
                return False
            draft.place(pod, group, choice, kind=plan.Kind.MOVE)
        # The last pod only has to fit somewhere: no need for the best place (most units are one pod).
        return scene.searcher.fits(scene.shape(pods[-1]))
    finally:
        draft.rollback(mark)


def _move_victims(scene: Scene, chosen: Sequence[victims.Unit], *, required: bool) -> bool:
    """Move every chosen unit that fits elsewhere; with ``required``, False unless every one does."""
    evicted = scene.draft.evicted
    for unit in chosen:
        pods = [pod for pod in unit.pods if pod.uid in evicted]
        if not move(scene, unit.group, pods) and required:
            return False
    return True


def make_room(
    scene: Scene,
    *,
    group: model.Group,
    minimum: Sequence[model.Pod],
    candidates: Iterable[victims.Unit] | Listed,
    reason: decisions.EvictionReason,
    eligible: Callable[[victims.Unit], bool],
    budget: int | None = None,
    moves: bool = False,
    validate: Callable[[], bool] | None = None,
) -> bool:
    """Evict (and move) units from ``candidates`` (in victim order) until ``minimum`` fits; see the module docstring.

    ``eligible`` is asked when a unit joins a pool and again before it is evicted (earlier evictions change queues'
    standing). ``budget`` caps the GPU (milli) evicted. With ``moves`` every evicted pod must be placed again.
    ``validate`` judges the draft once the minimum is placed. Candidates given as ``Listed`` let an attempt for one
    pod find the walk's first step node by node (``earliest``), with the same outcome, and let every walk pass the
    nodes its window cannot make ready (``_Search._hopeless``).
    """
    wanted = frozenset(collections.Counter(scene.pod_shapes[pod.uid] for pod in minimum).items())
    # Consolidation does not depend on the group's queue; reclaim and preemption do (standing, priority).
    memo = (reason, wanted) if moves else (reason, group.queue, group.priority, wanted)
    shapes_key = (reason, wanted)
    if scene.failed_before(memo):
        return False
    wanted_shapes = [scene.pod_shapes[pod.uid] for pod in minimum]
    units, scanned = roombounds.limits(wanted_shapes)
    listed: Listed | None = None
    window: tuple[Listed, int] | None = None
    if isinstance(candidates, Listed):
        listed = candidates if budget is None and (not moves or candidates.static) and len(minimum) == 1 else None
        end = scene.positions(candidates.key, candidates.units).window_end(candidates.start, candidates.queues, scanned)
        window = (candidates, end)
        candidates = candidates.candidates()
    search = _Search(
        scene,
        group=group,
        minimum=minimum,
        candidates=roombounds.Candidates(candidates, scanned),
        listed=listed,
        wanted=wanted,
        scanned=scanned,
        max_units=units,
        reason=reason,
        eligible=eligible,
        budget=budget,
        moves=moves,
        validate=validate,
        window=window,
    )
    # Where an attempt for these shapes already failed this cycle (a group of another queue, or before evictions
    # changed the picture), the cluster is likely to have no room for them at all: first ask whether any node could
    # gain room with every candidate gone, which is cheaper than a scan that looks at every candidate to fail (an
    # attempt found node by node needs no precheck: its bounds find no node as fast).
    if (listed is not None or not scene.shapes_failed(shapes_key) or search.could_gain()) and search.run():
        return True
    scene.note_failure(memo, shapes_key)
    return False


class _Search:
    """One attempt of ``make_room``: pools per node, evictions, then the units not needed dropped again."""

    def __init__(
        self,
        scene: Scene,
        *,
        group: model.Group,
        minimum: Sequence[model.Pod],
        candidates: roombounds.Candidates,
        listed: Listed | None,
        wanted: frozenset[tuple[shapes.Shape, int]],
        scanned: int,
        max_units: int,
        reason: decisions.EvictionReason,
        eligible: Callable[[victims.Unit], bool],
        budget: int | None,
        moves: bool,
        validate: Callable[[], bool] | None,
        window: tuple[Listed, int] | None = None,
    ) -> None:
        """``window``: where the candidates come from (``Listed``) and the position in its list they end before: the
        candidates are its units of its queues in between (``_hopeless``)."""
        self.scene = scene
        self.draft = scene.draft
        self.group = group
        self.minimum = minimum
        self.candidates = candidates
        self.listed = listed
        self.wanted = wanted
        self.scanned = scanned
        self.max_units = max_units
        self.fit_bound: roombounds.FitBound | None = None
        self.failed_settles = 0
        self.reason = reason
        self.eligible = eligible
        self.budget = budget
        self.moves = moves
        self.validate = validate
        self.window = window
        self.room = freeing.Room(scene.searcher, [scene.pod_shapes[pod.uid] for pod in minimum])
        self.start = scene.draft.checkpoint()
        self.pools: dict[model.NodeName, list[victims.Unit]] = {}
        self.pooled_gpu: dict[model.NodeName, int] = {}
        self.chosen: list[victims.Unit] = []
        self.freed = 0
        self.message = justification(scene, reason=reason, beneficiary=group, minimum=minimum)

    def could_gain(self) -> bool:
        """Would any node gain room for a pod of the minimum if every takeable candidate within the bound left it?

        If not, no pool can ever make a node ready (a pool is some of a node's candidates, and room only grows with
        what leaves), so the scan would look at every candidate and fail: this says so without the pools and the
        eligibility checks, and without their min-runtime wake-ups (no victim's ageing could change the answer) or
        their refusals (the group's status says that evicting every victim would not make room, which is then
        exactly true)."""
        leaving: dict[model.NodeName, list[model.Pod]] = {}
        for unit in self.candidates.drawn():
            if not self._takeable(unit):
                continue
            for pod in self._live(unit):
                if pod.node is not None:
                    leaving.setdefault(pod.node, []).append(pod)
        usable = self.room.nodes_of(pods[0] for pods in leaving.values())
        return any(self.room.gains(name, leaving[name]) for name in usable)

    def run(self) -> bool:
        if self.listed is not None:
            step = self._first_step()
            if step is None:
                self.draft.rollback(self.start)
                return False
            if step and self._keep_needed():
                return True
            # The walk goes on past where its steps were found node by node: walk it all, from the start.
            self._restart()
        if not self._scan():
            self.draft.rollback(self.start)
            return False
        return self._keep_needed()

    def _restart(self) -> None:
        self.draft.rollback(self.start)
        self.pools = {}
        self.pooled_gpu = {}
        self.chosen = []
        self.freed = 0
        self.failed_settles = 0
        self.fit_bound = None

    def _keep_needed(self) -> bool:
        """With the minimum placed, evict only the chosen units it needs; False (all undone) when it no longer fits."""
        # Drop the units that were not needed after all, in the order they were chosen (each try places the
        # minimum again). Past roombounds.UNITS of them (a large gang), one try instead: without the units on
        # nodes where no pod of the minimum went.
        if len(self.chosen) > roombounds.UNITS:
            return self._drop_unused()
        needed = list(self.chosen)
        tries = self.chosen
        last_ok = True
        for unit in tries:
            trial = [other for other in needed if other is not unit]
            if not trial:
                continue  # the last unit left is needed: the draft still holds the last success
            if self._attempt(trial):
                needed = trial
                last_ok = True
            else:
                last_ok = False
        if not last_ok and not self._attempt(needed):
            self.draft.rollback(self.start)
            return False
        return True

    def _drop_unused(self) -> bool:
        used = {self.draft.placed[pod.uid].node for pod in self.minimum if pod.uid in self.draft.placed}
        trial = [unit for unit in self.chosen if any(pod.node in used for pod in unit.pods)]
        if len(trial) == len(self.chosen) or self._attempt(trial):
            return True
        if not self._attempt(self.chosen):
            self.draft.rollback(self.start)
            return False
        return True

    def _live(self, unit: victims.Unit) -> tuple[model.Pod, ...]:
        return victims.live_pods(unit, self.draft.evicted)

    def _takeable(self, unit: victims.Unit) -> bool:
        return unit.group.id != self.group.id and victims.can_take(unit, self.draft.evicted) and bool(self._live(unit))

    def _scan(self) -> bool:
        """Pool the candidates per node and evict a pool as soon as its node gains room; True once the minimum
        fits (with the draft holding the evictions, moves and reservation)."""
        limit = self.scene.snapshot.config.consolidation_max_moves if self.moves else self.max_units
        for index, unit in self.candidates:
            if len(self.chosen) >= limit:
                return False
            if not self._takeable(unit):
                continue
            ready = self._pool(unit)
            if ready is None:
                continue
            batch = self.pools.pop(ready)
            self.pooled_gpu.pop(ready)
            single = self._single(ready, batch, functools.partial(self.candidates.on_node_after, ready, index))
            if single is not None:
                self.pools[ready] = batch  # kept for later: the node's room came from one unit alone
                self.pooled_gpu[ready] = sum(plan.held_milli_gpu(pod) for unit in batch for pod in self._live(unit))
                batch = [single]
            # A unit is pooled only on the nodes its pods run on.
            taken = {id(member) for member in batch}
            for name in dict.fromkeys(pod.node for member in batch for pod in member.pods if pod.node is not None):
                other = self.pools.get(name)
                if other:
                    other[:] = [member for member in other if id(member) not in taken]
            if not self._evict(batch, newest=unit):
                continue
            if not self._may_fit(batch):
                continue
            probe = self.draft.checkpoint()
            if self._settle(self.chosen):
                return True
            self.draft.rollback(probe)
            self.failed_settles += 1
        return False

    def _first_step(self) -> bool | None:
        """The walk's first step (``_scan`` up to its first try of the minimum), found node by node (``earliest``):
        True when the minimum fits after it, the draft then as the walk leaves it; False where the walk would go on
        (the first try failed); None when the walk would find no node ready (it fails, leaving the reason the walk
        would leave: ``_leave_reasons``). For a ``Listed.static`` action the steps after a failed try are found node
        by node too, as long as each evicts only groups that run on its node alone (``_alone``): None then also when
        the walk would fail later (no node ready after, or the units it may evict all chosen)."""
        listed = self.listed
        if listed is None:
            return False
        window = self.window
        assert window is not None  # set with ``listed``, from the same candidates: the window's end
        end = window[1]
        # Consolidation's bounds (every queue's units) pass the nodes its window cannot make ready: the nodes of a
        # full cluster's window mostly (bounds for one window: they serve one attempt of a shape a cycle anyway).
        bounds = self.scene.earliest(
            listed.key,
            listed.units,
            self.wanted,
            listed.queues,
            self.room,
            listed.start,
            window_end=end if listed.every_queue else None,
        )
        positions = bounds.positions
        units = listed.units
        limit = self.scene.snapshot.config.consolidation_max_moves if self.moves else self.max_units
        while True:
            found = self._first_ready(bounds, end)
            if found is None:
                if not self.chosen:
                    self._leave_reasons(positions, end)
                return None
            position, node, pool = found
            on_node = bounds.on_node(node)

            def after(position: int = position, on_node: list[int] = on_node) -> Iterator[victims.Unit]:
                for later in on_node[bisect.bisect_right(on_node, position) :]:
                    if later >= end:
                        return
                    yield units[later]

            single = self._single(node, pool, after)
            batch = [single] if single is not None else pool
            if not (self._evict(batch, newest=units[position]) and self._may_fit(batch)):
                return False
            probe = self.draft.checkpoint()
            if self._settle(self.chosen):
                return True
            if not listed.static or not _alone(batch, node):
                return False
            # Every other node and candidate is as it was: the walk's next step is the next node found ready.
            self.draft.rollback(probe)
            self.failed_settles += 1
            if len(self.chosen) >= limit:
                return None
            bounds.sync()

    def _leave_reasons(self, positions: earliest.Positions, end: int) -> None:
        """Leave the reasons the walk would leave when no node gets ready: it asks ``eligible`` of every takeable
        candidate some pod of the minimum could use, and the last reason given stays."""
        listed = self.listed
        assert listed is not None
        reasons = listed.reasons
        if reasons is None:
            if listed.static:
                return  # ``eligible`` leaves nothing: no reason, no time it waits for
            for unit in self.candidates.drawn():
                if self._takeable(unit) and self.room.nodes_of(self._live(unit)):
                    self.eligible(unit)
            return
        units = listed.units
        alike = listed.alike
        silent: set[Hashable] = set()
        """The kinds of unit found to leave no reason (``reasons`` reads no more than ``alike`` does)."""
        queues: Collection[model.QueueName] = listed.queues
        quiet = listed.quiet
        if quiet is not None:
            # A queue none of whose units could leave a reason, the largest included, is passed unread.
            queues = [queue for queue in queues if not quiet(queue, positions.largest(queue))]
        # The window's candidates from its end back: only the positions of the action's queues (most are not).
        for position in positions.backwards(queues, listed.start, end):
            unit = units[position]
            key = alike(unit) if alike is not None else None
            if key is not None and key in silent:
                continue
            if not self._takeable(unit) or not self.room.nodes_of(self._live(unit)):
                continue
            if reasons(unit):
                return
            if key is not None:
                silent.add(key)

    def _first_ready(
        self, bounds: earliest.Earliest, end: int
    ) -> tuple[int, model.NodeName, list[victims.Unit]] | None:
        """The node the walk finds ready first among the candidates before ``end``, the position of the candidate
        that makes it so and the node's pool then; None when no node is. Nodes are looked at in order of their
        bounds, until the next bound is past the best node found (a tie goes to the node the walk pools first)."""
        ready = bounds.ready
        best: tuple[int, int, model.NodeName, list[victims.Unit]] | None = None
        known: dict[Hashable, bool] = {}
        next_node = 0
        while True:
            limit = best[0] if best is not None else end - 1
            if next_node < len(ready) and ready[next_node][0] <= limit:
                name = ready[next_node][1]
                next_node += 1
                found = self._first_on(bounds.on_node(name), name, limit, known)
                if found is not None and (best is None or found[:2] < best[:2]):
                    best = (found[0], found[1], name, found[2])
                continue
            if bounds.frontier <= limit and not bounds.done():
                bounds.sweep(limit + 1)
                continue
            return None if best is None else (best[0], best[2], best[3])

    def _first_on(
        self, on_node: list[int], name: model.NodeName, limit: int, known: dict[Hashable, bool]
    ) -> tuple[int, int, list[victims.Unit]] | None:
        """The walk on one node: its candidates (``on_node``: the positions of the units of the action's queues on
        it, ``earliest.Earliest.on_node``) up to position ``limit`` pooled as ``_pool`` pools them. The position at
        which the node's pool gives it room, the node's rank among the nodes of that candidate (the walk takes the
        first that gains) and the pool; None when it does not gain by ``limit``. ``known``: the answers of
        ``eligible`` so far, per position or per ``Listed.alike`` key (the walk asks once per candidate)."""
        listed = self.listed
        assert listed is not None
        units = listed.units
        alike = listed.alike
        room = self.room
        pool: list[victims.Unit] = []
        pooled: list[model.Pod] = []
        for index in range(bisect.bisect_left(on_node, listed.start), bisect.bisect_right(on_node, limit)):
            position = on_node[index]
            unit = units[position]
            # A unit of a kind already refused is passed first (no call to ``eligible`` is saved or added by it).
            key: Hashable = position if alike is None else alike(unit)
            eligible = known.get(key)
            if eligible is False or not self._takeable(unit):
                continue
            live = self._live(unit)
            nodes = room.nodes_of(live)
            if name not in nodes:
                continue
            if eligible is None:
                eligible = known[key] = self.eligible(unit)
            if not eligible or not room.helps(name, pooled, live):
                continue
            pool.append(unit)
            pooled.extend(live)
            if room.gains(name, pooled):
                return position, nodes.index(name), pool
        return None

    def _may_fit(self, batch: Sequence[victims.Unit]) -> bool:
        """Could the minimum fit now? After a gang's first failed tries, an upper bound answers (it only says no
        where placing the minimum would fail, so nothing changes but the work)."""
        if len(self.minimum) <= 1 or self.failed_settles < _SETTLES_BEFORE_BOUND:
            return True
        if self.fit_bound is None:
            self.fit_bound = roombounds.FitBound(
                self.scene.searcher, [self.scene.pod_shapes[pod.uid] for pod in self.minimum]
            )
        else:
            self.fit_bound.changed(pod.node for member in batch for pod in member.pods if pod.node is not None)
        return self.fit_bound.may_fit()

    def _pool(self, unit: victims.Unit) -> model.NodeName | None:
        """Add ``unit`` to the pool of each node it helps; the first node that gains room from its pool, if any."""
        live = self._live(unit)
        gpu = sum(plan.held_milli_gpu(pod) for pod in live)
        nodes = self.room.nodes_of(live)
        if self.budget is not None:
            nodes = [name for name in nodes if self.freed + self.pooled_gpu.get(name, 0) + gpu <= self.budget]
        if not nodes or not self.eligible(unit):
            return None
        ready: model.NodeName | None = None
        window = self.window
        for name in nodes:
            if window is not None and self._hopeless(window, name):
                continue  # never ready: its pool would never be used
            pool = self.pools.setdefault(name, [])
            pooled = [pod for member in pool for pod in self._live(member)]
            if not self.room.helps(name, pooled, live):
                continue  # frees nothing this node lacks (a CPU-only pod for a GPU pod, say)
            pool.append(unit)
            self.pooled_gpu[name] = self.pooled_gpu.get(name, 0) + gpu
            if ready is None and self.room.gains(name, [*pooled, *live]):
                ready = name
        return ready

    def _hopeless(self, window: tuple[Listed, int], name: model.NodeName) -> bool:
        """Could no pool on the node give it room, even every candidate of the window on it gone? Then pooling there
        changes nothing (room only grows with what leaves). A window holds about a thousand units on as many nodes,
        and on a full cluster a walk finds a few of them ready: this is one check per node, where pooling asked two
        per candidate."""
        room = self.room
        return room.short(name) and not room.gains_with(name, self.scene.window_free(window[0], window[1], name))

    def _single(
        self, node: model.NodeName, batch: list[victims.Unit], after: Callable[[], Iterable[victims.Unit]]
    ) -> victims.Unit | None:
        """A later candidate (``after``: the candidates on ``node`` after the last of ``batch``) that alone gives
        ``node`` the room ``batch`` would, disturbing fewer pods and no more GPU (KAI's "no need to preempt both");
        None when there is none."""
        pods = sum(len(self._live(unit)) for unit in batch)
        if pods <= 1:
            return None
        gpu = sum(plan.held_milli_gpu(pod) for unit in batch for pod in self._live(unit))
        top = max(unit.group.priority for unit in batch)
        for later in after():
            if later.group.priority > top:
                return None  # candidates come lowest priority first
            live = self._live(later)
            if (
                len(live) < pods
                and self._takeable(later)
                and sum(plan.held_milli_gpu(pod) for pod in live) <= gpu
                and node in self.room.nodes_of(live)
                and self.room.gains(node, live)
                and self.eligible(later)
            ):
                return later
        return None

    def _evict(self, batch: Sequence[victims.Unit], *, newest: victims.Unit) -> bool:
        """Evict the units of ``batch`` still takeable (standings and gangs' spare pods change with each eviction:
        ask again); True when one was."""
        evicted_any = False
        for member in batch:
            if not self._takeable(member) or (member is not newest and not self.eligible(member)):
                continue
            self.freed += _evict_unit(
                self.scene, member, reason=self.reason, beneficiary=self.group, message=self.message
            )
            self.chosen.append(member)
            evicted_any = True
        return evicted_any

    def _settle(self, chosen: Sequence[victims.Unit]) -> bool:
        if gangs.try_place(
            draft=self.draft,
            searcher=self.scene.searcher,
            group=self.group,
            pods=self.minimum,
            pod_shapes=self.scene.pod_shapes,
            kind=plan.Kind.RESERVE,
        ):
            return False
        return _move_victims(self.scene, chosen, required=self.moves) and (self.validate is None or self.validate())

    def _attempt(self, chosen: Sequence[victims.Unit]) -> bool:
        self.draft.rollback(self.start)
        for unit in chosen:
            _evict_unit(self.scene, unit, reason=self.reason, beneficiary=self.group, message=self.message)
        return self._settle(chosen)


def _alone(batch: Sequence[victims.Unit], node: model.NodeName) -> bool:
    """Does every unit of ``batch`` belong to a group that runs on ``node`` alone? Evicting such units changes no
    other node, and no other unit's live pods or whether it may be taken (``victims.can_take`` reads its own group)."""
    return all(pod.node == node for unit in batch for pod in unit.group.members if pod.node is not None)

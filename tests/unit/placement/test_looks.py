"""Node looks: the capacity index that lets a scored search score each distinct node state once.

Looks are an optimisation that must change no placement, so the property here holds the grouped search to a search
that scores every node, on clusters of identical nodes (where looks merge the most, and where free pod slots and the
pods holding whole devices are all that tell nodes apart) over several cycles, with ties in node order and drawn.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.resources import Resources
from scheduler.placement import applying, capacity, decisions, engine, lookrank, model, scoring, search, shapes
from tests.unit.placement import builders

GIB = builders.GIB


class _Coarse:
    """Reads every part of the state and ties often, as the simulator's policies do."""

    def __call__(self, state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        return (
            5 * (sum(state.device_free_milli) // 500)
            + state.free_milli_cpu // 4000
            + 3 * max(state.device_pod_gpus, default=0)
            + sum(state.device_shared)
            + (devices[0] if devices else 0)
        )


class _Drawing(_Coarse):
    def __init__(self, seed: int) -> None:
        self._source = random.Random(seed)
        self.counts: list[int] = []

    def draw_tie(self, count: int) -> int:
        self.counts.append(count)
        return self._source.randrange(count)


class _Fixed:
    """Scores every choice the same and always draws ``pick``; records how many nodes tied."""

    def __init__(self, pick: int) -> None:
        self.pick = pick
        self.counts: list[int] = []

    def __call__(self, state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        return 0

    def draw_tie(self, count: int) -> int:
        self.counts.append(count)
        return self.pick


@st.composite
def _pod(draw: st.DrawFn, uid: str, created: int) -> model.Pod:
    kind = draw(st.sampled_from(["whole", "whole", "share", "share", "wide-share", "memory", "cpu"]))
    cpu = draw(st.sampled_from([500, 1000, 4000]))
    if kind == "whole":
        return builders.pod(uid, gpus=draw(st.integers(1, 2)), cpu=cpu, created=created)
    if kind == "share":
        return builders.pod(uid, fraction=draw(st.sampled_from([250, 500, 750])), cpu=cpu, created=created)
    if kind == "wide-share":
        return builders.pod(uid, fraction=500, devices=2, cpu=cpu, created=created)
    if kind == "memory":
        return builders.pod(uid, gpu_memory=8 * GIB, cpu=cpu, created=created)
    return builders.pod(uid, cpu=cpu, created=created)


@st.composite
def _waves(draw: st.DrawFn) -> tuple[list[model.Node], list[list[model.Group]]]:
    templates = [
        (draw(st.sampled_from([2, 4])), draw(st.sampled_from([8000, 16000])), slots)
        for slots in (draw(st.sampled_from([2, 3, 110])), draw(st.sampled_from([3, 110])))
    ]
    nodes = []
    for index in range(draw(st.integers(2, 8))):
        gpus, cpu, slots = templates[draw(st.integers(0, 1))]
        nodes.append(builders.node(f"n{index:02d}", gpus=gpus, cpu=cpu, memory=64 * GIB, pods=slots))
    waves = []
    created = 0
    for wave in range(3):
        groups = []
        for _ in range(draw(st.integers(1, 8))):
            uid = f"w{wave}p{created:02d}"
            groups.append(builders.group(uid, draw(_pod(uid, created)), created=created))
            created += 1
        waves.append(groups)
    return nodes, waves


def _replay(
    nodes: list[model.Node],
    waves: list[list[model.Group]],
    *,
    scorer: scoring.GpuPlacementScorer | None,
    by_look: bool,
    strategy: model.Strategy = model.Strategy.BINPACK,
) -> list[tuple[decisions.Placement, ...]]:
    warm = engine.Engine()
    warm.searcher.group_alike = by_look
    config = model.Config(scorer=scorer, gpu_strategy=strategy, actions=(model.Action.ALLOCATE,))
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=[], now_ns=0, config=config)
    placements: list[tuple[decisions.Placement, ...]] = []
    for groups in waves:
        offered = dataclasses.replace(snapshot, groups={**snapshot.groups, **{group.id: group for group in groups}})
        result = warm.run(offered)
        placements.append(result.placements)
        snapshot = applying.apply(offered, result)
    return placements


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_waves(), st.booleans())
def test_scoring_each_look_once_places_exactly_as_scoring_every_node(
    case: tuple[list[model.Node], list[list[model.Group]]], drawing: bool
) -> None:
    nodes, waves = case
    got = _replay(nodes, waves, scorer=_Drawing(3) if drawing else _Coarse(), by_look=True)
    want = _replay(nodes, waves, scorer=_Drawing(3) if drawing else _Coarse(), by_look=False)
    assert got == want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_waves())
def test_the_learned_fragmentation_scorer_places_by_ranked_looks_exactly_as_node_by_node(
    case: tuple[list[model.Node], list[list[model.Group]]],
) -> None:
    # The default strategy: from the second wave on it scores with what it learned, through the looks' ranking.
    nodes, waves = case
    fragmentation = model.Strategy.FRAGMENTATION
    got = _replay(nodes, waves, scorer=None, by_look=True, strategy=fragmentation)
    want = _replay(nodes, waves, scorer=None, by_look=False, strategy=fragmentation)
    assert got == want


def _capacity(*nodes: model.Node) -> capacity.Capacity:
    cap = capacity.Capacity()
    cap.sync({node.name: node for node in nodes}, margin_bytes=0, label_keys=frozenset())
    return cap


def _looks(cap: capacity.Capacity) -> list[list[int]]:
    return sorted(look.members for index in cap.classes for look in index.looks.values())


def test_identical_nodes_share_one_look_until_one_of_them_changes_and_a_rollback_rejoins_them() -> None:
    cap = _capacity(*(builders.node(f"n{i}", gpus=2) for i in range(3)))
    assert _looks(cap) == [[0, 1, 2]]
    checkpoint = cap.checkpoint()
    work = cap.by_order[1]
    cap.begin(work)
    work.take_whole((0,))
    cap.end(work)
    assert _looks(cap) == [[0, 2], [1]]
    cap.rollback(checkpoint)
    assert _looks(cap) == [[0, 1, 2]]


def test_nodes_with_few_free_pod_slots_look_apart_and_many_free_slots_look_alike() -> None:
    cap = _capacity(
        builders.node("a", gpus=1, pods=110),
        builders.node("b", gpus=1, pods=capacity.LOOK_POD_SLOTS + 5),
        builders.node("c", gpus=1, pods=2),
    )
    assert _looks(cap) == [[0, 1], [2]]


def test_the_devices_a_pod_holds_whole_are_counted_from_the_snapshot_and_from_tentative_placements() -> None:
    node = builders.node("n", gpus=4)
    held = tuple(
        dataclasses.replace(device, allotted_milli_gpu=1000, whole=True, holders=(model.PodUid(holder),))
        for device, holder in zip(node.devices[:3], ("big", "big", "small"), strict=True)
    )
    cap = _capacity(dataclasses.replace(node, devices=(*held, node.devices[3])))
    work = cap.by_order[0]
    assert work.build_state().device_pod_gpus == (2, 2, 1, 0)
    cap.begin(work)
    work.give_back_whole((2,))
    cap.end(work)
    assert work.build_state().device_pod_gpus == (2, 2, 0, 0)
    cap.begin(work)
    work.take_whole((2, 3))
    cap.end(work)
    assert work.build_state().device_pod_gpus == (2, 2, 2, 2)


def test_one_two_gpu_pod_and_two_one_gpu_pods_look_different() -> None:
    cap = _capacity(builders.node("a", gpus=4), builders.node("b", gpus=4))
    first, second = cap.by_order
    cap.begin(first)
    first.take_whole((0, 1))
    cap.end(first)
    for device in (0, 1):
        cap.begin(second)
        second.take_whole((device,))
        cap.end(second)
    assert _looks(cap) == [[0], [1]]


def test_a_full_shared_device_and_a_device_held_by_someone_unknown_look_different() -> None:
    node = builders.node("x", gpus=1)
    shared = dataclasses.replace(node.devices[0], allotted_milli_gpu=1000, gpu_group=model.GpuGroupId("g"))
    unknown = dataclasses.replace(node.devices[0], allotted_milli_gpu=1000)
    cap = _capacity(
        dataclasses.replace(node, name=model.NodeName("a"), devices=(shared,)),
        dataclasses.replace(node, name=model.NodeName("b"), devices=(unknown,)),
    )
    assert _looks(cap) == [[0], [1]]


def test_nodes_with_as_much_free_but_different_allocatable_or_device_memory_look_different() -> None:
    small = builders.node("a", gpus=1, cpu=8000)
    half_used = dataclasses.replace(builders.node("b", gpus=1, cpu=16000), used=Resources(milli_cpu=8000))
    other_memory = builders.node("c", gpus=1, cpu=8000, gpu_memory=16 * GIB)
    assert _looks(_capacity(small, half_used, other_memory)) == [[0], [1], [2]]


def test_idle_looks_are_kept_no_more_than_live_ones_and_a_margin() -> None:
    cap = _capacity(builders.node("n", gpus=1, cpu=1_000_000))
    work = cap.by_order[0]
    for _ in range(500):
        cap.begin(work)
        work.free_cpu -= 1
        cap.end(work)
    index = cap.classes[0]
    assert len(index.looks) == 1
    assert 0 < len(index.idle) <= len(index.looks) + 64


def test_drawn_ties_count_every_tied_node_and_take_the_drawn_one_in_node_order() -> None:
    nodes = [builders.node(f"n{i}", gpus=2) for i in range(5)]
    nodes.append(builders.node("tiny", gpus=2, cpu=500))  # too little CPU: not a candidate
    scorer = _Fixed(pick=3)
    config = model.Config(scorer=scorer, actions=(model.Action.ALLOCATE,))
    groups = [builders.group("g", builders.pod("p", gpus=1))]
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=0, config=config)
    result = engine.Engine().run(snapshot)
    assert scorer.counts == [5]
    assert [placement.node for placement in result.placements] == ["n3"]


def test_a_pod_needing_more_slots_than_a_look_records_is_placed_node_by_node() -> None:
    slots = capacity.LOOK_POD_SLOTS + 4
    nodes = [builders.node("a", gpus=1, pods=slots - 1), builders.node("b", gpus=1, pods=slots)]
    hungry = dataclasses.replace(
        builders.pod("p", gpus=1), requests=Resources(milli_cpu=1000, memory_bytes=GIB, milli_gpu=1000, pods=slots)
    )
    groups = [builders.group("g", hungry)]
    config = model.Config(scorer=_Coarse(), actions=(model.Action.ALLOCATE,))
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=0, config=config)
    assert [placement.node for placement in engine.Engine().run(snapshot).placements] == ["b"]


def test_a_scorer_sees_the_models_of_the_devices() -> None:
    seen: list[tuple[str, ...]] = []

    def scorer(state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        seen.append(state.device_models)
        return 0

    nodes = [builders.node("a", gpus=2, gpu_model="T4")]
    config = model.Config(scorer=scorer, actions=(model.Action.ALLOCATE,))
    groups = [builders.group("g", builders.pod("p", gpus=1))]
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=0, config=config)
    assert engine.Engine().run(snapshot).placements
    assert seen == [("T4", "T4")]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_waves(), st.sampled_from([None, "coarse"]), st.sampled_from(list(model.Strategy)))
def test_whether_a_pod_fits_somewhere_is_answered_as_the_search_would_place_it(
    case: tuple[list[model.Node], list[list[model.Group]]], scorer_name: str | None, strategy: model.Strategy
) -> None:
    # Room-making asks ``fits`` of every victim it may move; it must agree with ``find`` on every path.
    nodes, waves = case
    scorer = _Coarse() if scorer_name else None
    warm = engine.Engine()
    config = model.Config(scorer=scorer, gpu_strategy=strategy, actions=(model.Action.ALLOCATE,))
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=[], now_ns=0, config=config)
    for groups in waves[:-1]:
        offered = dataclasses.replace(snapshot, groups={**snapshot.groups, **{group.id: group for group in groups}})
        snapshot = applying.apply(offered, warm.run(offered))
    warm.run(snapshot)  # brings the searcher in step with the last state
    for group in waves[-1]:
        for pod in group.members:
            shape = shapes.shape_of(pod)
            assert warm.searcher.fits(shape) == (warm.searcher.find(shape) is not None), pod
            assert warm.searcher.fits(shape) == (warm.searcher.find(shape) is not None), pod  # from the caches


def test_a_ranking_keeps_one_entry_per_look_and_drops_gone_looks_tied_with_the_best() -> None:
    """Looks come and go as a busy cycle places and rolls back: a look back while its entry is still in the heap
    keeps that entry, and once ``best`` passes more gone looks tied with the best than live ones, they all go."""
    cap = _capacity(*(builders.node(f"n{i}", gpus=2, cpu=64_000) for i in range(40)))
    ranks = lookrank.LookRanks()

    def scored(look: capacity.Look) -> capacity.LookBest:
        return (0, (), ())  # every look ties

    def read() -> lookrank.Ranking:
        return ranks.heap(cap, 0, (0,), scored, epoch=1)

    heap = read()
    assert len(heap.entries) == 1
    for _ in range(3):
        checkpoint = cap.checkpoint()
        for order, work in enumerate(cap.by_order):
            cap.begin(work)
            work.free_cpu -= 1000 * (order + 1)  # forty looks, one per node
            cap.end(work)
        assert len(read().entries) == 41
        cap.rollback(checkpoint)  # the forty go, the first comes back: its entry serves again
        assert len(read().entries) == 41
    assert [candidate[1] for candidate in ranks.best(heap)] == [list(range(40))]
    assert len(heap.entries) == 1, "the forty gone looks tied with the best were dropped"
    assert ranks.best(heap) and len(heap.entries) == 1


def test_the_best_look_alone_is_the_tied_look_whose_first_node_comes_first() -> None:
    """``best(every=False)`` (the search's pick when no tie is drawn) is the candidate among every tied one with the
    smallest first node."""
    cap = _capacity(*(builders.node(f"n{i}", gpus=2, cpu=64_000) for i in range(12)))
    ranks = lookrank.LookRanks()
    for order, work in enumerate(cap.by_order):
        if order % 3:
            cap.begin(work)
            work.free_cpu -= 1000 * order  # a look of its own for two nodes in three
            cap.end(work)

    def scored(look: capacity.Look) -> capacity.LookBest:
        return (1 if look.members[0] % 2 else 0, (), ())  # the looks of odd first nodes tie for the best

    heap = ranks.heap(cap, 0, (0,), scored, epoch=1)
    every = ranks.best(heap)
    assert sorted(candidate[0] for candidate in every) == [1, 5, 7, 11]
    assert ranks.best(heap, every=False) == [min(every)]


def test_the_best_look_alone_follows_its_first_node_as_nodes_join_and_leave_looks() -> None:
    """A heap keyed by each look's first node reads the top alone: a node before a look's others joining it (the
    look's first node comes earlier) and a look's first node leaving it must both change the pick."""
    cap = _capacity(*(builders.node(f"n{i}", gpus=2, cpu=64_000) for i in range(8)))
    ranks = lookrank.LookRanks()
    best_free = {63_000, 62_000}

    def scored(look: capacity.Look) -> capacity.LookBest:
        return (1 if look.free_cpu in best_free else 0, (), ())

    def set_free(order: int, free_cpu: int) -> None:
        work = cap.by_order[order]
        cap.begin(work)
        work.free_cpu = free_cpu
        cap.end(work)

    def picks() -> tuple[int, int]:
        heap = ranks.heap(cap, 0, (0,), scored, epoch=1)
        alone = ranks.best(heap, every=False)
        live = [look for index in cap.classes for look in index.looks.values()]
        top = max(scored(look)[0] for look in live)
        expected = min(look.members[0] for look in live if scored(look)[0] == top)
        assert min(candidate[0] for candidate in ranks.best(heap)) == expected
        return alone[0][0], expected

    set_free(2, 63_000)
    set_free(5, 62_000)
    assert picks() == (2, 2)
    set_free(1, 62_000)  # joins node 5's look ahead of it: that look now comes first
    assert picks() == (1, 1)
    set_free(1, 64_000)  # and leaves it again: node 2's look comes first again
    assert picks() == (2, 2)
    set_free(0, 62_000)
    set_free(5, 64_000)
    assert picks() == (0, 0)


def test_the_nodes_grown_since_a_verdict_are_read_up_to_the_recheck_limit() -> None:
    log = [3, 1, 3, 2, 1] + list(range(10, 20)) + [1] * 50
    assert search._distinct(log, 0, 16) == {1, 2, 3, *range(10, 20)}
    assert search._distinct(log, 5, 16) == {1, *range(10, 20)}
    assert search._distinct(log, 0, 12) is None
    assert search._distinct(log, len(log), 4) == set()

"""The walk's first step found node by node (``earliest``, ``roommaking._Search._first_step``).

The property test in ``test_eviction_properties`` checks that every such first step ends where the walk's does, on
random clusters. These pin what random clusters seldom show: the window an attempt looks at (its bound counts the
candidates of the action's queues only, evicted ones included, as the walk draws them), the reason a failed
attempt leaves when several victims were refused for different reasons (the walk's last), and the bounds kept up to
date with the cycle's changes, rollbacks included.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

from scheduler.placement import (
    applying,
    capacity,
    decisions,
    earliest,
    engine,
    freeing,
    model,
    plan,
    roommaking,
    search,
    shapes,
    victims,
)
from tests.unit.placement import builders, clusters

NS = 1_000_000_000


def _unit(uid: str, queue: str, node: str) -> victims.Unit:
    pod = dataclasses.replace(
        builders.pod(uid, gpus=1), node=model.NodeName(node), phase=model.PodPhase.RUNNING, devices=(0,)
    )
    return victims.units(builders.group(uid, pod, queue=queue), ())[0]


def test_an_attempts_window_ends_after_as_many_units_of_its_queues_as_it_may_look_at() -> None:
    units = [_unit(f"u{index}", "a" if index % 3 else "b", f"n{index % 2}") for index in range(12)]
    positions = earliest.Positions(units)
    a, b = model.QueueName("a"), model.QueueName("b")
    # Queue b's units are at 0, 3, 6, 9: the third from position 1 on is at 9, so the window ends at 10.
    assert positions.window_end(1, [b], 3) == 10
    assert positions.window_end(0, [b], 4) == 10
    assert positions.window_end(0, [b], 5) == 12  # fewer units of b than that: the list's end
    assert positions.window_end(0, [a, b], 5) == 5
    assert positions.window_end(0, [model.QueueName("none")], 1) == 12
    assert positions.by_node[model.NodeName("n1")] == [1, 3, 5, 7, 9, 11]


def test_a_window_read_backwards_gives_its_queues_positions_from_its_end_to_its_start() -> None:
    units = [_unit(f"u{index}", "abc"[index % 3] if index < 9 else "b", "n0") for index in range(12)]
    positions = earliest.Positions(units)
    a, b, c = (model.QueueName(name) for name in "abc")
    # a: 0, 3, 6; b: 1, 4, 7, 9, 10, 11; c: 2, 5, 8.
    assert list(positions.backwards([a, b], 2, 10)) == [9, 7, 6, 4, 3]
    assert list(positions.backwards([c, a, b], 0, 12)) == list(range(11, -1, -1))
    assert list(positions.backwards([b], 5, 11)) == [10, 9, 7]
    assert list(positions.backwards([a, model.QueueName("none")], 7, 12)) == []
    assert list(positions.backwards([a, c], 4, 4)) == []


def _floored_cluster(nodes: list[model.Node], running: list[model.Pod], pending: model.Pod) -> model.Snapshot:
    """Queues ``q0``, ``q1``, ``q3`` under ``d``, each deserving 1 GPU; ``running`` (2-GPU pods named after their
    queue, ``q3``'s first, so older) placed one cycle each; then ``pending`` of ``q1`` asking for room. Both running
    queues hold more than their fair share (1.5 GPUs), but taking either pod would leave its queue below its deserved
    quota, and neither can move: every victim is refused, each for its own queue."""
    one = model.QueueResource(quota=1000, limit=model.UNLIMITED, over_quota_weight=1)
    parent = model.QueueName("d")
    queues = [model.Queue(name=parent)] + [
        model.Queue(name=model.QueueName(name), parent=parent, gpu=one, created_ns=index)
        for index, name in enumerate(("q0", "q1", "q3"))
    ]
    snapshot = model.snapshot(nodes=nodes, queues=queues, groups=[], now_ns=NS)
    for index, pod in enumerate(running):
        group = builders.group(pod.uid, pod, queue=pod.uid.removesuffix("-pod"), created=index)
        snapshot = dataclasses.replace(snapshot, groups={**snapshot.groups, group.id: group})
        snapshot = applying.apply(snapshot, engine.Engine().run(snapshot), now_ns=(index + 2) * NS)
    waiting = builders.group(pending.uid, pending, queue="q1", created=10)
    return dataclasses.replace(snapshot, groups={**snapshot.groups, waiting.id: waiting}, now_ns=10 * NS)


def _assert_q3s_floor_is_the_last_reason(snapshot: model.Snapshot) -> None:
    """Nothing is evicted for ``q1-pod``; its status gives ``q3``'s floor, as the walk does without the first step."""
    stepped = engine.Engine().run(snapshot)
    with mock.patch.object(roommaking._Search, "_first_step", lambda self: False):
        walked = engine.Engine().run(snapshot)
    assert not stepped.evictions and not stepped.nominations
    waiting = stepped.statuses[model.GroupId("q1-pod")]
    assert "it would take queue q3 to 0 GPU, below its deserved quota of 1 GPU" in waiting.message, waiting.message
    assert stepped.statuses == walked.statuses


def test_a_first_step_that_finds_no_node_ready_leaves_the_reason_the_walk_leaves_last() -> None:
    """One full 4-GPU node holding both pods. Victim order takes the younger pod (``q0``'s) first: the walk's last
    reason is ``q3``'s."""
    running = [builders.pod("q3-pod", gpus=2), builders.pod("q0-pod", gpus=2)]
    snapshot = _floored_cluster([builders.node("n0", gpus=4)], running, builders.pod("q1-pod", gpus=1))
    _assert_q3s_floor_is_the_last_reason(snapshot)


def test_the_last_reason_comes_from_a_node_no_pool_could_make_ready() -> None:
    """Two full 2-GPU nodes: ``q0``'s pod on ``n0``, ``q3``'s (older, so later in victim order) on ``n1``, whose memory
    could never hold the pending pod. Only ``n0`` has a bound, so the node-by-node step asks about ``q0``'s pod alone;
    the walk's last reason is ``q3``'s, found among the window's units (``q3``'s queue is not quiet: its largest unit
    breaks its floor)."""
    nodes = [
        builders.node("n0", gpus=2, labels={"zone": "a"}),
        builders.node("n1", gpus=2, memory=4 * builders.GIB, labels={"zone": "b"}),
    ]
    running = [
        dataclasses.replace(builders.pod(f"{queue}-pod", gpus=2), node_selector=(("zone", zone),))
        for queue, zone in (("q3", "b"), ("q0", "a"))
    ]
    snapshot = _floored_cluster(nodes, running, builders.pod("q1-pod", gpus=1, memory=8 * builders.GIB))
    assert {pod.node for group in snapshot.groups.values() for pod in group.members} == {"n0", "n1", None}
    _assert_q3s_floor_is_the_last_reason(snapshot)


def _three_full_nodes() -> tuple[plan.Draft, freeing.Room, list[victims.Unit]]:
    """Three one-GPU nodes, each held by a one-GPU pod of queue ``a``: a draft over them, the room a one-GPU pod
    needs, and the pods' units in victim order."""
    pods = [builders.group(f"p{index}", builders.pod(f"p{index}", gpus=1), queue="a") for index in range(3)]
    nodes = [builders.node(f"n{index}", gpus=1) for index in range(3)]
    snapshot = model.snapshot(
        nodes=nodes, queues=[*builders.open_queues(), model.Queue(name=model.QueueName("a"))], groups=pods, now_ns=NS
    )
    snapshot = applying.apply(snapshot, engine.Engine().run(snapshot), now_ns=2 * NS)
    cap = capacity.Capacity()
    cap.sync(snapshot.nodes, margin_bytes=0, label_keys=frozenset())
    searcher = search.Searcher(cap)
    searcher.configure(model.Config(), ())
    draft = plan.Draft(cap, plan.Usage({}))
    running = sorted(
        (unit for group in snapshot.groups.values() for unit in victims.units(group, ())), key=lambda u: u.order_key
    )
    return draft, freeing.Room(searcher, [shapes.shape_of(builders.pod("x", gpus=1))]), running


def test_the_bounds_follow_the_cycles_changes_an_eviction_undone_before_their_start_included() -> None:
    draft, room, units = _three_full_nodes()
    positions = earliest.Positions(units)
    queues = frozenset({model.QueueName("a")})
    bounds = earliest.Earliest(positions, room, draft.capacity, draft.evicted, queues, 0)
    bounds.sweep(len(units))
    node_of = {position: unit.pods[0].node for position, unit in enumerate(units)}
    assert bounds.ready == [(position, node_of[position]) for position in range(3)]

    mark = draft.checkpoint()
    draft.evict(units[0].pods[0], units[0].group, reason=decisions.EvictionReason.RECLAIM, beneficiary=None, message="")
    bounds.sync()  # the first node has room now: it is short of nothing, so no bound
    assert bounds.ready == [(1, node_of[1]), (2, node_of[2])]
    later = earliest.Earliest(positions, room, draft.capacity, draft.evicted, queues, 1)
    later.sweep(len(units))
    assert later.ready == [(1, node_of[1]), (2, node_of[2])]

    draft.rollback(mark)  # the pod before ``later``'s start runs again
    bounds.sync()
    later.sync()
    while not later.done():
        later.sweep(len(units))
    assert bounds.ready == later.ready == [(position, node_of[position]) for position in range(3)]


def test_a_consolidation_past_failed_tries_is_found_node_by_node_and_moves_as_the_walk_does() -> None:
    """``clusters.awaiting_consolidation``: two failed tries, then room. The steps are found node by node (each evicts
    one group on its own node), with the walk's plan and statuses: ``a`` and ``b`` move, the pod is nominated to
    ``n0``."""
    snapshot = clusters.awaiting_consolidation()

    first_step = roommaking._Search._first_step
    steps: list[tuple[bool | None, int]] = []

    def noted(self: roommaking._Search) -> bool | None:
        step = first_step(self)
        steps.append((step, self.failed_settles))
        return step

    with mock.patch.object(roommaking._Search, "_first_step", noted):
        stepped = engine.Engine().run(snapshot)
    with mock.patch.object(roommaking._Search, "_first_step", lambda self: False):
        walked = engine.Engine().run(snapshot)
    assert steps == [(True, 2)], "two failed tries, then room, all found node by node"
    assert builders.decisions(stepped) == builders.decisions(walked)
    assert stepped.statuses == walked.statuses
    assert [(p.pod, p.node) for p in stepped.nominations] == [("p", "n0")]
    assert sorted((e.pod, e.reason, e.moved_to) for e in stepped.evictions) == [
        ("a", decisions.EvictionReason.CONSOLIDATE, "n2"),
        ("b", decisions.EvictionReason.CONSOLIDATE, "n1"),
    ]

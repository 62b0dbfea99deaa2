"""Reclaim at KAI's scale-test shapes (``quotient bench kai-scale``), small: one plan for a gang that needs more victims
than a small group may take, and one cycle for a backlog of single-pod groups of a queue below its fair share.

The cluster is full of single-GPU pods of queue ``a``, each its own group (a Kubernetes Job of one pod); queues
``a`` and ``b`` sit under one parent with KAI's test defaults (every resource -1 quota, weight 1, -1 limit), except
``a``'s GPU as KAI's reclaim tests set it (no quota, no weight: everything it holds is over its fair share once
``b`` asks).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from scheduler.placement import applying, decisions, engine, model, roombounds, shapes, status
from tests.unit.placement import builders

NS = 1_000_000_000
A, B = model.QueueName("a"), model.QueueName("b")
NO_QUOTA = model.QueueResource(quota=0, limit=model.UNLIMITED, over_quota_weight=0)


def _queues(a_gpu: model.QueueResource, b_gpu: model.QueueResource = model.OPEN) -> list[model.Queue]:
    parent = model.QueueName("parent")
    return [
        model.Queue(name=parent),
        model.Queue(name=A, parent=parent, gpu=a_gpu),
        model.Queue(name=B, parent=parent, gpu=b_gpu),
    ]


def _full(nodes: int, a_gpu: model.QueueResource, b_gpu: model.QueueResource = model.OPEN) -> model.Snapshot:
    """``nodes`` x 8 GPUs, every GPU held by a single-GPU group of ``a`` (placed by the engine, as the fill is)."""
    snapshot = model.snapshot(
        nodes=[builders.node(f"n{index:03d}", gpus=8) for index in range(nodes)],
        queues=_queues(model.OPEN),
        groups=[
            builders.group(f"a-{index:04d}", builders.pod(f"a-{index:04d}", gpus=1, cpu=100, memory=0), queue=A)
            for index in range(nodes * 8)
        ],
        now_ns=NS,
    )
    result = engine.Engine().run(snapshot)
    assert len(result.placements) == nodes * 8
    snapshot = applying.apply(snapshot, result, now_ns=2 * NS)
    return dataclasses.replace(snapshot, queues={queue.name: queue for queue in _queues(a_gpu, b_gpu)})


def _with(snapshot: model.Snapshot, *groups: model.Group) -> model.Snapshot:
    return dataclasses.replace(snapshot, groups={**snapshot.groups, **{group.id: group for group in groups}})


def _running(snapshot: model.Snapshot, queue: model.QueueName) -> int:
    return sum(
        1
        for group in snapshot.groups.values()
        if group.queue == queue
        for pod in group.members
        if pod.phase is model.PodPhase.RUNNING
    )


def _single_gpu_groups(count: int) -> list[model.Group]:
    return [
        builders.group(f"b-{index:04d}", builders.pod(f"b-{index:04d}", gpus=1, cpu=100, memory=0), queue=B)
        for index in range(count)
    ]


def _gang(pods: int) -> model.Group:
    members = [builders.pod(f"big-{index:02d}", gpus=8, cpu=100, memory=0) for index in range(pods)]
    return builders.group("big", *members, queue=B, min_member=pods)


def test_a_gang_of_64_victims_reclaims_them_in_one_plan_and_is_placed_where_they_were() -> None:
    # 16 nodes x 8 GPUs full of a's single-GPU pods; b's gang of 8 pods x 8 GPUs needs 64 victims on 8 whole nodes.
    snapshot = _with(_full(16, NO_QUOTA), _gang(8))
    planner = engine.Engine()
    first = planner.run(snapshot)
    assert len(first.evictions) == 64
    assert {eviction.reason for eviction in first.evictions} == {decisions.EvictionReason.RECLAIM}
    assert {eviction.beneficiary for eviction in first.evictions} == {"big"}
    assert not first.placements
    assert first.statuses[model.GroupId("big")].reason is status.Reason.WAITING_FOR_RECLAIM
    # Victims are pooled per node: the eight nodes nominated are exactly the eight emptied, eight victims each.
    emptied = collections.Counter(eviction.node for eviction in first.evictions)
    assert set(emptied.values()) == {8}
    assert {nomination.node for nomination in first.nominations} == set(emptied)
    assert len(first.nominations) == 8
    second = planner.run(applying.apply(snapshot, first, now_ns=3 * NS))
    placed = [placement for placement in second.placements if placement.group == "big"]
    assert len(placed) == 8
    assert not second.evictions


def test_a_gang_that_needs_more_than_64_victims_reclaims_one_per_gpu_it_asks_for_on_whole_nodes() -> None:
    # b's gang of 10 pods x 8 GPUs needs 80 victims: past 64, the bound grows with the GPUs asked (one unit per GPU,
    # as the room it leaves is held for the gang while they go); ten nodes emptied, eight victims each, no more.
    snapshot = _with(_full(20, NO_QUOTA), _gang(10))
    planner = engine.Engine()
    result = planner.run(snapshot)
    assert len(result.evictions) == 80
    assert set(collections.Counter(eviction.node for eviction in result.evictions).values()) == {8}
    assert len(result.nominations) == 10
    assert result.statuses[model.GroupId("big")].reason is status.Reason.WAITING_FOR_RECLAIM
    second = planner.run(applying.apply(snapshot, result, now_ns=3 * NS))
    assert len([placement for placement in second.placements if placement.group == "big"]) == 10


def test_a_gang_is_refused_without_evictions_when_the_queues_allow_less_than_it_needs() -> None:
    # a's deserved quota keeps all but 79 GPUs (KAI's unschedulable scenario): 80 cannot be reclaimed, none is.
    snapshot = _with(
        _full(20, model.QueueResource(quota=81_000, limit=model.UNLIMITED, over_quota_weight=0)), _gang(10)
    )
    result = engine.Engine().run(snapshot)
    assert not result.evictions
    assert not result.nominations
    assert result.statuses[model.GroupId("big")].code is status.Code.UNSCHEDULABLE


def test_single_pod_groups_of_a_queue_below_its_fair_share_all_reclaim_in_one_cycle_up_to_it() -> None:
    # a deserves 80 GPUs, b 40, nobody shares the spare: b reclaims 40 of its 100 single-GPU groups in one cycle.
    a_gpu = model.QueueResource(quota=80_000, limit=model.UNLIMITED, over_quota_weight=0)
    b_gpu = model.QueueResource(quota=40_000, limit=model.UNLIMITED, over_quota_weight=0)
    snapshot = _with(_full(20, a_gpu, b_gpu), *_single_gpu_groups(100))
    planner = engine.Engine()
    first = planner.run(snapshot)
    assert first.queues[B].fair.milli_gpu == 40_000
    assert len(first.evictions) == 40
    assert len(first.nominations) == 40
    waiting = [gid for gid, found in first.statuses.items() if found.reason is status.Reason.WAITING_FOR_RECLAIM]
    assert len(waiting) == 40
    refused = first.statuses[model.GroupId("b-0099")]
    assert "over its fair share of 40 GPU" in refused.message
    after = applying.apply(snapshot, first, now_ns=3 * NS)
    second = planner.run(after)
    after = applying.apply(after, second, now_ns=4 * NS)
    assert _running(after, B) == 40
    assert _running(after, A) == 120
    assert not second.evictions  # b holds its fair share: nothing more is reclaimed


def test_a_backlog_larger_than_a_groups_candidate_bound_reclaims_in_one_cycle() -> None:
    # 130 nodes: 1,040 victims, more than the 1,000 candidates one single-GPU group may look at. Each group's attempt
    # starts after the victims already taken this cycle, so every one of b's 1,040 groups reclaims at once.
    snapshot = _with(_full(130, NO_QUOTA), *_single_gpu_groups(1040))
    planner = engine.Engine()
    first = planner.run(snapshot)
    assert len(first.evictions) == 1040
    assert len(first.nominations) == 1040
    after = applying.apply(snapshot, first, now_ns=3 * NS)
    second = planner.run(after)
    assert len([placement for placement in second.placements if placement.group.startswith("b-")]) == 1040


def test_what_an_attempt_looks_at_and_evicts_grows_with_the_gpus_a_group_asks_for() -> None:
    one = shapes.shape_of(builders.pod("one", gpus=1))
    eight = shapes.shape_of(builders.pod("eight", gpus=8))
    assert roombounds.limits([one]) == (64, 1_000)
    assert roombounds.limits([eight] * 4) == (64, 1_000)
    assert roombounds.limits([eight] * 250) == (2_000, 32_000)


def _leaving(snapshot: model.Snapshot, evicted: Sequence[decisions.Eviction]) -> model.Snapshot:
    """The snapshot while the evictions are under way: the victims still run, marked leaving (their deletion asked)."""
    gone = {eviction.pod for eviction in evicted}
    groups = {
        gid: dataclasses.replace(
            group,
            members=tuple(dataclasses.replace(pod, leaving=pod.uid in gone) for pod in group.members),
        )
        for gid, group in snapshot.groups.items()
    }
    return dataclasses.replace(snapshot, groups=groups)


def test_victims_still_leaving_are_no_victims_again_and_the_group_they_leave_for_waits_for_them() -> None:
    # Cycle 1: ten of b's single-GPU groups reclaim ten of a's pods. Cycle 2, the victims still leaving: the ten wait
    # for them on their nominated nodes and evict no one else, and ten more groups of b reclaim ten *other* pods.
    full = _full(4, NO_QUOTA)
    first_groups = _single_gpu_groups(10)
    planner = engine.Engine()
    first = planner.run(_with(full, *first_groups))
    assert len(first.evictions) == 10
    nominated = {str(n.pod): n.node for n in first.nominations}
    waiting = tuple(
        dataclasses.replace(
            group,
            members=tuple(dataclasses.replace(pod, nominated_node=nominated[str(pod.uid)]) for pod in group.members),
        )
        for group in first_groups
    )
    later = [
        builders.group(f"c-{index:02d}", builders.pod(f"c-{index:02d}", gpus=1, cpu=100, memory=0), queue=B)
        for index in range(10)
    ]
    second_snapshot = _with(_leaving(full, first.evictions), *waiting, *later)
    second = planner.run(second_snapshot)
    assert second == engine.Engine().run(second_snapshot)
    again = {eviction.pod for eviction in second.evictions} & {eviction.pod for eviction in first.evictions}
    assert not again
    assert {eviction.beneficiary for eviction in second.evictions} == {group.id for group in later}
    for group in waiting:
        found = second.statuses[group.id]
        assert found.reason is status.Reason.WAITING_FOR_RECLAIM, found
        assert "evicted pod(s) to leave its nominated node(s)" in found.message


def test_room_left_by_victims_already_gone_is_held_for_the_gang_while_the_others_leave() -> None:
    # KAI's pipelining. Cycle 1: b's gang of 8 pods x 8 GPUs reclaims 64 of a's pods on 8 nodes. Cycle 2: the victims
    # of 4 of those nodes are gone, the others still leaving, and 32 single-GPU jobs of b have come: the 8 nodes are
    # held for the gang (nominated again; the 4 still being vacated with their leaving pods counted as gone), none
    # is given to the newcomers, and the gang evicts no one more.
    full = _full(16, NO_QUOTA)
    planner = engine.Engine()
    first_snapshot = _with(full, _gang(8))
    first = planner.run(first_snapshot)
    assert len(first.evictions) == 64
    emptied = sorted({eviction.node for eviction in first.evictions})[:4]
    gone = tuple(eviction for eviction in first.evictions if eviction.node in emptied)
    still = [eviction for eviction in first.evictions if eviction.node not in emptied]
    # The gang nominated, the victims of the first 4 nodes deleted, the others still running and leaving.
    partly = applying.apply(first_snapshot, dataclasses.replace(first, evictions=gone), now_ns=3 * NS)
    second_snapshot = _with(_leaving(partly, still), *_single_gpu_groups(32))
    second = planner.run(second_snapshot)
    assert second == engine.Engine().run(second_snapshot)
    vacated = {eviction.node for eviction in first.evictions}
    assert not [placement for placement in second.placements if placement.node in vacated]
    held = {nomination.node for nomination in second.nominations if nomination.group == "big"}
    assert held == vacated
    assert not [eviction for eviction in second.evictions if eviction.beneficiary == "big"]
    assert second.statuses[model.GroupId("big")].reason is status.Reason.WAITING_FOR_RECLAIM
    # Cycle 3: every victim of the gang gone, it is placed on its eight nodes.
    third_snapshot = applying.apply(
        second_snapshot, dataclasses.replace(second, evictions=(*second.evictions, *still)), now_ns=4 * NS
    )
    third = planner.run(third_snapshot)
    placed = [placement for placement in third.placements if placement.group == "big"]
    assert len(placed) == 8

"""The append-only plan: checkpoint and rollback restore the working state exactly; applying a plan, and the gangs
it leaves below their minimum."""

from __future__ import annotations

import dataclasses

from scheduler.placement import applying, capacity, decisions, engine, gangs, model, plan, search, shapes
from tests.unit.placement import builders


def _picture(cap: capacity.Capacity) -> object:
    nodes = [(work.name, work.save()) for work in cap.by_order]
    indexes = [
        (
            sorted((count, list(bucket)) for count, bucket in index.whole.items() if bucket),
            sorted((count, list(bucket)) for count, bucket in index.shared.items() if bucket),
        )
        for index in cap.classes
    ]
    return nodes, indexes


def test_rollback_restores_every_node_and_index_and_finish_undoes_the_cycle() -> None:
    nodes = {node.name: node for node in (builders.node(f"n{i}", gpus=4) for i in range(3))}
    cap = capacity.Capacity()
    cap.sync(nodes, margin_bytes=0, label_keys=frozenset())
    searcher = search.Searcher(cap)
    searcher.configure(model.Config(), (250, 500))
    usage = plan.Usage({model.QueueName("q"): (model.QueueName("q"),)})
    draft = plan.Draft(cap, usage)
    group = builders.group("g", queue="q")
    initial = _picture(cap)

    def place(pod: model.Pod) -> None:
        choice = searcher.find(shapes.shape_of(pod))
        assert choice is not None
        draft.place(pod, group, choice)

    place(builders.pod("a", gpus=2))
    after_first = (_picture(cap), usage.allocated[model.QueueName("q")])
    checkpoint = draft.checkpoint()
    place(builders.pod("b", fraction=500))
    place(builders.pod("c", fraction=250))
    place(builders.pod("d", gpus=4))
    assert len(draft.placements) == 4
    draft.rollback(checkpoint)
    assert (_picture(cap), usage.allocated[model.QueueName("q")]) == after_first
    assert [placement.pod for placement in draft.placements] == ["a"]
    result = draft.finish({}, {})
    assert [placement.pod for placement in result.placements] == ["a"]
    assert _picture(cap) == initial
    assert usage.allocated[model.QueueName("q")] == model.ZERO


def test_an_applied_plan_shows_pods_running_and_shares_in_one_gpu_group() -> None:
    snapshot = model.snapshot(
        nodes=[builders.node("n0", gpus=2)],
        queues=builders.open_queues(),
        groups=[
            builders.group("a", builders.pod("a", fraction=500), created=1),
            builders.group("b", builders.pod("b", fraction=250), created=2),
            builders.group("w", builders.pod("w", gpus=1), created=3),
        ],
        now_ns=7,
    )
    result = engine.Engine().run(snapshot)
    after = applying.apply(snapshot, result)
    node = after.nodes[model.NodeName("n0")]
    shared = [device for device in node.devices if device.gpu_group is not None]
    assert len(shared) == 1 and shared[0].allotted_milli_gpu == 750 and shared[0].holders == ("a", "b")
    whole = [device for device in node.devices if device.whole]
    assert len(whole) == 1 and whole[0].holders == ("w",)
    assert node.used.pods == 4  # three pods and the GPU group's reservation pod
    pods = {pod.uid: pod for group in after.groups.values() for pod in group.members}
    assert all(pod.phase is model.PodPhase.RUNNING and pod.started_ns == 7 for pod in pods.values())
    assert pods[model.PodUid("a")].gpu_groups == pods[model.PodUid("b")].gpu_groups
    assert engine.Engine().run(after).placements == ()


def test_a_gang_whose_subgroup_loses_its_only_pod_is_marked_below_its_minimum_when_applied() -> None:
    pods = (
        dataclasses.replace(builders.pod("head", gpus=1), subgroup="head"),
        dataclasses.replace(builders.pod("w0", gpus=1), subgroup="workers"),
        dataclasses.replace(builders.pod("w1", gpus=1), subgroup="workers"),
    )
    gang = dataclasses.replace(
        builders.group("job", *pods, min_member=2),
        subgroups=(model.SubGroup(name="head", min_member=1), model.SubGroup(name="workers", min_member=1)),
    )
    snapshot = model.snapshot(
        nodes=[builders.node("n0", gpus=4)], queues=builders.open_queues(), groups=[gang], now_ns=5
    )
    running = applying.apply(snapshot, engine.Engine().run(snapshot))
    assert running.groups[model.GroupId("job")].below_min_since_ns is None
    head = next(pod for pod in running.groups[model.GroupId("job")].members if pod.uid == "head")
    eviction = decisions.Eviction(
        pod=head.uid,
        group=model.GroupId("job"),
        node=model.NodeName("n0"),
        reason=decisions.EvictionReason.RECLAIM,
        beneficiary=None,
        message="",
    )
    after = applying.apply(running, plan.Plan(placements=(), evictions=(eviction,), statuses={}), now_ns=9)
    job = after.groups[model.GroupId("job")]
    # Two of its two members run, but subgroup head has none of the one it needs.
    assert gangs.below_minimum(job) == "0 of the 1 members subgroup head needs"
    assert job.below_min_since_ns == 9

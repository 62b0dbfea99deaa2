"""The fragmentation strategy's learned workload (``learning``): what it learns, and what it does with it."""

from __future__ import annotations

import dataclasses

from scheduler.placement import applying, engine, learning, model, plan
from tests.unit.placement import builders

FRAGMENTATION = dataclasses.replace(model.DEFAULT_CONFIG, gpu_strategy=model.Strategy.FRAGMENTATION)


def _snapshot(nodes: list[model.Node], groups: list[model.Group], now_ns: int = 0) -> model.Snapshot:
    return model.snapshot(
        nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=now_ns, config=FRAGMENTATION
    )


def _share(uid: str, milli: int, created: int = 0) -> model.Group:
    return builders.group(uid, builders.pod(uid, fraction=milli, cpu=0, memory=0), created=created)


def _devices(result: plan.Plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {str(p.pod): (str(p.node), p.devices) for p in result.placements}


def test_the_seeds_sharing_pair_forms_on_a_fresh_cluster() -> None:
    # gpu-sharing (0.5) and inference-api (0.25) arrive together on a fresh 4-GPU node: the learned workload is
    # only these two shares, and the whole-GPU prior keeps the pair on one device as KAI's guide shows it.
    snapshot = _snapshot([builders.node("node-0", gpus=4)], [_share("gpu-sharing", 500), _share("inference", 250, 1)])
    placed = _devices(engine.Engine().run(snapshot))
    assert placed["gpu-sharing"] == placed["inference"] == ("node-0", (0,))


def test_the_vllm_pair_forms_on_one_device_after_the_first_pair() -> None:
    node = builders.node("node-0", gpus=4)
    warm = engine.Engine()
    first = _snapshot([node], [_share("a", 700)])
    after = applying.apply(first, warm.run(first))
    second = dataclasses.replace(after, groups={**after.groups, model.GroupId("b"): _share("b", 200, 1)})
    placed = _devices(warm.run(second))
    assert placed["b"] == ("node-0", (0,))


def test_a_workload_of_quarter_shares_keeps_whole_devices_free_for_whole_gpu_pods() -> None:
    # Two nodes of two GPUs; quarter shares arrive one a cycle. They fill devices one after another, so after
    # eight of them two devices are full and two whole devices are left on one node for a 2-GPU pod.
    nodes = [builders.node("n0", gpus=2), builders.node("n1", gpus=2)]
    warm = engine.Engine()
    snapshot = _snapshot(nodes, [])
    for i in range(8):
        snapshot = dataclasses.replace(
            snapshot, groups={**snapshot.groups, model.GroupId(f"q{i}"): _share(f"q{i}", 250, i)}, now_ns=i
        )
        result = warm.run(snapshot)
        assert len(result.placements) == 1
        snapshot = applying.apply(snapshot, result)
    used = {(p.node, p.devices) for g in snapshot.groups.values() for p in g.members}
    assert len(used) == 2, used
    whole = builders.group("whole", builders.pod("whole", gpus=2, cpu=0, memory=0), created=9)
    snapshot = dataclasses.replace(snapshot, groups={**snapshot.groups, whole.id: whole}, now_ns=9)
    assert [p.pod for p in warm.run(snapshot).placements] == ["whole"]


def test_a_restarted_engine_learns_the_workload_again_from_running_and_pending_pods() -> None:
    nodes = [builders.node("n0", gpus=4)]
    old = engine.Engine()
    snapshot = _snapshot(nodes, [_share("a", 500), _share("b", 250, 1)])
    snapshot = applying.apply(snapshot, old.run(snapshot))
    pending = builders.group("c", builders.pod("c", gpus=1, cpu=0, memory=0), created=2)
    snapshot = dataclasses.replace(snapshot, groups={**snapshot.groups, pending.id: pending})
    fresh = engine.Engine()
    fresh.run(snapshot)
    assert fresh.learner.arrivals == 3
    shapes = {(shape.gpu_count, shape.milli_gpu) for shape in fresh.learner.weights}
    assert shapes == {(1, 500), (1, 250), (1, 1000)}


def test_without_history_there_is_no_learned_scorer_and_the_engine_places_as_binpack() -> None:
    assert learning.Learner().scorer() is None
    nodes = [builders.node("n0", gpus=2), builders.node("n1", gpus=4)]
    groups = [builders.group("g", builders.pod("p", gpus=1))]
    binpack = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=0)
    assert engine.Engine().run(_snapshot(nodes, groups)).placements == engine.Engine().run(binpack).placements


def test_weights_halve_every_half_life_and_the_scorer_is_kept_until_the_distribution_drifts() -> None:
    learner = learning.Learner(half_life_arrivals=4)
    quarter = builders.pod("q", fraction=250)
    whole = builders.pod("w", gpus=1)
    learner.observe([quarter] * 3, reference_memory_bytes=builders.GIB)
    [weight] = learner.weights.values()  # three arrivals
    first = learner.scorer()
    assert first is not None
    learner.observe([quarter], reference_memory_bytes=builders.GIB)
    assert list(learner.weights.values()) == [weight // 3 * 4 // 2]
    assert learner.scorer() is first  # the same distribution: the same scorer, its memo kept
    learner.observe([whole] * 3, reference_memory_bytes=builders.GIB)
    assert learner.scorer() is not first

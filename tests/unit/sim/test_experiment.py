from __future__ import annotations

import dataclasses

import pytest

from common.quantities import GIB
from scheduler.sim import enginereplay, experiment, policies
from scheduler.sim.openb import TraceNode, TracePod

_CONTEXT = policies.PolicyContext(shapes=())


def node(name: str, gpus: int, *, cpu: int = 32_000, memory: int = 64 * GIB, model: str = "T4") -> TraceNode:
    return TraceNode(name=name, milli_cpu=cpu, memory_bytes=memory, gpu_count=gpus, gpu_model=model)


def pod(name: str, *, gpus: int = 1, milli: int = 1000, cpu: int = 1000, memory: int = GIB) -> TracePod:
    return TracePod(name=name, milli_cpu=cpu, memory_bytes=memory, gpu_count=gpus, milli_gpu=milli if gpus else 0)


def test_the_order_is_the_name_order_shuffled_by_the_seed_whatever_the_input_order() -> None:
    pods = [pod(f"p-{i:02d}", milli=100) for i in range(20)]
    forward = experiment.arrival_order(pods, seed=42, capacity_milli=10_000, target_percent=20)
    backward = experiment.arrival_order(pods[::-1], seed=42, capacity_milli=10_000, target_percent=20)
    other = experiment.arrival_order(pods, seed=43, capacity_milli=10_000, target_percent=20)
    assert [p.name for p in forward] == [p.name for p in backward]
    assert [p.name for p in forward] != [p.name for p in other]
    assert sorted(p.name for p in forward) == [p.name for p in pods]


def test_inflation_appends_copies_until_the_next_would_pass_the_target() -> None:
    # 2 GPUs asked of 4: copies of 1-GPU pods are appended while the total stays within 4 GPUs (100%).
    order = experiment.arrival_order([pod("a"), pod("b")], seed=7, capacity_milli=4000, target_percent=100)
    assert len(order) == 4
    assert sum(p.total_milli_gpu for p in order) == 4000
    assert {p.name for p in order[2:]} <= {"a-copy-1", "a-copy-2", "b-copy-1", "b-copy-2"}


def test_a_trace_asking_for_more_than_the_target_is_cut_down_to_it() -> None:
    order = experiment.arrival_order([pod(f"p{i}") for i in range(5)], seed=3, capacity_milli=2000, target_percent=100)
    assert len(order) == 2
    assert len({p.name for p in order}) == 2


def test_one_pod_at_a_time_a_failed_pod_is_dropped_and_still_counts_as_arrived() -> None:
    # One node of two devices, three 0.7 shares: 35%, 70%, 105% arrived; the third fits nowhere and fails.
    # No copies: a fourth 0.7 share would pass 130%.
    nodes = [node("n", 2)]
    pods = [pod(name, milli=700) for name in ("a", "b", "c")]
    result = experiment.run_seed(nodes=nodes, pods=pods, policy=policies.POLICIES["bestfit"], seed=42)
    allocated = [point.allocated_percent for point in result.curve]
    assert [point.arrived_percent for point in result.curve] == list(range(131))
    assert allocated[0] == 0
    assert allocated[1:36] == [35.0] * 35
    assert allocated[36:71] == [70.0] * 35
    assert allocated[71:131] == [70.0] * 60  # the third pod arrived (up to 105%) and failed
    assert result.failed_by_kind == {"cpu_only": 0, "fractional": 1, "whole": 0, "multi_gpu": 0}
    assert (result.attempted, result.placed) == (3, 2)
    assert result.allocated_at(100) == 70.0 == result.allocated_at(130)


def test_fragmentation_counts_what_the_typical_pods_cannot_use() -> None:
    # After two 0.7 shares, each device has 0.3 left, which a 0.7 share cannot use: 600 of 2000 milli-GPU (30%).
    nodes = [node("n", 2)]
    pods = [pod(name, milli=700) for name in ("a", "b", "c")]
    result = experiment.run_seed(nodes=nodes, pods=pods, policy=policies.POLICIES["fgd"], seed=1)
    assert result.curve[0].fragmentation_percent == 0
    assert result.curve[130].fragmentation_percent == pytest.approx(30.0)


def _small_trace() -> tuple[list[TraceNode], list[TracePod]]:
    nodes = [node("small", 2, cpu=8000), node("big", 4, cpu=64_000, model="V100M32")]
    pods = [pod("w1"), pod("w2", gpus=2, milli=1000), pod("s1", milli=500), pod("s2", milli=300), pod("c", gpus=0)]
    pods += [dataclasses.replace(pod(f"x{i}", milli=250), gpu_models=frozenset({"T4"})) for i in range(3)]
    return nodes, pods


@pytest.mark.parametrize("policy", ["bestfit", "clustering", "fgd", "quotient"])
def test_the_engine_backend_replays_like_the_fast_path_when_nothing_ties(policy: str) -> None:
    nodes, pods = _small_trace()
    runs = [
        experiment.run_seed(nodes=nodes, pods=pods, policy=policies.POLICIES[policy], seed=5, backend=backend)
        for backend in (experiment.Backend.FAST, experiment.Backend.ENGINE)
    ]
    fast, engine = runs
    assert [p.allocated_percent for p in engine.curve] == [p.allocated_percent for p in fast.curve]
    assert engine.failed_by_kind == fast.failed_by_kind


def test_the_engine_is_the_default_backend() -> None:
    nodes, pods = _small_trace()
    default = experiment.run_seed(nodes=nodes, pods=pods, policy=policies.POLICIES["fgd"], seed=5)
    engine = experiment.run_seed(
        nodes=nodes, pods=pods, policy=policies.POLICIES["fgd"], seed=5, backend=experiment.Backend.ENGINE
    )
    assert default == engine


def test_random_through_the_engine_spreads_over_the_nodes_and_repeats_with_its_seed() -> None:
    # Ten alike nodes, ten whole GPUs asked of twenty: node order alone would fill the first five nodes.
    nodes = [node(f"n{i}", 2) for i in range(10)]
    pods = [pod(f"p{i}") for i in range(10)]

    def used(seed: int) -> list[str]:
        cluster = enginereplay.EngineCluster(
            experiment.node_order(nodes, seed=seed), policies.POLICIES["random"](_CONTEXT), seed=seed
        )
        assert all(cluster.submit(pods))
        return sorted(name for name, state in cluster.snapshot.nodes.items() if state.used.milli_cpu)

    assert used(1) == used(1)
    assert len(used(1)) > 5
    assert used(1) != used(2)


def test_a_cluster_without_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU"):
        experiment.run_seed(nodes=[node("n", 0)], pods=[pod("a")], policy=policies.POLICIES["fgd"], seed=1)

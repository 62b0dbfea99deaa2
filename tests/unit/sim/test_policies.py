"""Each baseline on a case where the published plugin's choice is known, through the replay's own choice rule."""

from __future__ import annotations

import random

from common.quantities import GIB
from scheduler.placement.fragmentation import NodeFree, PodShape
from scheduler.sim import policies, replay
from scheduler.sim.openb import TraceNode

SHARE_300 = PodShape(milli_cpu=2000, memory_bytes=GIB, gpu_count=1, milli_gpu=300)
WHOLE_1 = PodShape(milli_cpu=4000, memory_bytes=GIB, gpu_count=1, milli_gpu=1000)
CPU_ONLY = PodShape(milli_cpu=8000, memory_bytes=GIB)


def cluster(*nodes: tuple[str, int, int], track: bool = False) -> replay.ReplayCluster:
    """Nodes (name, GPUs, cores) in node order."""
    return replay.ReplayCluster(
        [
            TraceNode(name=name, milli_cpu=cores * 1000, memory_bytes=256 * GIB, gpu_count=gpus, gpu_model="G2")
            for name, gpus, cores in nodes
        ],
        track_resident_kinds=track,
    )


def scorer(name: str, shapes: tuple[PodShape, ...] = (SHARE_300,)) -> replay.Scorer:
    return policies.POLICIES[name](policies.PolicyContext(shapes=shapes))


def place(target: replay.ReplayCluster, pod: PodShape, policy: replay.Scorer) -> str:
    placement = target.place(pod, policy)
    assert placement is not None
    return placement.node


def test_bestfit_takes_the_node_left_with_the_least_free_cpu_and_gpu() -> None:
    target = cluster(("roomy", 8, 96), ("snug", 2, 16))
    assert place(target, WHOLE_1, scorer("bestfit")) == "snug"


def test_dotprod_takes_the_node_whose_free_vector_aligns_least_with_the_request() -> None:
    # The plugin scores 1 - dot/2, so the smallest dot product of (free CPU, free GPU) with the request wins.
    target = cluster(("big", 8, 96), ("small", 1, 8))
    assert place(target, WHOLE_1, scorer("dotprod")) == "small"


def test_packing_prefers_a_shared_device_then_a_used_node_then_an_idle_one() -> None:
    policy = scorer("packing")
    target = cluster(("a", 2, 32), ("b", 2, 32), ("c", 2, 32))
    assert place(target, WHOLE_1, policy) == "a"  # every node idle: the first
    assert place(target, WHOLE_1, policy) == "a"  # a used node's free device beats an idle node
    assert place(target, SHARE_300, policy) == "b"  # "a" is full: an idle node
    placement = target.place(SHARE_300, policy)
    assert placement is not None and placement.node == "b"
    assert placement.devices == (1,)  # the shared device (0.7 left, listed after the free one), not the free one
    assert place(target, WHOLE_1, policy) == "b"  # its free device beats the idle "c"


def test_clustering_keeps_alike_requests_together() -> None:
    policy = scorer("clustering")
    target = cluster(("a", 4, 64), ("b", 4, 64), ("c", 4, 64), track=True)
    assert place(target, SHARE_300, policy) == "a"
    assert place(target, WHOLE_1, policy) == "b"  # a node without GPU pods beats one holding another class
    assert place(target, SHARE_300, policy) == "a"
    assert place(target, WHOLE_1, policy) == "b"


def test_random_spreads_over_every_feasible_node() -> None:
    policy = scorer("random")
    rng = random.Random(1)
    chosen = set()
    for _ in range(40):
        target = cluster(("a", 2, 32), ("b", 2, 32), ("c", 2, 32))
        placement = target.place(WHOLE_1, policy, rng)
        assert placement is not None
        chosen.add(placement.node)
    assert chosen == {"a", "b", "c"}


def test_fgd_fills_the_hole_a_typical_share_cannot_use_elsewhere() -> None:
    # Typical pods are 0.3 shares. One node has a device with 0.35 left (0.05 of it is stranded for them either
    # way); the other is empty. A 0.3 share into the 0.35 hole leaves the empty node's devices whole: least growth.
    policy = scorer("fgd")
    target = cluster(("empty", 2, 32), ("holey", 2, 32))
    assert place(target, PodShape(milli_cpu=1000, memory_bytes=GIB, gpu_count=1, milli_gpu=650), policy) == "empty"
    assert place(target, SHARE_300, policy) == "empty"  # into the 0.35 left by the 0.65 share


def test_fgd_keeps_cpu_only_pods_off_nodes_whose_gpus_they_would_strand() -> None:
    # Typical pods need 12 cores per GPU: on the 16-core node an 8-core pod strands the GPUs, on the big one not.
    shapes = (PodShape(milli_cpu=12_000, memory_bytes=GIB, gpu_count=1, milli_gpu=1000),)
    policy = scorer("fgd", shapes)
    target = cluster(("tight", 1, 16), ("roomy", 1, 96))
    assert place(target, CPU_ONLY, policy) == "roomy"


def test_quotient_also_keeps_cpu_only_pods_off_nodes_whose_gpus_they_would_strand() -> None:
    shapes = (PodShape(milli_cpu=12_000, memory_bytes=GIB, gpu_count=1, milli_gpu=1000),)
    policy = scorer("quotient", shapes)
    target = cluster(("tight", 1, 16), ("roomy", 1, 96))
    assert place(target, CPU_ONLY, policy) == "roomy"


def test_every_policy_scores_the_same_state_the_same() -> None:
    node = NodeFree(gpu_model="G2", milli_cpu=32_000, memory_bytes=64 * GIB, devices=(1000, 700))
    for name in policies.POLICIES:
        policy = scorer(name)
        assert policy(node, SHARE_300, (1,)) == policy(node, SHARE_300, (1,))

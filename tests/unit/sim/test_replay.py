from __future__ import annotations

import random

from common.quantities import GIB
from scheduler.placement.fragmentation import NodeFree, PodShape
from scheduler.sim import replay
from scheduler.sim.openb import TraceNode

SHARE = PodShape(milli_cpu=1000, memory_bytes=GIB, gpu_count=1, milli_gpu=400)
WHOLE = PodShape(milli_cpu=1000, memory_bytes=GIB, gpu_count=1, milli_gpu=1000)


class Constant:
    needs_resident_kinds = False
    breaks_ties_at_random = False

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        return 0


def nodes(*names: str, gpus: int = 2, cpu: int = 8000, model: str = "T4") -> list[TraceNode]:
    return [
        TraceNode(name=name, milli_cpu=cpu, memory_bytes=16 * GIB, gpu_count=gpus, gpu_model=model) for name in names
    ]


def test_identical_nodes_share_one_state_until_one_of_them_changes() -> None:
    cluster = replay.ReplayCluster(nodes("a", "b", "c"))
    assert [count for _, count in cluster.states()] == [3]
    cluster.place(SHARE, Constant())
    assert sorted(count for _, count in cluster.states()) == [1, 2]
    assert cluster.allocated_milli_gpu == 400


def test_ties_go_to_the_first_node_in_node_order() -> None:
    cluster = replay.ReplayCluster(nodes("z", "a", "m"))
    placed = [cluster.place(WHOLE, Constant()) for _ in range(3)]
    assert [placement.node for placement in placed if placement] == ["z", "z", "a"]


def test_random_ties_are_drawn_over_nodes_not_states() -> None:
    # Nine identical nodes and one different: the odd one is chosen about a tenth of the time, not half of it.
    chosen = 0
    rng = random.Random(7)
    for _ in range(400):
        cluster = replay.ReplayCluster(nodes(*"abcdefghi") + nodes("odd", model="P100"))
        placement = cluster.place(WHOLE, Constant(), rng)
        assert placement is not None
        chosen += placement.node == "odd"
    assert 15 <= chosen <= 70


def test_what_does_not_fit_anywhere_is_refused() -> None:
    cluster = replay.ReplayCluster(nodes("a", gpus=1, cpu=500))
    assert cluster.place(WHOLE, Constant()) is None  # too little CPU
    cluster = replay.ReplayCluster(nodes("a", gpus=1))
    constrained = PodShape(milli_cpu=1, memory_bytes=1, gpu_count=1, milli_gpu=100, gpu_models=frozenset({"A10"}))
    assert cluster.place(constrained, Constant()) is None  # wrong model
    assert cluster.place(PodShape(milli_cpu=1, memory_bytes=1, gpu_count=2, milli_gpu=1000), Constant()) is None

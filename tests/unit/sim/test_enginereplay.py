from __future__ import annotations

from common.quantities import GIB, MIB
from scheduler.placement import scoring
from scheduler.placement.fragmentation import NodeFree, PodShape
from scheduler.sim import enginereplay
from scheduler.sim.openb import TraceNode


class Recording:
    needs_resident_kinds = True
    breaks_ties_at_random = False

    def __init__(self) -> None:
        self.seen: list[tuple[NodeFree, PodShape, tuple[int, ...]]] = []

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        self.seen.append((node, pod, devices))
        return 0


def _state(*, shared: tuple[bool, ...], pod_gpus: tuple[int, ...]) -> scoring.NodeState:
    count = len(shared)
    devices = list(zip(shared, pod_gpus, strict=True))
    return scoring.NodeState(
        free_milli_cpu=4000,
        free_memory_bytes=8 * GIB,
        allocatable_milli_cpu=16000,
        allocatable_memory_bytes=64 * GIB,
        device_free_milli=tuple(500 if is_shared else 0 if held else 1000 for is_shared, held in devices),
        device_memory_bytes=(16 * GIB,) * count,
        device_models=("T4",) * count,
        device_whole_free=tuple(not is_shared and not held for is_shared, held in devices),
        device_shared=shared,
        device_pod_gpus=pod_gpus,
    )


def test_a_policy_sees_the_gpu_model_and_the_kinds_of_pods_on_the_node() -> None:
    policy = Recording()
    scorer = enginereplay.EngineScorer(policy)
    state = _state(shared=(True, False, False, False), pod_gpus=(0, 2, 2, 0))
    scorer(state, scoring.GpuRequest(milli_cpu=1000, share_milli=250, share_devices=1), (0,))
    node, pod, devices = policy.seen[0]
    assert node == NodeFree(
        gpu_model="T4",
        milli_cpu=4000,
        memory_bytes=8 * GIB,
        devices=(500, 0, 0, 1000),
        resident_kinds=frozenset({"share", "2-gpu"}),
    )
    assert pod == PodShape(milli_cpu=1000, memory_bytes=0, gpu_count=1, milli_gpu=250)
    assert devices == (0,)


def test_a_node_without_gpu_pods_has_no_resident_kinds() -> None:
    assert enginereplay.resident_kinds(_state(shared=(False, False), pod_gpus=(0, 0))) == frozenset()
    assert enginereplay.resident_kinds(_state(shared=(False, False), pod_gpus=(1, 0))) == frozenset({"1-gpu"})


def test_devices_get_the_memory_of_their_model() -> None:
    nodes = [
        TraceNode(name=name, milli_cpu=1000, memory_bytes=GIB, gpu_count=1, gpu_model=model)
        for name, model in (("a", "V100M32"), ("b", "G2"), ("c", "T4"), ("d", "G1"))
    ]
    assert enginereplay.device_memory_by_model(nodes) == {
        "V100M32": 32510 * MIB,
        "G2": 16 * GIB,
        "T4": 15109 * MIB,
        "G1": 16 * GIB,
    }

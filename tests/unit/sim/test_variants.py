from __future__ import annotations

import pytest

from common.quantities import GIB
from scheduler.sim import variants
from scheduler.sim.openb import TraceNode, TracePod

NODES = [
    TraceNode(name="t4", milli_cpu=96_000, memory_bytes=512 * GIB, gpu_count=2, gpu_model="T4"),
    TraceNode(name="g2", milli_cpu=96_000, memory_bytes=384 * GIB, gpu_count=8, gpu_model="G2"),
]


def trace() -> list[TracePod]:
    def pod(name: str, gpus: int, milli: int) -> TracePod:
        return TracePod(name=name, milli_cpu=4000, memory_bytes=GIB, gpu_count=gpus, milli_gpu=milli)

    pods = [pod(f"s{i}", 1, 500) for i in range(30)]
    pods += [pod(f"w{i}", 1, 1000) for i in range(60)]
    pods += [pod(f"m{i}", 8, 1000) for i in range(2)]
    pods += [pod(f"c{i}", 0, 0) for i in range(10)]
    return pods


def share_of_demand(pods: tuple[TracePod, ...], kind: str) -> float:
    total = sum(pod.total_milli_gpu for pod in pods)
    return sum(pod.total_milli_gpu for pod in pods if pod.kind == kind) / total


def test_names_are_parsed_and_checked() -> None:
    assert variants.parse("gpushare60") == ("gpushare", 60)
    assert variants.parse("cpu250") == ("cpu", 250)
    with pytest.raises(ValueError, match="family member"):
        variants.parse("gpushare")
    with pytest.raises(ValueError, match="0 to 100"):
        variants.parse("gpuspec150")


def test_gpushare_makes_fractional_pods_about_that_share_of_gpu_demand() -> None:
    drawn = variants.derive(trace(), NODES, "gpushare60", seed=3)
    assert len(drawn) == len(trace())
    assert sum(1 for pod in drawn if pod.gpu_count == 0) == 10
    assert share_of_demand(drawn, "fractional") == pytest.approx(0.60, abs=0.08)


def test_multigpu_adds_multi_gpu_pods_until_their_share() -> None:
    drawn = variants.derive(trace(), NODES, "multigpu40", seed=3)
    assert share_of_demand(drawn, "multi_gpu") >= 0.40
    assert len(drawn) > len(trace())


def test_gpuspec_constrains_that_share_of_gpu_pods_to_models_that_can_hold_them() -> None:
    drawn = variants.derive(trace(), NODES, "gpuspec25", seed=3)
    gpu_pods = [pod for pod in drawn if pod.gpu_count]
    constrained = [pod for pod in gpu_pods if pod.gpu_models]
    assert len(constrained) == round(len(gpu_pods) * 0.25)
    assert all(pod.gpu_models <= {"T4", "G2"} for pod in constrained)
    assert all(pod.gpu_models == {"G2"} for pod in constrained if pod.gpu_count == 8)


def test_cpu_redraws_that_many_cpu_only_pods() -> None:
    assert sum(1 for pod in variants.derive(trace(), NODES, "cpu200", seed=3) if pod.gpu_count == 0) == 20
    assert sum(1 for pod in variants.derive(trace(), NODES, "cpu0", seed=3) if pod.gpu_count == 0) == 0


def test_a_variant_is_reproducible_from_its_name_and_seed() -> None:
    assert variants.derive(trace(), NODES, "gpushare80", seed=1) == variants.derive(
        trace(), NODES, "gpushare80", seed=1
    )
    assert variants.derive(trace(), NODES, "gpushare80", seed=1) != variants.derive(
        trace(), NODES, "gpushare80", seed=2
    )

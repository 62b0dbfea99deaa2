from __future__ import annotations

import pytest

from common.quantities import GIB
from scheduler.placement import fragmentation
from scheduler.placement.fragmentation import NodeFree, PodShape, TypicalPod, Weighting, WorkloadProfile

SHARE = PodShape(milli_cpu=4000, memory_bytes=8 * GIB, gpu_count=1, milli_gpu=500)
WHOLE2 = PodShape(milli_cpu=16_000, memory_bytes=64 * GIB, gpu_count=2, milli_gpu=1000)
CPU_ONLY = PodShape(milli_cpu=8000, memory_bytes=GIB)


def node(*devices: int, cpu: int = 32_000, memory: int = 128 * GIB, model: str = "A10") -> NodeFree:
    return NodeFree(gpu_model=model, milli_cpu=cpu, memory_bytes=memory, devices=devices)


def stranded_milli_gpu(state: NodeFree, shape: PodShape, *, memory_aware: bool = False) -> int:
    """The meter over a profile of ``shape`` alone, at weight one: the free milli-GPU that shape cannot use."""
    profile = WorkloadProfile(typical=(TypicalPod(shape=shape, weight=1),))
    return fragmentation.FragmentationMeter(profile, memory_aware=memory_aware).weighted(state)


@pytest.mark.parametrize(
    ("state", "shape", "stranded"),
    [
        (node(1000, 300, 600), SHARE, 300),  # the 0.3 remainder is too small for a 0.5 share
        (node(1000, 300, 600), WHOLE2, 1900),  # one whole device only: nothing usable for two
        (node(1000, 1000, 300), WHOLE2, 300),
        (node(1000, 300, cpu=2000), SHARE, 1300),  # too little CPU: everything is stranded
        (node(1000, 300), CPU_ONLY, 1300),  # a CPU-only pod uses no GPU at all
        (
            node(1000, 300, model="T4"),
            PodShape(milli_cpu=1, memory_bytes=1, gpu_count=1, milli_gpu=200, gpu_models=frozenset({"A10"})),
            1300,
        ),
        (node(0, 0), SHARE, 0),
    ],
)
def test_stranded_gpu_is_what_a_shape_cannot_use(state: NodeFree, shape: PodShape, stranded: int) -> None:
    assert stranded_milli_gpu(state, shape) == stranded


def test_memory_strands_gpus_only_when_asked_to() -> None:
    state = node(1000, 1000, memory=4 * GIB)
    assert stranded_milli_gpu(state, SHARE) == 0
    assert stranded_milli_gpu(state, SHARE, memory_aware=True) == 2000


def test_typical_pods_are_the_most_popular_shapes_covering_the_coverage() -> None:
    shapes = [SHARE] * 6 + [WHOLE2] * 3 + [CPU_ONLY]
    profile = WorkloadProfile.from_shapes(shapes, coverage_percent=90)
    assert [(t.shape, t.weight) for t in profile.typical] == [(SHARE, 6), (WHOLE2, 3)]
    everything = WorkloadProfile.from_shapes(shapes, coverage_percent=100)
    assert everything.total_weight == 10


def test_weighting_by_gpu_demand_counts_what_each_shape_asks_for() -> None:
    shapes = [SHARE] * 6 + [WHOLE2] * 3 + [CPU_ONLY]
    profile = WorkloadProfile.from_shapes(shapes, coverage_percent=100, weighting=Weighting.GPU_DEMAND)
    assert {t.shape: t.weight for t in profile.typical} == {WHOLE2: 6000, SHARE: 3000}


def test_the_profile_does_not_depend_on_the_input_order() -> None:
    shapes = [SHARE, WHOLE2, CPU_ONLY, SHARE, WHOLE2, CPU_ONLY]
    assert WorkloadProfile.from_shapes(shapes, coverage_percent=50) == WorkloadProfile.from_shapes(
        shapes[::-1], coverage_percent=50
    )


def test_the_meter_weighs_each_typical_shape_by_its_popularity() -> None:
    profile = WorkloadProfile.from_shapes([SHARE] * 3 + [CPU_ONLY], coverage_percent=100)
    meter = fragmentation.FragmentationMeter(profile)
    state = node(1000, 300)
    assert meter.weighted(state) == 3 * 300 + 1 * 1300
    assert meter.weighted(state) == meter.weighted(state)  # memoised, same answer


def test_device_options_are_one_per_distinct_remainder_tightest_first() -> None:
    assert fragmentation.device_options(node(1000, 600, 1000, 600, 200), SHARE) == [(1,), (0,)]
    assert fragmentation.device_options(node(1000, 600, 1000), WHOLE2) == [(0, 2)]
    assert fragmentation.device_options(node(1000, 600), WHOLE2) == []
    assert fragmentation.device_options(node(), CPU_ONLY) == [()]


def test_fgd_scores_like_its_plugin() -> None:
    assert fragmentation.fgd_score(0, 1) == 50
    assert fragmentation.fgd_score(-10_000_000, 1) == 100
    assert fragmentation.fgd_score(10_000_000, 1) == 0
    assert fragmentation.fgd_score(40, 1) == fragmentation.fgd_score(0, 1) - 1  # 40 milli-GPU of growth: one point


def test_fgd_prefers_the_placement_that_strands_least() -> None:
    meter = fragmentation.FragmentationMeter(WorkloadProfile.from_shapes([SHARE]))
    scorer = fragmentation.FgdScorer(meter)
    state = node(1000, 700)
    # Into the 0.7 device: 0.2 is left and stranded for a 0.5 share; into the free device: 0.5 left, usable.
    assert scorer(state, PodShape(milli_cpu=1, memory_bytes=1, gpu_count=1, milli_gpu=500), (0,)) > scorer(
        state, PodShape(milli_cpu=1, memory_bytes=1, gpu_count=1, milli_gpu=500), (1,)
    )


def test_the_appetite_is_the_cpu_and_memory_gpu_pods_ask_per_gpu() -> None:
    appetite = fragmentation.Appetite.of([SHARE, WHOLE2, CPU_ONLY])
    # (4 + 16) cores and (8 + 64) GiB for 2.5 GPUs; the CPU-only pod does not count.
    assert appetite.milli_cpu_per_gpu == 8000
    assert appetite.memory_bytes_per_gpu == 72 * GIB * 1000 // 2500
    assert fragmentation.Appetite.of([CPU_ONLY]) == fragmentation.Appetite(milli_cpu_per_gpu=0, memory_bytes_per_gpu=0)


def test_a_node_starves_the_gpus_its_cpu_or_memory_cannot_feed() -> None:
    appetite = fragmentation.Appetite(milli_cpu_per_gpu=10_000, memory_bytes_per_gpu=40 * GIB)
    assert appetite.starved_milli_gpu(node(1000, 1000, 1000, cpu=30_000, memory=400 * GIB)) == 0
    assert appetite.starved_milli_gpu(node(1000, 1000, 1000, cpu=15_000, memory=400 * GIB)) == 1500
    assert appetite.starved_milli_gpu(node(1000, 1000, cpu=90_000, memory=60 * GIB)) == 500
    assert appetite.starved_milli_gpu(node(0, 0, cpu=0, memory=0)) == 0


def test_quotient_keeps_a_cpu_hungry_pod_off_the_node_it_would_starve() -> None:
    # Both nodes take the pod and FGD sees no difference (the typical share still fits either way), but on the
    # lean node the 20 cores left cannot feed its last three GPUs at 8 cores per GPU.
    shapes = [SHARE] * 10 + [WHOLE2]
    hungry = PodShape(milli_cpu=20_000, memory_bytes=GIB, gpu_count=1, milli_gpu=1000)
    lean = node(1000, 1000, 1000, 1000, cpu=40_000)
    rich = node(1000, 1000, 1000, 1000, cpu=96_000)
    quotient = fragmentation.QuotientScorer.for_workload(shapes)
    fgd = fragmentation.FgdScorer(fragmentation.FragmentationMeter(WorkloadProfile.from_shapes(shapes)))
    assert fgd(lean, hungry, (0,)) == fgd(rich, hungry, (0,))
    assert quotient(rich, hungry, (0,)) > quotient(lean, hungry, (0,))

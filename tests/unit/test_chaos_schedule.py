"""The chaos run's fault schedule and load: seeded, every kind at least twice in ten minutes, spaced to recover."""

from __future__ import annotations

import random

import pytest

from quotient.bench import chaos_schedule as schedule
from quotient.bench import chaos_workload as workload
from quotient.bench.chaos_schedule import FaultKind


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert schedule.plan(seed=7, duration_s=600) == schedule.plan(seed=7, duration_s=600)
    assert schedule.plan(seed=7, duration_s=600) != schedule.plan(seed=8, duration_s=600)


@pytest.mark.parametrize("seed", range(1, 21))
def test_ten_minutes_have_every_kind_of_fault_at_least_twice(seed: int) -> None:
    counts = schedule.by_kind(schedule.plan(seed=seed, duration_s=600))
    assert min(counts.values()) >= 2, counts


@pytest.mark.parametrize("seed", range(1, 21))
def test_faults_of_a_kind_and_exclusive_faults_leave_time_to_recover(seed: int) -> None:
    faults = schedule.plan(seed=seed, duration_s=600)
    ends: dict[FaultKind, float] = {}
    exclusive_end = 0.0
    for fault in faults:
        timing = schedule.TIMINGS[fault.kind]
        assert fault.at_s >= ends.get(fault.kind, 0.0) - 0.1
        ends[fault.kind] = fault.at_s + fault.effect_s + timing.settle_s
        if timing.exclusive:
            assert fault.at_s >= exclusive_end - 0.1
            exclusive_end = fault.at_s + fault.effect_s + timing.settle_s
        assert fault.at_s >= schedule.WARMUP_S and fault.at_s + fault.effect_s <= 600
        assert (fault.variant in timing.variants) if timing.variants else fault.variant == ""


def test_one_minute_has_a_few_faults() -> None:
    assert 2 <= len(schedule.plan(seed=7, duration_s=60)) <= 4


def test_the_queues_share_less_than_the_cluster_so_that_queues_go_over_quota() -> None:
    queues = workload.queues_for(24)
    assert [queue.name for queue in queues] == ["chaos-a", "chaos-b", "chaos-c"]
    assert sum(queue.gpu_quota for queue in queues) < 24


def test_the_load_draws_every_kind_of_job_as_manifests_a_user_applies() -> None:
    rng = random.Random(1)
    jobs = [workload.draw(rng, index=i, queues=workload.queues_for(24)) for i in range(200)]
    assert {job.kind for job in jobs} == set(workload.JobKind)
    gang = next(job for job in jobs if job.kind is workload.JobKind.GANG)
    assert gang.podgroup is not None and gang.podgroup["spec"]["minMember"] == len(gang.pods) > 1
    assert all(pod["metadata"]["annotations"]["pod-group-name"] == gang.name for pod in gang.pods)
    fraction = next(job for job in jobs if job.kind is workload.JobKind.FRACTION)
    assert "gpu-fraction" in fraction.pods[0]["metadata"]["annotations"] and 0 < fraction.milli_gpu < 1000
    assert len({pod_name for job in jobs for pod_name in job.pod_names}) == sum(len(job.pods) for job in jobs)
    assert {pod["spec"]["priorityClassName"] for job in jobs for pod in job.pods} == {"train", "build-preemptible"}

from __future__ import annotations

import pytest

from common import clusterspec, names, quantities
from common.errors import ClusterSpecError
from scheduler.sim import workload, workloadreport

TWO_TEAMS = """
nodes:
  - name: gpu
    gpus: {count: 2, model: A100-80GB}
pods:
  - name: a
    count: 2
    queue: team-a
    requests: {cpu: 1, memory: 1Gi, nvidia.com/gpu: 1}
    duration: 60s
  - name: b
    count: 2
    queue: team-b
    arrive: 10s
    requests: {cpu: 1, memory: 1Gi, nvidia.com/gpu: 1}
    duration: 60s
"""


def run(text: str, step: str = "30s") -> workloadreport.WorkloadReport:
    return workload.run(clusterspec.loads(text), step_ns=quantities.parse_duration_ns(step))


def test_utilisation_waits_and_fair_share_are_reported_per_queue() -> None:
    # 0s: both team-a pods start. 10s: team-b arrives; its fair share is one of the two GPUs, so reclaim evicts a
    # team-a pod and b-0 starts at once. 60s: a team-a pod ends and the evicted one (its queue now under its fair
    # share) starts over, until 120s. 70s: b-0 ends and b-1 starts (waited 60s), until 130s.
    report = run(TWO_TEAMS, step="10s")
    a, b = report.queues
    assert (a.name, b.name) == ("team-a", "team-b")
    assert sorted(b.waits_s) == [0.0, 60.0]
    assert a.waits_s == (0.0, 0.0)  # the wait is until the first start; the evicted pod started at 0s
    assert report.evictions == 1
    assert report.duration_s == 130
    assert [sample.gpu_percent for sample in report.samples] == [100.0] * 12 + [50.0, 0.0]
    assert report.jain_index == pytest.approx(1.0, abs=0.01)


def test_shares_and_gangs_come_from_kai_annotations() -> None:
    text = """
nodes:
  - name: gpu
    gpus: {count: 1, model: A100-80GB}
pods:
  - name: half
    count: 2
    annotations: {gpu-fraction: "0.5"}
    duration: 10s
  - name: gang
    count: 2
    annotations: {pod-group-name: together}
    requests: {nvidia.com/gpu: 1}
    duration: 10s
"""
    report = run(text, step="5s")
    (queue,) = report.queues
    assert queue.name == names.DEFAULT_QUEUE
    assert queue.pods == 4
    assert queue.started == 2  # the two halves share the device; the gang of two whole GPUs never fits on one
    assert report.samples[0].gpu_percent == 100.0


def test_a_bad_share_annotation_is_refused_with_the_pod_named() -> None:
    text = """
nodes:
  - {name: gpu, gpus: {count: 1, model: A100-80GB}}
pods:
  - {name: bad, annotations: {gpu-fraction: "1.5"}}
"""
    with pytest.raises(ClusterSpecError, match="pod default/bad: gpu-fraction"):
        run(text)


def test_jain_index_is_one_for_equal_ratios_and_one_over_n_for_a_monopoly() -> None:
    assert workloadreport.jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert workloadreport.jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert workloadreport.jain([]) is None

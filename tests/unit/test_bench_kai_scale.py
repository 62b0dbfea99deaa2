"""``quotient bench kai-scale``'s pure parts: KAI's figures and sizes, the objects it creates, timing from what the
watches showed, and the result object."""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from quotient.bench import kai_scale_figures as figures
from quotient.bench import kai_scale_stack as stack
from quotient.bench import kai_scale_world as world


def _pod(
    uid: str, *, namespace: str = "ns", job: str | None = "j", node: str | None = None, group: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": f"pod-{uid}", "namespace": namespace}
    if job is not None:
        meta["ownerReferences"] = [{"kind": "Job", "name": job, "controller": True, "uid": f"job-{job}"}]
    if group is not None:
        meta["annotations"] = {names.POD_GROUP_ANNOTATION: group}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def _group(name: str, *, namespace: str = "ns", reason: str | None = None) -> dict[str, Any]:
    conditions = []
    if reason is not None:
        conditions.append(
            {"type": names.UNSCHEDULABLE_CONDITION, "status": "True", "reason": reason, "message": "no room"}
        )
    return {"metadata": {"name": name, "namespace": namespace}, "status": {"schedulingConditions": conditions}}


def test_the_published_figures_are_kais_run_of_july_2026() -> None:
    published = {figure.key: figure.kai_s for figure in figures.KAI_FIGURES}
    assert published == {
        "fill_4000_s": 397.8,
        "reclaim_one_gpu_s": 13.9,
        "reclaim_4000_s": 694.5,
        "big_job_2000_gpus_s": 102.0,
        "unschedulable_verdict_s": 249.5,
    }
    budgets = {figure.key: figure.budget_s for figure in figures.KAI_FIGURES if figure.budget_s is not None}
    assert budgets == {"fill_4000_s": 20.0, "reclaim_one_gpu_s": 1.0, "unschedulable_verdict_s": 2.0}


def test_every_size_follows_from_the_node_count_as_in_kais_tests() -> None:
    sizes = figures.Sizes.of(500)
    assert (sizes.gpus, sizes.fill_jobs, sizes.big_job_pods, sizes.distributed_pods) == (4000, 4000, 250, 10)
    assert sizes.big_job_pods * figures.GPUS_PER_NODE == 2000
    # 79 GPUs above the quota can be reclaimed: one short of the 80 the distributed job needs.
    assert sizes.gpus - sizes.unschedulable_quota == 79
    assert figures.Sizes.of(16).big_job_pods == 8
    with pytest.raises(ValueError, match="at least 10 nodes"):
        figures.Sizes.of(9)


def test_a_single_gpu_job_is_one_pod_and_a_distributed_job_is_one_gang() -> None:
    single = world.job("a", queue_name=world.FIRST_QUEUE, gpus_per_pod=1)
    assert "parallelism" not in single["spec"] and "annotations" not in single["metadata"]
    template = single["spec"]["template"]
    assert template["metadata"]["labels"] == {names.QUEUE_LABEL: world.FIRST_QUEUE}
    assert template["spec"]["containers"][0]["resources"] == {"limits": {names.GPU_RESOURCE: "1"}}
    assert template["spec"]["schedulerName"] == world.SCHEDULER_NAME
    distributed = world.job("b", queue_name=world.SECOND_QUEUE, gpus_per_pod=8, pods=10)
    assert distributed["spec"]["parallelism"] == distributed["spec"]["completions"] == 10
    assert distributed["metadata"]["annotations"] == {names.BATCH_MIN_MEMBER_ANNOTATION: "10"}
    assert distributed["metadata"]["namespace"] == world.namespace_of(world.SECOND_QUEUE)


def test_a_queue_has_kais_test_defaults_and_its_parent() -> None:
    child = world.queue("child", parent="parent")
    assert child["spec"]["parentQueue"] == "parent"
    assert child["spec"]["resources"]["gpu"] == {"quota": -1, "overQuotaWeight": 1, "limit": -1}
    assert "parentQueue" not in world.queue("top", parent=None)["spec"]


def test_a_pod_keeps_the_time_it_was_first_seen_bound() -> None:
    seen = world.Observations()
    seen.pod("ADDED", _pod("1"), at=1.0)
    assert seen.live["ns"] == 1 and seen.bound["ns"] == 0
    seen.pod("MODIFIED", _pod("1", node="n1"), at=2.5)
    seen.pod("MODIFIED", _pod("1", node="n1"), at=4.0)
    assert seen.bound_times("ns") == [2.5]
    assert seen.bound["ns"] == 1 and seen.bound_in_job["ns", "j"] == 1


def test_a_deleted_or_terminating_pod_no_longer_counts() -> None:
    seen = world.Observations()
    seen.pod("ADDED", _pod("1", node="n1"), at=1.0)
    seen.pod("ADDED", _pod("2", node="n2"), at=1.0)
    terminating = _pod("2", node="n2")
    terminating["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    seen.pod("MODIFIED", terminating, at=2.0)
    seen.pod("DELETED", _pod("1", node="n1"), at=3.0)
    assert seen.live["ns"] == 0 and seen.bound["ns"] == 0 and seen.live_in_job["ns", "j"] == 0
    assert seen.bound_times("ns") == []


def test_a_relist_drops_the_pods_it_does_not_name() -> None:
    seen = world.Observations()
    seen.pod("ADDED", _pod("1", node="n1"), at=1.0)
    seen.pod("ADDED", _pod("2"), at=1.0)
    seen.relisted_pods([_pod("2", node="n2")], at=5.0)
    assert seen.live["ns"] == 1 and seen.bound_times("ns") == [5.0]


def test_the_verdict_is_the_first_time_the_jobs_podgroup_showed_the_condition() -> None:
    seen = world.Observations()
    seen.pod("ADDED", _pod("1", job="big", group="pg-big"), at=1.0)
    seen.podgroup("ADDED", _group("pg-big"), at=1.5)
    assert seen.verdict("ns", "big") is None
    seen.podgroup("MODIFIED", _group("pg-big", reason="GangDoesNotFit"), at=2.0)
    seen.podgroup("MODIFIED", _group("pg-big", reason="OverQuota"), at=3.0)
    verdict = seen.verdict("ns", "big")
    assert verdict is not None and verdict.unschedulable_at == 2.0 and verdict.reason == "OverQuota"
    assert verdict.seen_at == 1.5  # KAI's clock starts at the PodGroup's creation
    assert seen.verdict("ns", "other") is None
    seen.podgroup("DELETED", _group("pg-big"), at=4.0)
    assert seen.verdict("ns", "big") is None


def test_a_span_needs_every_expected_finish() -> None:
    assert figures.span_s(10.0, [11.0, 13.5, 12.0], expected=3) == 3.5
    assert figures.span_s(10.0, [11.0], expected=3) is None
    assert figures.mean([1.0, 2.0]) == 1.5 and figures.mean([]) is None


def test_the_result_puts_kais_figure_beside_each_and_says_where_each_ran() -> None:
    sizes = figures.Sizes.of(500)
    outcomes = {
        "fill_4000_s": figures.Outcome(seconds=12.34567, detail={"jobs": 4000}),
        "reclaim_one_gpu_s": figures.Outcome(seconds=1.5),
        "big_job_2000_gpus_s": figures.Outcome(seconds=None, problem="250 pods bound: not within 600 s"),
    }
    result = figures.result(sizes, outcomes, samples=10)
    assert result["fill_4000_s"] == 12.346 and result["big_job_2000_gpus_s"] is None
    assert result["kai"] == {figure.key: figure.kai_s for figure in figures.KAI_FIGURES}
    scenarios = result["scenarios"]
    assert isinstance(scenarios, dict)
    assert scenarios["fill_4000_s"]["within_budget"] is True and scenarios["fill_4000_s"]["jobs"] == 4000
    assert scenarios["reclaim_one_gpu_s"]["within_budget"] is False
    assert scenarios["big_job_2000_gpus_s"]["problem"] == "250 pods bound: not within 600 s"
    assert scenarios["reclaim_4000_s"]["problem"] == "not run"
    assert result["completed"] is False and result["comparable_to_kai"] is True
    setup = result["setup"]
    assert isinstance(setup, dict) and "real" in setup["kai"] and "emulator" in setup["ours"]


def test_the_schedulers_counters_are_summed_over_their_labels() -> None:
    text = "\n".join(
        [
            "# HELP quotient_binds_total Binds by outcome",
            "# TYPE quotient_binds_total counter",
            'quotient_binds_total{outcome="bound"} 120.0',
            'quotient_binds_total{outcome="conflict"} 3.0',
            "quotient_scheduling_cycles_total 7.0",
            "quotient_scheduling_cycle_duration_seconds_sum 1.25",
            'quotient_scheduling_cycle_duration_seconds_bucket{le="0.5"} 7.0',
            "quotient_binds_created 1.7e9",
        ]
    )
    assert stack.counters(text, stack.METRICS) == {"binds": 123.0, "cycles": 7.0, "cycle_s": 1.25}

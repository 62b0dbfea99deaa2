"""KAI v0.15-v0.18 in the pod grouper's decision: skip-podgrouper, batch-min-member on a Job (on a JobSet:
``test_grouping_jobset.py``), and the preemption delay and staleness grace copied from the workload into its
PodGroup."""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from scheduler.objects import grouping, pods
from scheduler.objects.records import PodRecord

S = 1_000_000_000


def owner(kind: str, name: str, *, api: str, annotations: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "annotations": annotations or {}}
    return {"apiVersion": api, "kind": kind, "metadata": meta, **extra}


def pod(name: str = "p-0", annotations: dict[str, str] | None = None) -> PodRecord:
    record = pods.decode({"metadata": {"name": name, "uid": f"uid-{name}", "annotations": annotations or {}}})
    assert record is not None
    return record


def job(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return owner("Job", "train", api="batch/v1", annotations=annotations, spec={"parallelism": 6})


@pytest.mark.parametrize(("value", "skips"), [("true", True), ("True", False), ("false", False), ("yes", False)])
def test_only_the_exact_value_true_opts_out_of_the_grouper(value: str, skips: bool) -> None:
    annotations = {names.SKIP_PODGROUPER_ANNOTATION: value}

    assert grouping.skips_grouper(pod(annotations=annotations)) is skips
    assert grouping.skips_grouper(job(annotations)) is skips


def test_batch_min_member_makes_a_job_one_gang_of_that_size() -> None:
    decided = grouping.decide(pod(), [job({names.BATCH_MIN_MEMBER_ANNOTATION: "2"})])

    assert decided.group_name == "pg-train-uid-train" and decided.min_member == 2
    assert decided.owner is not None and decided.owner["kind"] == "Job" and decided.warnings == ()


def test_without_the_annotation_a_jobs_pods_keep_a_group_each() -> None:
    decided = grouping.decide(pod(), [job()])

    assert decided.group_name == "pg-p-0-uid-p-0" and decided.min_member == 1


def test_batch_min_member_zero_is_a_group_without_gang_requirement() -> None:
    decided = grouping.decide(pod(), [job({names.BATCH_MIN_MEMBER_ANNOTATION: "0"})])

    assert decided.group_name == "pg-train-uid-train" and decided.min_member == 0


@pytest.mark.parametrize("value", ["two", "-1", "1.5", "99999999999"])
def test_an_unreadable_batch_min_member_is_left_out_with_a_warning(value: str) -> None:
    decided = grouping.decide(pod(), [job({names.BATCH_MIN_MEMBER_ANNOTATION: value})])

    assert decided.group_name == "pg-p-0-uid-p-0" and decided.min_member == 1
    [warning] = decided.warnings
    assert names.BATCH_MIN_MEMBER_ANNOTATION in warning and "Job/train" in warning


def test_the_preemption_delay_and_staleness_grace_come_from_the_nearest_owner_then_the_pod() -> None:
    replica_set = owner("ReplicaSet", "web-1", api="apps/v1", annotations={names.PREEMPTION_DELAY_ANNOTATION: "2m"})
    deployment = owner("Deployment", "web", api="apps/v1", annotations={names.PREEMPTION_DELAY_ANNOTATION: "10m"})
    annotated = pod(annotations={names.PREEMPTION_DELAY_ANNOTATION: "1h", names.STALENESS_GRACE_ANNOTATION: "-1s"})

    decided = grouping.decide(annotated, [replica_set, deployment])

    assert decided.preemption_delay_ns == 120 * S
    assert decided.staleness_grace_ns == -S


def test_a_pod_of_its_own_takes_its_own_annotations() -> None:
    decided = grouping.decide(pod(annotations={names.PREEMPTION_DELAY_ANNOTATION: "90s"}), [])

    assert decided.preemption_delay_ns == 90 * S and decided.staleness_grace_ns is None


@pytest.mark.parametrize(("value", "words"), [("5", "Go duration"), ("-2m", "0 or more")])
def test_a_delay_kai_ignores_is_skipped_for_the_next_source_with_a_warning(value: str, words: str) -> None:
    bad_owner = job({names.PREEMPTION_DELAY_ANNOTATION: value})
    decided = grouping.decide(pod(annotations={names.PREEMPTION_DELAY_ANNOTATION: "30s"}), [bad_owner])

    assert decided.preemption_delay_ns == 30 * S
    [warning] = decided.warnings
    assert f"{value!r} on Job/train" in warning and words in warning


def test_no_annotation_means_no_knob() -> None:
    decided = grouping.decide(pod(), [job()])

    assert decided.preemption_delay_ns is None and decided.staleness_grace_ns is None and decided.warnings == ()

"""A JobSet's PodGroup as KAI v0.16 groups it: one PodGroup, a subgroup per replicated job needing every replica, a
leaf per replica needing its parallelism, the root's ``minSubGroup`` from the startup policy or
``kai.scheduler/batch-min-member``, and each pod's leaf from JobSet's labels. The cases follow KAI's
``jobset_grouper_test.go``; where KAI's grouper fails and leaves the pod pending, Quotient groups it all the same."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from common import names
from scheduler.objects import grouping, pods
from scheduler.objects.records import PodRecord, SubGroupSpec

# A JobSet as KAI's e2e suite writes it (CreateSetWith2ReplicatedJobs), with a second replica of the workers.
JOBSET = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
  namespace: ml
  uid: 5b3c1d2e-0000-4000-8000-000000000001
  labels:
    kai.scheduler/queue: team-a
spec:
  startupPolicy:
    startupPolicyOrder: AnyOrder
  successPolicy:
    operator: All
  failurePolicy:
    maxRestarts: 3
  replicatedJobs:
    - name: driver
      replicas: 1
      template:
        spec:
          parallelism: 1
          completions: 1
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              schedulerName: kai-scheduler
              containers: [{name: driver, image: ubuntu, command: [sh, -c, sleep 60]}]
    - name: workers
      replicas: 2
      template:
        spec:
          parallelism: 4
          completions: 4
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              schedulerName: kai-scheduler
              containers: [{name: worker, image: ubuntu, command: [sh, -c, sleep 60]}]
"""


def jobset(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(JOBSET)
    for path, value in changes.items():
        *parents, key = path.split("__")
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        target[key] = value
    return obj


def pod(replicated_job: str | None = "workers", index: str | None = "1", name: str = "train-workers-1-2") -> PodRecord:
    labels = {}
    if replicated_job is not None:
        labels[names.JOBSET_REPLICATED_JOB_LABEL] = replicated_job
    if index is not None:
        labels[names.JOBSET_JOB_INDEX_LABEL] = index
    record = pods.decode({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels}})
    assert record is not None
    return record


def decide(owner: dict[str, Any], member: PodRecord | None = None) -> grouping.Grouping:
    """The pod's owners as the grouper reads them: the Job JobSet's controller made for its replica, then the JobSet."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train-workers-1", "uid": "uid-j"}, "spec": {}}
    return grouping.decide(member or pod(), [job, owner])


def test_a_jobset_is_one_podgroup_with_a_subgroup_per_replicated_job_and_a_leaf_per_replica() -> None:
    decided = decide(jobset())

    assert decided.group_name == "pg-train-5b3c1d2e-0000-4000-8000-000000000001"
    assert decided.owner is not None and decided.owner["kind"] == "JobSet"
    assert decided.queue == "team-a" and decided.note is None and decided.warnings == ()
    assert decided.min_subgroup == 2, "AnyOrder: every replicated job"
    assert decided.subgroups == (
        SubGroupSpec(name="driver", min_subgroup=1),
        SubGroupSpec(name="driver-replica-0", parent="driver", min_member=1),
        SubGroupSpec(name="workers", min_subgroup=2),
        SubGroupSpec(name="workers-replica-0", parent="workers", min_member=4),
        SubGroupSpec(name="workers-replica-1", parent="workers", min_member=4),
    )
    assert decided.subgroup == "workers-replica-1", "the pod's leaf, from its replicated job and job index"


def test_every_pod_of_the_jobset_gets_the_same_group_and_its_own_leaf() -> None:
    owner = jobset()
    driver = decide(owner, pod("driver", "0", name="train-driver-0-0"))
    worker = decide(owner, pod("workers", "0", name="train-workers-0-3"))

    assert driver.group_name == worker.group_name and driver.subgroups == worker.subgroups
    assert (driver.subgroup, worker.subgroup) == ("driver-replica-0", "workers-replica-0")


@pytest.mark.parametrize(
    ("changes", "root"),
    [
        ({"spec__startupPolicy__startupPolicyOrder": "InOrder"}, 1),
        ({"metadata__annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "1"}}, 1),
        ({"metadata__annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "9"}}, 2),
        ({"metadata__annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "2"},
          "spec__startupPolicy__startupPolicyOrder": "InOrder"}, 2),
    ],
    ids=["in-order-one-at-a-time", "batch-min-member", "batch-min-member-clamped", "batch-min-member-over-in-order"],
)  # fmt: skip
def test_the_roots_min_subgroup_follows_the_startup_policy_and_batch_min_member_wins(
    changes: dict[str, Any], root: int
) -> None:
    decided = decide(jobset(**changes))

    assert decided.min_subgroup == root and decided.warnings == ()


@pytest.mark.parametrize("value", ["not-an-int", "0", "-1", "2.5", " 2"])
def test_a_batch_min_member_kai_refuses_on_the_jobset_is_left_out_with_a_warning(value: str) -> None:
    decided = decide(jobset(metadata__annotations={names.BATCH_MIN_MEMBER_ANNOTATION: value}))

    assert decided.min_subgroup == 2 and decided.subgroup == "workers-replica-1"
    [warning] = decided.warnings
    assert names.BATCH_MIN_MEMBER_ANNOTATION in warning and "JobSet train" in warning and ">= 1" in warning


def test_a_replicated_jobs_template_annotation_sets_its_leaves_minimum_even_above_the_parallelism() -> None:
    owner = jobset()
    owner["spec"]["replicatedJobs"][1]["template"]["metadata"] = {
        "annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "2"}
    }
    owner["spec"]["replicatedJobs"][0]["template"]["metadata"] = {
        "annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "3"}
    }

    decided = decide(owner)

    leaves = {sub.name: sub.min_member for sub in decided.subgroups if sub.parent is not None}
    assert leaves == {"driver-replica-0": 3, "workers-replica-0": 2, "workers-replica-1": 2}


def test_an_unreadable_template_annotation_leaves_the_parallelism_with_a_warning() -> None:
    owner = jobset()
    owner["spec"]["replicatedJobs"][1]["template"]["metadata"] = {
        "annotations": {names.BATCH_MIN_MEMBER_ANNOTATION: "0"}
    }

    decided = decide(owner)

    assert {sub.min_member for sub in decided.subgroups if sub.parent == "workers"} == {4}
    [warning] = decided.warnings
    assert "replicatedJob workers" in warning and "parallelism (4)" in warning


def test_replicas_and_parallelism_default_to_one_and_a_replicated_job_of_no_replicas_gets_no_subgroup() -> None:
    owner = jobset()
    del owner["spec"]["replicatedJobs"][0]["replicas"]
    del owner["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
    owner["spec"]["replicatedJobs"].append({"name": "spare", "replicas": 0, "template": {}})

    decided = decide(owner)

    assert decided.subgroups[:2] == (
        SubGroupSpec(name="driver", min_subgroup=1),
        SubGroupSpec(name="driver-replica-0", parent="driver", min_member=1),
    )
    assert "spare" not in {sub.name for sub in decided.subgroups}
    assert decided.min_subgroup == 2, "the replicated job of no replicas is not counted"


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (pod(replicated_job=None), "lacks JobSet's labels"),
        (pod(index=None), "lacks JobSet's labels"),
        (pod(index="7"), "workers-replica-7 is not one of JobSet train's"),
    ],
    ids=["no-replicated-job-label", "no-job-index-label", "replica-not-in-spec"],
)
def test_a_pod_kai_cannot_route_to_a_leaf_gets_a_group_of_its_own_with_the_reason(
    member: PodRecord, words: str
) -> None:
    decided = decide(jobset(), member)

    assert decided.group_name == f"pg-{member.name}-{member.uid}" and decided.subgroups == ()
    assert decided.min_member == 1 and decided.queue == "team-a", "still the JobSet's queue"
    assert decided.note is not None and words in decided.note


def test_a_jobset_without_replicated_jobs_gives_its_pod_a_group_of_its_own() -> None:
    decided = decide(jobset(spec={"replicatedJobs": []}))

    assert decided.subgroups == () and decided.note is not None and "has no replicatedJobs" in decided.note

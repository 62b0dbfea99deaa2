from __future__ import annotations

from typing import Any

import pytest

from scheduler.objects import grouping, podgroups, pods
from scheduler.objects.grouping import OwnerProblem
from scheduler.objects.records import PodRecord


def obj(kind: str, name: str, *, api: str = "v1", labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}, "annotations": {}},
        **extra,
    }


def pod_json(name: str = "p", **kw: Any) -> dict[str, Any]:
    return obj("Pod", name, **kw)


def pod(name: str = "p", **kw: Any) -> PodRecord:
    record = pods.decode(pod_json(name, **kw))
    assert record is not None
    return record


def test_an_ownerless_pod_gets_its_own_group_of_one_in_the_default_queue() -> None:
    result = grouping.decide(pod("train"), [])
    assert result.group_name == "pg-train-uid-train"
    assert result.min_member == 1 and result.queue == "default-queue" and result.owner is None and result.note is None


def test_the_queue_label_of_the_owner_wins_over_the_pod() -> None:
    job = obj("Job", "j", api="batch/v1", labels={"kai.scheduler/queue": "team-a"})
    result = grouping.decide(pod(labels={"kai.scheduler/queue": "team-b"}), [job])
    assert result.queue == "team-a"


@pytest.mark.parametrize(
    ("kind", "api", "per_pod", "default_class"),
    [
        ("Job", "batch/v1", True, "train"),
        ("Deployment", "apps/v1", True, "inference"),
        ("StatefulSet", "apps/v1", False, "train"),
        ("ReplicaSet", "apps/v1", False, "train"),
    ],
)
def test_core_workload_kinds_group_as_kai_does(kind: str, api: str, per_pod: bool, default_class: str) -> None:
    result = grouping.decide(pod("w-1"), [obj(kind, "w", api=api)])
    assert result.min_member == 1 and result.priority_class == default_class
    assert result.group_name == ("pg-w-1-uid-w-1" if per_pod else "pg-w-uid-w")


def test_a_deployment_above_its_replicaset_decides() -> None:
    rs = obj("ReplicaSet", "web-abc", api="apps/v1")
    deploy = obj("Deployment", "web", api="apps/v1")
    result = grouping.decide(pod("web-abc-1"), [rs, deploy])
    assert result.group_name == "pg-web-abc-1-uid-web-abc-1" and result.priority_class == "inference"


def test_a_pytorchjob_is_one_gang_of_all_its_replicas_or_its_min_available() -> None:
    spec = {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}}
    job = obj("PyTorchJob", "pt", api="kubeflow.org/v1", spec=spec)
    assert grouping.decide(pod("pt-worker-0"), [job]).min_member == 4
    job["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2}}
    assert grouping.decide(pod("pt-worker-0"), [job]).min_member == 2


def test_ray_and_leaderworkerset_gangs() -> None:
    ray = obj("RayCluster", "r", api="ray.io/v1", spec={"workerGroupSpecs": [{"minReplicas": 2}, {"minReplicas": 1}]})
    assert grouping.decide(pod(), [ray]).min_member == 4
    lws = obj("LeaderWorkerSet", "l", api="leaderworkerset.x-k8s.io/v1", spec={"leaderWorkerTemplate": {"size": 4}})
    first = grouping.decide(pod(labels={"leaderworkerset.sigs.k8s.io/group-index": "0"}), [lws])
    second = grouping.decide(pod(labels={"leaderworkerset.sigs.k8s.io/group-index": "1"}), [lws])
    assert first.min_member == 4 and first.group_name != second.group_name


@pytest.mark.parametrize("problem", ["forbidden", "missing"])
def test_an_unreadable_or_missing_owner_never_leaves_the_pod_pending(problem: str) -> None:
    result = grouping.decide(pod("x"), OwnerProblem(kind="Job", name="j", problem=problem, message="status 403"))
    assert result.group_name == "pg-x-uid-x" and result.note is not None and problem in result.note


def test_a_vcluster_service_owner_gives_each_pod_its_own_group_not_one_for_the_tenant() -> None:
    service = obj("Service", "my-vcluster")
    first = grouping.decide(pod("a"), [service])
    second = grouping.decide(pod("b"), [service])
    assert first.group_name != second.group_name
    assert first.note is not None and "Service/my-vcluster" in first.note


def test_vcluster_synced_pods_of_one_tenant_statefulset_share_a_group() -> None:
    def synced(name: str) -> PodRecord:
        p = pod_json(name, labels={"vcluster.loft.sh/managed-by": "tenant-1"})
        p["metadata"]["annotations"] = {
            "vcluster.loft.sh/owner-set-kind": "StatefulSet",
            "vcluster.loft.sh/owner-set-name": "db",
            "vcluster.loft.sh/namespace": "prod",
        }
        record = pods.decode(p)
        assert record is not None
        return record

    service = obj("Service", "tenant-1")
    assert grouping.decide(synced("db-0-x"), [service]).group_name == grouping.decide(synced("db-1-x"), []).group_name


def test_priority_and_preemptibility_follow_kai() -> None:
    build = grouping.decide(pod(labels={"priorityClassName": "build"}), [])
    assert podgroups.priority_value(build.priority_class, {}) == 100
    assert not podgroups.is_preemptible(_preemptibility(build), 100)
    labelled = grouping.decide(
        pod(labels={"priorityClassName": "build", "kai.scheduler/preemptibility": "preemptible"}), []
    )
    assert podgroups.is_preemptible(_preemptibility(labelled), 100)
    assert podgroups.priority_value("custom", {"custom": 7}) == 7


def _preemptibility(decision: grouping.Grouping) -> str | None:
    """What the grouper writes into the PodGroup's ``spec.preemptibility``."""
    if decision.preemptible is None:
        return None
    return "preemptible" if decision.preemptible else "non-preemptible"


def test_group_names_stay_valid_object_names() -> None:
    name = grouping.group_name("A" * 400, "UID_with_Caps")
    assert len(name) <= 253 and name == name.lower() and "_" not in name

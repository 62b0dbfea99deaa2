"""The grouper with KAI v0.15-v0.18's knobs, over MemoryKube: a pod or workload that opts out with
``kai.scheduler/skip-podgrouper`` gets no PodGroup and no annotation; a workload's preemption delay and staleness
grace go into the spec of the PodGroup made for it; a Job with ``kai.scheduler/batch-min-member`` is one gang; a
JobSet is one PodGroup with KAI v0.16's two-level tree, each pod labelled with its leaf."""

from __future__ import annotations

from typing import Any

from common import names
from scheduler.kube import events, grouper, kubeapi
from scheduler.objects import podgroups, pods
from scheduler.objects.records import PodRecord
from tests.unit.kube.fakes import MemoryKube

NAMESPACE = "ml"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, ref: events.ObjectRef, *, type: events.EventType, reason: str, message: str) -> None:
        self.events.append((ref.name, reason, message))


async def stored_pod(
    kube: MemoryKube,
    name: str,
    *,
    annotations: dict[str, str],
    owners: tuple[dict[str, Any], ...] = (),
    labels: dict[str, str] | None = None,
) -> PodRecord:
    metadata = {"name": name, "namespace": NAMESPACE, "annotations": annotations, "ownerReferences": list(owners)}
    body = {
        "metadata": {**metadata, "labels": labels or {}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "ubuntu"}]},
    }
    record = pods.decode(await kube.create(kubeapi.PODS, body, namespace=NAMESPACE))
    assert record is not None
    return record


async def stored_job(kube: MemoryKube, annotations: dict[str, str]) -> dict[str, Any]:
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "annotations": annotations}}
    return await kube.create(kubeapi.JOBS, body, namespace=NAMESPACE)


def reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": True}


async def group(kube: MemoryKube, pod: PodRecord, recorder: Recorder) -> None:
    grouping = grouper.Grouper(kube, recorder=recorder, annotate_after_s=0.0)
    grouping.submit(pod)
    await grouping.drain()


async def test_a_pod_that_opts_out_gets_no_podgroup_and_keeps_the_one_it_names() -> None:
    kube, recorder = MemoryKube(), Recorder()
    pod = await stored_pod(
        kube, "p", annotations={names.SKIP_PODGROUPER_ANNOTATION: "true", names.POD_GROUP_ANNOTATION: "mine"}
    )

    await group(kube, pod, recorder)

    assert kube.of(kubeapi.POD_GROUPS) == []
    assert kube.of(kubeapi.PODS)[0]["metadata"]["annotations"][names.POD_GROUP_ANNOTATION] == "mine"
    assert recorder.events == []


async def test_a_job_that_opts_out_leaves_its_pods_to_the_users_podgroup_and_one_naming_none_is_told() -> None:
    kube, recorder = MemoryKube(), Recorder()
    job = await stored_job(kube, {names.SKIP_PODGROUPER_ANNOTATION: "true"})
    pod = await stored_pod(kube, "train-0", annotations={}, owners=(reference(job),))

    await group(kube, pod, recorder)

    assert kube.of(kubeapi.POD_GROUPS) == []
    assert names.POD_GROUP_ANNOTATION not in kube.of(kubeapi.PODS)[0]["metadata"]["annotations"]
    [(name, reason, message)] = recorder.events
    assert (name, reason) == ("train-0", "NoPodGroup") and "Job/train" in message


async def test_the_workloads_delay_and_grace_go_into_the_spec_of_its_podgroup_as_go_durations() -> None:
    kube, recorder = MemoryKube(), Recorder()
    pod = await stored_pod(
        kube,
        "p",
        annotations={names.PREEMPTION_DELAY_ANNOTATION: "120s", names.STALENESS_GRACE_ANNOTATION: "-1m"},
    )

    await group(kube, pod, recorder)

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    assert podgroup["spec"]["preemptionDelay"] == "2m0s"
    assert podgroup["spec"]["stalenessGracePeriod"] == "-1m0s"


async def test_a_job_with_batch_min_member_is_one_gang_owned_by_the_job_and_a_bad_delay_is_an_event() -> None:
    kube, recorder = MemoryKube(), Recorder()
    job = await stored_job(kube, {names.BATCH_MIN_MEMBER_ANNOTATION: "2", names.PREEMPTION_DELAY_ANNOTATION: "5"})
    pod = await stored_pod(kube, "train-0", annotations={}, owners=(reference(job),))

    await group(kube, pod, recorder)

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    assert podgroup["metadata"]["name"] == f"pg-train-{job['metadata']['uid']}"
    assert podgroup["spec"]["minMember"] == 2 and "preemptionDelay" not in podgroup["spec"]
    assert podgroup["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert [reason for _, reason, _ in recorder.events] == ["IgnoredAnnotation"]


async def stored_jobset(kube: MemoryKube, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A JobSet of a driver and two replicas of two workers."""

    def replicated(name: str, replicas: int, parallelism: int) -> dict[str, Any]:
        pod_spec = {"schedulerName": "kai-scheduler", "containers": [{"name": name, "image": "ubuntu"}]}
        return {
            "name": name,
            "replicas": replicas,
            "template": {"spec": {"parallelism": parallelism, "template": {"spec": pod_spec}}},
        }

    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "annotations": annotations or {}},
        "spec": {"replicatedJobs": [replicated("driver", 1, 1), replicated("workers", 2, 2)]},
    }
    return await kube.create(kubeapi.JOB_SETS, body, namespace=NAMESPACE)


async def jobset_pod(kube: MemoryKube, jobset: dict[str, Any], name: str, *, replica: str = "1") -> PodRecord:
    """A worker pod of replica ``replica`` as JobSet's controller makes it: owned by its Job, labelled."""
    meta = jobset["metadata"]
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": meta["name"], "uid": meta["uid"]}
    job = await kube.create(
        kubeapi.JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"llm-workers-{replica}", "ownerReferences": [{**owner, "controller": True}]},
        },
        namespace=NAMESPACE,
    )
    labels = {names.JOBSET_REPLICATED_JOB_LABEL: "workers", names.JOBSET_JOB_INDEX_LABEL: replica}
    return await stored_pod(kube, name, annotations={}, owners=(reference(job),), labels=labels)


async def test_a_jobsets_podgroup_carries_kais_tree_and_its_pod_gets_its_leaf_and_group_in_one_patch() -> None:
    kube, recorder = MemoryKube(), Recorder()
    jobset = await stored_jobset(kube, annotations={names.BATCH_MIN_MEMBER_ANNOTATION: "1"})
    pod = await jobset_pod(kube, jobset, "llm-workers-1-0")
    kube.calls.clear()

    await group(kube, pod, recorder)

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    assert podgroup["metadata"]["name"] == f"pg-llm-{jobset['metadata']['uid']}"
    assert podgroup["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    spec = podgroup["spec"]
    assert "minMember" not in spec and spec["minSubGroup"] == 1, "batch-min-member: the root's minSubGroup"
    assert spec["subGroups"] == [
        {"name": "driver", "minSubGroup": 1},
        {"name": "driver-replica-0", "parent": "driver", "minMember": 1},
        {"name": "workers", "minSubGroup": 2},
        {"name": "workers-replica-0", "parent": "workers", "minMember": 2},
        {"name": "workers-replica-1", "parent": "workers", "minMember": 2},
    ]
    assert podgroups.findings(podgroup) == (), "KAI's tree passes KAI's PodGroup rules"
    [stored] = [p for p in kube.of(kubeapi.PODS) if p["metadata"]["name"] == "llm-workers-1-0"]
    assert stored["metadata"]["labels"][names.SUBGROUP_LABEL] == "workers-replica-1"
    assert stored["metadata"]["annotations"][names.POD_GROUP_ANNOTATION] == podgroup["metadata"]["name"]
    assert [call for call in kube.calls if call[0] == "patch"] == [("patch", "llm-workers-1-0")], "one write"
    assert recorder.events == []


async def test_a_jobset_whose_flat_podgroup_exists_keeps_it_and_its_new_pod_is_labelled_all_the_same() -> None:
    kube, recorder = MemoryKube(), Recorder()
    jobset = await stored_jobset(kube)
    flat: dict[str, Any] = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": f"pg-llm-{jobset['metadata']['uid']}"},
        "spec": {"minMember": 5, "queue": "default-queue"},
    }
    await kube.create(kubeapi.POD_GROUPS, flat, namespace=NAMESPACE)
    pod = await jobset_pod(kube, jobset, "llm-workers-0-1", replica="0")

    await group(kube, pod, recorder)

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    assert podgroup["spec"] == flat["spec"], "an existing PodGroup is never rewritten"
    [stored] = [p for p in kube.of(kubeapi.PODS) if p["metadata"]["name"] == "llm-workers-0-1"]
    assert stored["metadata"]["labels"][names.SUBGROUP_LABEL] == "workers-replica-0"
    assert stored["metadata"]["annotations"][names.POD_GROUP_ANNOTATION] == flat["metadata"]["name"]


async def test_a_jobset_pod_without_jobsets_labels_gets_a_group_of_its_own_and_an_event_says_why() -> None:
    kube, recorder = MemoryKube(), Recorder()
    jobset = await stored_jobset(kube)
    meta = jobset["metadata"]
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": meta["name"], "uid": meta["uid"]}
    pod = await stored_pod(kube, "stray", annotations={}, owners=({**owner, "controller": True},))

    await group(kube, pod, recorder)

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    assert podgroup["spec"]["minMember"] == 1 and "subGroups" not in podgroup["spec"]
    assert podgroup["metadata"]["ownerReferences"][0]["kind"] == "Pod"
    [(name, reason, message)] = recorder.events
    assert (name, reason) == ("stray", "OwnGroup") and names.JOBSET_JOB_INDEX_LABEL in message

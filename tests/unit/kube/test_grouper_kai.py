"""The grouper with KAI v0.15-v0.18's knobs, over MemoryKube: a pod or workload that opts out with
``kai.scheduler/skip-podgrouper`` gets no PodGroup and no annotation; a workload's preemption delay and staleness
grace go into the spec of the PodGroup made for it; a Job with ``kai.scheduler/batch-min-member`` is one gang."""

from __future__ import annotations

from typing import Any

from common import names
from scheduler.kube import events, grouper, kubeapi
from scheduler.objects import pods
from scheduler.objects.records import PodRecord
from tests.unit.kube.fakes import MemoryKube

NAMESPACE = "ml"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, ref: events.ObjectRef, *, type: events.EventType, reason: str, message: str) -> None:
        self.events.append((ref.name, reason, message))


async def stored_pod(
    kube: MemoryKube, name: str, *, annotations: dict[str, str], owners: tuple[dict[str, Any], ...] = ()
) -> PodRecord:
    body = {
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations, "ownerReferences": list(owners)},
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

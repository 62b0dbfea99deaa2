"""The grouper when the API refuses a PodGroup: it says so on the pod and tries again until the pod has its group
(found by the chaos run: a 500 on the PodGroup's create left a pod ungrouped and unexplained for good)."""

from __future__ import annotations

from collections import deque

from common import names
from scheduler.kube import grouper, kubeapi
from scheduler.kube.errors import KubeError
from tests.unit.kube.fakes import MemoryKube
from tests.unit.kube.test_grouper_kai import Recorder, stored_pod


async def test_a_refused_podgroup_is_said_on_the_pod_and_made_at_a_later_attempt() -> None:
    kube, recorder = MemoryKube(), Recorder()
    pod = await stored_pod(kube, "train", annotations={})
    kube.fail["create"] = deque(
        [KubeError("500 InternalError: etcd is unhappy"), KubeError("500 InternalError: etcd is unhappy")]
    )
    grouping = grouper.Grouper(kube, recorder=recorder, annotate_after_s=0.0, still_present=lambda uid: True)

    grouping.submit(pod)
    await grouping.drain()

    [podgroup] = kube.of(kubeapi.POD_GROUPS)
    annotations = kube.of(kubeapi.PODS)[0]["metadata"]["annotations"]
    assert annotations[names.POD_GROUP_ANNOTATION] == podgroup["metadata"]["name"]
    [(name, reason, message)] = recorder.events
    assert (name, reason) == ("train", "GroupingFailed") and "etcd is unhappy" in message, "said once, not per try"


async def test_a_pod_deleted_while_its_group_is_refused_is_let_go() -> None:
    kube, recorder = MemoryKube(), Recorder()
    pod = await stored_pod(kube, "gone", annotations={})
    kube.fail["create"] = deque([KubeError("500 InternalError: etcd is unhappy")])
    grouping = grouper.Grouper(kube, recorder=recorder, annotate_after_s=0.0, still_present=lambda uid: False)

    grouping.submit(pod)
    await grouping.drain()

    assert kube.of(kubeapi.POD_GROUPS) == [] and recorder.events[0][1] == "GroupingFailed"

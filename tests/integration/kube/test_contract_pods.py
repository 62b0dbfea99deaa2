"""The KubeApi contract for what only pods do: binding (``pods/binding``), eviction, and graceful deletion of a pod
on a node, against ``MemoryKube`` and against ``KubeClient`` over the emulator (``conftest.kube``).

The emulator answers a binding with a 201 ``Status``, as the API server does, so the binding tests also prove
``KubeClient`` immune to the official client's parsing bug (KUBE-API-NOTES.md).
"""

from __future__ import annotations

import pytest

from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeInvalid
from scheduler.kube.kubeapi import BindOutcome, EvictOutcome, WatchType
from tests import polling
from tests.integration.kube.conftest import NODE, Backend, changes, pod, version

pytestmark = pytest.mark.integration


async def gone(kube: Backend, name: str) -> None:
    """Until the pod is removed (the emulator's pod garbage collector finishes a graceful deletion on its loop)."""

    async def absent() -> bool:
        return await kube.api.get(kubeapi.PODS, name=name, namespace="ml") is None

    await polling.until(absent, timeout_s=5, what=f"pod ml/{name} removed")


# --- binding ---


async def test_a_binding_sets_the_node_the_annotations_and_the_scheduled_condition(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p", annotations={"kept": "1"}), namespace="ml")

    result = await kube.api.bind_pod(
        namespace="ml", name="p", node=NODE, uid=created["metadata"]["uid"], annotations={"quotient.dev/gpu": "0"}
    )

    assert result == kubeapi.BindResult(outcome=BindOutcome.BOUND)
    bound = await kube.api.get(kubeapi.PODS, name="p", namespace="ml")
    assert bound is not None
    assert bound["spec"]["nodeName"] == NODE
    assert bound["metadata"]["annotations"] == {"kept": "1", "quotient.dev/gpu": "0"}
    [scheduled] = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "True"
    assert version(bound) > version(created)


async def test_a_second_binding_answers_already_assigned_with_the_node(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    uid = created["metadata"]["uid"]
    await kube.api.bind_pod(namespace="ml", name="p", node=NODE, uid=uid)

    again = await kube.api.bind_pod(namespace="ml", name="p", node="node-b", uid=uid)

    assert again == kubeapi.BindResult(
        outcome=BindOutcome.ALREADY_ASSIGNED,
        node=NODE,
        message=f'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "{NODE}"',
    )
    bound = await kube.api.get(kubeapi.PODS, name="p", namespace="ml")
    assert bound is not None and bound["spec"]["nodeName"] == NODE


async def test_binding_a_namesake_with_another_uid_is_refused_without_a_node(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    result = await kube.api.bind_pod(namespace="ml", name="p", node=NODE, uid="the-old-pods-uid")

    assert (result.outcome, result.node) == (BindOutcome.ALREADY_ASSIGNED, None)
    assert result.message == (
        'Operation cannot be fulfilled on pods/binding "p": Precondition failed: UID in precondition: '
        f"the-old-pods-uid, UID in object meta: {created['metadata']['uid']}"
    )
    assert await kube.api.get(kubeapi.PODS, name="p", namespace="ml") == created


async def test_binding_a_gated_pod_is_refused(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("p", schedulingGates=[{"name": "wait"}]), namespace="ml")

    result = await kube.api.bind_pod(namespace="ml", name="p", node=NODE)

    assert (result.outcome, result.node) == (BindOutcome.ALREADY_ASSIGNED, None)
    assert result.message.endswith("pod p has non-empty .spec.schedulingGates")


async def test_binding_a_missing_pod_answers_pod_gone(kube: Backend) -> None:
    result = await kube.api.bind_pod(namespace="ml", name="nobody", node=NODE)

    assert result == kubeapi.BindResult(outcome=BindOutcome.POD_GONE, message='pods "nobody" not found')


async def test_a_binding_without_a_node_is_invalid(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    with pytest.raises(KubeInvalid) as raised:
        await kube.api.bind_pod(namespace="ml", name="p", node="")

    assert (raised.value.status, raised.value.reason) == (422, "Invalid")
    assert raised.value.message == 'Binding "p" is invalid: target.name: Required value'


# --- graceful deletion and eviction ---


async def test_a_pod_on_a_node_is_marked_for_deletion_and_then_removed(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    await kube.api.bind_pod(namespace="ml", name="p", node=NODE)
    listed = await kube.api.list(kubeapi.PODS, namespace="ml")
    stream = kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, namespace="ml", timeout_s=10)

    deleted = await kube.api.delete(kubeapi.PODS, name="p", namespace="ml", grace_period_s=5)
    seen = await changes(stream, 2)
    await gone(kube, "p")

    assert deleted is not None
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 5
    assert deleted["metadata"]["deletionTimestamp"] > created["metadata"]["creationTimestamp"]
    assert [(e.type, e.object["metadata"].get("deletionGracePeriodSeconds")) for e in seen] == [
        (WatchType.MODIFIED, 5),
        (WatchType.DELETED, 5),
    ]
    assert version(seen[1].object) > version(seen[0].object) == version(deleted)


async def test_an_eviction_records_a_disruption_target_then_deletes_the_pod(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("victim"), namespace="ml")
    uid = created["metadata"]["uid"]
    await kube.api.bind_pod(namespace="ml", name="victim", node=NODE, uid=uid)
    listed = await kube.api.list(kubeapi.PODS, namespace="ml")
    stream = kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, namespace="ml", timeout_s=10)

    result = await kube.api.evict_pod(
        namespace="ml", name="victim", uid=uid, reason="PreemptionByScheduler", message="quotient: reclaimed"
    )
    seen = await changes(stream, 3)
    await gone(kube, "victim")
    again = await kube.api.evict_pod(namespace="ml", name="victim", uid=uid, reason="r", message="m")

    assert result == kubeapi.EvictResult(outcome=EvictOutcome.EVICTED, condition_written=True)
    assert [e.type for e in seen] == [WatchType.MODIFIED, WatchType.MODIFIED, WatchType.DELETED]
    conditions = {c["type"]: c for c in seen[0].object["status"]["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True", "the strategic patch kept the other conditions"
    target = conditions["DisruptionTarget"]
    assert (target["status"], target["reason"], target["message"]) == (
        "True",
        "PreemptionByScheduler",
        "quotient: reclaimed",
    )
    assert "deletionTimestamp" in seen[1].object["metadata"]
    assert again == kubeapi.EvictResult(outcome=EvictOutcome.POD_GONE, condition_written=False)


async def test_evicting_a_namesake_deletes_nothing(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    result = await kube.api.evict_pod(namespace="ml", name="p", uid="an-older-pod", reason="r", message="m")

    assert result.outcome is EvictOutcome.POD_GONE
    assert await kube.api.get(kubeapi.PODS, name="p", namespace="ml") is not None

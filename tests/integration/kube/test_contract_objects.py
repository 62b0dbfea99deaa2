"""The KubeApi contract for objects: create, get, list, resolve, replace, patch and delete, with their answers and
their errors as ``scheduler.kube.errors`` classes (status, reason and the API server's message), against
``MemoryKube`` and against ``KubeClient`` over the emulator (``conftest.kube``)."""

from __future__ import annotations

import pytest

from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeInvalid, KubeNotFound
from tests.integration.kube.conftest import NODE, Backend, pod, queue, version

pytestmark = pytest.mark.integration

STALE = (
    'Operation cannot be fulfilled on pods "p": the object has been modified; please apply your changes to the '
    "latest version and try again"
)


# --- create and get ---


async def test_create_answers_the_stored_object_with_its_identity_and_a_new_version(kube: Backend) -> None:
    before = await kube.api.list(kubeapi.PODS)
    sent = pod("p", labels={"app": "a"})
    sent["metadata"].update(uid="mine", resourceVersion="77")
    sent["status"] = {"phase": "Running"}

    created = await kube.api.create(kubeapi.PODS, sent, namespace="ml")

    meta = created["metadata"]
    assert (created["apiVersion"], created["kind"]) == ("v1", "Pod")
    assert (meta["name"], meta["namespace"], meta["labels"], meta["generation"]) == ("p", "ml", {"app": "a"}, 1)
    assert meta["uid"] not in ("", "mine"), "the server gives the uid"
    assert version(created) > int(before.resource_version), "a new version, not the one sent"
    assert meta["creationTimestamp"].endswith("Z")
    assert created.get("status", {}).get("phase") != "Running", "a create cannot set a pod's status"
    assert created["spec"]["containers"][0]["image"] == "ubuntu"
    assert await kube.api.get(kubeapi.PODS, name="p", namespace="ml") == created


async def test_a_second_create_of_a_name_raises_already_exists(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    with pytest.raises(KubeAlreadyExists) as raised:
        await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    assert (raised.value.status, raised.value.reason, raised.value.message) == (
        409,
        "AlreadyExists",
        'pods "p" already exists',
    )


async def test_a_create_in_a_missing_namespace_raises_not_found(kube: Backend) -> None:
    with pytest.raises(KubeNotFound) as raised:
        await kube.api.create(kubeapi.PODS, pod("p"), namespace="nowhere")

    assert (raised.value.status, raised.value.message) == (404, 'namespaces "nowhere" not found')


async def test_a_body_naming_another_namespace_than_the_request_is_a_bad_request(kube: Backend) -> None:
    body = pod("p")
    body["metadata"]["namespace"] = "default"

    with pytest.raises(KubeInvalid) as raised:
        await kube.api.create(kubeapi.PODS, body, namespace="ml")

    assert (raised.value.status, raised.value.reason) == (400, "BadRequest")


async def test_a_generated_name_is_the_prefix_and_five_characters(kube: Backend) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}

    created = await kube.api.create(kubeapi.PODS, body, namespace="ml")

    name = created["metadata"]["name"]
    assert name.startswith("worker-") and len(name) == len("worker-") + 5
    assert await kube.api.get(kubeapi.PODS, name=name, namespace="ml") is not None


async def test_cluster_scoped_objects_have_no_namespace_and_a_missing_object_reads_as_none(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.QUEUES, queue("research"))

    assert "namespace" not in created["metadata"]
    assert await kube.api.get(kubeapi.QUEUES, name="research") == created
    assert await kube.api.get(kubeapi.QUEUES, name="nobody") is None
    assert await kube.api.get(kubeapi.PODS, name="nobody", namespace="ml") is None


# --- list ---


async def test_a_list_answers_every_object_in_key_order_with_the_version_to_watch_from(kube: Backend) -> None:
    for namespace, name in [("ml", "b"), ("default", "z"), ("ml", "a")]:
        last = await kube.api.create(kubeapi.PODS, pod(name), namespace=namespace)

    everywhere = await kube.api.list(kubeapi.PODS)
    in_ml = await kube.api.list(kubeapi.PODS, namespace="ml")

    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in everywhere.items] == [
        ("default", "z"),
        ("ml", "a"),
        ("ml", "b"),
    ]
    assert everywhere.resource_version == last["metadata"]["resourceVersion"]
    assert all((p["apiVersion"], p["kind"]) == ("v1", "Pod") for p in everywhere.items), "a list's items get a kind"
    assert [p["metadata"]["name"] for p in in_ml.items] == ["a", "b"]


async def test_label_and_field_selectors_pick_what_the_scheduler_asks_for(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("ours", labels={"app": "a"}), namespace="ml")
    await kube.api.create(kubeapi.PODS, pod("kai", labels={"app": "b"}, scheduler="kai-scheduler"), namespace="ml")
    await kube.api.create(kubeapi.PODS, pod("theirs", scheduler="default-scheduler"), namespace="ml")
    bound = await kube.api.create(kubeapi.PODS, pod("ours-bound", labels={"app": "a"}), namespace="ml")
    await kube.api.bind_pod(namespace="ml", name="ours-bound", node=NODE, uid=bound["metadata"]["uid"])

    async def names(*, labels: str | None = None, fields: str | None = None) -> list[str]:
        listed = await kube.api.list(kubeapi.PODS, namespace="ml", label_selector=labels, field_selector=fields)
        return [p["metadata"]["name"] for p in listed.items]

    assert await names(fields="spec.schedulerName=quotient,spec.nodeName=") == ["ours"]
    assert await names(fields=f"spec.nodeName={NODE}") == ["ours-bound"]
    assert await names(fields="spec.schedulerName!=quotient") == ["kai", "theirs"]
    assert await names(fields="metadata.name=kai") == ["kai"]
    assert await names(fields="status.phase!=Succeeded") == ["kai", "ours", "ours-bound", "theirs"]
    assert await names(labels="app=a") == ["ours", "ours-bound"]
    assert await names(labels="app!=a") == ["kai", "theirs"]
    assert await names(labels="app in (a,b),app notin (a)") == ["kai"]
    assert await names(labels="!app") == ["theirs"]


async def test_a_malformed_selector_or_an_unsupported_field_is_a_bad_request(kube: Backend) -> None:
    with pytest.raises(KubeInvalid) as label:
        await kube.api.list(kubeapi.PODS, label_selector="app in a")
    with pytest.raises(KubeInvalid) as field:
        await kube.api.list(kubeapi.PODS, field_selector="spec.priority=1")

    assert (label.value.status, field.value.status) == (400, 400)
    assert field.value.message == "field label not supported: spec.priority"


# --- resolve ---


async def test_the_known_kinds_resolve_to_the_table_and_others_through_discovery(kube: Backend) -> None:
    widgets = kubeapi.Resource(group="example.com", version="v1", plural="widgets", kind="Widget", namespaced=True)
    await kube.define(widgets)

    assert await kube.api.resolve(api_version="apps/v1", kind="Deployment") is kubeapi.DEPLOYMENTS
    assert await kube.api.resolve(api_version="scheduling.run.ai/v2", kind="Queue") is kubeapi.QUEUES
    assert await kube.api.resolve(api_version="example.com/v1", kind="Widget") == widgets
    assert await kube.api.resolve(api_version="nowhere.io/v1", kind="Thing") is None


# --- replace ---


async def test_a_replace_with_the_current_version_writes_and_bumps_version_and_generation(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    changed = {**created, "spec": {**created["spec"], "activeDeadlineSeconds": 60}}
    changed["status"] = {"phase": "Failed"}

    replaced = await kube.api.replace(kubeapi.PODS, changed, name="p", namespace="ml")

    assert replaced["spec"]["activeDeadlineSeconds"] == 60
    assert version(replaced) > version(created)
    assert replaced["metadata"]["generation"] == 2
    assert (replaced["metadata"]["uid"], replaced["metadata"]["creationTimestamp"]) == (
        created["metadata"]["uid"],
        created["metadata"]["creationTimestamp"],
    )
    assert replaced.get("status") == created.get("status"), "a pod's status is written through /status only"


async def test_a_replace_that_changes_nothing_keeps_the_version(kube: Backend) -> None:
    created = await kube.api.create(
        kubeapi.CONFIG_MAPS, {"metadata": {"name": "c"}, "data": {"a": "1"}}, namespace="ml"
    )

    again = await kube.api.replace(kubeapi.CONFIG_MAPS, created, name="c", namespace="ml")

    assert again == created


async def test_a_replace_from_a_stale_version_raises_conflict(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"x": "1"}}}, name="p", namespace="ml")

    with pytest.raises(KubeConflict) as raised:
        await kube.api.replace(kubeapi.PODS, created, name="p", namespace="ml")

    assert (raised.value.status, raised.value.reason, raised.value.message) == (409, "Conflict", STALE)


async def test_a_replace_of_a_missing_object_raises_not_found(kube: Backend) -> None:
    with pytest.raises(KubeNotFound) as raised:
        await kube.api.replace(kubeapi.PODS, pod("p"), name="p", namespace="ml")

    assert raised.value.message == 'pods "p" not found'


async def test_a_custom_resource_is_replaced_only_with_a_version(kube: Backend) -> None:
    await kube.api.create(kubeapi.QUEUES, queue("research"))

    with pytest.raises(KubeInvalid) as raised:
        await kube.api.replace(kubeapi.QUEUES, queue("research"), name="research")

    assert (raised.value.status, raised.value.reason) == (422, "Invalid")


# --- patch ---


async def test_a_merge_patch_merges_maps_deletes_nulls_and_bumps_the_version(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p", labels={"keep": "1", "drop": "1"}), namespace="ml")

    patched = await kube.api.patch(
        kubeapi.PODS,
        {"metadata": {"labels": {"drop": None, "add": "1"}, "annotations": {"quotient.dev/gpu-devices": "0"}}},
        name="p",
        namespace="ml",
    )

    assert patched["metadata"]["labels"] == {"keep": "1", "add": "1"}
    assert patched["metadata"]["annotations"] == {"quotient.dev/gpu-devices": "0"}
    assert version(patched) > version(created)
    assert await kube.api.get(kubeapi.PODS, name="p", namespace="ml") == patched


async def test_a_patch_that_changes_nothing_keeps_the_version(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p", labels={"a": "1"}), namespace="ml")

    again = await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"a": "1"}}}, name="p", namespace="ml")

    assert version(again) == version(created)


async def test_strategic_patches_merge_conditions_by_type_and_merge_patches_replace_the_list(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    await kube.api.bind_pod(namespace="ml", name="p", node=NODE, uid=created["metadata"]["uid"])
    target = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "m"}
    ready = {"type": "Ready", "status": "False"}

    strategic = await kube.api.patch(
        kubeapi.PODS,
        {"status": {"conditions": [target]}},
        name="p",
        namespace="ml",
        subresource="status",
        patch_type=kubeapi.PatchType.STRATEGIC,
    )
    merged = await kube.api.patch(
        kubeapi.PODS, {"status": {"conditions": [ready]}}, name="p", namespace="ml", subresource="status"
    )

    assert [c["type"] for c in strategic["status"]["conditions"]] == ["PodScheduled", "DisruptionTarget"]
    assert merged["status"]["conditions"] == [ready]


async def test_a_status_patch_writes_only_the_status_and_a_main_patch_only_the_rest(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    on_status = await kube.api.patch(
        kubeapi.PODS,
        {"metadata": {"labels": {"a": "1"}}, "status": {"nominatedNodeName": NODE}},
        name="p",
        namespace="ml",
        subresource="status",
    )
    on_main = await kube.api.patch(
        kubeapi.PODS,
        {"metadata": {"labels": {"b": "1"}}, "status": {"nominatedNodeName": "elsewhere"}},
        name="p",
        namespace="ml",
    )

    assert on_status["status"]["nominatedNodeName"] == NODE
    assert on_status["metadata"]["labels"] == {}
    assert on_main["status"]["nominatedNodeName"] == NODE
    assert on_main["metadata"]["labels"] == {"b": "1"}


async def test_custom_resources_take_merge_patches_on_their_status_and_refuse_strategic_ones(kube: Backend) -> None:
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg-train-0-1234"},
        "spec": {"minMember": 4, "queue": "research"},
    }
    await kube.api.create(kubeapi.POD_GROUPS, group, namespace="ml")
    await kube.api.create(kubeapi.QUEUES, queue("research"))
    conditions = [
        {
            "type": "UnschedulableOnNodePool",
            "status": "True",
            "reason": "Unschedulable",
            "message": "GangDoesNotFit: 4 GPUs needed, 2 free",
            "reasons": [{"reason": "GangDoesNotFit", "message": "4 GPUs needed, 2 free"}],
        }
    ]

    patched = await kube.api.patch(
        kubeapi.POD_GROUPS,
        {"spec": {"minMember": 1}, "status": {"schedulingConditions": conditions}},
        name="pg-train-0-1234",
        namespace="ml",
        subresource="status",
    )
    queued = await kube.api.patch(
        kubeapi.QUEUES,
        {"status": {"allocated": {"nvidia.com/gpu": "0"}, "childQueues": []}},
        name="research",
        subresource="status",
    )
    with pytest.raises(KubeError) as raised:
        await kube.api.patch(
            kubeapi.QUEUES, {"spec": {"priority": 1}}, name="research", patch_type=kubeapi.PatchType.STRATEGIC
        )

    assert patched["status"] == {"schedulingConditions": conditions}
    assert patched["spec"] == {"minMember": 4, "queue": "research"}, "a status patch leaves the spec"
    assert queued["status"] == {"allocated": {"nvidia.com/gpu": "0"}, "childQueues": []}
    assert (type(raised.value), raised.value.status, raised.value.reason) == (KubeError, 415, "UnsupportedMediaType")


async def test_a_json_patch_applies_its_operations_and_a_failed_test_is_invalid(kube: Backend) -> None:
    await kube.api.create(kubeapi.CONFIG_MAPS, {"metadata": {"name": "c"}, "data": {"a": "1"}}, namespace="ml")

    patched = await kube.api.patch(
        kubeapi.CONFIG_MAPS,
        [
            {"op": "test", "path": "/data/a", "value": "1"},
            {"op": "replace", "path": "/data/a", "value": "2"},
            {"op": "add", "path": "/data/b", "value": "3"},
        ],
        name="c",
        namespace="ml",
        patch_type=kubeapi.PatchType.JSON,
    )
    with pytest.raises(KubeInvalid) as raised:
        await kube.api.patch(
            kubeapi.CONFIG_MAPS,
            [{"op": "test", "path": "/data/a", "value": "1"}],
            name="c",
            namespace="ml",
            patch_type=kubeapi.PatchType.JSON,
        )

    assert patched["data"] == {"a": "2", "b": "3"}
    assert (raised.value.status, raised.value.reason) == (422, "Invalid")


async def test_a_patch_of_a_missing_object_a_missing_subresource_or_a_stale_version_raises(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.CONFIG_MAPS, {"metadata": {"name": "c"}}, namespace="ml")
    await kube.api.patch(kubeapi.CONFIG_MAPS, {"data": {"a": "1"}}, name="c", namespace="ml")

    with pytest.raises(KubeNotFound) as missing:
        await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"a": "b"}}}, name="nobody", namespace="ml")
    with pytest.raises(KubeNotFound):
        await kube.api.patch(kubeapi.CONFIG_MAPS, {"status": {}}, name="c", namespace="ml", subresource="status")
    with pytest.raises(KubeConflict):
        stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": {"b": "2"}}
        await kube.api.patch(kubeapi.CONFIG_MAPS, stale, name="c", namespace="ml")

    assert missing.value.message == 'pods "nobody" not found'


# --- delete ---


async def test_a_delete_answers_the_last_state_at_a_new_version_then_none(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")

    deleted = await kube.api.delete(kubeapi.PODS, name="p", namespace="ml", uid=created["metadata"]["uid"])
    again = await kube.api.delete(kubeapi.PODS, name="p", namespace="ml")

    assert deleted is not None
    assert (deleted["metadata"]["name"], deleted["metadata"]["uid"]) == ("p", created["metadata"]["uid"])
    assert version(deleted) > version(created)
    assert await kube.api.get(kubeapi.PODS, name="p", namespace="ml") is None
    assert again is None


async def test_a_delete_on_another_uid_raises_conflict_and_deletes_nothing(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.QUEUES, queue("research"))

    with pytest.raises(KubeConflict) as raised:
        await kube.api.delete(kubeapi.QUEUES, name="research", uid="an-older-queue")

    assert raised.value.message == (
        'Operation cannot be fulfilled on queues.scheduling.run.ai "research": Precondition failed: '
        f"UID in precondition: an-older-queue, UID in object meta: {created['metadata']['uid']}"
    )
    assert await kube.api.get(kubeapi.QUEUES, name="research") == created

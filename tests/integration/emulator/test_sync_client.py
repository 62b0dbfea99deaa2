"""The emulator through the official synchronous ``kubernetes`` client (and raw HTTP where the wire matters)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from quotient.emulator.emulator import EmulatorThread
from tests.integration.emulator.conftest import pod_manifest
from tests.polling import until_sync


def _events(url: str, *, limit: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The first ``limit`` events of a watch, read off the wire line by line."""
    events = []
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        assert response.headers["Content-Type"] == "application/json"
        while len(events) < limit:
            line = response.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


def test_lists_carry_the_global_resource_version_and_a_watch_resumes_after_it(
    emulator: EmulatorThread, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod("default", pod_manifest("first"))
    listed = core.list_namespaced_pod("default")
    version = listed.metadata.resource_version
    assert [pod.metadata.name for pod in listed.items] == ["first"]
    assert int(version) >= int(listed.items[0].metadata.resource_version)
    core.create_namespaced_pod("default", pod_manifest("second"))
    core.delete_namespaced_pod("first", "default")
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=1)
    seen = [(event["type"], event["object"].metadata.name) for event in stream]
    assert seen == [("ADDED", "second"), ("DELETED", "first")]


def test_a_watch_without_a_version_starts_with_an_added_event_per_object(emulator: EmulatorThread) -> None:
    events = _events(f"{emulator.url}/api/v1/nodes?watch=true&timeoutSeconds=1", limit=10)
    assert [(event["type"], event["object"]["metadata"]["name"]) for event in events] == [
        ("ADDED", "node-0"),
        ("ADDED", "node-1"),
    ]


def test_a_watch_sends_bookmarks_with_the_current_version_when_asked(emulator: EmulatorThread) -> None:
    url = f"{emulator.url}/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true&resourceVersion=1"
    events = _events(url + "&timeoutSeconds=2", limit=1)
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["kind"] == "Pod" and events[0]["object"]["apiVersion"] == "v1"
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) == emulator.emulator.store.resource_version


def test_a_watch_from_below_the_compaction_floor_is_answered_with_an_error_event_410(
    emulator: EmulatorThread, core: client.CoreV1Api
) -> None:
    old = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("after"))
    emulator.call(emulator.emulator.compact)
    events = _events(f"{emulator.url}/api/v1/namespaces/default/pods?watch=true&resourceVersion={old}", limit=5)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as raised:
        for _ in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=1):
            pass
    assert raised.value.status == 410


def test_a_watch_ends_after_its_timeout(emulator: EmulatorThread, core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    assert (
        list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=1))
        == []
    )


def test_label_and_field_selectors_filter_lists(emulator: EmulatorThread, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("a", labels={"app": "web", "tier": "front"}))
    core.create_namespaced_pod("default", pod_manifest("b", labels={"app": "db"}, schedulerName="quotient"))
    core.create_namespaced_pod("default", pod_manifest("c", labels={"app": "batch"}, schedulerName="quotient"))
    emulator.call(lambda: emulator.emulator.api.bind("default", "c", {"target": {"name": "node-0"}}))

    def names(**selectors: str) -> list[str]:
        return sorted(pod.metadata.name for pod in core.list_namespaced_pod("default", **selectors).items)

    assert names(label_selector="app in (web,db)") == ["a", "b"]
    assert names(label_selector="app!=web,!tier") == ["b", "c"]
    assert names(label_selector="tier") == ["a"]
    assert names(field_selector="spec.schedulerName=quotient,spec.nodeName=") == ["b"]
    assert names(field_selector="metadata.name=c") == ["c"]
    until_sync(lambda: names(field_selector="status.phase=Running") == ["c"], what="pod c to run")
    assert names(field_selector="status.phase!=Running") == ["a", "b"]
    with pytest.raises(ApiException) as raised:
        core.list_namespaced_pod("default", field_selector="spec.nosuchfield=x")
    assert raised.value.status == 400 and "field label not supported" in raised.value.body


def test_a_field_selected_watch_sees_a_pod_leave_its_selection_as_deleted(
    emulator: EmulatorThread, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod("default", pod_manifest("pending", schedulerName="quotient"))
    version = core.list_namespaced_pod("default").metadata.resource_version
    emulator.call(lambda: emulator.emulator.api.bind("default", "pending", {"target": {"name": "node-1"}}))
    stream = watch.Watch().stream(
        core.list_pod_for_all_namespaces, field_selector="spec.nodeName=", resource_version=version, timeout_seconds=1
    )
    events = [(event["type"], event["object"].metadata.name, event["object"].spec.node_name) for event in stream]
    assert events == [("DELETED", "pending", None)]


def test_creating_an_existing_name_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("twice"))
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("default", pod_manifest("twice"))
    body = json.loads(raised.value.body)
    assert raised.value.status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'pods "twice" already exists' and body["details"] == {"name": "twice", "kind": "pods"}


def test_objects_get_server_defaults_and_a_name_from_generate_name(core: client.CoreV1Api) -> None:
    manifest = pod_manifest("")
    manifest["metadata"] = {"generateName": "worker-"}
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}  # type: ignore[index]
    pod = core.create_namespaced_pod("default", manifest)
    assert pod.metadata.name.startswith("worker-") and len(pod.metadata.name) == len("worker-") + 5
    assert pod.metadata.uid and pod.metadata.creation_timestamp and pod.metadata.generation == 1
    assert pod.spec.scheduler_name == "default-scheduler" and pod.spec.restart_policy == "Always"
    assert pod.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1", "cpu": "1"}
    assert pod.status.phase == "Pending" and pod.status.qos_class == "Burstable"
    assert {t.key for t in pod.spec.tolerations} == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def test_invalid_objects_are_422_with_causes(core: client.CoreV1Api) -> None:
    manifest = pod_manifest("Bad_Name")
    manifest["spec"] = {"containers": []}
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("default", manifest)
    body = json.loads(raised.value.body)
    assert raised.value.status == 422 and body["reason"] == "Invalid"
    assert {cause["field"] for cause in body["details"]["causes"]} == {"metadata.name", "spec.containers"}
    gpu_pod = pod_manifest(
        "fractional", resources={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}
    )
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("default", gpu_pod)
    assert "must be equal to nvidia.com/gpu limit of 2" in raised.value.body


def test_a_missing_namespace_is_404_and_a_missing_priority_class_403(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("nowhere", pod_manifest("lost", namespace="nowhere"))
    assert raised.value.status == 404
    assert json.loads(raised.value.body)["message"] == 'namespaces "nowhere" not found'
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("default", pod_manifest("vip", priorityClassName="no-such-class"))
    assert raised.value.status == 403
    trained = core.create_namespaced_pod("default", pod_manifest("trainee", priorityClassName="train"))
    assert trained.spec.priority == 50


def test_an_update_with_a_stale_resource_version_is_409_conflict(api_client: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api_client)
    lease = leases.create_namespaced_lease(
        "kube-system",
        {"metadata": {"name": "quotient-leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}},
    )
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = "b"
    renewed = leases.replace_namespaced_lease("quotient-leader", "kube-system", lease)
    assert renewed.spec.holder_identity == "b" and renewed.metadata.resource_version != stale
    lease.metadata.resource_version = stale
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as raised:
        leases.replace_namespaced_lease("quotient-leader", "kube-system", lease)
    assert raised.value.status == 409 and json.loads(raised.value.body)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("quotient-leader", "kube-system").spec.holder_identity == "b"


def test_the_three_patch_formats_apply_and_strategic_merge_keeps_other_container_fields(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    apps = client.AppsV1Api(api_client)
    template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "containers": [
                {"name": "app", "image": "web:1", "env": [{"name": "A", "value": "1"}]},
                {"name": "sidecar", "image": "proxy:1", "args": ["--port", "80"]},
            ]
        },
    }
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}, "template": template},
        },
    )
    strategic = {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "app"}, {"name": "sidecar"}],
                    "containers": [{"name": "sidecar", "image": "proxy:2"}],
                }
            }
        }
    }
    patched = apps.patch_namespaced_deployment(
        "web", "default", strategic, _content_type="application/strategic-merge-patch+json"
    )
    containers = patched.spec.template.spec.containers
    assert [(c.name, c.image) for c in containers] == [("app", "web:1"), ("sidecar", "proxy:2")]
    assert containers[1].args == ["--port", "80"] and containers[0].env[0].value == "1"
    assert patched.metadata.generation == 2
    merged = apps.patch_namespaced_deployment(
        "web", "default", {"metadata": {"labels": {"team": "a"}}}, _content_type="application/merge-patch+json"
    )
    assert merged.metadata.labels == {"team": "a"}
    operations = [
        {"op": "replace", "path": "/spec/replicas", "value": 0},
        {"op": "add", "path": "/metadata/labels/x", "value": "y"},
    ]
    jsoned = apps.patch_namespaced_deployment("web", "default", operations, _content_type="application/json-patch+json")
    assert jsoned.metadata.labels == {"team": "a", "x": "y"}
    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_pod("nope", "default", {"metadata": {}}, _content_type="application/merge-patch+json")
    assert raised.value.status == 404


def test_binding_answers_201_with_a_status_which_the_client_fails_to_parse(
    emulator: EmulatorThread, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod("default", pod_manifest("bound", schedulerName="quotient"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "bound"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-0"},
    }
    with pytest.raises(ValueError):  # the client's parse bug: the bind happened anyway
        core.create_namespaced_pod_binding("bound", "default", binding)
    pod = core.read_namespaced_pod("bound", "default")
    assert pod.spec.node_name == "node-0"
    scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert scheduled.status == "True"
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_binding("bound", "default", binding, _preload_content=False)
    assert raised.value.status == 409
    assert 'pod bound is already assigned to node "node-0"' in json.loads(raised.value.body)["message"]
    core.create_namespaced_pod("default", pod_manifest("raw", schedulerName="quotient"))
    binding["metadata"] = {"name": "raw"}
    raw = core.create_namespaced_pod_binding("raw", "default", binding, _preload_content=False)
    assert raw.status == 201 and json.loads(raw.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }


def test_custom_resources_have_a_status_subresource_that_the_main_resource_cannot_change(
    api_client: client.ApiClient,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    group, version = "scheduling.run.ai", "v2"
    queue = {
        "apiVersion": f"{group}/{version}",
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {"parentQueue": "default-parent-queue"},
        "status": {"allocated": {"gpu": 9}},
    }
    created = custom.create_cluster_custom_object(group, version, "queues", queue)
    assert "status" not in created
    updated = custom.patch_cluster_custom_object_status(
        group,
        version,
        "queues",
        "team-a",
        {"status": {"allocated": {"gpu": 2}}, "spec": {"parentQueue": "x"}},
        _content_type="application/merge-patch+json",
    )
    assert updated["status"] == {"allocated": {"gpu": 2}}
    assert updated["spec"]["parentQueue"] == "default-parent-queue"
    again = custom.patch_cluster_custom_object(
        group,
        version,
        "queues",
        "team-a",
        {"spec": {"priority": 7}, "status": {"allocated": {}}},
        _content_type="application/merge-patch+json",
    )
    assert again["status"] == {"allocated": {"gpu": 2}} and again["spec"]["priority"] == 7
    assert again["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as raised:
        custom.patch_cluster_custom_object(
            group, version, "queues", "team-a", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert raised.value.status == 415
    podgroup = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg-1"},
        "spec": {"minMember": 2, "queue": "team-a"},
    }
    custom.create_namespaced_custom_object("scheduling.run.ai", "v2alpha2", "default", "podgroups", podgroup)
    listed = custom.list_namespaced_custom_object("scheduling.run.ai", "v2alpha2", "default", "podgroups")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["pg-1"]


def test_core_events_are_served_through_events_k8s_io_too(api_client: client.ApiClient) -> None:
    events = client.EventsV1Api(api_client)
    events.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "e1"},
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reason": "Unschedulable",
            "note": "no node fits",
            "type": "Warning",
            "action": "Scheduling",
            "reportingController": "quotient",
            "reportingInstance": "quotient-0",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        },
    )
    core_events = client.CoreV1Api(api_client).list_namespaced_event(
        "default", field_selector="involvedObject.name=p,reason=Unschedulable"
    )
    assert [(event.message, event.reporting_component) for event in core_events.items] == [("no node fits", "quotient")]
    assert events.read_namespaced_event("e1", "default").note == "no node fits"

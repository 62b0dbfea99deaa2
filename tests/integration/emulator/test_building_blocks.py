"""The emulator's pure parts: patches, selectors, tables, faults, the store's history, protobuf bodies."""

from __future__ import annotations

import pytest

from quotient.emulator import patches, printers, protobuf, selectors, status
from quotient.emulator.faults import Fault, Faults
from quotient.emulator.kinds import default_registry
from quotient.emulator.store import EventType, Store


def test_a_strategic_merge_patch_merges_containers_by_name_and_honours_directives() -> None:
    pod = {
        "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
        "spec": {
            "containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "side", "image": "side:1"},
            ],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]},
    }
    patch = {
        "metadata": {"labels": {"b": None, "c": "3"}, "finalizers": ["y"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
            "containers": [
                {"name": "app", "env": [{"name": "A", "$patch": "delete"}, {"name": "C", "value": "3"}]},
                {"name": "new", "image": "new:1"},
            ],
            "tolerations": [{"key": "other", "operator": "Exists"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    merged = patches.strategic_merge_patch(pod, patch)
    assert not isinstance(merged, status.Failure)
    assert merged["metadata"] == {"labels": {"a": "1", "c": "3"}, "finalizers": ["x", "y"]}
    assert [c["name"] for c in merged["spec"]["containers"]] == ["side", "app", "new"]
    app = merged["spec"]["containers"][1]
    assert app["image"] == "app:1" and app["env"] == [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}]
    assert merged["spec"]["tolerations"] == [{"key": "other", "operator": "Exists"}]  # no merge key: replaced
    assert merged["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "PodScheduled", "status": "True"},
    ]
    assert pod["spec"]["containers"][0]["env"][0]["name"] == "A", "the input must not change"


def test_a_replace_directive_replaces_a_whole_list() -> None:
    merged = patches.strategic_merge_patch(
        {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}},
        {"spec": {"containers": [{"$patch": "replace"}, {"name": "c", "image": "3"}]}},
    )
    assert merged == {"spec": {"containers": [{"name": "c", "image": "3"}]}}


def test_a_merge_patch_replaces_lists_and_deletes_with_null() -> None:
    merged = patches.merge_patch({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3], "b": None}, "e": {"f": 1}})
    assert merged == {"a": {"c": [3]}, "d": 1, "e": {"f": 1}}


def test_a_json_patch_applies_all_operations_or_none() -> None:
    document = {"metadata": {"labels": {"a": "1"}}, "list": [1, 2]}
    patched = patches.json_patch(
        document,
        [
            {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "remove", "path": "/list/0"},
            {"op": "copy", "from": "/metadata/labels/a", "path": "/copied"},
            {"op": "test", "path": "/copied", "value": "1"},
        ],
    )
    assert patched == {"metadata": {"labels": {"a": "1", "b/c": "2"}}, "list": [2, 3], "copied": "1"}
    failed = patches.json_patch(document, [{"op": "test", "path": "/metadata/labels/a", "value": "9"}])
    assert isinstance(failed, status.Failure) and failed.code == 422
    assert document == {"metadata": {"labels": {"a": "1"}}, "list": [1, 2]}


def test_custom_resources_refuse_strategic_merge_patches_with_415() -> None:
    refused = patches.apply_patch({}, "application/strategic-merge-patch+json", {}, strategic_allowed=False)
    assert isinstance(refused, status.Failure) and refused.code == 415


@pytest.mark.parametrize(
    ("query", "labels", "matches"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web,tier!=db", {"app": "web", "tier": "front"}, True),
        ("app in (web, api)", {"app": "api"}, True),
        ("app notin (web)", {}, True),
        ("app notin (web)", {"app": "web"}, False),
        ("!app", {"app": "x"}, False),
        ("gpus>2", {"gpus": "4"}, True),
        ("gpus<2", {"gpus": "4"}, False),
        ("kai.scheduler/queue", {"kai.scheduler/queue": "test"}, True),
    ],
)
def test_label_selectors_follow_the_api_server_grammar(query: str, labels: dict[str, str], matches: bool) -> None:
    selector = selectors.parse_labels(query)
    assert isinstance(selector, selectors.LabelSelector)
    assert selector.matches(labels) is matches


def test_a_malformed_label_selector_is_a_bad_request() -> None:
    parsed = selectors.parse_labels("app in web")
    assert isinstance(parsed, status.Failure) and parsed.code == 400


def test_field_selectors_support_inequality_and_missing_fields() -> None:
    pods = default_registry().lookup("", "v1", "pods")
    assert pods is not None
    selector = selectors.parse_fields("spec.nodeName=,status.phase!=Failed", pods)
    assert isinstance(selector, selectors.FieldSelector)
    assert selector.matches({"spec": {}, "status": {"phase": "Pending"}})
    assert not selector.matches({"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}})
    assert not selector.matches({"spec": {}, "status": {"phase": "Failed"}})


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 3600, "3d1h"),
        (400 * 86400, "400d"),
        (3 * 365 * 86400, "3y"),
    ],
)
def test_ages_print_as_kubectl_prints_them(seconds: int, shown: str) -> None:
    assert printers.human_duration(seconds) == shown


def test_faults_last_for_a_count_or_a_duration_and_add_up() -> None:
    now = [100.0]
    faults = Faults(clock=lambda: now[0])
    faults.add(Fault(verb="create", subresource="binding", code=500), count=2)
    faults.add(Fault(verb="watch", delay_s=0.5), duration_s=10)
    assert faults.take(verb="create", resource="pods", subresource="binding").code == 500
    assert faults.take(verb="create", resource="pods").code is None
    assert faults.take(verb="create", resource="pods", subresource="binding").code == 500
    assert faults.take(verb="create", resource="pods", subresource="binding").code is None
    assert faults.take(verb="watch", resource="pods").delay_s == 0.5
    now[0] += 10
    assert faults.take(verb="watch", resource="pods").delay_s == 0.0
    assert len(faults) == 0


def test_the_store_records_history_and_raises_its_floor_as_history_falls_off() -> None:
    store = Store(history_events=3)
    seen = []
    store.subscribe(lambda change: seen.append((change.type, change.rv)))
    for index in range(5):
        store.create("configmaps", {"metadata": {"name": f"c{index}", "namespace": "default"}})
    assert store.resource_version == 5 and store.floor == 2
    assert store.changes_after(1) is None
    assert [change.rv for change in store.changes_after(2) or []] == [3, 4, 5]
    deleted = store.delete("configmaps", "default", "c0")
    assert deleted is not None and deleted["metadata"]["resourceVersion"] == "6"
    assert seen[-1] == (EventType.DELETED, 6)
    assert store.compact() == 6 and store.changes_after(5) is None


def test_kubectl_create_namespace_protobuf_bodies_decode() -> None:
    body = (
        b'k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x19\n\x11\n\x01x\x12\x00\x1a\x00"\x00*\x002\x008\x00B\x00'
        b'\x12\x00\x1a\x02\n\x00\x1a\x00"\x00'
    )
    decoded = protobuf.decode(body)
    assert decoded["apiVersion"] == "v1" and decoded["kind"] == "Namespace"
    assert decoded["metadata"]["name"] == "x"
    with pytest.raises(protobuf.ProtobufError, match="not supported"):
        protobuf.decode(b"k8s\x00\n\x1f\n\x14networking.k8s.io/v1\x12\x07Ingress")

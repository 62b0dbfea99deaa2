"""The admission review: which pods are refused (with which message), which are wired for a GPU share, and how.

The patched pods are checked by applying the webhook's JSONPatch with the emulator's RFC 6902 implementation, the
one that applies it in the integration tests, so the tests read the pod a user would get back.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import names
from quotient.emulator import patches, status
from scheduler.kube import admission
from scheduler.objects import gpurequest
from tests.unit.kube_webhook.reviews import pod, review_body

NAMES = ("quotient",)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
Obj = dict[str, Any]


def respond(obj: object, *, scheduler_names: tuple[str, ...] = NAMES, **kwargs: Any) -> Obj:
    answer = admission.review(review_body(obj, **kwargs), scheduler_names=scheduler_names)
    assert answer.status == 200, answer.body
    document = json.loads(answer.body)
    assert (document["apiVersion"], document["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: Obj = document["response"]
    return response


def patched(obj: Obj, response: Obj) -> Obj:
    assert response["allowed"] is True
    if "patch" not in response:
        return obj
    assert response["patchType"] == "JSONPatch"
    result = patches.json_patch(obj, json.loads(base64.b64decode(response["patch"])))
    assert not isinstance(result, status.Failure), result
    return result


def env_of(obj: Obj, container: str, *, field: str = "containers") -> dict[str, Obj]:
    [found] = [c for c in obj["spec"][field] if c["name"] == container]
    return {entry["name"]: entry for entry in found.get("env", [])}


def configmap_ref(entry: Obj) -> tuple[str, str]:
    ref = entry["valueFrom"]["configMapKeyRef"]
    assert set(ref) == {"name", "key"}, "not optional: the container must wait for its GPU assignment"
    return ref["name"], ref["key"]


# --- refusals: one reading with the scheduler, a message that says what is wrong and what is accepted ---

INVALID = [
    pytest.param(pod({"gpu-fraction": "1.5"}), "gpu-fraction", ["'1.5'", "strictly between 0 and 1"], id="1.5"),
    pytest.param(pod({"gpu-fraction": "0"}), "gpu-fraction", ["'0'", "strictly between 0 and 1"], id="0"),
    pytest.param(pod({"gpu-fraction": "-0.2"}), "gpu-fraction", ["'-0.2'", "strictly between 0 and 1"], id="-0.2"),
    pytest.param(pod({"gpu-fraction": "abc"}), "gpu-fraction", ["'abc'", '"0.5"'], id="abc"),
    pytest.param(
        pod({"gpu-fraction": "0.5"}, gpus="1"), "nvidia.com/gpu", ["must not request nvidia.com/gpu"], id="with-gpu"
    ),
    pytest.param(
        pod({"gpu-fraction": "0.5", "gpu-memory": "3000"}), "gpu-memory", ["both set", "one way only"], id="both"
    ),
    pytest.param(
        pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"}, containers=("main", "sidecar")),
        "gpu-fraction-container-name",
        ["'trainer'", "containers: main, sidecar"],
        id="no-such-container",
    ),
    pytest.param(pod({"gpu-memory": "3 bananas"}), "gpu-memory", ["'3 bananas'", '"3000"', '"3Gi"'], id="memory"),
    pytest.param(
        pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}),
        "gpu-fraction-num-devices",
        ["'0'", "whole number from 1"],
        id="num-devices",
    ),
]


@pytest.mark.parametrize(("obj", "field", "phrases"), INVALID)
def test_invalid_gpu_annotations_are_refused_with_the_schedulers_own_message(
    obj: Obj, field: str, phrases: list[str]
) -> None:
    response = respond(obj)
    problem = gpurequest.parse(obj)

    assert isinstance(problem, gpurequest.AnnotationProblem) and problem.field == field
    assert response["allowed"] is False
    assert response["status"] == {"code": 422, "reason": "Invalid", "message": problem.message}
    for phrase in phrases:
        assert phrase in response["status"]["message"]
    assert "patch" not in response


def test_a_refusal_answers_the_reviews_uid() -> None:
    assert respond(pod({"gpu-fraction": "1.5"}), uid="the-uid")["uid"] == "the-uid"


# --- shares are wired to their ConfigMap ---


def test_a_fractional_pod_gets_env_from_its_configmap_and_the_nvidia_runtime() -> None:
    obj = pod({"gpu-fraction": "0.5"})
    response = respond(obj, uid="uid-1")
    result = patched(obj, response)
    configmap = result["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]
    env = env_of(result, "main")

    assert configmap == f"train-gpu-{hashlib.sha256(b'uid-1').hexdigest()[:10]}"
    assert configmap_ref(env["NVIDIA_VISIBLE_DEVICES"]) == (configmap, "NVIDIA_VISIBLE_DEVICES")
    assert configmap_ref(env["GPU_PORTION"]) == (configmap, "GPU_PORTION")
    assert result["spec"]["runtimeClassName"] == "nvidia"
    assert result["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert response["uid"] == "uid-1" and "warnings" not in response


@pytest.mark.parametrize("memory", ["3000", "3Gi", "3GiB"])
def test_a_gpu_memory_pod_is_wired_like_a_fraction(memory: str) -> None:
    obj = pod({"gpu-memory": memory})
    result = patched(obj, respond(obj))
    configmap = result["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]

    assert configmap_ref(env_of(result, "main")["NVIDIA_VISIBLE_DEVICES"]) == (configmap, "NVIDIA_VISIBLE_DEVICES")
    assert result["spec"]["runtimeClassName"] == "nvidia"


def test_a_share_on_several_devices_still_reads_one_key_that_will_list_every_uuid() -> None:
    obj = pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    result = patched(obj, respond(obj))
    env = env_of(result, "main")

    assert [name for name in env if name == "NVIDIA_VISIBLE_DEVICES"] == ["NVIDIA_VISIBLE_DEVICES"]
    assert configmap_ref(env["NVIDIA_VISIBLE_DEVICES"])[1] == "NVIDIA_VISIBLE_DEVICES"


def test_the_named_container_gets_the_gpu_and_every_other_container_gets_none() -> None:
    obj = pod({"gpu-fraction": "0.25", "gpu-fraction-container-name": "server"}, containers=("proxy", "server"))
    obj["spec"]["initContainers"] = [{"name": "download", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}]
    result = patched(obj, respond(obj))

    assert "valueFrom" in env_of(result, "server")["NVIDIA_VISIBLE_DEVICES"]
    # CUDA images set NVIDIA_VISIBLE_DEVICES=all; without "void" the NVIDIA runtime would show them every GPU.
    assert env_of(result, "proxy") == {"NVIDIA_VISIBLE_DEVICES": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}}
    assert env_of(result, "download", field="initContainers")["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "GPU_PORTION" not in env_of(result, "proxy")


def test_the_pods_own_gpu_variables_are_replaced_everywhere_with_a_warning_and_its_other_env_kept() -> None:
    obj = pod({"gpu-fraction": "0.5"})
    obj["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "MODEL", "value": "llama"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},  # duplicates: the kubelet keeps the last
    ]
    response = respond(obj)
    env = patched(obj, response)["spec"]["containers"][0]["env"]

    assert [entry["name"] for entry in env] == [
        "NVIDIA_VISIBLE_DEVICES",
        "MODEL",
        "NVIDIA_VISIBLE_DEVICES",
        "GPU_PORTION",
    ]
    assert env[1] == {"name": "MODEL", "value": "llama"}
    assert all("valueFrom" in entry for entry in env if entry["name"] != "MODEL")
    assert response["warnings"] == [
        "container 'main': NVIDIA_VISIBLE_DEVICES is set by Quotient's GPU sharing; the pod's own value was replaced"
    ]


def test_a_runtime_class_the_pod_names_is_kept() -> None:
    obj = pod({"gpu-fraction": "0.5"})
    obj["spec"]["runtimeClassName"] = "nvidia-cdi"

    assert patched(obj, respond(obj))["spec"]["runtimeClassName"] == "nvidia-cdi"


def test_admitting_a_pod_twice_changes_nothing_the_second_time() -> None:
    obj = pod({"gpu-fraction": "0.5"})
    once = patched(obj, respond(obj, uid="same"))
    twice = patched(once, respond(once, uid="same"))

    assert twice == once


def test_a_scheduler_name_added_by_configuration_is_served_too() -> None:
    obj = pod({"gpu-fraction": "0.5"}, scheduler="kai-scheduler")

    assert "patch" not in respond(obj)
    assert "patch" in respond(obj, scheduler_names=("quotient", "kai-scheduler"))


# --- names of the ConfigMap ---


def test_a_pod_made_from_generate_name_gets_a_configmap_named_after_the_prefix_and_the_request() -> None:
    obj = pod({"gpu-fraction": "0.7"}, name=None, generate_name="vllm-test-07-5d8f6c9b7-")
    first = patched(obj, respond(obj, uid="uid-a"))["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]
    second = patched(obj, respond(obj, uid="uid-b"))["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]

    assert first.startswith("vllm-test-07-5d8f6c9b7-gpu-") and second.startswith("vllm-test-07-5d8f6c9b7-gpu-")
    assert first != second, "two pods of one ReplicaSet never share a ConfigMap"


def test_a_pod_without_annotations_before_admission_still_gets_the_configmap_annotation() -> None:
    obj = pod({"gpu-fraction": "0.5"})
    operations, _ = admission.share_patch({**obj, "metadata": {"name": "p"}}, chosen="main", configmap="p-gpu-1")

    assert operations[0] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {"quotient.dev/gpu-configmap": "p-gpu-1"},
    }


@given(text=st.text(max_size=300), uid=st.text(max_size=40))
@settings(max_examples=300)
def test_configmap_names_are_dns_subdomains_of_at_most_253_characters(text: str, uid: str) -> None:
    for metadata in ({"name": text}, {"generateName": text}):
        name = admission.configmap_name({"metadata": metadata}, request_uid=uid)

        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name


def test_a_long_pod_name_is_cut_so_the_configmap_name_fits() -> None:
    name = admission.configmap_name({"metadata": {"name": "a" * 250}}, request_uid="u")

    assert len(name) == 253 and name.startswith("a" * 200) and DNS_SUBDOMAIN.match(name)


# --- what passes untouched ---


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(gpus="2"), id="whole-gpus"),
        pytest.param(pod(), id="cpu-only"),
        pytest.param(pod({"gpu-fraction": "1.5"}, scheduler="kai-scheduler"), id="another-scheduler"),
        pytest.param(pod({"gpu-fraction": "0.5"}, scheduler=None), id="the-default-scheduler"),
        pytest.param(pod({"gpu-fraction": "0.5"}, scheduler="volcano"), id="a-share-of-another-scheduler"),
    ],
)
def test_pods_without_a_share_of_ours_pass_untouched(obj: Obj) -> None:
    assert respond(obj) == {"uid": "3b1f0a52-2c11-4d7e-9a4e-1f6c2d9b8e01", "allowed": True}


def test_updates_and_other_resources_pass_untouched() -> None:
    update = respond(pod({"gpu-fraction": "1.5"}), operation="UPDATE")
    body = json.loads(review_body(pod({"gpu-fraction": "1.5"})))
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    other = json.loads(admission.review(json.dumps(body).encode(), scheduler_names=NAMES).body)["response"]

    assert update["allowed"] is True and "patch" not in update
    assert other["allowed"] is True and "patch" not in other


# --- malformed reviews ---


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "admission.k8s.io/v1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}', "no uid"),
    ],
)
def test_a_body_that_is_not_an_admission_review_gets_400_with_a_message(body: bytes, phrase: str) -> None:
    answer = admission.review(body, scheduler_names=NAMES)

    assert answer.status == 400 and answer.content_type == "text/plain"
    assert phrase in answer.body.decode()


@pytest.mark.parametrize(
    ("obj", "phrase"),
    [
        (None, "no pod object"),
        ({"metadata": [], "spec": {}}, "metadata is not an object"),
        ({"metadata": {"annotations": {"gpu-fraction": 0.5}}, "spec": {}}, "annotations"),
        ({"metadata": {}, "spec": {"containers": []}}, "spec.containers"),
        ({"metadata": {}, "spec": {"containers": [{"image": "x"}]}}, "has no name"),
        ({"metadata": {}, "spec": {"containers": [{"name": "a", "env": {"A": "1"}}]}}, "env"),
        ({"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": ["x"]}}]}}, "resources"),
        ({"metadata": {}, "spec": {"schedulerName": 3, "containers": [{"name": "a"}]}}, "schedulerName"),
    ],
)
def test_a_review_of_a_malformed_pod_is_refused_in_the_review_with_400(obj: object, phrase: str) -> None:
    response = respond(obj)

    assert response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
    assert phrase in response["status"]["message"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
POD_KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "annotations",
        "containers",
        "initContainers",
        "env",
        "name",
        "resources",
        "limits",
        "schedulerName",
        "gpu-fraction",
        "gpu-memory",
        "gpu-fraction-container-name",
        "nvidia.com/gpu",
        "valueFrom",
    ]
)
POD_LIKE = st.recursive(
    st.none() | st.text(max_size=6) | st.sampled_from(["quotient", "0.5", "main", "1"]) | st.integers(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(POD_KEYS, children, max_size=5),
    max_leaves=30,
)


@given(obj=JSON | POD_LIKE)
@settings(max_examples=300)
def test_no_review_object_whatever_its_shape_makes_the_webhook_raise(obj: object) -> None:
    answer = admission.review(review_body(obj), scheduler_names=NAMES)

    assert answer.status == 200
    assert "response" in json.loads(answer.body)


@given(body=st.binary(max_size=200) | JSON.map(lambda value: json.dumps(value).encode()))
def test_no_body_whatever_it_holds_makes_the_webhook_raise(body: bytes) -> None:
    assert admission.review(body, scheduler_names=NAMES).status in (200, 400)


ENV_NAMES = st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "GPU_PORTION", "MODEL", "CUDA_VISIBLE_DEVICES"])
ENV = st.lists(st.builds(lambda name, value: {"name": name, "value": value}, ENV_NAMES, st.sampled_from(["all", "0"])))


@st.composite
def share_pods(draw: st.DrawFn) -> Obj:
    containers = draw(
        st.lists(st.sampled_from(["main", "sidecar", "proxy", "server"]), min_size=1, max_size=4, unique=True)
    )
    annotations = {"gpu-fraction": draw(st.sampled_from(["0.5", "0.25", "0.7"]))}
    if draw(st.booleans()):
        annotations["gpu-fraction-container-name"] = draw(st.sampled_from(containers))
    obj = pod(annotations, containers=tuple(containers))
    for field in ("containers", "initContainers"):
        if field == "initContainers":
            if not draw(st.booleans()):
                continue
            obj["spec"][field] = [{"name": "init", "image": "busybox"}]
        for container in obj["spec"][field]:
            if draw(st.booleans()):
                container["env"] = draw(ENV)
    if draw(st.booleans()):
        obj["spec"]["runtimeClassName"] = draw(st.sampled_from(["nvidia", "kata"]))
    return obj


@given(obj=share_pods())
@settings(max_examples=200)
def test_every_share_is_wired_the_same_whatever_env_the_pod_brings_and_a_second_pass_changes_nothing(obj: Obj) -> None:
    result = patched(obj, respond(obj))
    chosen = obj["metadata"]["annotations"].get("gpu-fraction-container-name", obj["spec"]["containers"][0]["name"])
    configmap = result["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]

    for field in ("containers", "initContainers"):
        for before, after in zip(obj["spec"].get(field, []), result["spec"].get(field, []), strict=True):
            env = after["env"]
            is_chosen = field == "containers" and after["name"] == chosen
            ours = {"NVIDIA_VISIBLE_DEVICES", "GPU_PORTION"} if is_chosen else {"NVIDIA_VISIBLE_DEVICES"}
            assert [e for e in env if e["name"] not in ours] == [
                e for e in before.get("env", []) if e["name"] not in ours
            ]
            if is_chosen:
                for name in ("NVIDIA_VISIBLE_DEVICES", "GPU_PORTION"):
                    entries = [e for e in env if e["name"] == name]
                    assert entries and all(configmap_ref(e) == (configmap, name) for e in entries)
            else:
                entries = [e for e in env if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
                assert entries and all(e == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} for e in entries)
    assert result["spec"]["runtimeClassName"] == obj["spec"].get("runtimeClassName", "nvidia")
    assert patched(result, respond(result)) == result

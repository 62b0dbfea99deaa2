"""The admission review of GPU sharing, pure: an ``AdmissionReview`` in, the answer out (bytes to bytes).

A fractional pod (``gpu-fraction`` or ``gpu-memory``) learns which device it shares only at binding, long after its
spec became immutable. So at creation the review points the chosen container's ``NVIDIA_VISIBLE_DEVICES`` and
``GPU_PORTION`` at keys of a ConfigMap that does not exist yet, names that ConfigMap in the pod's annotation
``quotient.dev/gpu-configmap``, and sets ``runtimeClassName: nvidia`` when the pod names no runtime class. The
binder writes the ConfigMap (the device UUIDs, comma-separated when ``gpu-fraction-num-devices`` > 1, and the
portion) before it binds; until then the kubelet holds the container (``CreateContainerConfigError``), so a share
never starts without its assignment. The references are not optional for that reason: CUDA images set
``NVIDIA_VISIBLE_DEVICES=all`` themselves, and a container that started without ours would see every GPU of its
node. For the same reason the pod's other containers (and init containers) get ``NVIDIA_VISIBLE_DEVICES=void``,
which makes the NVIDIA runtime expose no GPU to them.

At admission a pod made from ``generateName`` has no name yet, and a pod recreated under an old name could meet
its predecessor's ConfigMap before garbage collection removes it, so the ConfigMap's name is the pod's name (or
``generateName``) with a digest of the admission request's uid, which is unique per request.

Validation is :func:`scheduler.objects.gpurequest.parse`, the very reading the scheduler uses, so the webhook and the
scheduler never disagree; a problem becomes a refusal (422, the problem's message, which kubectl prints). One rule is
the webhook's alone, KAI's: a pod may not be created with ``nvidia.com/container.<c>.gpus.devices``, which KAI's
binder writes on placed pods (the scheduler reads such pods, bound before it took over, without complaint). Pods of
other schedulers, pods without a share, and operations other than CREATE pass untouched. A body that is not an
``admission.k8s.io/v1`` AdmissionReview gets HTTP 400 with a message; a review whose pod is malformed is refused
in the review (400), never a crash. ``scheduler.kube.webhook`` serves it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from common import logs, names
from scheduler.objects import gpurequest, nvfractions
from scheduler.objects.gpurequest import AnnotationProblem

log = logs.get("scheduler.kube.webhook")

ADMISSION_VERSION = "admission.k8s.io/v1"
_CONFIGMAP_NAME_MAX = 253  # a DNS subdomain
_DIGEST_CHARS = 10
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")


# --- the review: pure, bytes in, bytes out ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the webhook says about one pod: allowed (with a JSONPatch, maybe empty) or refused with a Status."""

    allowed: bool
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""


ALLOW = Verdict(allowed=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReviewAnswer:
    """The HTTP answer to a review request."""

    status: int
    body: bytes
    content_type: str = "application/json"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Review:
    """An AdmissionReview's request, read: its ``uid`` and the ``request`` object itself."""

    uid: str
    request: Mapping[str, Any]


def read_review(body: bytes) -> Review | ReviewAnswer:
    """The request of an AdmissionReview, or the 400 answer to a body that is not one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return _bad_review(f"the body is not JSON: {exc}")
    if not isinstance(document, dict):
        return _bad_review("the body is not a JSON object")
    if document.get("apiVersion") != ADMISSION_VERSION or document.get("kind") != "AdmissionReview":
        return _bad_review(
            f"expected an AdmissionReview of {ADMISSION_VERSION}, got kind {document.get('kind')!r} of "
            f"{document.get('apiVersion')!r}"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        return _bad_review("the AdmissionReview carries no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _bad_review("the AdmissionReview request has no uid")
    return Review(uid=uid, request=request)


def review(body: bytes, *, scheduler_names: Collection[str]) -> ReviewAnswer:
    """Answer an AdmissionReview: 200 with the review's response, or 400 with a message when it is not one."""
    read = read_review(body)
    if isinstance(read, ReviewAnswer):
        return read
    return respond(read.uid, admit(read.request, scheduler_names=scheduler_names))


def respond(uid: str, verdict: Verdict) -> ReviewAnswer:
    """The AdmissionReview that carries ``verdict`` as the response to the request ``uid``."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "reason": verdict.reason, "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    answer = {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}
    return ReviewAnswer(status=200, body=json.dumps(answer).encode())


def _bad_review(message: str) -> ReviewAnswer:
    log.warning("admission_review_malformed", error=message)
    return ReviewAnswer(status=400, body=f"{message}\n".encode(), content_type="text/plain")


def admit(request: Mapping[str, Any], *, scheduler_names: Collection[str]) -> Verdict:
    """The verdict on one admission request (the ``request`` of an AdmissionReview)."""
    resource = request.get("resource")
    if resource != {"group": "", "version": "v1", "resource": "pods"} or request.get("subResource"):
        return ALLOW  # a configuration that sends more than pods is not ours to police
    if request.get("operation") != "CREATE":
        return ALLOW
    pod = request.get("object")
    problem = _shape_problem(pod)
    if problem is not None:
        log.warning("admission_pod_malformed", namespace=str(request.get("namespace")), error=problem)
        return Verdict(allowed=False, code=400, reason="BadRequest", message=f"malformed pod: {problem}")
    assert isinstance(pod, dict)
    if (pod["spec"].get("schedulerName") or names.DEFAULT_SCHEDULER) not in scheduler_names:
        return ALLOW
    who = _display_name(pod, request)
    devices = nvfractions.device_keys(pod["metadata"].get("annotations") or {})
    if devices:
        message = (
            f"{devices[0]} is the binder's: it records the devices a placed pod was given (KAI's NvFractions), and a "
            "pod may not be created with it; remove it"
        )
        log.info("gpu_request_refused", pod=who, field=devices[0], message=message)
        return Verdict(allowed=False, code=422, reason="Invalid", message=message)
    parsed = gpurequest.parse(pod)
    if isinstance(parsed, AnnotationProblem):
        log.info("gpu_request_refused", pod=who, field=parsed.field, message=parsed.message)
        return Verdict(allowed=False, code=422, reason="Invalid", message=parsed.message)
    if not parsed.is_share:
        return ALLOW
    configmap = configmap_name(pod, request_uid=str(request.get("uid") or ""))
    patch, warnings = share_patch(pod, chosen=parsed.container, configmap=configmap)
    log.info("gpu_share_admitted", pod=who, configmap=configmap, container=parsed.container, devices=parsed.devices)
    return Verdict(allowed=True, patch=patch, warnings=warnings)


def configmap_name(pod: Mapping[str, Any], *, request_uid: str) -> str:
    """The pod's GPU ConfigMap: its name (or ``generateName``) and a digest of the request's uid, a DNS name."""
    metadata = pod.get("metadata") or {}
    base = str(metadata.get("name") or metadata.get("generateName") or "pod").lower()
    labels = (label.strip("-") for label in _NOT_DNS.sub("-", base).split("."))
    base = ".".join(label for label in labels if label)
    suffix = f"-gpu-{hashlib.sha256(request_uid.encode()).hexdigest()[:_DIGEST_CHARS]}"
    base = base[: _CONFIGMAP_NAME_MAX - len(suffix)].rstrip("-.") or "pod"
    return base + suffix


def share_patch(
    pod: Mapping[str, Any], *, chosen: str | None, configmap: str
) -> tuple[tuple[Mapping[str, Any], ...], tuple[str, ...]]:
    """The JSONPatch that wires a share into ``pod``, and the warnings for values of the pod's that it replaces."""
    operations: list[Mapping[str, Any]] = []
    warnings: list[str] = []
    annotations = pod["metadata"].get("annotations")
    if annotations is None:
        operations.append(
            {"op": "add", "path": "/metadata/annotations", "value": {names.GPU_CONFIGMAP_ANNOTATION: configmap}}
        )
    else:
        operations.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_pointer(names.GPU_CONFIGMAP_ANNOTATION)}",
                "value": configmap,
            }
        )
    spec = pod["spec"]
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or []):
            if field == "containers" and container["name"] == chosen:
                wanted = {
                    name: _from_configmap(name, configmap)
                    for name in (names.VISIBLE_DEVICES_ENV, names.GPU_PORTION_ENV)
                }
            else:
                wanted = {names.VISIBLE_DEVICES_ENV: {"name": names.VISIBLE_DEVICES_ENV, "value": names.NO_DEVICES}}
            path = f"/spec/{field}/{index}/env"
            env = container.get("env")
            if env is None:
                operations.append({"op": "add", "path": path, "value": list(wanted.values())})
                continue
            for name, entry in wanted.items():
                # Every entry of the name: the kubelet lets the last of duplicates win.
                found = [position for position, existing in enumerate(env) if existing["name"] == name]
                for position in found:
                    if env[position] != entry:
                        operations.append({"op": "replace", "path": f"{path}/{position}", "value": entry})
                        warnings.append(
                            f"{field[:-1]} {container['name']!r}: {name} is set by Quotient's GPU sharing; the pod's "
                            "own value was replaced"
                        )
                if not found:
                    operations.append({"op": "add", "path": f"{path}/-", "value": entry})
    if not spec.get("runtimeClassName"):
        operations.append({"op": "add", "path": "/spec/runtimeClassName", "value": names.NVIDIA_RUNTIME_CLASS})
    return tuple(operations), tuple(dict.fromkeys(warnings))


def _from_configmap(name: str, configmap: str) -> Mapping[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": name}}}


def _pointer(key: str) -> str:
    """A key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _display_name(pod: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    metadata = pod["metadata"]
    name = metadata.get("name") or f"{metadata.get('generateName') or ''}*"
    return f"{request.get('namespace') or metadata.get('namespace') or ''}/{name}"


def _shape_problem(pod: object) -> str | None:
    """Why ``pod`` cannot be read as a pod (the fields that the GPU reading and the patch touch), or None."""
    if not isinstance(pod, dict):
        return "the request carries no pod object"
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(metadata, dict):
        return "metadata is not an object"
    for key in ("name", "generateName", "namespace"):
        if not isinstance(metadata.get(key) or "", str):
            return f"metadata.{key} is not a string"
    annotations = metadata.get("annotations")
    if annotations is not None and not (
        isinstance(annotations, dict) and all(isinstance(value, str) for value in annotations.values())
    ):
        return "metadata.annotations must map names to strings"
    if not isinstance(spec, dict):
        return "spec is not an object"
    for key in ("schedulerName", "runtimeClassName"):
        if not isinstance(spec.get(key) or "", str):
            return f"spec.{key} is not a string"
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return "spec.containers is not a non-empty list"
    for field in ("containers", "initContainers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            return f"spec.{field} is not a list"
        for index, container in enumerate(items):
            where = f"spec.{field}[{index}]"
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                return f"{where} has no name"
            env = container.get("env")
            if env is not None and not (
                isinstance(env, list) and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in env)
            ):
                return f"{where}.env is not a list of named variables"
            resources = container.get("resources")
            if resources is not None and not (
                isinstance(resources, dict)
                and all(isinstance(resources.get(part) or {}, dict) for part in ("limits", "requests"))
            ):
                return f"{where}.resources is not an object of limits and requests"
    return None

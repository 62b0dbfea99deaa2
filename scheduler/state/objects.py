"""Kubernetes objects (JSON dicts) to the placement model's values. Pure.

Everything the API hands us is untrusted input: a Queue with a quota of ``"lots"``, a node without allocatable, a
pod with a malformed request. Each reader returns a model value, or a ``Problem`` that says what is wrong in the
object's own terms, so the caller can report it (a condition, an event, a metric) and carry on with the rest.

Units at this edge (KAI-COMPAT.md): Queue GPU amounts are devices (fractions allowed) -> milli-GPU; CPU is
millicores already; memory is MB (10^6 bytes) -> bytes. ``-1`` keeps its meaning; unset is 0.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from collections.abc import Mapping, Sequence
from typing import Any

from common import quantities
from common.errors import QuantityError
from common.resources import Resources
from scheduler.kube import gpurequest
from scheduler.placement import model

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, set by GPU Feature Discovery
GPU_DEVICES_ANNOTATION = "quotient.dev/gpu-devices"
GPU_SHARE_ANNOTATION = "quotient.dev/gpu-share"
GPU_GROUP_LABEL = "runai-gpu-group"
GPU_GROUPS_ANNOTATION = "quotient.dev/gpu-groups"
"""Every GPU group of a pod sharing several devices, comma-separated (the label can name only one)."""


def pod_gpu_groups(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The GPU groups a sharing pod is in, one per device: the annotation, else the KAI label."""
    meta = _meta(pod)
    listed = _dict(meta.get("annotations")).get(GPU_GROUPS_ANNOTATION)
    if isinstance(listed, str) and listed.strip():
        return tuple(part.strip() for part in listed.split(",") if part.strip())
    label = _dict(meta.get("labels")).get(GPU_GROUP_LABEL)
    return (str(label),) if label else ()


MB = 10**6


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Why an object could not be read: ``field`` is the path inside the object."""

    field: str
    message: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def timestamp_ns(text: object) -> int:
    """An RFC 3339 timestamp (``2026-11-22T00:00:00Z``) in ns since the epoch; 0 when absent or malformed."""
    if not isinstance(text, str) or not text:
        return 0
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


# --- queues -------------------------------------------------------------------------------------------------------


def _queue_amount(value: object, kind: str, field: str) -> int | Problem:
    if value is None:
        return 0
    if isinstance(value, bool):
        return Problem(field=field, message=f"{value!r} is not a number")
    try:
        number = decimal.Decimal(str(value))
    except decimal.InvalidOperation:
        return Problem(field=field, message=f"{value!r} is not a number (use -1 for unlimited)")
    if not number.is_finite():
        return Problem(field=field, message=f"{value!r} is not a number")
    if number == -1:
        return model.UNLIMITED
    if number < 0:
        return Problem(field=field, message=f"{value!r} is negative; only -1 (unlimited) may be")
    if kind == "gpu":
        return int((number * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    if kind == "memory":
        return int(number * MB)
    return int(number)


def _queue_resource(spec: Mapping[str, Any], kind: str) -> model.QueueResource | Problem:
    section = _dict(_dict(spec.get("resources")).get(kind))
    values: dict[str, int] = {}
    for key, attr in (("quota", "quota"), ("limit", "limit")):
        amount = _queue_amount(section.get(key), kind, f"spec.resources.{kind}.{key}")
        if isinstance(amount, Problem):
            return amount
        values[attr] = amount
    weight = section.get("overQuotaWeight")
    if weight is None:
        weight_value = 0
    elif isinstance(weight, int | float) and not isinstance(weight, bool) and weight >= 0:
        weight_value = int(weight)
    else:
        return Problem(field=f"spec.resources.{kind}.overQuotaWeight", message=f"{weight!r} is not a weight >= 0")
    return model.QueueResource(quota=values["quota"], limit=values["limit"], over_quota_weight=weight_value)


def _duration(value: object, field: str) -> int | Problem:
    if value is None:
        return 0
    try:
        return quantities.parse_duration_ns(value if isinstance(value, int | float) else str(value))
    except QuantityError as exc:
        return Problem(field=field, message=str(exc))


def queue_from(obj: Mapping[str, Any]) -> model.Queue | Problem:
    """A ``scheduling.run.ai/v2`` Queue."""
    meta = _meta(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return Problem(field="metadata.name", message="missing")
    spec = _dict(obj.get("spec"))
    parent = spec.get("parentQueue")
    if parent is not None and not isinstance(parent, str):
        return Problem(field="spec.parentQueue", message=f"{parent!r} is not a queue name")
    priority = spec.get("priority", 100)
    if not isinstance(priority, int) or isinstance(priority, bool):
        return Problem(field="spec.priority", message=f"{priority!r} is not an integer")
    resources: dict[str, model.QueueResource] = {}
    for kind in ("gpu", "cpu", "memory"):
        resource = _queue_resource(spec, kind)
        if isinstance(resource, Problem):
            return resource
        resources[kind] = resource
    preempt = _duration(spec.get("preemptMinRuntime"), "spec.preemptMinRuntime")
    reclaim = _duration(spec.get("reclaimMinRuntime"), "spec.reclaimMinRuntime")
    if isinstance(preempt, Problem):
        return preempt
    if isinstance(reclaim, Problem):
        return reclaim
    return model.Queue(
        name=model.QueueName(name),
        parent=model.QueueName(parent) if parent else None,
        priority=priority,
        created_ns=timestamp_ns(meta.get("creationTimestamp")),
        gpu=resources["gpu"],
        cpu=resources["cpu"],
        memory=resources["memory"],
        preempt_min_runtime_ns=preempt,
        reclaim_min_runtime_ns=reclaim,
    )


# --- pods ---------------------------------------------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any]) -> tuple[int, int] | Problem:
    resources = _dict(container.get("resources"))
    requests, limits = _dict(resources.get("requests")), _dict(resources.get("limits"))
    name = container.get("name")
    try:
        cpu_raw = requests.get("cpu", limits.get("cpu"))
        memory_raw = requests.get("memory", limits.get("memory"))
        cpu = quantities.parse_millicores(str(cpu_raw)) if cpu_raw is not None else 0
        memory = quantities.parse_bytes(str(memory_raw)) if memory_raw is not None else 0
    except QuantityError as exc:
        return Problem(field=f"spec.containers[{name}].resources", message=str(exc))
    return cpu, memory


def pod_requests(pod: Mapping[str, Any]) -> Resources | Problem:
    """CPU, memory and one pod slot as the kubelet counts them: the larger of the sum over the containers and the
    largest init container, plus the pod overhead. GPUs are left to :func:`gpurequest.parse`."""
    spec = _dict(pod.get("spec"))
    cpu = memory = 0
    for container in _list(spec.get("containers")):
        amounts = _container_requests(_dict(container))
        if isinstance(amounts, Problem):
            return amounts
        cpu, memory = cpu + amounts[0], memory + amounts[1]
    for container in _list(spec.get("initContainers")):
        amounts = _container_requests(_dict(container))
        if isinstance(amounts, Problem):
            return amounts
        cpu, memory = max(cpu, amounts[0]), max(memory, amounts[1])
    overhead = _dict(spec.get("overhead"))
    try:
        cpu += quantities.parse_millicores(str(overhead["cpu"])) if "cpu" in overhead else 0
        memory += quantities.parse_bytes(str(overhead["memory"])) if "memory" in overhead else 0
    except QuantityError as exc:
        return Problem(field="spec.overhead", message=str(exc))
    return Resources(milli_cpu=cpu, memory_bytes=memory, pods=1)


def _requirement(expression: Mapping[str, Any]) -> model.Requirement | None:
    try:
        operator = model.Operator(str(expression.get("operator")))
    except ValueError:
        return None
    values = tuple(str(value) for value in _list(expression.get("values")))
    return model.Requirement(key=str(expression.get("key") or ""), operator=operator, values=values)


def _affinity(spec: Mapping[str, Any]) -> tuple[model.AffinityTerm, ...] | Problem:
    required = _dict(
        _dict(_dict(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    terms = []
    for term in _list(required.get("nodeSelectorTerms")):
        expressions = []
        for expression in _list(_dict(term).get("matchExpressions")):
            requirement = _requirement(_dict(expression))
            if requirement is None:
                return Problem(
                    field="spec.affinity.nodeAffinity",
                    message=f"operator {_dict(expression).get('operator')!r} is not one of In, NotIn, Exists, "
                    "DoesNotExist, Gt, Lt",
                )
            expressions.append(requirement)
        if expressions:
            terms.append(model.AffinityTerm(expressions=tuple(expressions)))
    return tuple(terms)


def _tolerations(spec: Mapping[str, Any]) -> tuple[model.Toleration, ...]:
    out = []
    for raw in _list(spec.get("tolerations")):
        toleration = _dict(raw)
        try:
            operator = model.TolerationOperator(str(toleration.get("operator") or "Equal"))
        except ValueError:
            continue
        effect_text = toleration.get("effect")
        try:
            effect = model.TaintEffect(str(effect_text)) if effect_text else None
        except ValueError:
            continue
        out.append(
            model.Toleration(
                key=str(toleration.get("key") or ""),
                operator=operator,
                value=str(toleration.get("value") or ""),
                effect=effect,
            )
        )
    return tuple(out)


def bound_devices(pod: Mapping[str, Any]) -> tuple[int, ...]:
    """The device indexes the binder recorded on the pod (``quotient.dev/gpu-devices: "0,3"``)."""
    text = _dict(_meta(pod).get("annotations")).get(GPU_DEVICES_ANNOTATION)
    if not isinstance(text, str) or not text.strip():
        return ()
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.isascii() and part.isdigit():
            out.append(int(part))
    return tuple(out)


def is_terminated(pod: Mapping[str, Any]) -> bool:
    return _dict(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def pod_from(
    pod: Mapping[str, Any], request: gpurequest.GpuRequest, *, subgroup: str | None = None
) -> model.Pod | Problem:
    """A pod of ours as a member of its group (pending, or running on its node with its devices)."""
    meta = _meta(pod)
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    requests = pod_requests(pod)
    if isinstance(requests, Problem):
        return requests
    affinity = _affinity(spec)
    if isinstance(affinity, Problem):
        return affinity
    share = None
    if request.is_share:
        share = model.GpuShare(milli_gpu=request.milli_gpu, memory_bytes=request.memory_bytes, devices=request.devices)
    else:
        requests = dataclasses.replace(requests, milli_gpu=request.whole * model.MILLI_GPU_PER_DEVICE)
    node_name = spec.get("nodeName")
    phase_text = status.get("phase")
    if phase_text == "Succeeded":
        phase = model.PodPhase.SUCCEEDED
    elif node_name:
        phase = model.PodPhase.RUNNING
    else:
        phase = model.PodPhase.PENDING
    pod_annotations = _dict(meta.get("annotations"))
    devices = bound_devices(pod) if node_name else ()
    allotted = 0
    if share is not None and node_name:
        recorded = pod_annotations.get(GPU_SHARE_ANNOTATION)
        allotted = int(recorded) if isinstance(recorded, str) and recorded.isascii() and recorded.isdigit() else 0
        allotted = allotted or share.milli_gpu
    groups = tuple(model.GpuGroupId(group) for group in pod_gpu_groups(pod)) if share is not None else ()
    return model.Pod(
        uid=model.PodUid(str(meta.get("uid") or "")),
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or "default"),
        requests=requests,
        share=share,
        node_selector=tuple(sorted((str(k), str(v)) for k, v in _dict(spec.get("nodeSelector")).items())),
        affinity=affinity,
        tolerations=_tolerations(spec),
        created_ns=timestamp_ns(meta.get("creationTimestamp")),
        phase=phase,
        subgroup=subgroup,
        node=model.NodeName(str(node_name)) if node_name else None,
        devices=devices,
        gpu_groups=groups,
        allotted_milli_gpu=allotted,
        started_ns=timestamp_ns(status.get("startTime")) or None,
        nominated_node=model.NodeName(str(status["nominatedNodeName"])) if status.get("nominatedNodeName") else None,
    )


# --- nodes --------------------------------------------------------------------------------------------------------


def node_capacity(node: Mapping[str, Any]) -> tuple[Resources, int] | Problem:
    """Allocatable CPU, memory and pod slots, and the number of GPUs."""
    allocatable = _dict(_dict(node.get("status")).get("allocatable"))
    try:
        cpu = quantities.parse_millicores(str(allocatable.get("cpu", "0")))
        memory = quantities.parse_bytes(str(allocatable.get("memory", "0")))
        pods = quantities.parse_count(str(allocatable.get("pods", "110")))
        gpus = quantities.parse_count(str(allocatable.get(GPU_RESOURCE, "0")))
    except QuantityError as exc:
        return Problem(field="status.allocatable", message=str(exc))
    return Resources(milli_cpu=cpu, memory_bytes=memory, milli_gpu=gpus * model.MILLI_GPU_PER_DEVICE, pods=pods), gpus


def node_ready(node: Mapping[str, Any]) -> bool:
    for condition in _list(_dict(node.get("status")).get("conditions")):
        condition = _dict(condition)
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def node_taints(node: Mapping[str, Any]) -> tuple[model.Taint, ...]:
    out = []
    for raw in _list(_dict(node.get("spec")).get("taints")):
        taint = _dict(raw)
        try:
            effect = model.TaintEffect(str(taint.get("effect")))
        except ValueError:
            continue
        out.append(model.Taint(key=str(taint.get("key") or ""), value=str(taint.get("value") or ""), effect=effect))
    return tuple(out)


def device_memory_bytes(node: Mapping[str, Any]) -> int:
    """Per-device memory from the ``nvidia.com/gpu.memory`` label (MiB); 0 when unknown."""
    text = _dict(_meta(node).get("labels")).get(GPU_MEMORY_LABEL)
    if isinstance(text, str) and text.isascii() and text.isdigit():
        return int(text) * quantities.MIB
    return 0

"""A node's JSON to a ``NodeRecord``: what placement reads of it, and nothing that changes with every heartbeat.

The kubelet rewrites a node's status every few seconds (heartbeats, images, addresses); none of that matters to
placement, so the record leaves it out and two records of the same node compare equal until something placement
reads (labels, taints, cordon, allocatable, readiness) changes. Device memory comes from GPU Feature Discovery's
``nvidia.com/gpu.memory`` label (MiB) until telemetry measures it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names, quantities
from common.errors import QuantityError
from common.resources import Resources
from scheduler.objects import fields
from scheduler.objects.records import NodeRecord, Problem
from scheduler.placement import model


def decode(obj: Mapping[str, Any]) -> NodeRecord | None:
    """The record of a node; None for an object without a name."""
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    labels = fields.string_map(meta.get("labels"))
    spec = fields.mapping(obj.get("spec"))
    capacity = _capacity(fields.mapping(fields.mapping(obj.get("status")).get("allocatable")))
    return NodeRecord(
        name=name,
        uid=fields.text(meta.get("uid")),
        resource_version=fields.text(meta.get("resourceVersion")),
        capacity=capacity[0] if isinstance(capacity, tuple) else capacity,
        gpu_count=capacity[1] if isinstance(capacity, tuple) else 0,
        labels=labels,
        taints=_taints(spec),
        ready=_ready(fields.mapping(obj.get("status"))),
        unschedulable=bool(spec.get("unschedulable")),
        device_memory_bytes=_device_memory(labels),
        health_cleared_ns=_health_cleared(fields.string_map(meta.get("annotations"))),
    )


def _health_cleared(annotations: Mapping[str, str]) -> int | Problem:
    """The operator's clearing time in ns (0: none), or a Problem when it is not an RFC 3339 time (the reports keep
    counting, and the operator is told)."""
    value = annotations.get(names.GPU_HEALTH_CLEARED_ANNOTATION)
    if value is None or not value.strip():
        return 0
    cleared_ns = fields.timestamp_ns(value.strip())
    if cleared_ns <= 0:
        return Problem(
            field=f"metadata.annotations[{names.GPU_HEALTH_CLEARED_ANNOTATION}]",
            message=f"{value!r} is not an RFC 3339 time (like 2026-11-26T17:00:00Z); the GPU health reports of this "
            "node are not cleared",
        )
    return cleared_ns


def _capacity(allocatable: Mapping[str, Any]) -> tuple[Resources, int] | Problem:
    try:
        cpu = quantities.parse_millicores(str(allocatable.get("cpu", "0")))
        memory = quantities.parse_bytes(str(allocatable.get("memory", "0")))
        pods = quantities.parse_count(str(allocatable.get("pods", "110")))
        gpus = quantities.parse_count(str(allocatable.get(names.GPU_RESOURCE, "0")))
    except QuantityError as exc:
        return Problem(field="status.allocatable", message=str(exc))
    return Resources(milli_cpu=cpu, memory_bytes=memory, milli_gpu=gpus * model.MILLI_GPU_PER_DEVICE, pods=pods), gpus


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in fields.sequence(status.get("conditions")):
        condition = fields.mapping(condition)
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _taints(spec: Mapping[str, Any]) -> tuple[model.Taint, ...]:
    out = []
    for raw in fields.sequence(spec.get("taints")):
        taint = fields.mapping(raw)
        try:
            effect = model.TaintEffect(str(taint.get("effect")))
        except ValueError:
            continue
        out.append(model.Taint(key=str(taint.get("key") or ""), value=str(taint.get("value") or ""), effect=effect))
    return tuple(out)


def _device_memory(labels: Mapping[str, str]) -> int:
    mib = fields.whole_number(labels.get(names.GPU_MEMORY_LABEL))
    return mib * quantities.MIB if mib is not None else 0

"""A ``scheduling.run.ai/v2`` Queue's JSON to a ``QueueRecord``: the model's ``Queue``, or what is wrong with it.

Units at this edge (KAI-COMPAT.md): GPU amounts are devices (fractions allowed) -> milli-GPU; CPU is millicores
already; memory is MB (10^6 bytes) -> bytes. ``-1`` keeps its meaning (unlimited); unset is 0. A Queue with a quota
of ``"lots"`` becomes a ``Problem`` naming the field, so the snapshot leaves it out with an ``Invalid`` condition
and its groups wait with ``QueueDoesNotExist`` instead of the scheduler stopping.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import Any

from common import names, quantities
from common.errors import QuantityError
from scheduler.objects import fields
from scheduler.objects.records import Problem, QueueRecord
from scheduler.placement import model

MB = 10**6


def decode(obj: Mapping[str, Any]) -> QueueRecord | None:
    """The record of a Queue; None for an object without a name."""
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    annotations = fields.string_map(meta.get("annotations"))
    return QueueRecord(
        name=name,
        uid=fields.text(meta.get("uid")),
        resource_version=fields.text(meta.get("resourceVersion")),
        queue=queue_from(obj),
        overuse_policy=annotations.get(names.OVERUSE_POLICY_ANNOTATION),
    )


def _amount(value: object, kind: str, field: str) -> int | Problem:
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


def _resource(spec: Mapping[str, Any], kind: str) -> model.QueueResource | Problem:
    section = fields.mapping(fields.mapping(spec.get("resources")).get(kind))
    values: dict[str, int] = {}
    for key in ("quota", "limit"):
        amount = _amount(section.get(key), kind, f"spec.resources.{kind}.{key}")
        if isinstance(amount, Problem):
            return amount
        values[key] = amount
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
    """The model's ``Queue`` from a Queue object, or the first problem found in it."""
    meta = fields.meta(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return Problem(field="metadata.name", message="missing")
    spec = fields.mapping(obj.get("spec"))
    parent = spec.get("parentQueue")
    if parent is not None and not isinstance(parent, str):
        return Problem(field="spec.parentQueue", message=f"{parent!r} is not a queue name")
    priority = spec.get("priority", 100)
    if not isinstance(priority, int) or isinstance(priority, bool):
        return Problem(field="spec.priority", message=f"{priority!r} is not an integer")
    resources: dict[str, model.QueueResource] = {}
    for kind in ("gpu", "cpu", "memory"):
        resource = _resource(spec, kind)
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
        created_ns=fields.timestamp_ns(meta.get("creationTimestamp")),
        gpu=resources["gpu"],
        cpu=resources["cpu"],
        memory=resources["memory"],
        preempt_min_runtime_ns=preempt,
        reclaim_min_runtime_ns=reclaim,
    )

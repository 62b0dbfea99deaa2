"""A PodGroup's and a PriorityClass's JSON to records; a group's priority and preemptibility as KAI decides them.

A PodGroup's ``minMember`` must be a whole number of at least 1 (anything else reads as 1: a gang of one), its
``queue`` may be empty (the snapshot then uses ``default-queue``, the telemetry the pod's queue label), and its
subgroups keep only entries with a name and an integer minimum. KAI's rule for priority: the cluster's
PriorityClass of that name, else KAI's built-in classes, else ``train``'s 50; a priority of at least 100 is
non-preemptible unless ``spec.preemptibility`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names
from scheduler.objects import fields
from scheduler.objects.records import PodGroupRecord, PriorityClassRecord
from scheduler.placement import model


def decode(obj: Mapping[str, Any]) -> PodGroupRecord | None:
    """The record of a PodGroup; None for an object without a name."""
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    spec = fields.mapping(obj.get("spec"))
    min_member = spec.get("minMember")
    preemptibility = spec.get("preemptibility")
    return PodGroupRecord(
        namespace=fields.text(meta.get("namespace")),
        name=name,
        uid=fields.text(meta.get("uid")),
        resource_version=fields.text(meta.get("resourceVersion")),
        created_ns=fields.timestamp_ns(meta.get("creationTimestamp")),
        min_member=min_member if isinstance(min_member, int) and min_member >= 1 else 1,
        queue=str(spec.get("queue") or ""),
        priority_class=str(spec.get("priorityClassName") or names.DEFAULT_PRIORITY_CLASS),
        preemptibility=preemptibility if preemptibility in (names.PREEMPTIBLE, names.NON_PREEMPTIBLE) else None,
        subgroups=tuple(
            model.SubGroup(name=str(sub.get("name")), min_member=int(sub.get("minMember") or 1))
            for sub in fields.sequence(spec.get("subGroups"))
            if isinstance(sub, dict) and sub.get("name") and isinstance(sub.get("minMember", 1), int)
        ),
    )


def decode_priority_class(obj: Mapping[str, Any]) -> PriorityClassRecord | None:
    """The record of a PriorityClass; None for an object without a name."""
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    value = obj.get("value")
    return PriorityClassRecord(
        name=name,
        uid=fields.text(meta.get("uid")),
        resource_version=fields.text(meta.get("resourceVersion")),
        value=value if isinstance(value, int) and not isinstance(value, bool) else None,
    )


def priority_value(priority_class: str, known: Mapping[str, int]) -> int:
    """The numeric priority of a class: the cluster's PriorityClasses, then KAI's defaults, else ``train``'s 50."""
    if priority_class in known:
        return known[priority_class]
    return names.KAI_PRIORITY_CLASSES.get(priority_class, names.KAI_PRIORITY_CLASSES[names.DEFAULT_PRIORITY_CLASS])


def is_preemptible(preemptibility: str | None, priority: int) -> bool:
    """KAI: priority >= 100 is non-preemptible unless the preemptibility says otherwise."""
    if preemptibility is not None:
        return preemptibility == names.PREEMPTIBLE
    return priority < names.NON_PREEMPTIBLE_FROM

"""A PodGroup's and a PriorityClass's JSON to records; a group's priority and preemptibility as KAI decides them.

A PodGroup is read with KAI v0.18's meaning (KAI's ``podgroup_types.go`` and its PodGroup webhook):

- ``spec.minMember``: the gang size, a whole number >= 0. KAI's 0 is "no gang requirement" (every pod elastic);
  ``min_member`` reads it, like an unset or unreadable value, as 1, and ``min_member_declared`` keeps what was
  written (the snapshot passes 0 on to the engine as "no minimum").
- ``spec.minSubGroup`` and ``spec.subGroups[] {name, parent, minMember, minSubGroup}``: KAI's subgroup tree. A leaf
  holds pods and needs its ``minMember``; a mid-level subgroup (some entry names it as ``parent``) needs
  ``minSubGroup`` of its direct children (all of them when unset), and so does the PodGroup of its top-level
  subgroups. KAI's PodGroup webhook rules (``podgrouprules``) are checked here too: what it refuses (both minimums
  on one level, a missing parent, a cycle, a duplicate name, a leaf with ``minSubGroup`` or without ``minMember``)
  is a ``Problem`` and the rest of the tree is still read; what it only warns of (a ``minSubGroup`` above the number
  of children) or refuses only on creation (a mid-level ``minMember``, which its scheduler never reads) is not, as
  KAI's scheduler reads such a spec. :func:`findings` hands all of it, with its severity, to the webhook.
- ``spec.preemptionDelay`` (else the ``kai.scheduler/preemption-delay`` annotation): a Go duration;
  ``kai.scheduler/last-eviction-timestamp`` re-arms it. A negative one is no delay (KAI's scheduler), with a warning.
- ``spec.stalenessGracePeriod`` (else the ``kai.scheduler/staleness-grace-period`` annotation): a Go duration,
  negative meaning never stale.

A value that cannot be read becomes a ``Problem`` naming its field and keeps the field's default: one bad PodGroup
never stops the scheduler. ``queue`` may be empty (the snapshot then uses ``default-queue``, the telemetry the pod's
queue label). KAI's rule for priority: the cluster's PriorityClass of that name, else KAI's built-in classes, else
``train``'s 50; a priority of at least 100 is non-preemptible unless ``spec.preemptibility`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names
from scheduler.objects import durations, fields, podgrouprules
from scheduler.objects.records import PodGroupRecord, PriorityClassRecord, Problem


def decode(obj: Mapping[str, Any]) -> PodGroupRecord | None:
    """The record of a PodGroup; None for an object without a name."""
    read = _read(obj)
    return read[0] if read is not None else None


def findings(obj: Mapping[str, Any]) -> tuple[podgrouprules.Finding, ...]:
    """Everything wrong with a PodGroup by KAI's rules and the schema's types, each with its severity: what the
    PodGroup webhook refuses or warns of. The record's ``problems`` are those that stop the group."""
    read = _read(obj)
    return read[1] if read is not None else ()


def _read(obj: Mapping[str, Any]) -> tuple[PodGroupRecord, tuple[podgrouprules.Finding, ...]] | None:
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    spec = fields.mapping(obj.get("spec"))
    annotations = fields.string_map(meta.get("annotations"))
    found: list[podgrouprules.Finding] = []
    min_member = podgrouprules.count(spec, "minMember", "spec.minMember", found)
    min_subgroup = podgrouprules.count(spec, "minSubGroup", "spec.minSubGroup", found)
    entries = podgrouprules.read_subgroups(spec.get("subGroups"), found)
    podgrouprules.check(min_member=min_member, min_subgroup=min_subgroup, entries=entries, findings=found)
    preemptibility = spec.get("preemptibility")
    if preemptibility is not None and preemptibility not in (names.PREEMPTIBLE, names.NON_PREEMPTIBLE):
        found.append(
            podgrouprules.Finding(
                field="spec.preemptibility",
                message=f"{preemptibility!r} is not {names.PREEMPTIBLE!r} or {names.NON_PREEMPTIBLE!r}; the "
                "priority decides",
                severity=podgrouprules.Severity.UNREADABLE,
            )
        )
    delay = _duration(
        spec.get("preemptionDelay"),
        annotations.get(names.PREEMPTION_DELAY_ANNOTATION),
        field="spec.preemptionDelay",
        annotation=names.PREEMPTION_DELAY_ANNOTATION,
        negative_allowed=False,
        findings=found,
    )
    grace = _duration(
        spec.get("stalenessGracePeriod"),
        annotations.get(names.STALENESS_GRACE_ANNOTATION),
        field="spec.stalenessGracePeriod",
        annotation=names.STALENESS_GRACE_ANNOTATION,
        negative_allowed=True,
        findings=found,
    )
    last_eviction = _last_eviction(annotations, found)
    record = PodGroupRecord(
        namespace=fields.text(meta.get("namespace")),
        name=name,
        uid=fields.text(meta.get("uid")),
        resource_version=fields.text(meta.get("resourceVersion")),
        created_ns=fields.timestamp_ns(meta.get("creationTimestamp")),
        min_member=min_member if min_member else 1,
        queue=str(spec.get("queue") or ""),
        priority_class=str(spec.get("priorityClassName") or names.DEFAULT_PRIORITY_CLASS),
        preemptibility=preemptibility if preemptibility in (names.PREEMPTIBLE, names.NON_PREEMPTIBLE) else None,
        min_member_declared=min_member,
        min_subgroup=min_subgroup,
        subgroup_tree=tuple(entry.spec for entry in entries),
        preemption_delay_ns=delay or 0,
        last_eviction_ns=last_eviction,
        staleness_grace_ns=grace,
        problems=tuple(
            Problem(field=finding.field, message=finding.message) for finding in found if finding.severity.is_problem
        ),
    )
    return record, tuple(found)


# --- the parts ------------------------------------------------------------------------------------------------------


def _duration(
    value: object,
    annotation_value: str | None,
    *,
    field: str,
    annotation: str,
    negative_allowed: bool,
    findings: list[podgrouprules.Finding],
) -> int | None:
    """The spec field's Go duration, else the annotation's; None when neither is set or readable. A spec value that
    cannot be read is refused by the webhook (KAI's cannot decode it); an annotation's is left out with a warning."""
    for text, where in ((value, field), (annotation_value, f"metadata.annotations[{annotation}]")):
        if text is None:
            continue
        severity = podgrouprules.Severity.UNREADABLE if where == field else podgrouprules.Severity.IGNORED
        parsed = durations.parse_ns(text) if isinstance(text, str) else None
        if parsed is None:
            findings.append(
                podgrouprules.Finding(field=where, message=f"{text!r} is not {durations.FORMS}", severity=severity)
            )
            continue
        if parsed < 0 and not negative_allowed:
            # KAI decodes it and its scheduler waits for no delay: admitted with a warning, read as none.
            findings.append(
                podgrouprules.Finding(
                    field=where,
                    message=f"{text!r} is negative: no delay",
                    severity=podgrouprules.Severity.WARNING if where == field else severity,
                )
            )
            return None
        return parsed
    return None


def _last_eviction(annotations: Mapping[str, str], findings: list[podgrouprules.Finding]) -> int:
    text = annotations.get(names.LAST_EVICTION_ANNOTATION)
    if text is None:
        return 0
    moment = fields.timestamp_ns(text)
    if moment == 0:
        findings.append(
            podgrouprules.Finding(
                field=f"metadata.annotations[{names.LAST_EVICTION_ANNOTATION}]",
                message=f"{text!r} is not an RFC 3339 time such as 2026-07-12T10:33:43Z",
                severity=podgrouprules.Severity.IGNORED,
            )
        )
    return moment


# --- priority classes and the priority rule -------------------------------------------------------------------------


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

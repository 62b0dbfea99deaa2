"""A PodGroup's and a PriorityClass's JSON to records; a group's priority and preemptibility as KAI decides them.

A PodGroup is read with KAI v0.18's meaning (KAI's ``podgroup_types.go`` and its PodGroup webhook):

- ``spec.minMember``: the gang size, a whole number >= 0. KAI's 0 is "no gang requirement" (every pod elastic);
  ``min_member`` reads it, like an unset or unreadable value, as 1, and ``min_member_declared`` keeps what was
  written (the snapshot passes 0 on to the engine as "no minimum").
- ``spec.minSubGroup`` and ``spec.subGroups[] {name, parent, minMember, minSubGroup}``: KAI's subgroup tree. A leaf
  holds pods and needs its ``minMember``; a mid-level subgroup (some entry names it as ``parent``) needs
  ``minSubGroup`` of its direct children (all of them when unset), and so does the PodGroup of its top-level
  subgroups. What KAI's webhook refuses (both minimums on one level, a missing parent, a cycle, a duplicate name, a
  leaf with ``minSubGroup``, a mid-level subgroup with ``minMember``, a ``minSubGroup`` above the number of
  children) is a ``Problem`` here; the rest of the tree is still read.
- ``spec.preemptionDelay`` (else the ``kai.scheduler/preemption-delay`` annotation): a non-negative Go duration;
  ``kai.scheduler/last-eviction-timestamp`` re-arms it.
- ``spec.stalenessGracePeriod`` (else the ``kai.scheduler/staleness-grace-period`` annotation): a Go duration,
  negative meaning never stale.

A value that cannot be read becomes a ``Problem`` naming its field and keeps the field's default: one bad PodGroup
never stops the scheduler. ``queue`` may be empty (the snapshot then uses ``default-queue``, the telemetry the pod's
queue label). KAI's rule for priority: the cluster's PriorityClass of that name, else KAI's built-in classes, else
``train``'s 50; a priority of at least 100 is non-preemptible unless ``spec.preemptibility`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common import names
from scheduler.objects import durations, fields
from scheduler.objects.records import PodGroupRecord, PriorityClassRecord, Problem, SubGroupSpec


def decode(obj: Mapping[str, Any]) -> PodGroupRecord | None:
    """The record of a PodGroup; None for an object without a name."""
    meta = fields.meta(obj)
    name = fields.text(meta.get("name"))
    if not name:
        return None
    spec = fields.mapping(obj.get("spec"))
    annotations = fields.string_map(meta.get("annotations"))
    problems: list[Problem] = []
    min_member = _count(spec, "minMember", "spec.minMember", problems)
    min_subgroup = _count(spec, "minSubGroup", "spec.minSubGroup", problems)
    if min_member is not None and min_subgroup is not None:
        problems.append(
            Problem(
                field="spec.minSubGroup",
                message=f"minMember ({min_member}) and minSubGroup ({min_subgroup}) are mutually exclusive: set "
                "minMember for a number of pods or minSubGroup for a number of subgroups, not both",
            )
        )
    tree = _subgroup_tree(spec.get("subGroups"), problems)
    if min_subgroup is not None:
        roots = sum(1 for sub in tree if sub.parent is None)
        if min_subgroup > roots:
            problems.append(
                Problem(
                    field="spec.minSubGroup",
                    message=f"minSubGroup ({min_subgroup}) exceeds the number of top-level subgroups ({roots})",
                )
            )
    preemptibility = spec.get("preemptibility")
    if preemptibility is not None and preemptibility not in (names.PREEMPTIBLE, names.NON_PREEMPTIBLE):
        problems.append(
            Problem(
                field="spec.preemptibility",
                message=f"{preemptibility!r} is not {names.PREEMPTIBLE!r} or {names.NON_PREEMPTIBLE!r}; the "
                "priority decides",
            )
        )
    delay = _duration(
        spec.get("preemptionDelay"),
        annotations.get(names.PREEMPTION_DELAY_ANNOTATION),
        field="spec.preemptionDelay",
        annotation=names.PREEMPTION_DELAY_ANNOTATION,
        negative_allowed=False,
        problems=problems,
    )
    grace = _duration(
        spec.get("stalenessGracePeriod"),
        annotations.get(names.STALENESS_GRACE_ANNOTATION),
        field="spec.stalenessGracePeriod",
        annotation=names.STALENESS_GRACE_ANNOTATION,
        negative_allowed=True,
        problems=problems,
    )
    return PodGroupRecord(
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
        subgroup_tree=tree,
        preemption_delay_ns=delay or 0,
        last_eviction_ns=_last_eviction(annotations, problems),
        staleness_grace_ns=grace,
        problems=tuple(problems),
    )


# --- the parts ------------------------------------------------------------------------------------------------------


def _count(section: Mapping[str, Any], key: str, field: str, problems: list[Problem]) -> int | None:
    """A minimum (``minMember``, ``minSubGroup``): a whole number >= 0, None when unset or unreadable."""
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(Problem(field=field, message=f"{value!r} is not a whole number >= 0"))
        return None
    return value


def _duration(
    value: object,
    annotation_value: str | None,
    *,
    field: str,
    annotation: str,
    negative_allowed: bool,
    problems: list[Problem],
) -> int | None:
    """The spec field's Go duration, else the annotation's; None when neither is set or readable."""
    for text, where in ((value, field), (annotation_value, f"metadata.annotations[{annotation}]")):
        if text is None:
            continue
        parsed = durations.parse_ns(text) if isinstance(text, str) else None
        if parsed is None:
            problems.append(Problem(field=where, message=f"{text!r} is not {durations.FORMS}"))
            continue
        if parsed < 0 and not negative_allowed:
            problems.append(Problem(field=where, message=f"{text!r} is negative; the delay must be 0 or more"))
            continue
        return parsed
    return None


def _last_eviction(annotations: Mapping[str, str], problems: list[Problem]) -> int:
    text = annotations.get(names.LAST_EVICTION_ANNOTATION)
    if text is None:
        return 0
    moment = fields.timestamp_ns(text)
    if moment == 0:
        problems.append(
            Problem(
                field=f"metadata.annotations[{names.LAST_EVICTION_ANNOTATION}]",
                message=f"{text!r} is not an RFC 3339 time such as 2026-07-12T10:33:43Z",
            )
        )
    return moment


def _subgroup_tree(raw: object, problems: list[Problem]) -> tuple[SubGroupSpec, ...]:
    """The ``spec.subGroups`` entries that can be read, and a problem for each rule of KAI's that the tree breaks."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(Problem(field="spec.subGroups", message="is not a list of subgroups"))
        return ()
    entries: list[SubGroupSpec] = []
    positions: list[int] = []  # each entry's index in spec.subGroups, for the field of a problem
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"spec.subGroups[{index}]"
        entry = fields.mapping(item)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append(Problem(field=f"{where}.name", message="a subgroup needs a name"))
            continue
        if name in seen:
            problems.append(Problem(field=f"{where}.name", message=f"duplicate subgroup name {name!r}"))
            continue
        seen.add(name)
        parent = entry.get("parent")
        if parent is not None and not isinstance(parent, str):
            problems.append(Problem(field=f"{where}.parent", message=f"{parent!r} is not a subgroup name"))
            parent = None
        positions.append(index)
        entries.append(
            SubGroupSpec(
                name=name,
                parent=parent or None,
                min_member=_count(entry, "minMember", f"{where}.minMember", problems),
                min_subgroup=_count(entry, "minSubGroup", f"{where}.minSubGroup", problems),
            )
        )
    _check_tree(entries, positions, problems)
    return tuple(entries)


def _check_tree(entries: Sequence[SubGroupSpec], positions: Sequence[int], problems: list[Problem]) -> None:
    """KAI's rules for the tree (its PodGroup webhook): parents exist, no cycle, each level's minimum fits it."""
    by_name = {entry.name: entry for entry in entries}
    children: dict[str, list[str]] = {}
    for index, entry in zip(positions, entries, strict=True):
        if entry.parent is None:
            continue
        if entry.parent not in by_name:
            problems.append(
                Problem(
                    field=f"spec.subGroups[{index}].parent",
                    message=f"parent {entry.parent!r} of {entry.name!r} is not a subgroup of this PodGroup",
                )
            )
            continue
        children.setdefault(entry.parent, []).append(entry.name)
    for index, entry in zip(positions, entries, strict=True):
        ancestor, steps = entry.parent, 0
        while ancestor is not None and ancestor in by_name and steps <= len(entries):
            if ancestor == entry.name:
                problems.append(
                    Problem(
                        field=f"spec.subGroups[{index}].parent",
                        message=f"the parents of subgroup {entry.name!r} lead back to it: a cycle",
                    )
                )
                break
            ancestor, steps = by_name[ancestor].parent, steps + 1
    for index, entry in zip(positions, entries, strict=True):
        where = f"spec.subGroups[{index}]"
        kids = children.get(entry.name, [])
        if entry.min_member is not None and entry.min_subgroup is not None:
            problems.append(
                Problem(
                    field=f"{where}.minSubGroup",
                    message=f"subgroup {entry.name!r}: minMember and minSubGroup are mutually exclusive",
                )
            )
        elif not kids and entry.min_subgroup is not None:
            problems.append(
                Problem(
                    field=f"{where}.minSubGroup",
                    message=f"subgroup {entry.name!r} has no child subgroups; a leaf takes minMember, not minSubGroup",
                )
            )
        elif kids and entry.min_member is not None:
            problems.append(
                Problem(
                    field=f"{where}.minMember",
                    message=f"subgroup {entry.name!r} has child subgroups ({', '.join(kids)}); use minSubGroup",
                )
            )
        if kids and entry.min_subgroup is not None and entry.min_subgroup > len(kids):
            problems.append(
                Problem(
                    field=f"{where}.minSubGroup",
                    message=f"subgroup {entry.name!r}: minSubGroup ({entry.min_subgroup}) exceeds the number of "
                    f"its child subgroups ({len(kids)})",
                )
            )


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

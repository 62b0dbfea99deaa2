"""KAI's rules for a PodGroup's spec (its PodGroup validating webhook, ``pkg/apis/scheduling/v2alpha2/
podgroup_webhook.go``): what is refused, what is refused only on creation, and what is admitted with a warning.
Pure; one set of findings serves both lines of defence.

- The PodGroup webhook (``scheduler.kube.podgroupadmission``) refuses the findings that refuse and hands the others
  to the client as warnings, which kubectl prints.
- The decoder (``scheduler.objects.podgroups``) keeps the findings that refuse as the record's ``Problem``\\ s, so a
  PodGroup stored without the webhook (a cluster where it was not registered, an object older than it) has its
  pending pods kept out with the reason, as KAI's webhook would have kept the object out. What KAI only warns of
  does not stop a group: KAI's scheduler reads such a spec, and so does Quotient's.

KAI's rules, in its order: both ``minMember`` and ``minSubGroup`` at the top is refused; so is a duplicate subgroup
name, a ``parent`` that is no subgroup of the PodGroup, a cycle of parents and both minimums on one subgroup (KAI's
"structural" errors: when there is one, nothing else is checked). Then each subgroup: a leaf with ``minSubGroup``,
or without ``minMember``, is refused; a mid-level subgroup with ``minMember`` is refused on creation and warned of on
update (KAI keeps older objects updatable; its scheduler never reads that value); a ``minSubGroup`` above the number
of direct children, at the top or on a subgroup, is a warning (the group can never be satisfied, and waits). KAI
stops at the first structural error; Quotient names every one it finds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from scheduler.objects import fields
from scheduler.objects.records import SubGroupSpec


class Severity(enum.Enum):
    UNREADABLE = "unreadable"
    """A value that is not of its schema's type (a real API server's CRD schema refuses it first): refused, and the
    record reads the field's default."""
    REFUSED = "refused"
    """KAI's webhook refuses it on creation and on update."""
    REFUSED_ON_CREATE = "refused on create"
    """KAI's webhook refuses it on creation and warns of it on update."""
    WARNING = "warning"
    """Admitted with a warning."""
    IGNORED = "ignored"
    """A value outside the spec that cannot be read (an annotation): left out; the webhook warns of it."""

    @property
    def is_problem(self) -> bool:
        """Is it one of the record's ``Problem``\\ s: a spec KAI refuses (the snapshot keeps the group's pending pods
        out for it), or a value left out?"""
        return self in (Severity.UNREADABLE, Severity.REFUSED, Severity.IGNORED)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One thing wrong with a PodGroup: the path of the field at fault and what is wrong with it."""

    field: str
    message: str
    severity: Severity


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A ``spec.subGroups`` entry that could be read, and where it stands in the list."""

    index: int
    spec: SubGroupSpec
    written: frozenset[str] = frozenset()
    """The keys the entry carries, readable or not (a minimum written but unreadable is not also "missing")."""


def count(section: fields.Json, key: str, field: str, findings: list[Finding]) -> int | None:
    """A minimum (``minMember``, ``minSubGroup``): a whole number >= 0, None when unset or unreadable."""
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        findings.append(
            Finding(field=field, message=f"{value!r} is not a whole number >= 0", severity=Severity.UNREADABLE)
        )
        return None
    return value


def read_subgroups(raw: object, findings: list[Finding]) -> tuple[Entry, ...]:
    """The ``spec.subGroups`` entries that can be read (a duplicate name: the first), each fault a finding."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        findings.append(
            Finding(field="spec.subGroups", message="is not a list of subgroups", severity=Severity.UNREADABLE)
        )
        return ()
    entries: list[Entry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"spec.subGroups[{index}]"
        entry = fields.mapping(item)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            findings.append(
                Finding(field=f"{where}.name", message="a subgroup needs a name", severity=Severity.UNREADABLE)
            )
            continue
        if name in seen:
            findings.append(
                Finding(field=f"{where}.name", message=f"duplicate subgroup name {name!r}", severity=Severity.REFUSED)
            )
            continue
        seen.add(name)
        parent = entry.get("parent")
        if parent is not None and not isinstance(parent, str):
            findings.append(
                Finding(
                    field=f"{where}.parent", message=f"{parent!r} is not a subgroup name", severity=Severity.UNREADABLE
                )
            )
            parent = None
        spec = SubGroupSpec(
            name=name,
            parent=parent or None,
            min_member=count(entry, "minMember", f"{where}.minMember", findings),
            min_subgroup=count(entry, "minSubGroup", f"{where}.minSubGroup", findings),
        )
        entries.append(
            Entry(
                index=index, spec=spec, written=frozenset(str(key) for key, value in entry.items() if value is not None)
            )
        )
    return tuple(entries)


def check(
    *, min_member: int | None, min_subgroup: int | None, entries: Sequence[Entry], findings: list[Finding]
) -> None:
    """KAI's rules for the top-level minimums and the tree, as findings (see the module's docstring)."""
    structural = _structural(min_member, min_subgroup, entries)
    findings.extend(structural)
    if structural:
        return  # KAI checks the minimums only of a tree that holds together
    children: dict[str, list[str]] = {}
    for entry in entries:
        if entry.spec.parent is not None:
            children.setdefault(entry.spec.parent, []).append(entry.spec.name)
    for entry in sorted(entries, key=lambda e: e.spec.name):  # KAI's order: by name
        findings.extend(_minimums(entry, children.get(entry.spec.name, [])))
    roots = sum(1 for entry in entries if entry.spec.parent is None)
    if min_subgroup is not None and min_subgroup > roots:
        findings.append(
            Finding(
                field="spec.minSubGroup",
                message=f"minSubGroup ({min_subgroup}) exceeds the number of direct child SubGroups ({roots}): the "
                "group can never be satisfied and waits",
                severity=Severity.WARNING,
            )
        )


def _structural(min_member: int | None, min_subgroup: int | None, entries: Sequence[Entry]) -> list[Finding]:
    """KAI's structural errors: both minimums at the top or on a subgroup, a missing parent, a cycle. (A duplicate
    name is found while reading.)"""
    found: list[Finding] = []
    if min_member is not None and min_subgroup is not None:
        found.append(
            Finding(
                field="spec.minSubGroup",
                message=f"minMember and minSubGroup are mutually exclusive: set minMember ({min_member}) to schedule "
                "a fixed number of pods, or set minSubGroup to require a minimum number of child SubGroups, but not "
                "both",
                severity=Severity.REFUSED,
            )
        )
    by_name = {entry.spec.name: entry.spec for entry in entries}
    for entry in entries:
        sub, where = entry.spec, f"spec.subGroups[{entry.index}]"
        if sub.parent is not None and sub.parent not in by_name:
            found.append(
                Finding(
                    field=f"{where}.parent",
                    message=f"parent {sub.parent!r} of {sub.name!r} is not a subgroup of this PodGroup",
                    severity=Severity.REFUSED,
                )
            )
        ancestor, steps = sub.parent, 0
        while ancestor is not None and ancestor in by_name and steps <= len(entries):
            if ancestor == sub.name:
                found.append(
                    Finding(
                        field=f"{where}.parent",
                        message=f"the parents of subgroup {sub.name!r} lead back to it: a cycle",
                        severity=Severity.REFUSED,
                    )
                )
                break
            ancestor, steps = by_name[ancestor].parent, steps + 1
        if sub.min_member is not None and sub.min_subgroup is not None:
            found.append(
                Finding(
                    field=f"{where}.minSubGroup",
                    message=f"subgroup {sub.name!r}: minMember and minSubGroup are mutually exclusive",
                    severity=Severity.REFUSED,
                )
            )
    return found


def _minimums(entry: Entry, kids: Sequence[str]) -> list[Finding]:
    """KAI's rules for one subgroup's minimums, given its direct children."""
    sub, where = entry.spec, f"spec.subGroups[{entry.index}]"
    if not kids:
        found = []
        if sub.min_subgroup is not None:
            found.append(
                Finding(
                    field=f"{where}.minSubGroup",
                    message=f"subgroup {sub.name!r}: minSubGroup cannot be set on a leaf SubGroup (no child "
                    "SubGroups); a leaf takes minMember",
                    severity=Severity.REFUSED,
                )
            )
        if sub.min_member is None and "minMember" not in entry.written:
            found.append(
                Finding(
                    field=f"{where}.minMember",
                    message=f"subgroup {sub.name!r}: minMember is required on a leaf SubGroup (0: no gang requirement)",
                    severity=Severity.REFUSED,
                )
            )
        return found
    found = []
    if sub.min_member is not None:
        found.append(
            Finding(
                field=f"{where}.minMember",
                message=f"subgroup {sub.name!r}: minMember cannot be set on a mid-level SubGroup (has child "
                f"SubGroups: {', '.join(kids)}); use minSubGroup instead",
                severity=Severity.REFUSED_ON_CREATE,
            )
        )
    if sub.min_subgroup is not None and sub.min_subgroup > len(kids):
        found.append(
            Finding(
                field=f"{where}.minSubGroup",
                message=f"subgroup {sub.name!r}: minSubGroup ({sub.min_subgroup}) exceeds the number of direct "
                f"child SubGroups ({len(kids)}): it can never be satisfied",
                severity=Severity.WARNING,
            )
        )
    return found

"""A JobSet's PodGroup as KAI v0.16 and later make it: one PodGroup per JobSet with a two-level subgroup tree. Pure.

KAI's JobSet grouper (``pkg/podgrouper/podgrouper/plugins/jobset/jobset_grouper.go``) builds, for each of the
JobSet's ``spec.replicatedJobs``, a mid-level subgroup named after it whose ``minSubGroup`` is its ``replicas`` (every
replica is needed), and under it one leaf per replica, ``<replicatedJob>-replica-<index>``, whose ``minMember`` is the
replicated job's ``template.spec.parallelism`` (default 1), or the ``kai.scheduler/batch-min-member`` annotation of
its ``template.metadata`` (>= 1; above the parallelism is allowed). The PodGroup's ``minSubGroup`` is the number of
replicated jobs, 1 when ``spec.startupPolicy.startupPolicyOrder`` is ``InOrder`` (JobSet's controller then creates
the replicated jobs one after another), or the JobSet's own ``kai.scheduler/batch-min-member`` (>= 1, at most the
number of replicated jobs); the PodGroup sets no ``minMember``. Each pod goes to its leaf by the labels JobSet's
controller puts on it, ``jobset.sigs.k8s.io/replicatedjob-name`` and ``jobset.sigs.k8s.io/job-index``, and the
grouper writes the leaf's name into its ``kai.scheduler/subgroup-name`` label, as KAI's pod controller does.

Where KAI's grouper fails (its pod stays pending, retried), Quotient does not: an annotation it cannot read is left
out with a warning (KAI: the pod is not grouped), and a JobSet it cannot shape into a tree (no replicated jobs, a
pod without JobSet's labels or whose replica is not in the spec) is a reason for the caller to give the pod a group
of its own. A replicated job with ``replicas: 0`` gets no subgroup (KAI writes a mid-level subgroup with no children
and ``minSubGroup: 0``, which its own webhook refuses as a leaf with ``minSubGroup``) and is not counted in the
PodGroup's ``minSubGroup``. KAI copies the replicated job's topology annotations into each leaf's
``topologyConstraint``; Quotient does not place by topology, and writes none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import names
from scheduler.objects import fields
from scheduler.objects.records import SubGroupSpec

IN_ORDER = "InOrder"
"""JobSet's ``spec.startupPolicy.startupPolicyOrder`` under which its replicated jobs start one after another."""
_INT32_MAX = 2**31 - 1  # KAI parses the annotation as an int32


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tree:
    """The JobSet's PodGroup tree and the pod's leaf in it."""

    min_subgroup: int
    """The PodGroup's ``spec.minSubGroup``: replicated jobs that must be satisfied."""
    subgroups: tuple[SubGroupSpec, ...]
    """Each replicated job, then its replicas' leaves, in the JobSet's order."""
    leaf: str
    """The pod's leaf: its ``kai.scheduler/subgroup-name``."""
    warnings: tuple[str, ...] = ()
    """Annotations that could not be read and were left out, each with why."""


def leaf_name(replicated_job: str, index: str) -> str:
    """KAI's name of a replica's leaf subgroup."""
    return f"{replicated_job}-replica-{index}"


def shape(jobset: Mapping[str, Any], pod_labels: Mapping[str, str]) -> Tree | str:
    """The tree of ``jobset`` and the leaf of the pod with ``pod_labels``, or why there is none."""
    where = f"JobSet {fields.text(fields.meta(jobset).get('name'))}"
    jobs = [fields.mapping(job) for job in fields.sequence(fields.mapping(jobset.get("spec")).get("replicatedJobs"))]
    if not jobs:
        return f"{where} has no replicatedJobs"
    warnings: list[str] = []
    subgroups: list[SubGroupSpec] = []
    counted = 0
    for index, job in enumerate(jobs):
        name = fields.text(job.get("name"))
        if not name:
            return f"{where}: replicatedJobs[{index}] has no name"
        replicas = _count(job.get("replicas"), default=1)
        if replicas == 0:
            continue
        counted += 1
        leaf_minimum = _leaf_minimum(job, f"{where}, replicatedJob {name}", warnings)
        subgroups.append(SubGroupSpec(name=name, min_subgroup=replicas))
        subgroups.extend(
            SubGroupSpec(name=leaf_name(name, str(replica)), parent=name, min_member=leaf_minimum)
            for replica in range(replicas)
        )
    replicated_job = pod_labels.get(names.JOBSET_REPLICATED_JOB_LABEL, "")
    job_index = pod_labels.get(names.JOBSET_JOB_INDEX_LABEL, "")
    if not replicated_job or not job_index:
        return (
            f"the pod of {where} lacks JobSet's labels {names.JOBSET_REPLICATED_JOB_LABEL} and "
            f"{names.JOBSET_JOB_INDEX_LABEL}, which say its replica"
        )
    leaf = leaf_name(replicated_job, job_index)
    if not any(sub.name == leaf for sub in subgroups):
        return f"the pod's replica {leaf} is not one of {where}'s (its spec.replicatedJobs and their replicas)"
    return Tree(
        min_subgroup=_root_minimum(jobset, counted, where, warnings),
        subgroups=tuple(subgroups),
        leaf=leaf,
        warnings=tuple(warnings),
    )


def _count(value: object, *, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _positive(text: str) -> int | None:
    """A whole number from 1 as Go's ``strconv.ParseInt(text, 10, 32)`` reads it (a sign allowed, no spaces)."""
    digits = text[1:] if text.startswith("+") else text
    if not digits.isascii() or not digits.isdigit() or not 1 <= int(digits) <= _INT32_MAX:
        return None
    return int(digits)


def _annotation(annotations: Mapping[str, str], where: str, otherwise: str, warnings: list[str]) -> int | None:
    text = annotations.get(names.BATCH_MIN_MEMBER_ANNOTATION)
    if text is None:
        return None
    value = _positive(text)
    if value is None:
        warnings.append(
            f"{names.BATCH_MIN_MEMBER_ANNOTATION} {text!r} on {where} is not a whole number >= 1; it is left out "
            f"and {otherwise}"
        )
    return value


def _leaf_minimum(job: Mapping[str, Any], where: str, warnings: list[str]) -> int:
    template = fields.mapping(job.get("template"))
    parallelism = _count(fields.mapping(template.get("spec")).get("parallelism"), default=1)
    annotations = fields.string_map(fields.meta(template).get("annotations"))
    written = _annotation(annotations, where, f"each replica needs its parallelism ({parallelism})", warnings)
    return parallelism if written is None else written


def _root_minimum(jobset: Mapping[str, Any], counted: int, where: str, warnings: list[str]) -> int:
    annotations = fields.string_map(fields.meta(jobset).get("annotations"))
    written = _annotation(annotations, where, "the startup policy decides", warnings)
    if written is not None:
        return min(written, counted)
    startup = fields.mapping(fields.mapping(jobset.get("spec")).get("startupPolicy"))
    return 1 if startup.get("startupPolicyOrder") == IN_ORDER else counted

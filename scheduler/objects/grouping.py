"""Which PodGroup a pod belongs to, as KAI's pod-grouper decides it, minus its failure modes. Pure.

The caller resolves the pod's chain of controller owners (reading each owner through the API) and hands the
chain, or the reason it could not be read, to :func:`decide`. KAI keeps a pod pending when an owner cannot be read
(403), does not exist (404) or is of a kind it does not know; under vCluster the synced pods' owner is the
vCluster's own Service on the host, which is why KAI's guide turns ``setOwner`` off. Quotient never leaves a pod
pending for its owner and never merges a tenant into one group: such a pod gets a group of its own, and the
decision carries a note for an event that says why. vCluster-synced pods are recognised by the annotations vCluster
writes on them (``vcluster.loft.sh/owner-set-kind``/``-name`` name the tenant-side workload; ``vcluster.loft.sh/
namespace`` its namespace); when they name a workload, the pods of that workload are grouped together as KAI would
group them in the tenant's cluster.

A JobSet's pods share one PodGroup with KAI v0.16's two-level subgroup tree (``jobsets``: a subgroup per replicated
job, a leaf per replica, each pod's leaf in its ``kai.scheduler/subgroup-name``). KAI v0.15-v0.17's workload knobs
are read here too, as KAI's grouper reads them: ``kai.scheduler/skip-podgrouper`` (:func:`skips_grouper`: the grouper
then makes nothing), ``kai.scheduler/batch-min-member`` on a Job (one gang of that size) or a JobSet (the tree's
root ``minSubGroup``), and ``kai.scheduler/preemption-delay`` and
``kai.scheduler/staleness-grace-period`` from the owners (nearest first) then the pod, for the PodGroup's spec. An
annotation that cannot be read is left out with a warning for an event, never a failure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from common import names
from scheduler.objects import durations, fields, jobsets
from scheduler.objects.records import PodRecord, SubGroupSpec

# Kinds whose pods each get a group of their own (no gang), and kinds whose pods share one group.
_PER_POD = {("batch", "Job"), ("batch", "CronJob"), ("apps", "Deployment")}
_SHARED = {("apps", "StatefulSet"), ("apps", "ReplicaSet")}
_KUBEFLOW = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}
_RAY = {"RayCluster", "RayJob"}
_BATCH = {("batch", "Job")}  # where KAI reads kai.scheduler/batch-min-member as a gang size (a JobSet's: jobsets.py)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OwnerProblem:
    """Why the owner chain could not be read: ``forbidden`` (403), ``missing`` (404) or ``error``."""

    kind: str
    name: str
    problem: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Grouping:
    """The PodGroup a pod belongs to and how that group is made."""

    group_name: str
    min_member: int
    """The PodGroup's ``spec.minMember``; not written when the group has ``subgroups`` (KAI sets one or the other)."""
    queue: str
    priority_class: str
    preemptible: bool | None
    """None: decided from the priority (>= 100 non-preemptible) once the class's value is known."""
    owner: Mapping[str, Any] | None
    """The top owner the group is made for (its apiVersion, kind, name, uid), None for a pod's own group."""
    note: str | None = None
    """Why the pod got a group of its own when it has an owner: the text of an event."""
    preemption_delay_ns: int | None = None
    """``kai.scheduler/preemption-delay`` of the owners (nearest first), else of the pod: the PodGroup's
    ``spec.preemptionDelay``. None: none set (or none readable)."""
    staleness_grace_ns: int | None = None
    """``kai.scheduler/staleness-grace-period`` likewise: the PodGroup's ``spec.stalenessGracePeriod``."""
    warnings: tuple[str, ...] = ()
    """Annotations that could not be read and were left out, each with why: the texts of warning events."""
    min_subgroup: int | None = None
    """The PodGroup's ``spec.minSubGroup`` (with ``subgroups``): top-level subgroups that must be satisfied."""
    subgroups: tuple[SubGroupSpec, ...] = ()
    """The PodGroup's ``spec.subGroups`` (KAI's tree, a JobSet's); empty: a flat gang of ``min_member``."""
    subgroup: str | None = None
    """The pod's leaf in ``subgroups``: its ``kai.scheduler/subgroup-name`` label."""


def skips_grouper(obj: Mapping[str, Any] | PodRecord) -> bool:
    """``kai.scheduler/skip-podgrouper: "true"`` (exactly; KAI ignores any other value) on a pod or an owner."""
    written = obj.annotations if isinstance(obj, PodRecord) else _annotations(obj)
    return written.get(names.SKIP_PODGROUPER_ANNOTATION) == "true"


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return fields.string_map(fields.meta(obj).get("annotations"))


def _knob(
    pod: PodRecord, owners: Sequence[Mapping[str, Any]], key: str, *, negative_allowed: bool, warnings: list[str]
) -> int | None:
    """A duration annotation as KAI's grouper reads it: the owners' from the nearest, then the pod's; a value that
    is not a Go duration is skipped with a warning and the next source is read."""
    sources = [(f"{owner.get('kind')}/{_meta(owner, 'name')}", _annotations(owner)) for owner in owners]
    sources.append((f"pod {pod.name}", pod.annotations))
    for where, written in sources:
        text = written.get(key)
        if text is None:
            continue
        value = durations.parse_ns(text)
        if value is None or (value < 0 and not negative_allowed):
            need = durations.FORMS if value is None else "a duration of 0 or more"
            warnings.append(f"{key} {text!r} on {where} is not {need}; it is left out")
            continue
        return value
    return None


def _with_knobs(grouping: Grouping, pod: PodRecord, owners: Sequence[Mapping[str, Any]]) -> Grouping:
    warnings = list(grouping.warnings)
    delay = _knob(pod, owners, names.PREEMPTION_DELAY_ANNOTATION, negative_allowed=False, warnings=warnings)
    grace = _knob(pod, owners, names.STALENESS_GRACE_ANNOTATION, negative_allowed=True, warnings=warnings)
    return dataclasses.replace(grouping, preemption_delay_ns=delay, staleness_grace_ns=grace, warnings=tuple(warnings))


def _batch_min_member(owner: Mapping[str, Any]) -> int | str | None:
    """``kai.scheduler/batch-min-member`` on a Job: a whole number (KAI parses an int32), or why not."""
    text = _annotations(owner).get(names.BATCH_MIN_MEMBER_ANNOTATION)
    if text is None:
        return None
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit() and int(stripped) < 2**31:
        return int(stripped)
    return (
        f"{names.BATCH_MIN_MEMBER_ANNOTATION} {text!r} on {owner.get('kind')}/{_meta(owner, 'name')} is not a whole "
        "number >= 0; it is left out"
    )


def _api_group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def _name_part(text: str, limit: int) -> str:
    cleaned = re.sub(r"[^a-z0-9.-]", "-", text.lower()).strip("-.")
    return cleaned[:limit].strip("-.") or "x"


def group_name(owner_name: str, uid: str) -> str:
    """``pg-<name>-<uid>`` as KAI names groups, kept a valid object name (at most 253 characters)."""
    return f"pg-{_name_part(owner_name, 200)}-{_name_part(uid, 48)}"


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return fields.string_map(fields.meta(obj).get("labels"))


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str(fields.meta(obj).get(key) or "")


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and value >= 0 else default


def _kubeflow_min_member(owner: Mapping[str, Any], specs_key: str) -> int:
    spec = owner.get("spec") or {}
    policy = ((spec.get("runPolicy") or {}).get("schedulingPolicy") or {}).get("minAvailable")
    if isinstance(policy, int) and policy > 0:
        return policy
    replicas = spec.get(specs_key) or {}
    total = sum(_int((replica or {}).get("replicas"), 1) for replica in replicas.values() if isinstance(replica, dict))
    return max(total, 1)


def _ray_min_member(owner: Mapping[str, Any]) -> int:
    spec = owner.get("spec") or {}
    if owner.get("kind") == "RayJob":
        spec = spec.get("rayClusterSpec") or {}
    workers = spec.get("workerGroupSpecs") or []
    return 1 + sum(_int((group or {}).get("minReplicas"), 0) for group in workers if isinstance(group, dict))


def _priority_class(pod: PodRecord, owner: Mapping[str, Any] | None, default: str) -> str:
    if owner is not None and _labels(owner).get(names.PRIORITY_CLASS_LABEL):
        return _labels(owner)[names.PRIORITY_CLASS_LABEL]
    if pod.labels.get(names.PRIORITY_CLASS_LABEL):
        return pod.labels[names.PRIORITY_CLASS_LABEL]
    return pod.priority_class or default


def _preemptible(pod: PodRecord, owner: Mapping[str, Any] | None) -> bool | None:
    for labels in (_labels(owner) if owner is not None else None, pod.labels):
        value = labels.get(names.PREEMPTIBILITY_LABEL) if labels is not None else None
        if value in (names.PREEMPTIBLE, names.NON_PREEMPTIBLE):
            return value == names.PREEMPTIBLE
    return None


def _queue(pod: PodRecord, owner: Mapping[str, Any] | None, queue_label: str) -> str:
    if owner is not None and _labels(owner).get(queue_label):
        return _labels(owner)[queue_label]
    return pod.labels.get(queue_label) or names.DEFAULT_QUEUE


def _own_group(pod: PodRecord, *, queue_label: str, note: str | None) -> Grouping:
    return Grouping(
        group_name=group_name(pod.name, pod.uid),
        min_member=1,
        queue=_queue(pod, None, queue_label),
        priority_class=_priority_class(pod, None, names.DEFAULT_PRIORITY_CLASS),
        preemptible=_preemptible(pod, None),
        owner=None,
        note=note,
    )


def _vcluster(pod: PodRecord, queue_label: str) -> Grouping | None:
    kind = pod.annotations.get(names.VCLUSTER_OWNER_KIND_ANNOTATION)
    name = pod.annotations.get(names.VCLUSTER_OWNER_NAME_ANNOTATION)
    if not kind or not name:
        return None
    tenant = pod.labels.get(names.VCLUSTER_MANAGED_BY_LABEL, "vcluster")
    namespace = pod.annotations.get(names.VCLUSTER_NAMESPACE_ANNOTATION, "")
    per_pod = kind in {"Job", "CronJob", "Deployment"}
    key = f"{tenant}/{namespace}/{kind}/{name}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    if per_pod:
        return _own_group(pod, queue_label=queue_label, note=None)
    return Grouping(
        group_name=group_name(f"{tenant}-{namespace}-{name}", digest),
        min_member=1,
        queue=_queue(pod, None, queue_label),
        priority_class=_priority_class(pod, None, names.DEFAULT_PRIORITY_CLASS),
        preemptible=_preemptible(pod, None),
        owner={"apiVersion": "vcluster.loft.sh/tenant", "kind": kind, "name": name, "uid": digest},
    )


def decide(
    pod: PodRecord,
    owners: Sequence[Mapping[str, Any]] | OwnerProblem,
    *,
    queue_label: str = names.QUEUE_LABEL,
) -> Grouping:
    """The group of ``pod``, given its controller owners from the nearest to the top (empty: ownerless)."""
    if isinstance(owners, OwnerProblem):
        own = _own_group(
            pod,
            queue_label=queue_label,
            note=f"owner {owners.kind}/{owners.name} is {owners.problem} ({owners.message}); the pod gets a group of "
            "its own",
        )
        return _with_knobs(own, pod, ())
    return _with_knobs(_decide(pod, owners, queue_label), pod, owners)


def _decide(pod: PodRecord, owners: Sequence[Mapping[str, Any]], queue_label: str) -> Grouping:
    vcluster = _vcluster(pod, queue_label)
    if vcluster is not None:
        return vcluster
    if not owners:
        return _own_group(pod, queue_label=queue_label, note=None)
    # The topmost owner of a kind we group by decides (a Deployment above its ReplicaSet, a CronJob above its Job).
    for owner in reversed(owners):
        grouping = _by_owner(pod, owner, queue_label)
        if grouping is not None:
            return grouping
    top = owners[-1]
    return _own_group(
        pod,
        queue_label=queue_label,
        note=f"owner {top.get('kind')}/{_meta(top, 'name')} is not a workload kind Quotient groups by; the pod gets "
        "a group of its own",
    )


def _by_owner(pod: PodRecord, owner: Mapping[str, Any], queue_label: str) -> Grouping | None:
    kind = str(owner.get("kind") or "")
    group = _api_group(str(owner.get("apiVersion") or ""))
    name, uid = _meta(owner, "name"), _meta(owner, "uid")
    ref = {"apiVersion": owner.get("apiVersion"), "kind": kind, "name": name, "uid": uid}

    def made(
        min_member: int,
        default_class: str,
        *,
        per_pod: bool = False,
        suffix: str = "",
        warning: str | None = None,
        note: str | None = None,
    ) -> Grouping:
        return Grouping(
            group_name=group_name(pod.name, pod.uid) if per_pod else group_name(f"{name}{suffix}", uid),
            min_member=min_member,
            queue=_queue(pod, owner, queue_label),
            priority_class=_priority_class(pod, owner, default_class),
            preemptible=_preemptible(pod, owner),
            owner=ref,
            warnings=(warning,) if warning else (),
            note=note,
        )

    batch = _batch_min_member(owner) if (group, kind) in _BATCH else None
    if (group, kind) == ("batch", "Job") and isinstance(batch, int):
        # KAI v0.15: a Job with the annotation is one gang of that many pods (without it, a group per pod).
        return made(batch, names.DEFAULT_PRIORITY_CLASS)
    if (group, kind) in _PER_POD:
        default_class = names.DEPLOYMENT_PRIORITY_CLASS if kind == "Deployment" else names.DEFAULT_PRIORITY_CLASS
        return made(1, default_class, per_pod=True, warning=batch if isinstance(batch, str) else None)
    if (group, kind) in _SHARED:
        return made(1, names.DEFAULT_PRIORITY_CLASS)
    if group == "kubeflow.org" and kind in _KUBEFLOW:
        return made(_kubeflow_min_member(owner, _KUBEFLOW[kind]), names.DEFAULT_PRIORITY_CLASS)
    if group == "ray.io" and kind in _RAY:
        return made(_ray_min_member(owner), names.DEFAULT_PRIORITY_CLASS)
    if group == "jobset.x-k8s.io" and kind == "JobSet":
        # KAI v0.16: one PodGroup, a subgroup per replicated job and a leaf per replica (jobsets.py).
        tree = jobsets.shape(owner, pod.labels)
        if isinstance(tree, str):
            note = f"{tree}: the pod gets a group of its own"
            return made(1, names.DEFAULT_PRIORITY_CLASS, per_pod=True, note=note)
        return dataclasses.replace(
            made(0, names.DEFAULT_PRIORITY_CLASS),
            min_subgroup=tree.min_subgroup,
            subgroups=tree.subgroups,
            subgroup=tree.leaf,
            warnings=tree.warnings,
        )
    if group == "leaderworkerset.x-k8s.io" and kind == "LeaderWorkerSet":
        size = _int(((owner.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size"), 1)
        index = pod.labels.get(names.LWS_GROUP_INDEX_LABEL, "0")
        return made(max(size, 1), names.DEFAULT_PRIORITY_CLASS, suffix=f"-{_name_part(index, 10)}")
    return None

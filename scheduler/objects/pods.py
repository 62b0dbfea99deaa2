"""A pod's JSON to a ``PodRecord``: identity, place, phase, requests, GPU request, and what the binder recorded.

What the kubelet counts (``requests``): the larger of the sum over the containers and the largest init container,
plus the pod overhead; GPUs are read by ``gpurequest`` (whole ``nvidia.com/gpu`` or KAI's sharing annotations). A
request that cannot be read is kept as its ``Problem`` (the snapshot reports the pod with the reason) rather than
dropping the pod, since the scheduler must still count what a bound pod holds.

A reservation pod (``quotient.dev/gpu-group-reservation`` label) also gets its ``Reservation``: its group, node,
device UUID and index as it wrote them, and its phase in the reservation's life, read back from the object alone
(``deletionTimestamp`` is draining, a UUID is ready, a finished pod failed), so a restarted scheduler rebuilds every
reservation from its pod watch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from common import names, quantities
from common.errors import QuantityError
from common.resources import Resources
from scheduler.objects import fields, gpurequest
from scheduler.objects.records import (
    OwnerRef,
    Phase,
    PodRecord,
    Problem,
    Reservation,
    ReservationPhase,
    Scheduling,
)
from scheduler.placement import model

_PHASES = {phase.value: phase for phase in Phase}
# Go's strconv.Atoi: an optional sign and ASCII digits (a label value cannot start with a sign, but a record can be
# built from any mapping); 18 digits keep it within int64.
_SIGNED_INTEGER = re.compile(r"^[+-]?[0-9]{1,18}$")


def decode(obj: Mapping[str, Any]) -> PodRecord | None:
    """The record of a pod; None for an object without a name or uid (not a pod the API could have sent)."""
    meta = fields.meta(obj)
    name, uid = fields.text(meta.get("name")), fields.text(meta.get("uid"))
    if not name or not uid:
        return None
    spec = fields.mapping(obj.get("spec"))
    status = fields.mapping(obj.get("status"))
    labels = fields.string_map(meta.get("labels"))
    annotations = fields.string_map(meta.get("annotations"))
    namespace = fields.text(meta.get("namespace")) or "default"
    node = fields.text(spec.get("nodeName")) or None
    groups = fields.csv(annotations.get(names.GPU_GROUPS_ANNOTATION))
    if not groups and labels.get(names.GPU_GROUP_LABEL):
        groups = (labels[names.GPU_GROUP_LABEL],)
    return PodRecord(
        namespace=namespace,
        name=name,
        uid=uid,
        resource_version=fields.text(meta.get("resourceVersion")),
        created_ns=fields.timestamp_ns(meta.get("creationTimestamp")),
        labels=labels,
        annotations=annotations,
        owners=owners_of(obj),
        deleting=bool(meta.get("deletionTimestamp")),
        scheduler_name=fields.text(spec.get("schedulerName")),
        priority_class=fields.text(spec.get("priorityClassName")) or None,
        node=node,
        phase=_phase(status.get("phase")),
        started_ns=fields.timestamp_ns(status.get("startTime")) or None,
        nominated_node=fields.text(status.get("nominatedNodeName")) or None,
        requests=requests(spec),
        gpu=gpurequest.parse(obj),
        scheduling=_scheduling(spec),
        pod_group=annotations.get(names.POD_GROUP_ANNOTATION) or None,
        subgroup=labels.get(names.SUBGROUP_LABEL) or None,
        task_priority=_task_priority(labels),
        devices=fields.indexes(annotations.get(names.GPU_DEVICES_ANNOTATION)),
        share_milli=fields.whole_number(annotations.get(names.GPU_SHARE_ANNOTATION)) or 0,
        gpu_groups=groups,
        gpu_uuids=fields.csv(annotations.get(names.GPU_UUIDS_ANNOTATION)),
        configmap=annotations.get(names.GPU_CONFIGMAP_ANNOTATION) or None,
        reservation=_reservation(meta, labels, annotations, node, status, namespace=namespace, name=name, uid=uid),
    )


def _task_priority(labels: Mapping[str, str]) -> int | Problem | None:
    """KAI's ``kai.scheduler/task-priority`` label: an integer as Go's ``strconv.Atoi`` reads it (a sign, digits)."""
    text = labels.get(names.TASK_PRIORITY_LABEL)
    if text is None:
        return None
    if _SIGNED_INTEGER.match(text):
        return int(text)
    return Problem(
        field=f"metadata.labels[{names.TASK_PRIORITY_LABEL}]",
        message=f'{text!r} is not an integer such as "10"; the pod is ordered after the pods whose label is one',
    )


def _phase(value: object) -> Phase:
    """Absent (a pod just created) reads as Pending; a phase this version does not know, as Unknown."""
    if not value:
        return Phase.PENDING
    return _PHASES.get(fields.text(value), Phase.UNKNOWN)


def owners_of(obj: Mapping[str, Any]) -> tuple[OwnerRef, ...]:
    """An object's ``metadata.ownerReferences`` (a pod's, or an owner's own, as the grouper walks up the chain)."""
    return tuple(
        OwnerRef(
            api_version=fields.text(ref.get("apiVersion")),
            kind=fields.text(ref.get("kind")),
            name=fields.text(ref.get("name")),
            uid=fields.text(ref.get("uid")),
            controller=ref.get("controller") is True,
        )
        for ref in fields.sequence(fields.meta(obj).get("ownerReferences"))
        if isinstance(ref, dict)
    )


# --- requests -------------------------------------------------------------------------------------------------------


def _container_requests(container: Mapping[str, Any]) -> tuple[int, int] | Problem:
    resources = fields.mapping(container.get("resources"))
    requested, limits = fields.mapping(resources.get("requests")), fields.mapping(resources.get("limits"))
    try:
        cpu_raw = requested.get("cpu", limits.get("cpu"))
        memory_raw = requested.get("memory", limits.get("memory"))
        cpu = quantities.parse_millicores(str(cpu_raw)) if cpu_raw is not None else 0
        memory = quantities.parse_bytes(str(memory_raw)) if memory_raw is not None else 0
    except QuantityError as exc:
        return Problem(field=f"spec.containers[{container.get('name')}].resources", message=str(exc))
    return cpu, memory


def requests(spec: Mapping[str, Any]) -> Resources | Problem:
    """CPU, memory and one pod slot as the kubelet counts them: the larger of the sum over the containers and the
    largest init container, plus the pod overhead."""
    cpu = memory = 0
    for container in fields.sequence(spec.get("containers")):
        amounts = _container_requests(fields.mapping(container))
        if isinstance(amounts, Problem):
            return amounts
        cpu, memory = cpu + amounts[0], memory + amounts[1]
    for container in fields.sequence(spec.get("initContainers")):
        amounts = _container_requests(fields.mapping(container))
        if isinstance(amounts, Problem):
            return amounts
        cpu, memory = max(cpu, amounts[0]), max(memory, amounts[1])
    overhead = fields.mapping(spec.get("overhead"))
    try:
        cpu += quantities.parse_millicores(str(overhead["cpu"])) if "cpu" in overhead else 0
        memory += quantities.parse_bytes(str(overhead["memory"])) if "memory" in overhead else 0
    except QuantityError as exc:
        return Problem(field="spec.overhead", message=str(exc))
    return Resources(milli_cpu=cpu, memory_bytes=memory, pods=1)


# --- node constraints -----------------------------------------------------------------------------------------------


def _scheduling(spec: Mapping[str, Any]) -> Scheduling:
    return Scheduling(
        node_selector=tuple(sorted((str(k), str(v)) for k, v in fields.mapping(spec.get("nodeSelector")).items())),
        affinity=_affinity(spec),
        tolerations=_tolerations(spec),
    )


def _requirement(expression: Mapping[str, Any]) -> model.Requirement | None:
    try:
        operator = model.Operator(str(expression.get("operator")))
    except ValueError:
        return None
    values = tuple(str(value) for value in fields.sequence(expression.get("values")))
    return model.Requirement(key=str(expression.get("key") or ""), operator=operator, values=values)


def _affinity(spec: Mapping[str, Any]) -> tuple[model.AffinityTerm, ...] | Problem:
    node_affinity = fields.mapping(fields.mapping(spec.get("affinity")).get("nodeAffinity"))
    required = fields.mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = []
    for term in fields.sequence(required.get("nodeSelectorTerms")):
        expressions = []
        for expression in fields.sequence(fields.mapping(term).get("matchExpressions")):
            requirement = _requirement(fields.mapping(expression))
            if requirement is None:
                return Problem(
                    field="spec.affinity.nodeAffinity",
                    message=f"operator {fields.mapping(expression).get('operator')!r} is not one of In, NotIn, "
                    "Exists, DoesNotExist, Gt, Lt",
                )
            expressions.append(requirement)
        if expressions:
            terms.append(model.AffinityTerm(expressions=tuple(expressions)))
    return tuple(terms)


def _tolerations(spec: Mapping[str, Any]) -> tuple[model.Toleration, ...]:
    out = []
    for raw in fields.sequence(spec.get("tolerations")):
        toleration = fields.mapping(raw)
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


# --- reservation pods -----------------------------------------------------------------------------------------------


def _reservation(
    meta: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    node: str | None,
    status: Mapping[str, Any],
    *,
    namespace: str,
    name: str,
    uid: str,
) -> Reservation | None:
    label = labels.get(names.RESERVATION_GROUP_LABEL)
    if not label:
        return None
    uuid = annotations.get(names.RESERVATION_UUID_ANNOTATION, "").strip() or None
    failed = None
    phase_text = fields.text(status.get("phase"))
    if phase_text in ("Failed", "Succeeded"):
        reason = status.get("reason")
        failed = f"the reservation pod {phase_text.lower()}" + (
            f": {reason} {status.get('message') or ''}".rstrip() if reason else ""
        )
    if meta.get("deletionTimestamp"):
        phase = ReservationPhase.DRAINING
    elif uuid is not None and failed is None:
        phase = ReservationPhase.READY
    else:
        phase = ReservationPhase.WAITING_FOR_UUID
    return Reservation(
        group=annotations.get(names.RESERVATION_GROUP_ANNOTATION) or label,
        node=node or "",
        namespace=namespace,
        name=name,
        uid=uid,
        phase=phase,
        uuid=uuid,
        index=fields.whole_number(annotations.get(names.RESERVATION_INDEX_ANNOTATION, "")),
        failed=failed,
    )

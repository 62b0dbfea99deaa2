"""What ``explain`` says about a pod, decided from what ``gather`` read: pure, the time is an argument.

A pod is in one of four situations, each with its own answer:
- **pending**: its gang and queue, the reason the scheduler recorded (code and message), the queue's deserved / fair
  share / allocated / requested / limit in the resource that blocks it, the best nodes and what each lacked, and
  what would unblock it (all from the PodGroup's ``status.quotient`` and the Queue's status);
- **running**: where, on which devices or GPU group and with which reservation pod, its allotted and measured GPU
  memory per device and any alert firing on it (the leader's ``/metrics``; Events when those cannot be read);
- **evicted** (gone, or terminating with a ``DisruptionTarget``): when and why, and who took its place (the
  ``Evict`` event names the PodGroup it made room for; that group's pods say where they run now);
- **finished** or not ours: said in one line.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from quotient.explain import facts, gather, scrape
from scheduler.objects import pods as pod_decoder
from scheduler.objects.records import PodRecord
from scheduler.placement import status
from scheduler.telemetry import overuse

Resource = status.Resource
ALERT_NAMES = frozenset(name.value for name in overuse.AlertName)


class State(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    EVICTED = "Evicted"
    FINISHED = "Finished"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    namespace: str
    name: str
    node: str | None = None
    phase: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueNumbers:
    """One queue's figures in one resource (its unit: milli-GPU, millicores or bytes); None where unknown."""

    name: str
    resource: Resource
    deserved: int | None = None
    fair_share: int | None = None
    allocated: int | None = None
    requested: int | None = None
    quota: int | None = None
    limit: int | None = None
    over_quota: bool = False
    pending_groups: int | None = None
    oldest_pending_ns: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    reason: str | None
    message: str | None
    code: str | None = None
    since_ns: int | None = None
    resource: Resource | None = None
    requested: int | None = None
    candidates: tuple[status.Candidate, ...] = ()
    unblock: tuple[facts.Unblock, ...] = ()
    queues: tuple[QueueNumbers, ...] = ()
    """The group's queue, and any other queue a hint names (an ancestor whose limit blocks), in the resource."""
    structured: bool = False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMemory:
    node: str
    gpu: int
    allotted_bytes: int | None = None
    used_bytes: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    name: str
    severity: str = ""
    node: str = ""
    gpu: str = ""
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    node: str
    devices: tuple[int, ...] = ()
    whole_gpus: int = 0
    share_milli: int = 0
    """Milli-GPU on each device, for a share (0: whole devices or none)."""
    gpu_groups: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    reservations: tuple[PodRef, ...] = ()
    memory: tuple[DeviceMemory, ...] = ()
    alerts: tuple[Alert, ...] = ()
    measured: bool = False
    """Whether the memory and alerts come from the leader's metrics (else from Events, without numbers)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Evicted:
    at_ns: int | None
    message: str
    action: str | None = None
    disruption: tuple[str, str] | None = None
    for_group: str | None = None
    for_queue: str | None = None
    for_priority: int | None = None
    replacements: tuple[PodRef, ...] = ()
    """The pods of the group it made room for, where they run now."""
    for_reason: str | None = None
    """Why that group still waits, when it does."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    pod: PodRef
    state: State
    uid: str = ""
    scheduler_name: str = ""
    ours: bool = True
    group: str | None = None
    min_member: int | None = None
    members: tuple[PodRef, ...] = ()
    queue: str | None = None
    pending: Pending | None = None
    running: Running | None = None
    evicted: Evicted | None = None
    metrics_source: str | None = None
    unread: tuple[str, ...] = ()


def _ref(pod: Mapping[str, Any]) -> PodRef:
    record = pod_decoder.decode(pod)
    if record is None:
        return PodRef(namespace="", name="")
    return PodRef(namespace=record.namespace, name=record.name, node=record.node, phase=record.phase.value)


def queue_numbers(queue: facts.QueueFacts, resource: Resource) -> QueueNumbers:
    return QueueNumbers(
        name=queue.name,
        resource=resource,
        deserved=facts.amount_of(queue.deserved, resource),
        fair_share=facts.amount_of(queue.fair, resource),
        allocated=facts.amount_of(queue.allocated, resource),
        requested=facts.amount_of(queue.requested, resource),
        quota=queue.setting(resource, "quota"),
        limit=queue.setting(resource, "limit"),
        over_quota=queue.over_quota,
        pending_groups=queue.pending_groups,
        oldest_pending_ns=queue.oldest_pending_ns,
    )


def _pending(group: facts.GroupStatus, queue: str | None, queues: Mapping[str, facts.QueueFacts]) -> Pending:
    resource = group.resource if group.resource in (Resource.GPU, Resource.CPU, Resource.MEMORY) else Resource.GPU
    named = [queue] if queue else []
    named += [hint.queue for hint in group.unblock if hint.queue and hint.queue not in named]
    return Pending(
        reason=group.reason,
        message=group.message,
        code=group.code,
        since_ns=group.since_ns,
        resource=group.resource,
        requested=group.requested,
        candidates=group.candidates,
        unblock=group.unblock,
        queues=tuple(queue_numbers(queues[name], resource) for name in named if name in queues),
        structured=group.structured,
    )


def _memory(record: PodRecord, metrics: scrape.Metrics) -> tuple[DeviceMemory, ...]:
    rows: dict[tuple[str, int], DeviceMemory] = {}
    for name in ("quotient_pod_gpu_memory_allotted_bytes", "quotient_pod_gpu_memory_used_bytes"):
        for sample in metrics.select(name, namespace=record.namespace, pod=record.name):
            try:
                key = (sample.labels.get("node", ""), int(sample.labels.get("gpu", "")))
            except ValueError:
                continue
            row = rows.get(key) or DeviceMemory(node=key[0], gpu=key[1])
            if name.endswith("allotted_bytes"):
                row = dataclasses.replace(row, allotted_bytes=int(sample.value))
            else:
                row = dataclasses.replace(row, used_bytes=int(sample.value))
            rows[key] = row
    return tuple(rows[key] for key in sorted(rows))


def _alerts_from_events(events: Sequence[facts.EventFact]) -> tuple[Alert, ...]:
    """Alerts still firing by their Events: the newest Event of each alert name is not its ``Resolved``."""
    latest: dict[str, facts.EventFact] = {}
    for event in sorted(events, key=lambda event: event.at_ns or 0):
        name = event.reason.removesuffix("Resolved")
        if name in ALERT_NAMES:
            latest[name] = event
    return tuple(
        Alert(name=name, message=event.message)
        for name, event in sorted(latest.items())
        if not event.reason.endswith("Resolved")
    )


def _running(
    record: PodRecord,
    inputs: gather.ExplainInputs,
    events: Sequence[facts.EventFact],
) -> Running:
    reservations = tuple(sorted((_ref(pod) for pod in inputs.reservations), key=lambda ref: ref.name))
    metrics = inputs.metrics if isinstance(inputs.metrics, scrape.Metrics) else None
    memory: tuple[DeviceMemory, ...] = ()
    alerts = _alerts_from_events(events)
    if metrics is not None:
        memory = _memory(record, metrics)
        by_message = {alert.name: alert.message for alert in alerts}
        alerts = tuple(
            Alert(
                name=labels.get("alert", ""),
                severity=labels.get("severity", ""),
                node=labels.get("node", ""),
                gpu=labels.get("gpu", ""),
                message=by_message.get(labels.get("alert", ""), ""),
            )
            for labels in metrics.alerts(namespace=record.namespace, pod=record.name)
        )
    whole = 0 if record.share_milli else len(record.devices)
    return Running(
        node=record.node or "",
        devices=record.devices,
        whole_gpus=whole,
        share_milli=record.share_milli,
        gpu_groups=record.gpu_groups,
        gpu_uuids=record.gpu_uuids,
        reservations=reservations,
        memory=memory,
        alerts=alerts,
        measured=metrics is not None,
    )


def _evicted(inputs: gather.ExplainInputs, events: Sequence[facts.EventFact]) -> Evicted | None:
    evicts = [event for event in events if event.reason == "Evict"]
    disruption = facts.disruption(inputs.pod) if inputs.pod else None
    if not evicts and disruption is None:
        return None
    latest = max(evicts, key=lambda event: event.at_ns or 0) if evicts else None
    message = latest.message if latest else (disruption[1] if disruption else "")
    made_for = facts.evicted_for(message)
    replacements = tuple(sorted((_ref(pod) for pod in inputs.beneficiary_pods), key=lambda ref: ref.name))
    waits = facts.group_status(inputs.beneficiary) if inputs.beneficiary is not None else None
    return Evicted(
        at_ns=latest.at_ns if latest else None,
        message=message,
        action=made_for.action if made_for else None,
        disruption=disruption,
        for_group=f"{made_for.namespace}/{made_for.group}" if made_for else None,
        for_queue=made_for.queue if made_for else None,
        for_priority=made_for.priority if made_for else None,
        replacements=replacements,
        for_reason=f"{waits.reason}: {waits.message}" if waits is not None and waits.reason else None,
    )


def explain(inputs: gather.ExplainInputs, *, scheduler_names: Sequence[str] = ("quotient",)) -> Explanation:
    """The explanation of ``inputs.target`` (its pod, or the pod its PodGroup is explained through)."""
    queues = {found.name: found for obj in inputs.queues if (found := facts.queue(obj)) is not None}
    events = [facts.event(event) for event in inputs.events]
    record = pod_decoder.decode(inputs.pod) if inputs.pod is not None else None
    group_spec = (inputs.podgroup or {}).get("spec") or {}
    group_status = facts.group_status(inputs.podgroup)
    queue = str(group_spec.get("queue") or "") or group_status.queue or None
    min_member = group_spec.get("minMember")
    group_name = (
        f"{inputs.target.namespace}/{(inputs.podgroup.get('metadata') or {}).get('name')}" if inputs.podgroup else None
    )
    base = Explanation(
        pod=_ref(inputs.pod)
        if inputs.pod is not None
        else PodRef(namespace=inputs.target.namespace, name=inputs.target.name),
        state=State.PENDING,
        uid=record.uid if record else "",
        scheduler_name=record.scheduler_name if record else "",
        ours=record is None or record.scheduler_name in scheduler_names,
        group=group_name,
        min_member=min_member if isinstance(min_member, int) and not isinstance(min_member, bool) else None,
        members=tuple(sorted((_ref(pod) for pod in inputs.members), key=lambda ref: ref.name)),
        queue=queue,
        metrics_source=inputs.metrics.source if isinstance(inputs.metrics, scrape.Metrics) else None,
        unread=tuple(inputs.unread)
        + ((f"metrics: {inputs.metrics.reason}",) if isinstance(inputs.metrics, scrape.Unread) else ()),
    )
    evicted = _evicted(inputs, events)
    if record is None or (record.deleting and evicted is not None):
        return dataclasses.replace(base, state=State.EVICTED, evicted=evicted)
    if record.terminated:
        return dataclasses.replace(base, state=State.FINISHED)
    if record.node is not None:
        return dataclasses.replace(base, state=State.RUNNING, running=_running(record, inputs, events))
    if group_status.reason is None:
        group_status = _from_pod_event(group_status, events)
    return dataclasses.replace(base, state=State.PENDING, pending=_pending(group_status, queue, queues))


def _from_pod_event(group: facts.GroupStatus, events: Sequence[facts.EventFact]) -> facts.GroupStatus:
    """A pod refused before it joins a gang (an invalid GPU request, a queue label that names nothing...) has no
    PodGroup condition: the scheduler says why in a Warning ``Unschedulable`` Event on the pod, ``REASON: message``."""
    said = [event for event in events if event.reason == "Unschedulable" and event.type == "Warning"]
    if not said:
        return group
    newest = max(said, key=lambda event: event.at_ns or 0)
    reason, colon, message = newest.message.partition(": ")
    if not colon or not reason.isidentifier():
        reason, message = "Unschedulable", newest.message
    return dataclasses.replace(group, reason=reason, message=message, since_ns=newest.at_ns)

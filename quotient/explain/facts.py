"""What the operator's view reads from the API objects, decoded once into typed facts.

Pods, nodes, Queue specs and PodGroup specs go through the scheduler's own decoders (``scheduler.objects``), so
``explain`` reads an annotation or a quota exactly as the scheduler does. What the scheduler writes for people is
read here: KAI's ``schedulingConditions`` and Queue status, and Quotient's ``status.quotient`` beside them
(``scheduler.kube.statusfields``). A field that cannot be read is left out (None, empty), never an error: the view
says less, it does not fail.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping
from typing import Any

from common import names
from common.resources import Resources
from quotient.explain import units
from scheduler.objects import queues
from scheduler.placement import model, status

Resource = status.Resource
_EVICT_FOR = re.compile(r"^(\w[\w-]*) for ([^/\s]+)/(\S+) \(queue (\S+), priority (-?\d+)\)")
"""``roommaking._evict_unit``'s message: ``reclaim for NS/GROUP (queue Q, priority P)``."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def time_ns(text: object) -> int | None:
    """An RFC 3339 time (``2026-01-02T03:04:05Z``, with or without fractions) in ns; None when unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1_000_000_000)


def _resources(value: object) -> Resources | None:
    """A KAI resource map (``{"gpu": "1.5", "cpu": "500m", "memory": "16Gi"}``); None when absent."""
    found = _map(value)
    if not found:
        return None
    return Resources(
        milli_gpu=units.parse(Resource.GPU, found.get("gpu", "0")) or 0,
        milli_cpu=units.parse(Resource.CPU, found.get("cpu", "0")) or 0,
        memory_bytes=units.parse(Resource.MEMORY, found.get("memory", "0")) or 0,
    )


def _resource(value: object) -> Resource | None:
    try:
        return Resource(value) if isinstance(value, str) else None
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unblock:
    remedy: str
    message: str
    queue: str | None = None
    resource: Resource | None = None
    current: int | None = None
    needed: int | None = None
    at_ns: int | None = None
    pods: tuple[tuple[str, str, str], ...] = ()
    """Evictions under way: (namespace, name, node) of each victim."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupStatus:
    """Why a PodGroup waits, as the scheduler wrote it (KAI's condition, and ``status.quotient``)."""

    reason: str | None = None
    message: str | None = None
    since_ns: int | None = None
    code: str | None = None
    queue: str | None = None
    resource: Resource | None = None
    requested: int | None = None
    candidates: tuple[status.Candidate, ...] = ()
    unblock: tuple[Unblock, ...] = ()
    structured: bool = False
    """Whether ``status.quotient`` was there (a scheduler before it writes only the condition)."""


def _candidate(raw: Mapping[str, Any]) -> status.Candidate | None:
    node = _text(raw.get("node"))
    if node is None:
        return None
    lacks = []
    for item in _list(raw.get("lacking")):
        entry = _map(item)
        resource = _resource(entry.get("resource"))
        if resource is None:
            continue
        requested, free = units.parse(resource, entry.get("requested")), units.parse(resource, entry.get("free"))
        if requested is not None and free is not None:
            lacks.append(status.Lack(resource=resource, requested=requested, free=free))
    gpu = raw.get("gpu")
    measured = raw.get("measuredFreeMemory")
    return status.Candidate(
        node=node,
        gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
        lacks=tuple(lacks),
        measured_free_bytes=units.parse(Resource.MEMORY, measured) if measured is not None else None,
        unattributed_bytes=units.parse(Resource.MEMORY, raw.get("unattributedMemory", "0")) or 0,
        unhealthy_gpus=tuple(index for index in _list(raw.get("unhealthyGpus")) if isinstance(index, int)),
    )


def _unblock(raw: Mapping[str, Any]) -> Unblock | None:
    remedy, message = _text(raw.get("remedy")), _text(raw.get("message"))
    if remedy is None or message is None:
        return None
    resource = _resource(raw.get("resource"))
    pods = tuple(
        (str(_map(pod).get("namespace", "")), str(_map(pod).get("name", "")), str(_map(pod).get("node", "")))
        for pod in _list(raw.get("pods"))
    )
    return Unblock(
        remedy=remedy,
        message=message,
        queue=_text(raw.get("queue")),
        resource=resource,
        current=units.parse(resource, raw.get("current")) if resource is not None else None,
        needed=units.parse(resource, raw.get("needed")) if resource is not None else None,
        at_ns=time_ns(raw.get("at")),
        pods=pods,
    )


def group_status(podgroup: Mapping[str, Any] | None) -> GroupStatus:
    """The PodGroup's condition and ``status.quotient``; empty when it has none (placed, or not looked at yet)."""
    raw_status = _map(_map(podgroup).get("status"))
    condition = next(
        (
            _map(item)
            for item in _list(raw_status.get("schedulingConditions"))
            if _map(item).get("type") == names.UNSCHEDULABLE_CONDITION
        ),
        {},
    )
    ours = _map(raw_status.get("quotient"))
    resource = _resource(ours.get("resource"))
    return GroupStatus(
        reason=_text(condition.get("reason")) or _text(ours.get("reason")),
        message=_text(condition.get("message")),
        since_ns=time_ns(condition.get("lastTransitionTime")),
        code=_text(ours.get("code")),
        queue=_text(ours.get("queue")),
        resource=resource,
        requested=units.parse(resource, ours.get("requested")) if resource is not None else None,
        candidates=tuple(found for item in _list(ours.get("candidates")) if (found := _candidate(_map(item)))),
        unblock=tuple(hint for item in _list(ours.get("unblock")) if (hint := _unblock(_map(item)))),
        structured=bool(ours),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueFacts:
    """A Queue: its spec as the scheduler reads it, KAI's status, and Quotient's share and pending groups."""

    name: str
    parent: str | None = None
    priority: int = 100
    settings: model.Queue | None = None
    """None when the spec cannot be read (the Queue's ``Invalid`` condition says why)."""
    allocated: Resources | None = None
    requested: Resources | None = None
    deserved: Resources | None = None
    fair: Resources | None = None
    pending_groups: int | None = None
    oldest_pending_ns: int | None = None
    children: tuple[str, ...] = ()
    conditions: tuple[tuple[str, str, str], ...] = ()
    """(type, reason, message) of each condition that holds."""

    def setting(self, resource: Resource, which: str) -> int | None:
        """``quota`` or ``limit`` of ``resource`` in its unit; -1 unlimited; None unreadable."""
        if self.settings is None or resource not in (Resource.GPU, Resource.CPU, Resource.MEMORY):
            return None
        per = {Resource.GPU: self.settings.gpu, Resource.CPU: self.settings.cpu, Resource.MEMORY: self.settings.memory}
        chosen = per[resource]
        return chosen.quota if which == "quota" else chosen.limit

    @property
    def over_quota(self) -> bool:
        return any(kind == names.OVER_QUOTA_CONDITION for kind, _, _ in self.conditions)


def amount_of(amounts: Resources | None, resource: Resource) -> int | None:
    if amounts is None:
        return None
    if resource is Resource.GPU:
        return amounts.milli_gpu
    if resource is Resource.CPU:
        return amounts.milli_cpu
    if resource is Resource.MEMORY:
        return amounts.memory_bytes
    return None


def queue(obj: Mapping[str, Any]) -> QueueFacts | None:
    record = queues.decode(obj)
    if record is None:
        return None
    spec, raw_status = _map(obj.get("spec")), _map(obj.get("status"))
    ours = _map(raw_status.get("quotient"))
    settings = record.queue if isinstance(record.queue, model.Queue) else None
    pending = ours.get("pendingGroups")
    priority = spec.get("priority")
    return QueueFacts(
        name=record.name,
        parent=_text(spec.get("parentQueue")),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 100,
        settings=settings,
        allocated=_resources(raw_status.get("allocated")),
        requested=_resources(raw_status.get("requested")),
        deserved=_resources(ours.get("deserved")),
        fair=_resources(ours.get("fairShare")),
        pending_groups=pending if isinstance(pending, int) and not isinstance(pending, bool) else None,
        oldest_pending_ns=time_ns(ours.get("oldestPendingSince")),
        children=tuple(str(child) for child in _list(raw_status.get("childQueues")) if isinstance(child, str)),
        conditions=tuple(
            (str(_map(item).get("type", "")), str(_map(item).get("reason", "")), str(_map(item).get("message", "")))
            for item in _list(raw_status.get("conditions"))
            if _map(item).get("status", "True") == "True"
        ),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EventFact:
    reason: str
    message: str
    type: str = "Normal"
    at_ns: int | None = None
    count: int = 1
    source: str = ""


def event(obj: Mapping[str, Any]) -> EventFact:
    """A core/v1 Event (the last time it was seen: ``lastTimestamp``, else ``eventTime``, else creation)."""
    meta = _map(obj.get("metadata"))
    at = time_ns(obj.get("lastTimestamp")) or time_ns(obj.get("eventTime")) or time_ns(meta.get("creationTimestamp"))
    count = obj.get("count")
    source = _map(obj.get("source")).get("component") or obj.get("reportingComponent") or ""
    return EventFact(
        reason=str(obj.get("reason") or ""),
        message=str(obj.get("message") or obj.get("note") or ""),
        type=str(obj.get("type") or "Normal"),
        at_ns=at,
        count=count if isinstance(count, int) and count > 0 else 1,
        source=str(source),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvictedFor:
    """Who an eviction made room for, from the ``Evict`` event's message."""

    action: str
    namespace: str
    group: str
    queue: str
    priority: int


def evicted_for(message: str) -> EvictedFor | None:
    match = _EVICT_FOR.match(message)
    if match is None:
        return None
    action, namespace, group, queue_name, priority = match.groups()
    return EvictedFor(action=action, namespace=namespace, group=group, queue=queue_name, priority=int(priority))


def disruption(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The pod's ``DisruptionTarget`` condition (reason, message), written before an eviction."""
    for item in _list(_map(pod.get("status")).get("conditions")):
        entry = _map(item)
        if entry.get("type") == names.DISRUPTION_TARGET_CONDITION and entry.get("status") == "True":
            return str(entry.get("reason") or ""), str(entry.get("message") or "")
    return None

"""The ``-o json`` documents of ``explain``, ``queues`` and ``top``: versioned, documented in docs/explain.md.

Each document carries ``apiVersion: quotient.dev/explain/v1`` and a ``kind`` (``PodExplanation``, ``QueueTable``,
``GpuTable``). Amounts are integers in the base unit of their resource, named once for the whole schema: ``gpu``
in milli-GPU (1000 = one device), ``cpu`` in millicores, ``memory`` and ``gpu-memory`` in bytes, ``pods`` a count;
a quota or limit of ``-1`` is unlimited; ``null`` is unknown. Times are RFC 3339. Within v1, fields are only added.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from quotient.explain import explaining, facts
from scheduler.placement import status

API_VERSION = "quotient.dev/explain/v1"


def time_text(at_ns: int | None) -> str | None:
    if at_ns is None:
        return None
    moment = datetime.datetime.fromtimestamp(at_ns / 1e9, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(ref: explaining.PodRef) -> dict[str, Any]:
    return {"namespace": ref.namespace, "name": ref.name, "node": ref.node, "phase": ref.phase}


def queue_numbers(numbers: explaining.QueueNumbers) -> dict[str, Any]:
    return {
        "name": numbers.name,
        "resource": numbers.resource.value,
        "deserved": numbers.deserved,
        "fairShare": numbers.fair_share,
        "allocated": numbers.allocated,
        "requested": numbers.requested,
        "quota": numbers.quota,
        "limit": numbers.limit,
        "overQuota": numbers.over_quota,
        "pendingGroups": numbers.pending_groups,
        "oldestPendingSince": time_text(numbers.oldest_pending_ns),
    }


def _candidate(candidate: status.Candidate) -> dict[str, Any]:
    return {
        "node": candidate.node,
        "gpu": candidate.gpu,
        "lacking": [
            {"resource": lack.resource.value, "requested": lack.requested, "free": lack.free}
            for lack in candidate.lacks
        ],
        "measuredFreeMemoryBytes": candidate.measured_free_bytes,
        "unattributedMemoryBytes": candidate.unattributed_bytes,
        "unhealthyGpus": list(candidate.unhealthy_gpus),
    }


def _unblock(hint: facts.Unblock) -> dict[str, Any]:
    return {
        "remedy": hint.remedy,
        "message": hint.message,
        "queue": hint.queue,
        "resource": hint.resource.value if hint.resource is not None else None,
        "current": hint.current,
        "needed": hint.needed,
        "at": time_text(hint.at_ns),
        "pods": [{"namespace": ns, "name": name, "node": node} for ns, name, node in hint.pods],
    }


def _pending(pending: explaining.Pending) -> dict[str, Any]:
    return {
        "code": pending.code,
        "reason": pending.reason,
        "message": pending.message,
        "since": time_text(pending.since_ns),
        "resource": pending.resource.value if pending.resource is not None else None,
        "requested": pending.requested,
        "queues": [queue_numbers(numbers) for numbers in pending.queues],
        "candidates": [_candidate(candidate) for candidate in pending.candidates],
        "unblock": [_unblock(hint) for hint in pending.unblock],
        "structured": pending.structured,
    }


def _running(running: explaining.Running) -> dict[str, Any]:
    return {
        "node": running.node,
        "gpus": list(running.devices),
        "wholeGpus": running.whole_gpus,
        "shareMilliGpu": running.share_milli,
        "gpuGroups": list(running.gpu_groups),
        "gpuUuids": list(running.gpu_uuids),
        "reservationPods": [_pod(ref) for ref in running.reservations],
        "memory": [
            {
                "node": row.node,
                "gpu": row.gpu,
                "allottedBytes": row.allotted_bytes,
                "usedBytes": row.used_bytes,
            }
            for row in running.memory
        ],
        "measured": running.measured,
        "alerts": [
            {
                "name": alert.name,
                "severity": alert.severity,
                "node": alert.node,
                "gpu": alert.gpu,
                "message": alert.message,
            }
            for alert in running.alerts
        ],
    }


def _evicted(evicted: explaining.Evicted) -> dict[str, Any]:
    return {
        "at": time_text(evicted.at_ns),
        "action": evicted.action,
        "message": evicted.message,
        "disruption": (
            {"reason": evicted.disruption[0], "message": evicted.disruption[1]} if evicted.disruption else None
        ),
        "madeRoomFor": (
            {
                "podGroup": evicted.for_group,
                "queue": evicted.for_queue,
                "priority": evicted.for_priority,
                "pods": [_pod(ref) for ref in evicted.replacements],
                "waiting": evicted.for_reason,
            }
            if evicted.for_group
            else None
        ),
    }


def explanation(found: explaining.Explanation) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodExplanation",
        "pod": {**_pod(found.pod), "uid": found.uid or None, "schedulerName": found.scheduler_name or None},
        "state": found.state.value,
        "scheduledByQuotient": found.ours,
        "podGroup": (
            {"name": found.group, "minMember": found.min_member, "pods": [_pod(ref) for ref in found.members]}
            if found.group
            else None
        ),
        "queue": found.queue,
        "pending": _pending(found.pending) if found.pending else None,
        "running": _running(found.running) if found.running else None,
        "evicted": _evicted(found.evicted) if found.evicted else None,
        "metricsSource": found.metrics_source,
        "unreadable": list(found.unread),
    }


def table(kind: str, rows: Sequence[dict[str, Any]], *, unread: Sequence[str], source: str | None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "items": list(rows),
        "metricsSource": source,
        "unreadable": list(unread),
    }

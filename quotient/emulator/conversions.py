"""Conversion between kinds that share a storage: core ``v1`` Events and ``events.k8s.io/v1`` Events.

A real API server stores one Event and serves it through both APIs, so an event the scheduler writes through
``events.k8s.io/v1`` shows in ``kubectl get events`` and ``kubectl describe pod`` (which read core ``v1``). The
store keeps the core form; these functions translate on the way in and out. Every other kind is stored as served.
"""

from __future__ import annotations

from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj

EVENTS_V1 = "events.k8s.io/v1"

# events.k8s.io/v1 field -> core v1 field (k8s.io/kubernetes/pkg/apis/events/v1/conversion.go)
_EVENT_FIELDS = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)


def to_storage(kind: Kind, obj: Obj) -> Obj:
    """The stored form of an object written through ``kind``."""
    if kind.api_version != EVENTS_V1:
        return obj
    converted = {key: value for key, value in obj.items() if key not in {new for new, _ in _EVENT_FIELDS}}
    for new, old in _EVENT_FIELDS:
        if new in obj:
            converted[old] = obj[new]
    converted["apiVersion"], converted["kind"] = "v1", "Event"
    return converted


def from_storage(kind: Kind, obj: Obj) -> Obj:
    """A stored object as ``kind`` serves it."""
    if kind.api_version != EVENTS_V1:
        return obj
    converted = {key: value for key, value in obj.items() if key not in {old for _, old in _EVENT_FIELDS}}
    for new, old in _EVENT_FIELDS:
        if old in obj:
            converted[new] = obj[old]
    converted["apiVersion"], converted["kind"] = EVENTS_V1, "Event"
    return converted

"""Alerts go out three ways: a Prometheus series, a Kubernetes Event, and a ``wire.Alert`` on NATS.

Each ``overuse.Transition`` (firing or resolved) of the telemetry analysis reaches people through whatever they
watch: Prometheus and Grafana (``quotient_alert{...}`` is 1 while an alert fires and is removed when it resolves;
``quotient_alerts_firing{alert}`` counts them), ``kubectl describe pod`` (a Warning Event on the pod, or on the Node
for a node-level alert, when it fires; a Normal one when it resolves), and any NATS subscriber of
``quotient.v1.alerts.<AlertName>`` (DESIGN.md, wire protocol).

Nothing here may hold up scheduling or telemetry: ``send`` is synchronous and never waits. Events go to the
recorder, which aggregates and rate-limits its own writes. NATS messages wait in a bounded queue that ``run``
publishes; when NATS is down or not configured, a message is dropped and counted (the series and the Event still
tell), never queued without bound and never raised.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from common import logs, messaging, subjects, wire
from common.errors import BusError, WireError
from scheduler.kube import events
from scheduler.metrics import SchedulerMetrics
from scheduler.telemetry import overuse

log = logs.get("scheduler.alerts")

# A burst of transitions (a node of 8 GPUs going stale, a flapping cluster) is a few hundred; beyond that the oldest
# wait longest and matter least, so they are the ones dropped.
DEFAULT_MAX_QUEUED: Final = 4096


@dataclasses.dataclass(slots=True)
class AlertCounters:
    sent: int = 0  # transitions handled
    published: int = 0  # wire.Alert messages on NATS
    dropped: int = 0  # messages not published: NATS down or absent, the queue full, or a publish failed
    events: int = 0


def series_labels(transition: overuse.Transition) -> tuple[str, str, str, str, str, str]:
    """The ``quotient_alert`` labels: alert, severity, namespace, pod, node, gpu (empty where they do not apply)."""
    return (
        transition.name.value,
        transition.severity.value,
        transition.pod_namespace or "",
        transition.pod_name or "",
        transition.node,
        "" if transition.gpu_index is None else str(transition.gpu_index),
    )


def event_target(transition: overuse.Transition) -> events.ObjectRef:
    """The pod the alert names, or else its node."""
    if transition.pod_name and transition.pod_namespace:
        return events.ObjectRef(
            api_version="v1",
            kind="Pod",
            name=transition.pod_name,
            namespace=transition.pod_namespace,
            uid=transition.pod_uid or "",
        )
    return events.ObjectRef(api_version="v1", kind="Node", name=transition.node)


def event_reason(transition: overuse.Transition) -> str:
    """The alert's name while it fires; with ``Resolved`` appended once it is over."""
    name = transition.name.value
    return name if transition.state is wire.AlertState.FIRING else f"{name}Resolved"


class AlertSink:
    """Sends transitions to the metrics, the Event recorder and (when given a bus) NATS; ``run`` publishes."""

    def __init__(
        self,
        *,
        metrics: SchedulerMetrics,
        recorder: events.EventSink,
        bus: messaging.MessageBus | None,
        identity: str,
        max_queued: int = DEFAULT_MAX_QUEUED,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._metrics = metrics
        self._recorder = recorder
        self._bus = bus
        self._identity = identity[:253] or "quotient-scheduler"
        self._boot = secrets.token_hex(8)
        self._seq = 0
        self._clock_ns = clock_ns
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self._max_queued = max_queued
        self._firing: dict[tuple[str, str, str, int], tuple[str, str, str, str, str, str]] = {}
        self._wake: Callable[[], None] | None = None
        self.counters = AlertCounters()
        metrics.set_alerts_firing({}, names=[name.value for name in overuse.AlertName])

    def firing(self) -> Mapping[tuple[str, str, str, int], tuple[str, str, str, str, str, str]]:
        """The alerts firing now: series key -> ``quotient_alert`` labels."""
        return dict(self._firing)

    def send(self, transitions: Iterable[overuse.Transition]) -> None:
        """Record each transition in the metrics, as an Event, and queue its ``wire.Alert``; returns at once."""
        touched = False
        for transition in transitions:
            touched = True
            self.counters.sent += 1
            self._series(transition)
            self._event(transition)
            self._enqueue(transition)
            log.info(
                "alert",
                alert=transition.name.value,
                state=transition.state.value,
                node=transition.node,
                pod=f"{transition.pod_namespace}/{transition.pod_name}" if transition.pod_name else None,
                gpu=transition.gpu_index,
                message=transition.message,
            )
        if touched:
            counts: dict[str, int] = {}
            for labels in self._firing.values():
                counts[labels[0]] = counts.get(labels[0], 0) + 1
            self._metrics.set_alerts_firing(counts)
            if self._queue and self._wake is not None:
                self._wake()

    def _series(self, transition: overuse.Transition) -> None:
        key = transition.series_key
        if transition.state is wire.AlertState.FIRING:
            labels = series_labels(transition)
            previous = self._firing.get(key)
            if previous is not None and previous != labels:
                self._metrics.set_alert(previous, firing=False)
            self._firing[key] = labels
            self._metrics.set_alert(labels, firing=True)
        else:
            fired = self._firing.pop(key, None)
            if fired is not None:
                self._metrics.set_alert(fired, firing=False)

    def _event(self, transition: overuse.Transition) -> None:
        firing = transition.state is wire.AlertState.FIRING
        self._recorder.record(
            event_target(transition),
            type=events.EventType.WARNING if firing else events.EventType.NORMAL,
            reason=event_reason(transition),
            message=transition.message,
        )
        self.counters.events += 1

    def _enqueue(self, transition: overuse.Transition) -> None:
        if self._bus is None:
            return
        self._seq += 1
        try:
            payload = wire.encode(overuse.to_alert(transition, emitter=self._identity, boot=self._boot, seq=self._seq))
        except WireError as exc:  # a field beyond the schema's bounds: a bug to see in the log, never a crash
            self.counters.dropped += 1
            log.warning("alert_not_encodable", alert=transition.name.value, error=str(exc))
            return
        if len(self._queue) >= self._max_queued:
            self._queue.popleft()
            self.counters.dropped += 1
        self._queue.append((subjects.alert(transition.name.value), payload))

    async def run(self) -> None:
        """Publish queued alerts until cancelled; while NATS is down they are dropped and counted."""
        wake = asyncio.Event()
        self._wake = wake.set
        try:
            while True:
                if not self._queue:
                    wake.clear()
                    await wake.wait()
                    continue
                await self.publish_queued()
        finally:
            self._wake = None

    async def publish_queued(self) -> None:
        """Publish what is queued now (``run``'s body, callable from tests)."""
        bus = self._bus
        while self._queue:
            subject, payload = self._queue.popleft()
            if bus is None or not bus.connected:
                self.counters.dropped += 1
                continue
            try:
                await bus.publish(subject, payload)
            except BusError as exc:
                self.counters.dropped += 1
                log.warning("alert_dropped", subject=subject, error=str(exc))
                continue
            self.counters.published += 1

"""Alerts three ways: Prometheus series, Events (a fake recorder) and ``wire.Alert`` on a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from common import subjects, wire
from common.natsconn import NatsBus, Subscription
from common.natsserver import NatsServer
from scheduler import alerts
from scheduler.kube import events
from scheduler.metrics import SchedulerMetrics
from scheduler.telemetry import overuse
from tests import polling

GIB = 1024**3


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    ref: events.ObjectRef
    type: events.EventType
    reason: str
    message: str


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[Recorded] = []

    def record(self, ref: events.ObjectRef, *, type: events.EventType, reason: str, message: str) -> None:
        self.events.append(Recorded(ref=ref, type=type, reason=reason, message=message))


def overuse_transition(state: wire.AlertState, *, used_gib: int = 30) -> overuse.Transition:
    return overuse.Transition(
        name=overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION,
        state=state,
        severity=wire.Severity.WARNING,
        at_ns=2_000_000_000,
        since_ns=1_000_000_000,
        node="gpu-1",
        pod_uid="uid-a",
        pod_namespace="ml",
        pod_name="train",
        queue="team-a",
        gpu_uuid="GPU-0",
        gpu_index=0,
        allotted_bytes=20 * GIB,
        used_bytes=used_gib * GIB,
        neighbours=("ml/infer",),
        message=f"pod ml/train uses {used_gib}Gi on GPU 0",
    )


def stale_transition(state: wire.AlertState) -> overuse.Transition:
    return overuse.Transition(
        name=overuse.AlertName.TELEMETRY_STALE,
        state=state,
        severity=wire.Severity.WARNING,
        at_ns=5,
        since_ns=1,
        node="gpu-2",
        message="no telemetry from node gpu-2",
    )


def sample(metrics: SchedulerMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


ALERT_LABELS = {"alert": "GpuMemoryOverconsumption", "severity": "warning", "namespace": "ml", "pod": "train"}


def test_a_firing_alert_is_a_series_and_a_warning_event_on_the_pod_and_resolving_removes_the_series() -> None:
    metrics = SchedulerMetrics(CollectorRegistry())
    recorder = FakeRecorder()
    sink = alerts.AlertSink(metrics=metrics, recorder=recorder, bus=None, identity="sched-a")
    sink.send([overuse_transition(wire.AlertState.FIRING)])
    labels = {**ALERT_LABELS, "node": "gpu-1", "gpu": "0"}
    assert sample(metrics, "quotient_alert", labels) == 1
    assert sample(metrics, "quotient_alerts_firing", {"alert": "GpuMemoryOverconsumption"}) == 1
    assert sample(metrics, "quotient_alerts_firing", {"alert": "TelemetryStale"}) == 0
    (event,) = recorder.events
    assert (event.ref.kind, event.ref.namespace, event.ref.name, event.ref.uid) == ("Pod", "ml", "train", "uid-a")
    assert (event.type, event.reason) == (events.EventType.WARNING, "GpuMemoryOverconsumption")
    sink.send([overuse_transition(wire.AlertState.RESOLVED, used_gib=10)])
    assert sample(metrics, "quotient_alert", labels) is None
    assert sample(metrics, "quotient_alerts_firing", {"alert": "GpuMemoryOverconsumption"}) == 0
    assert (recorder.events[-1].type, recorder.events[-1].reason) == (
        events.EventType.NORMAL,
        "GpuMemoryOverconsumptionResolved",
    )
    assert sink.counters.dropped == 0  # no bus configured: nothing to publish, nothing dropped


def test_a_node_level_alert_is_an_event_on_the_node_with_empty_pod_labels() -> None:
    metrics = SchedulerMetrics(CollectorRegistry())
    recorder = FakeRecorder()
    sink = alerts.AlertSink(metrics=metrics, recorder=recorder, bus=None, identity="sched-a")
    sink.send([stale_transition(wire.AlertState.FIRING)])
    labels = {"alert": "TelemetryStale", "severity": "warning", "namespace": "", "pod": "", "node": "gpu-2", "gpu": ""}
    assert sample(metrics, "quotient_alert", labels) == 1
    assert (recorder.events[0].ref.kind, recorder.events[0].ref.name) == ("Node", "gpu-2")


class DownBus:
    connected = False

    async def publish(self, subject: str, payload: bytes) -> None:
        raise AssertionError("a down bus must not be published to")

    async def subscribe(self, subject: str, handler: Callable[[str, bytes], Awaitable[None]]) -> Subscription:
        raise AssertionError("unused")

    async def flush(self, timeout_s: float = 2.0) -> None: ...

    async def close(self) -> None: ...


async def test_with_nats_down_alerts_are_dropped_and_counted_and_the_rest_still_happens() -> None:
    metrics = SchedulerMetrics(CollectorRegistry())
    recorder = FakeRecorder()
    sink = alerts.AlertSink(metrics=metrics, recorder=recorder, bus=DownBus(), identity="sched-a")
    sink.send([overuse_transition(wire.AlertState.FIRING), stale_transition(wire.AlertState.FIRING)])
    await sink.publish_queued()
    assert (sink.counters.published, sink.counters.dropped) == (0, 2)
    assert len(recorder.events) == 2 and len(sink.firing()) == 2


async def test_the_queue_of_alerts_for_nats_is_bounded_and_drops_the_oldest() -> None:
    metrics = SchedulerMetrics(CollectorRegistry())
    sink = alerts.AlertSink(
        metrics=metrics,
        recorder=FakeRecorder(),
        bus=DownBus(),
        identity="sched-a",
        max_queued=3,
    )
    sink.send([stale_transition(wire.AlertState.FIRING)] * 5)
    assert sink.counters.dropped == 2
    await sink.publish_queued()
    assert sink.counters.dropped == 5


async def test_a_subscriber_of_the_alert_subject_receives_the_alert_with_names_and_numbers(
    nats_server: NatsServer,
) -> None:
    publisher = NatsBus(servers=nats_server.url, name="test-alerts-publisher")
    reader = NatsBus(servers=nats_server.url, name="test-alerts-reader")
    await publisher.connect_once()
    await reader.connect_once()
    received: asyncio.Queue[tuple[str, wire.Alert]] = asyncio.Queue()

    async def on_message(subject: str, data: bytes) -> None:
        await received.put((subject, wire.decode_alert(data)))

    await reader.subscribe(subjects.ALERTS_ALL, on_message)
    await reader.flush()
    sink = alerts.AlertSink(
        metrics=SchedulerMetrics(CollectorRegistry()), recorder=FakeRecorder(), bus=publisher, identity="sched-a"
    )
    runner = asyncio.create_task(sink.run())
    try:
        sink.send([overuse_transition(wire.AlertState.FIRING)])
        await polling.until(
            lambda: sink.counters.published + sink.counters.dropped > 0, timeout_s=15, what="the runner publishing"
        )
        assert sink.counters.dropped == 0, sink.counters
        await publisher.flush()
        try:
            subject, alert = await asyncio.wait_for(received.get(), timeout=15)
        except TimeoutError:
            pytest.fail(
                f"published, not received: publisher {publisher.counters}, reader {reader.counters}, "
                f"server {nats_server.running=}: {nats_server.log_tail()}"
            )
    finally:
        runner.cancel()
        await publisher.close()
        await reader.close()
    assert subject == "quotient.v1.alerts.GpuMemoryOverconsumption"
    assert (alert.state, alert.pod_namespace, alert.pod_name, alert.node_name, alert.gpu_index) == (
        wire.AlertState.FIRING,
        "ml",
        "train",
        "gpu-1",
        0,
    )
    assert (alert.allotted_bytes, alert.used_bytes, alert.node) == (20 * GIB, 30 * GIB, "sched-a")
    assert alert.labels["neighbours"] == "ml/infer"
    assert sink.counters.published == 1

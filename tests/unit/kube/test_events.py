"""scheduler.kube.events: repeats are aggregated into one Event's count, and writes stay within a rate."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import pytest

from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeForbidden, KubeUnavailable
from scheduler.kube.events import EventRecorder, EventType, ObjectRef, TokenBucket
from tests.unit.kube.fakes import MemoryKube, VirtualClock

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train-0", "namespace": "ml", "uid": "u-1", "resourceVersion": "5"},
}
QUEUE = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "test", "uid": "q-1"}}


# --- the token bucket ---


def test_a_bucket_gives_its_burst_at_once_then_one_token_per_period() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)

    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(0.5) == pytest.approx(0.5)


def test_a_bucket_refills_to_its_burst_and_no_further() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=2)
    bucket.take(0.0)
    bucket.take(0.0)

    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]


def test_a_bucket_without_rate_or_burst_is_refused() -> None:
    with pytest.raises(ValueError, match="rate_per_s > 0"):
        TokenBucket(rate_per_s=0.0, burst=1)


# --- the recorder ---


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def api() -> MemoryKube:
    return MemoryKube()


def recorder_for(api: MemoryKube, clock: VirtualClock, **options: float) -> EventRecorder:
    return EventRecorder(
        api,
        instance="quotient-7d9f-abc",
        monotonic=clock.monotonic,
        wall=clock.wall,
        sleep=clock.sleep,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_event_is_written_as_a_core_v1_event_about_the_object(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock)
    running.append(asyncio.create_task(recorder.run()))

    recorder.warning(POD, "Unschedulable", "queue test is over its GPU limit (2 of 2 GPUs in use)")
    await clock.advance(0)

    [event] = api.of(kubeapi.EVENTS)
    assert event["metadata"]["namespace"] == "ml"
    assert event["metadata"]["name"].startswith("train-0.")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "train-0",
        "namespace": "ml",
        "uid": "u-1",
    }
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "Unschedulable", 1)
    assert event["message"] == "queue test is over its GPU limit (2 of 2 GPUs in use)"
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:16:40Z"
    assert event["source"] == {"component": "quotient"}
    assert event["reportingInstance"] == "quotient-7d9f-abc"


async def test_repeats_within_the_window_raise_the_count_of_one_event(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock, window_s=600.0)
    running.append(asyncio.create_task(recorder.run()))

    recorder.warning(POD, "Unschedulable", "no node fits")
    await clock.advance(0)
    for _ in range(4):
        await clock.advance(60)
        recorder.warning(POD, "Unschedulable", "no node fits")
    await clock.advance(0)

    [event] = api.of(kubeapi.EVENTS)
    assert event["count"] == 5
    assert event["lastTimestamp"] == "2026-01-01T00:20:40Z"
    assert event["firstTimestamp"] == "2026-01-01T00:16:40Z"
    assert (recorder.stats.created, recorder.stats.patched, recorder.stats.aggregated) == (1, 4, 4)


async def test_a_different_message_or_a_repeat_after_the_window_is_a_new_event(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock, window_s=600.0)
    running.append(asyncio.create_task(recorder.run()))

    recorder.warning(POD, "Unschedulable", "no node fits")
    recorder.warning(POD, "Unschedulable", "queue over limit")
    await clock.advance(601)
    recorder.warning(POD, "Unschedulable", "no node fits")
    await clock.advance(0)

    assert sorted((e["message"], e["count"]) for e in api.of(kubeapi.EVENTS)) == [
        ("no node fits", 1),
        ("no node fits", 1),
        ("queue over limit", 1),
    ]


async def test_a_storm_of_repeats_costs_at_most_the_rate_in_api_writes_and_loses_no_count(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock, rate_per_s=1.0, burst=2)
    running.append(asyncio.create_task(recorder.run()))

    for _ in range(1000):
        recorder.warning(POD, "Unschedulable", "no node fits")
        await clock.advance(0.01)
    await clock.advance(2)

    writes = sum(1 for call, _ in api.calls if call in ("create", "patch"))
    assert 2 < writes <= 2 + 12, "the burst, then one per second over about 12 s"
    [event] = api.of(kubeapi.EVENTS)
    assert event["count"] == 1000


async def test_events_about_cluster_scoped_objects_go_to_the_default_namespace(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock)
    running.append(asyncio.create_task(recorder.run()))

    recorder.record(ObjectRef.of(QUEUE), type=EventType.WARNING, reason="QueueCycle", message="parent loop")
    await clock.advance(0)

    [event] = api.of(kubeapi.EVENTS)
    assert event["metadata"]["namespace"] == "default"
    assert "namespace" not in event["involvedObject"]


async def test_an_unavailable_api_is_retried_and_a_refusal_is_dropped_without_stopping_the_recorder(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock)
    running.append(asyncio.create_task(recorder.run()))
    api.fail["create"] = deque([KubeUnavailable("down"), KubeForbidden("events is forbidden", status=403)])

    recorder.warning(POD, "Evict", "preempted by a higher priority job")
    await clock.advance(0)
    assert api.of(kubeapi.EVENTS) == []
    await clock.advance(1)
    assert recorder.stats.dropped == 1
    recorder.warning(POD, "Evict", "another message")
    await clock.advance(0)

    assert [e["message"] for e in api.of(kubeapi.EVENTS)] == ["another message"]


async def test_an_event_that_expired_on_the_server_is_created_again(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock)
    running.append(asyncio.create_task(recorder.run()))
    recorder.warning(POD, "StaleJob", "gang below minMember")
    await clock.advance(0)
    api.objects.clear()

    recorder.warning(POD, "StaleJob", "gang below minMember")
    await clock.advance(0)

    [event] = api.of(kubeapi.EVENTS)
    assert event["count"] == 2


async def test_long_messages_are_truncated_to_what_the_api_accepts(
    api: MemoryKube, clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    recorder = recorder_for(api, clock)
    running.append(asyncio.create_task(recorder.run()))

    recorder.warning(POD, "Unschedulable", "é" * 2000)
    await clock.advance(0)

    [event] = api.of(kubeapi.EVENTS)
    assert len(event["message"].encode()) <= 1024
    assert event["message"].endswith("...")


async def test_the_memory_of_events_is_bounded(api: MemoryKube, clock: VirtualClock) -> None:
    recorder = recorder_for(api, clock, max_events=10)

    for i in range(25):
        recorder.warning(POD, "Unschedulable", f"message {i}")

    assert recorder.stats.dropped == 15
    assert recorder.stats.recorded == 25


async def test_flush_returns_once_everything_recorded_is_written(
    api: MemoryKube, running: list[asyncio.Task[None]]
) -> None:
    recorder = EventRecorder(api)
    running.append(asyncio.create_task(recorder.run()))

    for i in range(5):
        recorder.normal(POD, "Bound", f"bound to node-{i}")
    await asyncio.wait_for(recorder.flush(), 5)

    assert len(api.of(kubeapi.EVENTS)) == 5

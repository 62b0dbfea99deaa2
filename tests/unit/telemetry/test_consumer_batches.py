"""The telemetry consumer's receiving side, over a fake bus that hands it batches: exactly the messages beyond the
buffer's limits are dropped, a full batch is applied at once, subjects are checked before any decoding, and
``latest()`` is a live view of samples built as they are read."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

from common import subjects, wire
from common.errors import WireReason
from scheduler.telemetry.feed import consumer

GIB = 1024**3
T0 = 1_700_000_000_000_000_000


@dataclasses.dataclass
class Counts:
    reconnects: int = 0


class FakeSubscription:
    async def unsubscribe(self) -> None:
        pass


class FakeBus:
    """A ``TelemetryBus`` whose batches the test hands over itself; the stream is empty."""

    def __init__(self) -> None:
        self.counters = Counts()
        self.handler: Callable[[list[tuple[str, bytes]]], None] | None = None
        self.filters: Sequence[str] = ()

    @property
    def connected(self) -> bool:
        return True

    async def subscribe_batches(
        self, subject_filters: Sequence[str], on_batch: Callable[[list[tuple[str, bytes]]], None]
    ) -> FakeSubscription:
        self.filters = subject_filters
        self.handler = on_batch
        return FakeSubscription()

    async def declare_telemetry_stream(self) -> None:
        pass

    async def last_per_subject(self, subject_filter: str, *, timeout_s: float = 2.0) -> Sequence[tuple[str, bytes]]:
        return []

    def deliver(self, batch: list[tuple[str, bytes]]) -> None:
        assert self.handler is not None
        self.handler(batch)


def sample(node: str, *, seq: int) -> tuple[str, bytes]:
    message = wire.NodeTelemetry(
        v=1,
        node=node,
        boot="b1",
        seq=seq,
        ts_ns=T0 + seq,
        interval_ms=250,
        gpus=(
            wire.GpuReport(
                index=0,
                uuid="GPU-0",
                model="A100",
                memory_total_bytes=80 * GIB,
                memory_reserved_bytes=0,
                memory_used_bytes=seq * GIB,
                memory_free_bytes=(80 - seq) * GIB,
                processes=(),
            ),
        ),
    )
    return subjects.telemetry(node), wire.encode(message)


@contextlib.asynccontextmanager
async def running(config: consumer.ConsumerConfig) -> AsyncIterator[tuple[consumer.TelemetryConsumer, FakeBus]]:
    bus = FakeBus()
    telemetry = consumer.TelemetryConsumer(bus=bus, config=config, now_ns=lambda: T0)
    task = asyncio.create_task(telemetry.run())
    try:
        await asyncio.wait_for(telemetry.ready.wait(), 5)
        yield telemetry, bus
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# Only a full batch (or a flush) applies anything: the timer is far away.
HELD = {"max_batch": 10_000, "flush_interval_s": 3600}


async def test_the_consumer_subscribes_to_telemetry_and_health_in_one_batched_subscription() -> None:
    async with running(consumer.ConsumerConfig(**HELD)) as (_, bus):
        assert tuple(bus.filters) == (subjects.TELEMETRY_ALL, subjects.HEALTH_ALL)


async def test_a_batch_beyond_the_message_limit_keeps_exactly_the_messages_that_fit() -> None:
    async with running(consumer.ConsumerConfig(max_buffered_messages=5, **HELD)) as (telemetry, bus):
        bus.deliver([sample("gpu-a", seq=seq) for seq in range(1, 4)])
        bus.deliver([sample("gpu-a", seq=seq) for seq in range(4, 9)])
        assert telemetry.buffered == 5
        assert telemetry.counters.dropped_buffer_full == 3
        telemetry.flush()
        assert telemetry.latest()["gpu-a"].telemetry.seq == 5


async def test_a_batch_beyond_the_byte_limit_keeps_exactly_the_messages_that_fit() -> None:
    size = len(sample("gpu-a", seq=1)[1])
    config = consumer.ConsumerConfig(max_buffered_bytes=3 * size + size // 2, **HELD)
    async with running(config) as (telemetry, bus):
        bus.deliver([sample("gpu-a", seq=seq) for seq in range(1, 6)])
        assert (telemetry.buffered, telemetry.counters.dropped_buffer_full) == (3, 2)


async def test_a_full_batch_is_applied_as_soon_as_it_arrives() -> None:
    config = consumer.ConsumerConfig(max_batch=3, flush_interval_s=3600)
    async with running(config) as (telemetry, bus):
        bus.deliver([sample("gpu-a", seq=1), sample("gpu-b", seq=1)])
        assert not telemetry.latest() and telemetry.buffered == 2
        bus.deliver([sample("gpu-c", seq=1)])
        assert sorted(telemetry.latest()) == ["gpu-a", "gpu-b", "gpu-c"] and telemetry.buffered == 0
        assert telemetry.changed.is_set()


def test_a_telemetry_subject_that_names_no_node_is_rejected_before_decoding() -> None:
    telemetry = consumer.TelemetryConsumer(bus=FakeBus())
    telemetry.ingest(
        [
            (f"{subjects.TELEMETRY_PREFIX}.a.b", b"\xc1 not msgpack"),  # two tokens: no node
            (f"{subjects.TELEMETRY_PREFIX}.", sample("gpu-a", seq=1)[1]),
            ("quotient.v1.other.gpu-a", sample("gpu-a", seq=1)[1]),
        ]
    )
    assert telemetry.counters.rejected[WireReason.SUBJECT_MISMATCH] == 3
    assert telemetry.counters.rejected_total == 3


def test_the_same_subject_keeps_naming_its_node_after_a_flood_of_other_subjects() -> None:
    telemetry = consumer.TelemetryConsumer(
        bus=FakeBus(), config=consumer.ConsumerConfig(max_nodes=3), now_ns=lambda: T0
    )
    telemetry.ingest([sample("gpu.a", seq=1)])  # a dotted name: its subject's token is gpu~a
    flood = [(subjects.telemetry(f"forged-{i}"), b"\x00") for i in range(50)]
    telemetry.ingest(flood)
    telemetry.ingest([sample("gpu.a", seq=2)])
    assert telemetry.latest()["gpu.a"].telemetry.seq == 2
    assert telemetry.counters.rejected_total == 50


def test_latest_is_a_live_view_of_samples_built_as_they_are_read() -> None:
    now = [T0]
    telemetry = consumer.TelemetryConsumer(bus=FakeBus(), now_ns=lambda: now[0])
    view = telemetry.latest()
    telemetry.ingest([sample("gpu-a", seq=1)])
    held = view["gpu-a"]
    now[0] += 250_000_000
    telemetry.ingest([sample("gpu-a", seq=2)])

    assert (held.telemetry.seq, held.received_ns) == (1, T0)  # a sample read earlier does not change
    assert (view["gpu-a"].telemetry.seq, view["gpu-a"].received_ns) == (2, T0 + 250_000_000)
    assert view["gpu-a"] == telemetry.latest()["gpu-a"]
    assert len(view) == 1 and list(view) == ["gpu-a"] and "gpu-b" not in view and view.get("gpu-b") is None
    assert {node: s.telemetry.seq for node, s in view.items()} == {"gpu-a": 2}
    telemetry.forget("gpu-a")
    assert not view and "gpu-a" not in view

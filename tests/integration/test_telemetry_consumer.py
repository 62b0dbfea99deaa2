"""The scheduler's telemetry consumer against a real nats-server: start-up replay, live follow, rejections by reason,
floods of hostile messages, bounded memory, and a server restart."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack

from common import subjects, wire
from common.errors import BusError, WireReason
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from scheduler.telemetry.feed import consumer
from tests.polling import until

GIB = 1024**3
T0 = 1_700_000_000_000_000_000


def telemetry(
    node: str, *, seq: int, boot: str = "b1", ts_ns: int | None = None, used_gib: int = 1
) -> wire.NodeTelemetry:
    return wire.NodeTelemetry(
        v=1,
        node=node,
        boot=boot,
        seq=seq,
        ts_ns=time.time_ns() if ts_ns is None else ts_ns,  # the consumer refuses a stamp far from its clock
        interval_ms=1000,
        driver_version="550.54.15",
        gpus=(
            wire.GpuReport(
                index=0,
                uuid=f"GPU-{node}-0",
                model="A100-80GB",
                memory_total_bytes=80 * GIB,
                memory_reserved_bytes=0,
                memory_used_bytes=used_gib * GIB,
                memory_free_bytes=(80 - used_gib) * GIB,
                processes=(wire.ProcessReport(pid=100, used_memory_bytes=used_gib * GIB, pod_uid="uid-1"),),
            ),
        ),
    )


def health(node: str, *, seq: int, status: wire.HealthStatus = wire.HealthStatus.HEALTHY) -> wire.NodeHealth:
    return wire.NodeHealth(v=1, node=node, boot="b1", seq=seq, ts_ns=time.time_ns(), status=status, problems=())


def tampered(message: wire.NodeTelemetry, **changes: Any) -> bytes:
    """A message re-encoded with plain msgpack after changing (or, with None, removing) fields."""
    fields = msgpack.unpackb(wire.encode(message))
    for key, value in changes.items():
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    return bytes(msgpack.packb(fields))


@contextlib.asynccontextmanager
async def connected(server: NatsServer, name: str) -> AsyncIterator[NatsBus]:
    bus = NatsBus(servers=server.url, name=name)
    await bus.connect_once()
    try:
        yield bus
    finally:
        await bus.close()


@contextlib.asynccontextmanager
async def running(
    server: NatsServer, config: consumer.ConsumerConfig | None = None
) -> AsyncIterator[consumer.TelemetryConsumer]:
    async with connected(server, "scheduler") as bus:
        telemetry_consumer = consumer.TelemetryConsumer(bus=bus, config=config)
        task = asyncio.create_task(telemetry_consumer.run())
        try:
            await asyncio.wait_for(telemetry_consumer.ready.wait(), 10)
            yield telemetry_consumer
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def publish(bus: NatsBus, subject: str, payload: bytes) -> None:
    await bus.publish(subject, payload)


async def test_last_sample_and_health_of_every_node_are_read_at_start(nats_server: NatsServer) -> None:
    async with connected(nats_server, "agent") as agent:
        await agent.declare_telemetry_stream()
        for node in ("gpu-a", "gpu-b", "gpu-c.example"):
            for seq in (1, 2, 3):
                await publish(agent, subjects.telemetry(node), wire.encode(telemetry(node, seq=seq)))
            await publish(agent, subjects.health(node), wire.encode(health(node, seq=1)))
        await agent.flush()

        async with running(nats_server) as telemetry_consumer:
            latest = telemetry_consumer.latest()
            assert {node: sample.telemetry.seq for node, sample in latest.items()} == {
                "gpu-a": 3,
                "gpu-b": 3,
                "gpu-c.example": 3,
            }
            assert set(telemetry_consumer.health()) == {"gpu-a", "gpu-b", "gpu-c.example"}
            changes = telemetry_consumer.take_changes()
            assert changes.telemetry == {"gpu-a", "gpu-b", "gpu-c.example"}
            assert telemetry_consumer.counters.replays == 1
            assert telemetry_consumer.counters.rejected_total == 0


async def test_samples_published_while_the_consumer_starts_are_neither_lost_nor_rejected(
    nats_server: NatsServer,
) -> None:
    async with connected(nats_server, "agent") as agent:
        await agent.declare_telemetry_stream()
        nodes = [f"gpu-{i}" for i in range(20)]
        published = 0
        stop = asyncio.Event()

        async def keep_publishing() -> None:
            nonlocal published
            while not stop.is_set():  # whole rounds only, so every node ends at the same seq
                published += 1
                for node in nodes:
                    await publish(agent, subjects.telemetry(node), wire.encode(telemetry(node, seq=published)))
                await asyncio.sleep(0)

        publisher = asyncio.create_task(keep_publishing())
        try:
            await until(lambda: published >= 20)
            async with running(nats_server) as telemetry_consumer:
                await until(lambda: telemetry_consumer.counters.accepted_telemetry >= 40 * len(nodes))
                stop.set()
                await publisher
                await agent.flush()
                await until(lambda: all(telemetry_consumer.latest()[n].telemetry.seq == published for n in nodes))
                assert telemetry_consumer.counters.rejected_total == 0
        finally:
            publisher.cancel()


async def test_live_samples_replace_the_previous_ones_and_signal_a_change(nats_server: NatsServer) -> None:
    async with running(nats_server) as telemetry_consumer, connected(nats_server, "agent") as agent:
        assert not telemetry_consumer.latest()
        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=1, used_gib=2)))
        await asyncio.wait_for(telemetry_consumer.changed.wait(), 5)
        assert telemetry_consumer.take_changes().telemetry == {"gpu-a"}
        assert not telemetry_consumer.changed.is_set()

        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=2, used_gib=30)))
        await publish(
            agent, subjects.health("gpu-a"), wire.encode(health("gpu-a", seq=1, status=wire.HealthStatus.DEGRADED))
        )
        await until(lambda: "gpu-a" in telemetry_consumer.health())
        await until(lambda: telemetry_consumer.latest()["gpu-a"].telemetry.seq == 2)
        sample = telemetry_consumer.latest()["gpu-a"]
        assert sample.telemetry.gpus[0].memory_used_bytes == 30 * GIB
        assert sample.received_ns > 0
        assert telemetry_consumer.health()["gpu-a"].health.status is wire.HealthStatus.DEGRADED
        assert telemetry_consumer.counters.accepted_telemetry == 2
        assert telemetry_consumer.counters.accepted_health == 1


async def test_every_kind_of_bad_message_is_rejected_and_counted_by_reason(nats_server: NatsServer) -> None:
    good = telemetry("gpu-a", seq=10)
    bad: dict[WireReason, tuple[str, bytes]] = {
        WireReason.NOT_MSGPACK: (subjects.telemetry("gpu-a"), b"\xc1 not msgpack"),
        WireReason.TRUNCATED: (subjects.telemetry("gpu-a"), wire.encode(good)[:-7]),
        # Nested deeper than the decoder allows, under a key the schema does not know.
        WireReason.OVERSIZED: (subjects.telemetry("gpu-a"), b"\x81\xa1x" + b"\x91" * 100_000 + b"\xc0"),
        WireReason.WRONG_TYPE: (subjects.telemetry("gpu-a"), tampered(good, seq="eleven")),
        WireReason.OUT_OF_RANGE: (subjects.telemetry("gpu-a"), tampered(good, interval_ms=0)),
        WireReason.MISSING_FIELD: (subjects.telemetry("gpu-a"), tampered(good, boot=None)),
        WireReason.UNKNOWN_VERSION: (subjects.telemetry("gpu-a"), tampered(good, v=2)),
        WireReason.CLOCK_SKEW: (
            subjects.telemetry("gpu-a"),
            wire.encode(telemetry("gpu-a", seq=11, ts_ns=time.time_ns() + 3600 * 10**9)),
        ),
        WireReason.SUBJECT_MISMATCH: (subjects.telemetry("gpu-b"), wire.encode(telemetry("gpu-a", seq=11))),
    }
    async with running(nats_server) as telemetry_consumer, connected(nats_server, "agent") as agent:
        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(good))
        await until(lambda: "gpu-a" in telemetry_consumer.latest())
        for subject, payload in bad.values():
            await publish(agent, subject, payload)
        # The same message again (as a replay overlapping the live feed delivers it) is a duplicate, not a rejection.
        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(good))
        # Health is checked by the same rules.
        await publish(agent, subjects.health("gpu-a"), b"\x00")
        await until(lambda: telemetry_consumer.counters.received >= 1 + len(bad) + 2)

        rejected = telemetry_consumer.counters.rejected
        assert {reason: rejected[reason] for reason in bad} == {
            reason: 2 if reason is WireReason.WRONG_TYPE else 1 for reason in bad
        }
        assert telemetry_consumer.counters.duplicates == 1
        assert telemetry_consumer.latest()["gpu-a"].telemetry.seq == 10
        assert "gpu-b" not in telemetry_consumer.latest()


def test_a_payload_beyond_the_largest_nats_message_is_rejected_as_oversized() -> None:
    # nats-server refuses such a message from a publisher, so only a misconfigured server could deliver it.
    telemetry_consumer = consumer.TelemetryConsumer(bus=NatsBus(servers="nats://127.0.0.1:1", name="unused"))
    telemetry_consumer.ingest([(subjects.telemetry("gpu-a"), b"\x00" * (wire.MAX_MESSAGE_BYTES + 1))])
    assert telemetry_consumer.counters.rejected[WireReason.OVERSIZED] == 1
    assert not telemetry_consumer.latest()


def test_nodes_beyond_the_cap_are_dropped_and_silent_nodes_are_forgotten() -> None:
    now = [T0]
    telemetry_consumer = consumer.TelemetryConsumer(
        bus=NatsBus(servers="nats://127.0.0.1:1", name="unused"),
        config=consumer.ConsumerConfig(max_nodes=3, forget_after_s=60),
        now_ns=lambda: now[0],
    )
    nodes = [f"gpu-{i}" for i in range(5)]
    telemetry_consumer.ingest([(subjects.telemetry(n), wire.encode(telemetry(n, seq=1, ts_ns=now[0]))) for n in nodes])
    assert sorted(telemetry_consumer.latest()) == nodes[:3]
    assert telemetry_consumer.counters.dropped_node_limit == 2

    now[0] += 30 * 10**9
    telemetry_consumer.ingest([(subjects.telemetry("gpu-0"), wire.encode(telemetry("gpu-0", seq=2, ts_ns=now[0])))])
    telemetry_consumer.take_changes()
    now[0] += 40 * 10**9
    assert telemetry_consumer.forget_silent(now[0]) == {"gpu-1", "gpu-2"}
    assert sorted(telemetry_consumer.latest()) == ["gpu-0"]
    assert telemetry_consumer.take_changes().forgotten == {"gpu-1", "gpu-2"}
    # A forgotten node's next message is accepted as a first one, and room was made for new nodes.
    telemetry_consumer.ingest(
        [(subjects.telemetry(n), wire.encode(telemetry(n, seq=1, ts_ns=now[0]))) for n in ("gpu-1", "gpu-4")]
    )
    assert sorted(telemetry_consumer.latest()) == ["gpu-0", "gpu-1", "gpu-4"]


async def test_a_flood_of_garbage_oversized_and_forged_messages_is_counted_without_harm(
    nats_server: NatsServer,
) -> None:
    config = consumer.ConsumerConfig(max_nodes=50, max_buffered_messages=2000)
    flood = 6000
    async with running(nats_server, config) as telemetry_consumer, connected(nats_server, "attacker") as attacker:
        for i in range(flood):
            match i % 4:
                case 0:
                    subject, payload = subjects.telemetry(f"n{i}"), bytes([i % 256]) * (i % 300)
                case 1:
                    subject, payload = subjects.telemetry("gpu-a"), b"\x81\xa1x" + b"\x91" * 5000 + b"\xc0"
                case 2:  # forged: a valid message naming another node than its subject
                    subject, payload = subjects.telemetry("gpu-a"), wire.encode(telemetry(f"n{i}", seq=1))
                case _:  # valid messages from ever new node names: bounded by max_nodes
                    subject, payload = subjects.telemetry(f"n{i}"), wire.encode(telemetry(f"n{i}", seq=1))
            await publish(attacker, subject, payload)
            if i % 500 == 0:
                await attacker.flush()
                assert telemetry_consumer.buffered <= config.max_buffered_messages
        await attacker.flush()
        counters = telemetry_consumer.counters
        await until(lambda: counters.received + counters.dropped_buffer_full >= flood)

        assert counters.rejected[WireReason.SUBJECT_MISMATCH] == flood // 4
        assert counters.rejected[WireReason.OVERSIZED] == flood // 4
        assert counters.rejected_total >= flood // 2
        assert counters.dropped_node_limit == flood // 4 - config.max_nodes
        assert len(telemetry_consumer.latest()) == config.max_nodes

        # Still alive and taking good messages from a node it knows.
        await publish(attacker, subjects.telemetry("n3"), wire.encode(telemetry("n3", seq=2)))
        await until(lambda: telemetry_consumer.latest()["n3"].telemetry.seq == 2)


async def test_messages_beyond_the_buffer_are_dropped_and_counted_at_the_door(nats_server: NatsServer) -> None:
    # A batch is due only after a long interval or 1,000 messages, so the buffer fills up before anything is applied.
    config = consumer.ConsumerConfig(max_batch=1000, max_buffered_messages=10, flush_interval_s=30)
    async with running(nats_server, config) as telemetry_consumer, connected(nats_server, "agent") as agent:
        for seq in range(1, 26):
            await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=seq)))
        await agent.flush()
        await until(lambda: telemetry_consumer.counters.dropped_buffer_full == 15)
        assert telemetry_consumer.buffered == 10
        telemetry_consumer.flush()
        assert telemetry_consumer.latest()["gpu-a"].telemetry.seq == 10


async def test_the_consumer_recovers_after_nats_server_restarts(nats_server: NatsServer) -> None:
    async with running(nats_server) as telemetry_consumer, connected(nats_server, "agent") as agent:
        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=1)))
        await until(lambda: "gpu-a" in telemetry_consumer.latest())

        nats_server.stop()
        nats_server.start()  # same port; memory storage: the stream is gone with the old process

        # The agent keeps publishing its newest sample; the consumer reconnects, declares and replays the stream,
        # and follows live again.
        seq = 2

        async def followed_after_reconnect() -> bool:
            nonlocal seq
            if telemetry_consumer.latest()["gpu-a"].telemetry.seq >= 2:
                return True
            with contextlib.suppress(BusError):
                await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=seq)))
                seq += 1
            return False

        await until(followed_after_reconnect, timeout_s=20, interval_s=0.05)
        await until(lambda: telemetry_consumer.counters.replays >= 2)
        assert telemetry_consumer.counters.gaps >= 1
        await publish(agent, subjects.telemetry("gpu-a"), wire.encode(telemetry("gpu-a", seq=1000)))
        await agent.flush()
        await until(lambda: telemetry_consumer.latest()["gpu-a"].telemetry.seq == 1000)

    # The restarted server holds the stream again, so a scheduler starting now reads the last sample at once.
    async with running(nats_server) as fresh:
        assert fresh.latest()["gpu-a"].telemetry.seq == 1000

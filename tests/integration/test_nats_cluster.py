"""NATS as a cluster, proven with three real ``nats-server`` processes on loopback (TLS on clients and routes, as deploy
runs them): the telemetry stream keeps three copies, and killing the server the scheduler's connections are on, one
after the other, loses neither telemetry nor alerts, and decodes nothing twice.

The scheduler's side is its real NATS side: ``NatsBus`` over every server of the cluster with ``stream_replicas=3``,
and the ``TelemetryConsumer`` that reads telemetry through the fast path and replays the stream after a reconnect.
Three agents publish a sample every 50 ms each over their own connections; a reader on the cluster stands for a
third-party alert subscriber. Between the bus and the consumer, a counting wrapper records every message handed
over, live or replayed, so "nothing decoded twice" is checked message by message rather than inferred.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import nats
import pytest

from common import messaging, natstls, subjects, wire
from common.errors import BusError
from common.natscluster import NatsCluster
from common.natsconn import NatsBus
from quotient import natscerts
from scheduler.telemetry.feed import consumer
from tests.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GIB = 1024**3
NODES = ("gpu-a", "gpu-b", "gpu-c")
SCHEDULER = "quotient-scheduler-cluster-test"
INTERVAL_S = 0.05
# What a failover may take: the reader reconnects within its backoff (well under a second), JetStream elects a new
# stream leader within a few seconds; twice that, for a loaded machine.
FAILOVER_S = 20.0


def sample(node: str, seq: int) -> bytes:
    return wire.encode(
        wire.NodeTelemetry(
            v=1,
            node=node,
            boot="b1",
            seq=seq,
            ts_ns=time.time_ns(),
            interval_ms=round(INTERVAL_S * 1000),
            driver_version="550.54.15",
            gpus=(
                wire.GpuReport(
                    index=0,
                    uuid=f"GPU-{node}-0",
                    model="A100-80GB",
                    memory_total_bytes=80 * GIB,
                    memory_reserved_bytes=0,
                    memory_used_bytes=GIB,
                    memory_free_bytes=79 * GIB,
                    processes=(wire.ProcessReport(pid=100, used_memory_bytes=GIB, pod_uid="uid-1"),),
                ),
            ),
        )
    )


def alert(count: int) -> bytes:
    return wire.encode(
        wire.Alert(
            v=1,
            node=SCHEDULER,
            boot="s1",
            seq=count,
            ts_ns=time.time_ns(),
            name="TelemetryStale",
            state=wire.AlertState.FIRING,
            severity=wire.Severity.WARNING,
            node_name=NODES[0],
            message=f"alert {count}",
            labels={},
        )
    )


class CountingBus:
    """The scheduler's bus as the consumer sees it (``consumer.TelemetryBus``), counting what it hands over: every
    live message by (node, seq), and every replayed one."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.live: list[tuple[str, int]] = []
        self.replayed = 0

    @property
    def connected(self) -> bool:
        return self.bus.connected

    @property
    def counters(self) -> messaging.BusCounters:
        return self.bus.counters

    async def subscribe_batches(
        self, subject_filters: Sequence[str], on_batch: messaging.BatchHandler
    ) -> messaging.Subscription:
        def counted(batch: list[tuple[str, bytes]]) -> None:
            for _, payload in batch:
                message = wire.decode_telemetry(payload)
                self.live.append((message.node, message.seq))
            on_batch(batch)

        return await self.bus.subscribe_batches(subject_filters, counted)

    async def declare_telemetry_stream(self) -> None:
        await self.bus.declare_telemetry_stream()

    async def last_per_subject(self, subject_filter: str, *, timeout_s: float = 2.0) -> Sequence[tuple[str, bytes]]:
        replayed = await self.bus.last_per_subject(subject_filter, timeout_s=timeout_s)
        self.replayed += len(replayed)
        return replayed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    files = natscerts.for_loopback(tmp_path_factory.mktemp("nats-tls") / "tls")
    with NatsCluster(tls=files) as started:
        yield started


def ca_of(cluster: NatsCluster) -> Path:
    assert cluster.tls is not None
    return cluster.tls.ca


@contextlib.asynccontextmanager
async def connected(cluster: NatsCluster, name: str, *, replicas: int = 1) -> AsyncIterator[NatsBus]:
    bus = NatsBus(servers=cluster.urls, name=name, tls_ca=ca_of(cluster), stream_replicas=replicas)
    await asyncio.wait_for(bus.connect_once(), 20)
    try:
        yield bus
    finally:
        await bus.close()


async def test_the_telemetry_stream_keeps_three_copies_on_the_cluster(cluster: NatsCluster) -> None:
    async with connected(cluster, "scheduler-declaring", replicas=3) as bus:
        await bus.declare_telemetry_stream()
        await bus.declare_telemetry_stream()  # idempotent

    client = await nats.connect(
        servers=cluster.urls.split(","), tls=natstls.client_context(ca_of(cluster)), connect_timeout=5
    )
    try:
        info = await client.jetstream().stream_info(subjects.TELEMETRY_STREAM)
    finally:
        await client.close()
    assert info.config.num_replicas == 3
    assert info.cluster is not None and info.cluster.leader and len(info.cluster.replicas or []) == 2


class AlertProbe:
    """The scheduler's client publishing alerts, and a third party (on the cluster too) hearing them."""

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self.sent = 0
        self.heard: list[int] = []

    async def hear(self, _subject: str, data: bytes) -> None:
        self.heard.append(wire.decode_alert(data).seq)

    async def heard_since(self, first: int) -> bool:
        """Publish the next alert (while the client has no server, it waits for the next poll); whether one numbered
        ``first`` or later was heard."""
        with contextlib.suppress(BusError):
            await self.bus.publish(subjects.alert("TelemetryStale"), alert(self.sent + 1))
            self.sent += 1
        return any(seq >= first for seq in self.heard)


async def outlive(cluster: NatsCluster, victim: int, telemetry: consumer.TelemetryConsumer, alerts: AlertProbe) -> None:
    """Kill member ``victim``; telemetry of every node and an alert get through within ``FAILOVER_S``, and so does the
    stream's replay where the reader lost its server; then the member comes back."""
    before = {node: s.telemetry.seq for node, s in telemetry.latest().items()}
    gaps, replays, first_alert = telemetry.counters.gaps, telemetry.counters.replays, alerts.sent + 1
    cluster.kill(victim)

    def moved_on() -> bool:
        latest = telemetry.latest()
        return all(latest[node].telemetry.seq >= before[node] + 5 for node in NODES)

    await until(moved_on, timeout_s=FAILOVER_S, what=f"telemetry of every node after server {victim} died")
    await until(
        lambda: alerts.heard_since(first_alert),
        timeout_s=FAILOVER_S,
        interval_s=0.2,
        what=f"an alert after server {victim} died",
    )
    if telemetry.counters.gaps > gaps:  # the reader's server: the stream is replayed once it has a leader again
        await until(
            lambda: telemetry.counters.replays > replays,
            timeout_s=FAILOVER_S,
            what=f"the stream replayed after server {victim} died",
        )
    await asyncio.to_thread(cluster.restart, victim)


async def test_killing_the_server_the_scheduler_is_on_loses_no_telemetry_nor_alert_and_decodes_nothing_twice(
    cluster: NatsCluster,
) -> None:
    sent: dict[str, int] = dict.fromkeys(NODES, 0)
    stop = asyncio.Event()

    async def agent(node: str) -> None:
        async with connected(cluster, f"quotient-agent-{node}") as bus:
            while not stop.is_set():
                with contextlib.suppress(BusError):  # its server is the one down: the next sample goes later
                    await bus.publish(subjects.telemetry(node), sample(node, sent[node] + 1))
                    sent[node] += 1
                await asyncio.sleep(INTERVAL_S)

    async with (
        connected(cluster, SCHEDULER, replicas=3) as bus,
        connected(cluster, "alert-reader") as reader,
        asyncio.TaskGroup() as group,
    ):
        alerts = AlertProbe(bus)
        await reader.subscribe(subjects.ALERTS_ALL, alerts.hear)
        await reader.flush()
        counting = CountingBus(bus)
        telemetry = consumer.TelemetryConsumer(bus=counting)
        reading = group.create_task(telemetry.run())
        agents = [group.create_task(agent(node)) for node in NODES]
        await until(lambda: set(telemetry.latest()) == set(NODES), timeout_s=FAILOVER_S, what="every node")
        victims = cluster.connected(SCHEDULER)
        assert victims, "the scheduler is connected somewhere"
        # Its reader's server and its client's (one server or two), one at a time, so JetStream keeps a quorum.
        for victim in victims:
            await outlive(cluster, victim, telemetry, alerts)
        stop.set()
        await asyncio.gather(*agents)
        await until(lambda: telemetry.buffered == 0, what="the consumer's buffer applied")
        reading.cancel()

    counters = telemetry.counters
    live = counting.live
    assert len(live) == len(set(live)), "a message was handed over twice by the live subscription"
    assert counters.received == len(live) + counting.replayed
    # Every message handed over was either accepted once or recognised as one already accepted (the replay's
    # overlap with the live feed): none was accepted twice, rejected, or taken for a second publisher.
    assert counters.accepted_telemetry + counters.duplicates == counters.received
    assert counters.accepted_telemetry <= sum(sent.values())
    assert counters.rejected_total == 0 and counters.forks == 0
    # The reader lost its server at least once, and replayed the stream after it.
    assert counters.gaps >= 1 and counters.replays >= 2


@pytest.fixture(autouse=True)
def _whole_cluster(cluster: NatsCluster) -> Iterator[None]:
    """Each test starts and ends with every member running."""
    for index, server in enumerate(cluster.servers):
        if not server.running:
            cluster.restart(index)
    yield

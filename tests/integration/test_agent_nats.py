"""The agent against a real nats-server: what it publishes, what the stream keeps, outages and restarts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from agent import fakenode
from agent.loop import AgentLoop
from agent.metrics import AgentMetrics
from agent.podmap import PodMapper
from common import clusterspec, sequencing, subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from tests.polling import until

SPEC = """
nodes:
  - name: gpu-a
    gpus: {count: 2, model: A100-80GB}
    unowned_processes:
      - {gpu: 1, memory: 6Gi}
  - name: gpu-b
    gpus: {count: 1, model: T4}
pods:
  - name: train
    node: gpu-a
    requests: {nvidia.com/gpu: 1}
    gpu_memory: "2Gi@0s,30Gi@20s"
  - name: infer
    node: gpu-a
    annotations: {gpu-fraction: "0.25"}
    gpu_memory: "3Gi"
"""


class Clock:
    """A clock the test moves by hand, so the fake GPUs' memory scripts are deterministic."""

    def __init__(self) -> None:
        self.now_ns = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        return self.now_ns


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, subject: str, data: bytes) -> None:
        self.messages.append((subject, data))
        self.arrived.set()

    def telemetry(self, node: str) -> list[wire.NodeTelemetry]:
        subject = subjects.telemetry(node)
        return [wire.decode_telemetry(data, subject_node=node) for s, data in self.messages if s == subject]

    def health(self, node: str) -> list[wire.NodeHealth]:
        subject = subjects.health(node)
        return [wire.decode_health(data, subject_node=node) for s, data in self.messages if s == subject]


@contextlib.asynccontextmanager
async def running_agent(
    server_url: str, node: str, clock: Clock, *, interval_s: float = 0.1, boot: str | None = None
) -> AsyncIterator[tuple[AgentLoop, fakenode.FakeNode, NatsBus]]:
    spec = clusterspec.loads(SPEC)
    fake = fakenode.from_cluster_spec(spec, node=node, clock=clock)
    agent_ref: list[AgentLoop] = []

    async def reconnected() -> None:
        await agent_ref[0].on_reconnect()

    bus = NatsBus(servers=server_url, name=f"test-agent-{node}", on_reconnect=reconnected)
    agent = AgentLoop(
        node=node,
        probe=fake.probe,
        pods=PodMapper(fake.proc_root),
        bus=bus,
        metrics=AgentMetrics(node=node),
        interval_s=interval_s,
        clock_ns=clock,
        boot=boot,
    )
    agent_ref.append(agent)
    connect = asyncio.create_task(bus.connect())
    task = asyncio.create_task(agent.run())
    try:
        yield agent, fake, bus
    finally:
        task.cancel()
        connect.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(asyncio.CancelledError):
            await connect
        await bus.close()
        fake.close()


@pytest.fixture
async def reader(nats_server: NatsServer) -> AsyncIterator[tuple[NatsBus, Collector]]:
    bus = NatsBus(servers=nats_server.url, name="test-reader")
    await bus.connect_once()
    collector = Collector()
    await bus.subscribe("quotient.v1.>", collector)
    yield bus, collector
    await bus.close()


async def test_a_subscriber_decodes_exactly_what_the_fake_gpus_reported(
    nats_server: NatsServer, reader: tuple[NatsBus, Collector]
) -> None:
    _, collector = reader
    clock = Clock()
    async with running_agent(nats_server.url, "gpu-a", clock) as (agent, fake, _):
        await until(lambda: len(collector.telemetry("gpu-a")) >= 2)
        clock.now_ns += 25 * 1_000_000_000  # the train pod's script steps up to 30Gi at 20 s
        expected = fake.probe.sample()
        await until(lambda: any(t.ts_ns == expected.ts_ns for t in collector.telemetry("gpu-a")))
    received = next(t for t in collector.telemetry("gpu-a") if t.ts_ns == expected.ts_ns)
    assert received.node == "gpu-a" and received.boot == agent.boot
    assert [g.uuid for g in received.gpus] == [d.uuid for d in expected.devices]
    for report, device in zip(received.gpus, expected.devices, strict=True):
        assert report.memory_total_bytes == device.memory_total_bytes
        assert report.memory_used_bytes == device.memory_used_bytes
        assert report.memory_free_bytes == device.memory_free_bytes
        assert sorted((p.pid, p.used_memory_bytes) for p in report.processes) == sorted(
            (p.pid, p.used_memory_bytes) for p in device.processes or ()
        )
    train_uid = fakenode.pod_uid_for("default", "train")
    infer_uid = fakenode.pod_uid_for("default", "infer")
    by_pod = {p.pod_uid: (g.index, p.used_memory_bytes) for g in received.gpus for p in g.processes}
    assert by_pod[train_uid] == (0, 30 * 1024**3)
    assert by_pod[infer_uid] == (1, 3 * 1024**3)
    assert by_pod[None] == (1, 6 * 1024**3)  # the process of no pod is reported as such
    seqs = [t.seq for t in collector.telemetry("gpu-a")]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert collector.health("gpu-a")[0].status == wire.HealthStatus.HEALTHY


async def test_the_stream_holds_the_last_sample_and_health_of_every_node(
    nats_server: NatsServer, reader: tuple[NatsBus, Collector]
) -> None:
    bus, collector = reader
    await bus.declare_telemetry_stream()
    await bus.declare_telemetry_stream()  # idempotent
    clock = Clock()
    async with running_agent(nats_server.url, "gpu-a", clock), running_agent(nats_server.url, "gpu-b", clock):
        await until(lambda: len(collector.telemetry("gpu-a")) >= 3 and len(collector.telemetry("gpu-b")) >= 3)

    async def stream_holds_the_last_sample_received() -> bool:
        # The agents are gone: their last sample reaches the stream and the reader, in whichever order.
        last_a = await bus.last_message(subjects.telemetry("gpu-a"))
        return last_a is not None and wire.decode_telemetry(last_a).seq == collector.telemetry("gpu-a")[-1].seq

    await until(stream_holds_the_last_sample_received, what="the stream's last gpu-a sample")
    replay = await bus.last_per_subject("quotient.v1.>")
    assert sorted(subject for subject, _ in replay) == sorted(
        [subjects.telemetry("gpu-a"), subjects.telemetry("gpu-b"), subjects.health("gpu-a"), subjects.health("gpu-b")]
    )
    health_b = next(data for subject, data in replay if subject == subjects.health("gpu-b"))
    assert wire.decode_health(health_b).status == wire.HealthStatus.HEALTHY
    assert await bus.last_message(subjects.telemetry("no-such-node")) is None


async def test_the_agent_survives_a_nats_outage_and_publishes_its_newest_sample_when_back(
    nats_server: NatsServer,
) -> None:
    clock = Clock()
    async with running_agent(nats_server.url, "gpu-a", clock, interval_s=0.05) as (agent, _, bus):
        await until(lambda: bus.connected)
        nats_server.stop()
        await until(lambda: not bus.connected)
        outage_started_seq = agent.latest.seq if agent.latest else 0
        # The agent keeps sampling through the outage.
        await until(lambda: agent.latest is not None and agent.latest.seq > outage_started_seq + 3)
        assert agent.healthy()
        nats_server.start()
        listener = NatsBus(servers=nats_server.url, name="late-reader")
        await listener.connect_once()
        collector = Collector()
        await listener.subscribe(subjects.TELEMETRY_ALL, collector)
        await until(lambda: bus.connected, timeout_s=15)
        await until(lambda: len(collector.telemetry("gpu-a")) >= 2)
        await listener.close()
    assert bus.counters.disconnects >= 1 and bus.counters.reconnects >= 1
    first = collector.telemetry("gpu-a")[0]
    # Nothing from the outage was queued: the first message after it is a fresh one.
    assert first.seq > outage_started_seq + 3


async def test_a_reader_accepts_a_restarted_agent_with_a_new_boot(
    nats_server: NatsServer, reader: tuple[NatsBus, Collector]
) -> None:
    _, collector = reader
    clock = Clock()
    gate = sequencing.SequenceGate()
    async with running_agent(nats_server.url, "gpu-b", clock, boot="first-boot"):
        await until(lambda: len(collector.telemetry("gpu-b")) >= 5)
    clock.now_ns += 1_000_000_000
    first_run = collector.telemetry("gpu-b")
    for message in first_run:
        assert gate.admit_message(message).accepted
    collector.messages.clear()
    async with running_agent(nats_server.url, "gpu-b", clock, boot="second-boot"):
        await until(lambda: len(collector.telemetry("gpu-b")) >= 1)
    restarted = collector.telemetry("gpu-b")[0]
    assert restarted.boot == "second-boot" and restarted.seq < first_run[-1].seq
    assert gate.admit_message(restarted).accepted
    assert not gate.admit_message(first_run[-1]).accepted  # the old boot cannot come back

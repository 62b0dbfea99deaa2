"""NATS as a cluster, with the real scheduler process: three real nats-servers on loopback, TLS on clients and routes
as deploy runs them, the agents of emulated GPU nodes and a third-party alert subscriber on the cluster, and the
scheduler given every server (``--nats`` a list, ``--nats-ca``, ``--telemetry-stream-replicas 3``).

The server each of the scheduler's connections is on is killed in turn (and brought back before the next, so
JetStream keeps its quorum): within a bounded wait the scheduler accepts telemetry again and an over-consumption that
begins after the kill reaches the subscriber as an alert. Nothing is rejected and no node looks published twice
(``TelemetryConflict``). (The message-by-message proof that the consumer decodes nothing twice through a failover,
which needs the consumer's own counters, is ``tests/integration/test_nats_cluster.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import clusterspec, subjects, wire
from common.natscluster import NatsCluster
from common.natsconn import NatsBus
from common.natsserver import free_port
from quotient import natscerts
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from quotient.emulator.kubelets import KubeletConfig
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from tests import polling
from tests.e2e import harness
from tests.e2e.telemetry_harness import INTERVAL_S, SCHEDULER_FLAGS, LoopThread, share_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = """
nodes:
  - {name: gpu-0, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-1, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-2, gpus: {count: 1, model: A100-80GB}}
"""
IDENTITY = "sched-a"
CONNECTION = f"quotient-scheduler-{IDENTITY}"
# A reconnect takes the backoff (under a second), the stream's new leader a few seconds; an alert, the grace (1 s)
# and a few intervals more. Room for a loaded machine on top.
FAILOVER_S = 30.0


class Alerts:
    """A third-party subscriber of ``quotient.v1.alerts.>`` on the cluster, over TLS with the CA pinned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[wire.Alert] = []
        self.bus: NatsBus | None = None

    async def start(self, urls: str, ca: Path) -> None:
        self.bus = NatsBus(servers=urls, name="test-alert-reader", tls_ca=ca)
        await asyncio.wait_for(self.bus.connect_once(), 20)
        await self.bus.subscribe(subjects.ALERTS_ALL, self._on_message)
        await self.bus.flush()

    async def _on_message(self, _subject: str, data: bytes) -> None:
        with self._lock:
            self._received.append(wire.decode_alert(data))

    def fired_for(self, pod: str) -> bool:
        with self._lock:
            return any(a.pod_name == pod and a.state is wire.AlertState.FIRING for a in self._received)

    def names(self) -> set[str]:
        with self._lock:
            return {a.name for a in self._received}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class World:
    cluster: NatsCluster
    alerts: Alerts
    kubectl: harness.Kubectl
    metrics_port: int
    workdir: Path

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of ``name`` on the scheduler's /metrics whose labels include ``labels``."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        return None

    def accepted(self) -> float:
        return self.value("quotient_telemetry_messages_total", outcome="accepted") or 0.0

    def apply(self, name: str, *objects: Mapping[str, Any]) -> None:
        harness.apply_objects(self.kubectl, self.workdir, name, *objects)


@contextlib.contextmanager
def clustered_world() -> Iterator[World]:
    workdir = tempfile.TemporaryDirectory(prefix="quotient-nats-cluster-e2e-")
    files = natscerts.for_loopback(Path(workdir.name) / "tls")
    cluster = NatsCluster(tls=files).start()
    spec = clusterspec.loads(SPEC)
    loop = LoopThread()
    emulator = EmulatorThread(spec, config=EmulatorConfig(kubelet=KubeletConfig(start_delay_s=0.05))).start()
    nodes = EmulatedNodes(spec, nats_url=cluster.urls, interval_s=INTERVAL_S, tls_ca=files.ca)
    runtime = GpuNodesRuntime(nodes)

    def add_runtimes() -> None:
        for name in nodes.fakes:
            emulator.emulator.add_runtime(runtime, node=name)

    emulator.call(add_runtimes)

    async def start_agents() -> asyncio.Task[None]:
        return asyncio.create_task(nodes.run())

    agents = loop.run(start_agents())
    alerts = Alerts()
    loop.run(alerts.start(cluster.urls, files.ca))
    port = free_port()
    scheduler = harness.SchedulerProcess(
        emulator.url,
        "--nats",
        cluster.urls,
        "--nats-ca",
        str(files.ca),
        "--telemetry-stream-replicas",
        "3",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        *SCHEDULER_FLAGS,
        identity=IDENTITY,
    )
    kubectl = harness.Kubectl(emulator.url)
    world = World(cluster=cluster, alerts=alerts, kubectl=kubectl, metrics_port=port, workdir=Path(workdir.name))
    try:
        polling.until_sync(
            lambda: world.value("quotient_scheduler_leader") == 1.0, timeout_s=30, what="the scheduler leading"
        )
        yield world
    finally:
        print(scheduler.log()[-6000:])
        scheduler.close()
        kubectl.close()

        async def stop_agents() -> None:
            agents.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await agents
            if alerts.bus is not None:
                await alerts.bus.close()

        with contextlib.suppress(Exception):
            loop.run(stop_agents(), timeout_s=10)
        loop.stop()
        emulator.stop()
        nodes.close()
        cluster.close()
        workdir.cleanup()


def test_killing_the_nats_server_the_scheduler_is_on_stops_neither_telemetry_nor_alerts() -> None:
    with clustered_world() as world:
        polling.until_sync(lambda: world.accepted() >= 3 * 4, timeout_s=30, what="telemetry of the three nodes")
        victims = world.cluster.connected(CONNECTION)
        assert victims, "the scheduler is connected to the cluster"
        for round_, victim in enumerate(victims):
            before = world.accepted()
            world.cluster.kill(victim)

            def telemetry_again(before: float = before) -> bool:
                # Three nodes at 4 Hz: 12 samples a second; two seconds' worth.
                return world.accepted() >= before + 3 * 8

            polling.until_sync(
                telemetry_again, timeout_s=FAILOVER_S, what=f"telemetry accepted again after server {victim} died"
            )
            # A share that outgrows its allotment now is alerted, and the subscriber hears it.
            pod, node = f"grower-{round_}", f"gpu-{round_ % 3}"
            world.apply(pod, share_pod(pod, fraction="0.25", node=node, memory="2Gi@0s,30Gi@1s"))

            def alerted(pod: str = pod) -> bool:
                return world.alerts.fired_for(pod)

            polling.until_sync(
                alerted, timeout_s=FAILOVER_S + harness.STEP_TIMEOUT_S, what=f"the alert for {pod} after {victim} died"
            )
            world.cluster.restart(victim)

        assert (world.value("quotient_telemetry_messages_total", outcome="rejected") or 0.0) == 0.0
        assert "TelemetryConflict" not in world.alerts.names()

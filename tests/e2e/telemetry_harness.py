"""The world of the telemetry proofs: emulator, emulated GPU nodes, a real nats-server and the real scheduler.

The emulator runs in its thread (``harness.cluster`` style) with ``GpuNodesRuntime`` as the container runtime of
every GPU node, so a pod the emulated kubelet starts runs processes on the fake GPUs of its node, with the memory its
``quotient.dev/sim-gpu-memory`` script says, and the real agents (``EmulatedNodes``) publish them to the real
nats-server. A second thread runs an asyncio loop for the agents and for a third-party subscriber of
``quotient.v1.alerts.>``. The scheduler is its own process (``harness.SchedulerProcess``) with ``--nats`` and a
``/metrics`` port the test scrapes. Durations are short (agent interval 0.25 s, grace 1 s) so the proofs run in
seconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import tempfile
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from common import clusterspec, names, subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer, free_port
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from quotient.emulator.kubelets import KubeletConfig
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from tests import polling
from tests.e2e import harness

T = TypeVar("T")

INTERVAL_S = 0.25
GRACE_S = 1.0
EVICT_GRACE_S = 1.0
STALE_FLOOR_S = 1.0

SCHEDULER_FLAGS = (
    "--overuse-grace",
    f"{GRACE_S}s",
    "--overuse-evict-grace",
    f"{EVICT_GRACE_S}s",
    "--overuse-tolerance",
    "512Mi",
    "--overuse-tolerance-percent",
    "0",
    "--unattributed-threshold",
    "1Gi",
    "--ghost-grace",
    "10m",
    "--telemetry-stale-floor",
    f"{STALE_FLOOR_S}s",
    "--headroom-window",
    "3s",
)


class LoopThread:
    """An asyncio loop in a daemon thread, for the agents and the alert subscriber."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="telemetry-world", daemon=True)
        self._thread.start()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def run(self, work: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return self.submit(work).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    subject: str
    alert: wire.Alert
    at_s: float


class AlertListener:
    """A third-party subscriber of ``quotient.v1.alerts.>``, decoding with the published schema."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._decisions: list[wire.Decision] = []
        self.bus: NatsBus | None = None

    async def start(self, url: str) -> None:
        self.bus = NatsBus(servers=url, name="test-alert-listener")
        await self.bus.connect_once()
        await self.bus.subscribe(subjects.ALERTS_ALL, self._on_message)
        await self.bus.subscribe(subjects.DECISIONS, self._on_decision)
        await self.bus.flush()

    async def _on_decision(self, _subject: str, data: bytes) -> None:
        decision = wire.decode_decision(data)
        with self._lock:
            self._decisions.append(decision)

    def decisions(self) -> list[wire.Decision]:
        with self._lock:
            return list(self._decisions)

    async def _on_message(self, subject: str, data: bytes) -> None:
        received = Received(subject=subject, alert=wire.decode_alert(data), at_s=time.monotonic())
        with self._lock:
            self._received.append(received)

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)


@dataclasses.dataclass(slots=True, kw_only=True)
class TelemetryWorld:
    emulator: EmulatorThread
    nats: NatsServer
    nodes: EmulatedNodes
    scheduler: harness.SchedulerProcess
    kubectl: harness.Kubectl
    metrics_port: int
    listener: AlertListener
    loop: LoopThread
    workdir: Path

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """Every sample on the scheduler's ``/metrics`` (name, labels, value); empty while it cannot be read."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of ``name`` whose labels include ``labels``; None when there is none."""
        found = [value for sample, got, value in self.metrics() if sample == name and labels.items() <= got.items()]
        return found[0] if found else None

    def apply(self, name: str, *objects: Mapping[str, Any]) -> None:
        harness.apply_objects(self.kubectl, self.workdir, name, *objects)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return harness.pods(self.kubectl, namespace).get(name)

    def running(self, name: str, namespace: str = "default") -> bool:
        """Whether the pod is bound and its kubelet reports it Running."""
        pod = self.pod(name, namespace)
        return pod is not None and harness.bound(pod) and (pod.get("status") or {}).get("phase") == "Running"

    def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Publish raw messages over one connection, in order (a flood)."""

        async def send() -> None:
            bus = NatsBus(servers=self.nats.url, name="test-flood")
            await bus.connect_once()
            try:
                for subject, payload in messages:
                    await bus.publish(subject, payload)
                await bus.flush(timeout_s=30)
            finally:
                await bus.close()

        self.loop.run(send())

    def publish(self, subject: str, payload: bytes) -> None:
        """Publish raw bytes on a subject, as a hostile or broken agent would."""

        async def send() -> None:
            bus = NatsBus(servers=self.nats.url, name="test-flood")
            await bus.connect_once()
            try:
                await bus.publish(subject, payload)
                await bus.flush()
            finally:
                await bus.close()

        self.loop.run(send())


def share_pod(
    name: str,
    *,
    fraction: str,
    node: str,
    memory: str | None = None,
    queue: str | None = None,
) -> dict[str, Any]:
    """A pod of ours asking for a fraction of a GPU, pinned to ``node``, whose process follows ``memory``."""
    annotations = {"gpu-fraction": fraction}
    if memory is not None:
        annotations[names.SIM_GPU_MEMORY_ANNOTATION] = memory
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": annotations,
            "labels": {"kai.scheduler/queue": queue} if queue else {},
        },
        "spec": {
            "schedulerName": "quotient",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "ubuntu"}],
        },
    }


def queue(name: str, *, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A leaf Queue under KAI's default parent, open on every resource."""
    open_resource = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {"gpu": open_resource, "cpu": open_resource, "memory": open_resource},
        },
    }


@contextlib.contextmanager
def telemetry_world(spec_text: str, *extra: str, nats_config: str = "") -> Iterator[TelemetryWorld]:
    """Everything started, in order, and stopped in reverse; the scheduler's log is printed on the way out."""
    spec = clusterspec.loads(spec_text)
    loop = LoopThread()
    nats = NatsServer(extra_config=nats_config).start()
    emulator = EmulatorThread(spec, config=EmulatorConfig(kubelet=KubeletConfig(start_delay_s=0.05))).start()
    nodes = EmulatedNodes(spec, nats_url=nats.url, interval_s=INTERVAL_S)
    runtime = GpuNodesRuntime(nodes)

    def add_runtimes() -> None:
        for name in nodes.fakes:
            emulator.emulator.add_runtime(runtime, node=name)

    emulator.call(add_runtimes)

    async def start_agents() -> asyncio.Task[None]:
        return asyncio.create_task(nodes.run())

    async def stop_agents(task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    agents = loop.run(start_agents())
    listener = AlertListener()
    loop.run(listener.start(nats.url))
    port = free_port()
    scheduler = harness.SchedulerProcess(
        emulator.url,
        "--nats",
        nats.url,
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        *SCHEDULER_FLAGS,
        *extra,
    )
    kubectl = harness.Kubectl(emulator.url)
    workdir = tempfile.TemporaryDirectory(prefix="quotient-telemetry-e2e-")
    world = TelemetryWorld(
        emulator=emulator,
        nats=nats,
        nodes=nodes,
        scheduler=scheduler,
        kubectl=kubectl,
        metrics_port=port,
        listener=listener,
        loop=loop,
        workdir=Path(workdir.name),
    )
    try:
        polling.until_sync(
            lambda: world.value("quotient_scheduler_leader") == 1.0, timeout_s=30, what="the scheduler leading"
        )
        yield world
    finally:
        print(scheduler.log()[-6000:])
        scheduler.close()
        kubectl.close()
        with contextlib.suppress(Exception):
            loop.run(stop_agents(agents), timeout_s=10)
        if listener.bus is not None:
            with contextlib.suppress(Exception):
                loop.run(listener.bus.close(), timeout_s=5)
        loop.stop()
        emulator.stop()
        nodes.close()
        nats.close()
        workdir.cleanup()

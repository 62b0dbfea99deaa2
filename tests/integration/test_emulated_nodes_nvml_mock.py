"""Emulated GPU nodes over the mock NVML driver: one agent process per node, its state file driven by the pods its
kubelet starts (through ``GpuNodesRuntime``, as in the demo), and every agent process gone when the nodes stop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common import clusterspec, names, subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from quotient.emulator.runtime import PodLaunch
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from quotient.nvmlmock import profiles
from tests import mockdriver
from tests.polling import until

pytestmark = pytest.mark.integration

GiB = 1024**3
POD_UID = "3f0e2d1c-4b5a-4968-8776-a5b4c3d2e1f0"


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []

    async def __call__(self, subject: str, data: bytes) -> None:
        self.messages.append((subject, data))

    def telemetry(self, node: str) -> list[wire.NodeTelemetry]:
        return [wire.decode_telemetry(d, subject_node=node) for s, d in self.messages if s == subjects.telemetry(node)]

    def health(self, node: str) -> list[wire.NodeHealth]:
        return [wire.decode_health(d, subject_node=node) for s, d in self.messages if s == subjects.health(node)]


@contextlib.asynccontextmanager
async def running(nodes: EmulatedNodes) -> AsyncIterator[None]:
    task = asyncio.create_task(nodes.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        nodes.close()


def launch(node: str, script: str, gpu: int) -> PodLaunch:
    return PodLaunch(
        node=node,
        namespace="team-a",
        name="train",
        uid=POD_UID,
        gpu_indices=(gpu,),
        gpu_uuids=(),
        env={},
        labels={},
        annotations={names.SIM_GPU_MEMORY_ANNOTATION: script},
        started_ns=time.time_ns(),
    )


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def pod_memory(message: wire.NodeTelemetry, gpu: int) -> list[int | None]:
    return [p.used_memory_bytes for p in message.gpus[gpu].processes if p.pod_uid == POD_UID]


async def test_each_node_runs_its_own_agent_process_over_the_mock_and_its_pods_drive_the_driver_state(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    mock = mockdriver.library(profiles.CURRENT)
    reader = NatsBus(servers=nats_server.url, name="test-reader")
    await reader.connect_once()
    collector = Collector()
    await reader.subscribe("quotient.v1.>", collector)
    spec = clusterspec.parse_inline("2x2xA100-80GB")
    nodes = EmulatedNodes(spec, nats_url=nats_server.url, interval_s=0.2, nvml_mock=mock, workdir=tmp_path)
    runtime = GpuNodesRuntime(nodes)
    node = spec.nodes[0].name
    async with running(nodes):
        await until(lambda: all(collector.telemetry(n.name) for n in spec.nodes), what="telemetry of both nodes")
        assert nodes.processes is not None and len(nodes.processes.processes) == 2  # one process per node
        pids = [process.pid for process in nodes.processes.processes.values()]
        assert {t.driver_version for n in spec.nodes for t in collector.telemetry(n.name)} == {"580.65.06"}
        assert "2 agent processes" in nodes.probe_description

        runtime.start_pod(launch(node, "2Gi@0s,6Gi@1s", gpu=1))
        await until(lambda: pod_memory(collector.telemetry(node)[-1], 1) == [6 * GiB], what="the pod's 6 GiB")
        assert any(pod_memory(t, 1) == [2 * GiB] for t in collector.telemetry(node))  # it started at 2 GiB

        nodes.fakes[node].probe.inject_xid(0, 79)
        await until(
            lambda: any(p.code == 79 for h in collector.health(node) for p in h.problems), what="Xid 79 in health"
        )

        runtime.stop_pod(launch(node, "2Gi@0s,6Gi@1s", gpu=1))
        await until(lambda: pod_memory(collector.telemetry(node)[-1], 1) == [], what="the pod's process gone")
    await reader.close()
    assert alive(pids) == [], "agent processes outlived the emulated nodes"

"""The scheduler on NATS: it declares the telemetry stream and publishes every bind as a ``Decision``."""

from __future__ import annotations

import asyncio
import json

import pytest

from common import subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from tests import polling
from tests.e2e import harness
from tests.e2e.harness import Kubectl, SchedulerProcess

pytestmark = pytest.mark.integration


def test_every_bind_is_published_as_a_decision_and_the_stream_is_declared(nats_server: NatsServer) -> None:
    with harness.cluster("1x4xA100-80GB") as emulator:
        kubectl = Kubectl(emulator.url)
        scheduler = SchedulerProcess(emulator.url, "--nats", nats_server.url)
        received: list[wire.Decision] = []
        try:

            async def scenario() -> None:
                bus = NatsBus(servers=nats_server.url, name="test-decisions")
                await bus.connect_once()

                async def on_message(_subject: str, data: bytes) -> None:
                    received.append(wire.decode_decision(data))

                await bus.subscribe(subjects.DECISIONS, on_message)
                pod = harness.gpu_pod("train", gpus=2)
                proc = await asyncio.create_subprocess_exec(
                    kubectl.binary,
                    "--server",
                    kubectl.server,
                    "--cache-dir",
                    "/tmp/quotient-decisions-kc",
                    "create",
                    "-f",
                    "-",
                    stdin=asyncio.subprocess.PIPE,
                )
                await proc.communicate(json.dumps(pod).encode())
                await polling.until(
                    lambda: any(d.pod_name == "train" for d in received),
                    timeout_s=30,
                    what="the decision binding train",
                )
                assert await bus.last_message(subjects.telemetry("no-node")) is None  # the stream exists: no error
                await bus.close()

            asyncio.run(scenario())
        finally:
            print(scheduler.log()[-3000:])
            scheduler.close()
            kubectl.close()
    binds = [d for d in received if d.pod_name == "train"]
    assert len(binds) == 1
    decision = binds[0]
    assert decision.action == wire.DecisionAction.BIND and decision.node_name == "node-0"
    assert len(decision.gpu_indices) == 2 and decision.queue == "default-queue"

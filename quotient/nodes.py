"""Emulated GPU nodes: many real agents in one process, each over fake GPUs and a proc tree of its own.

Every GPU node of a cluster spec gets a :class:`agent.fakenode.FakeNode` (fake NVML, plus the /proc files that
attribute its processes to pods) and an :class:`agent.loop.AgentLoop`, the production agent loop, unchanged.
They share one NATS connection (a real node has one agent and one connection; hundreds of emulated nodes in one
process do not need hundreds of sockets) and publish on their own node's subjects. The demo, the emulator and the
tests drive the fakes: pods start and stop, memory follows scripts, failures are injected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent import fakenode
from agent.loop import AgentLoop
from agent.metrics import AgentMetrics
from agent.podmap import PodMapper
from common import clusterspec, command, config, logs, tasks
from common.config import Setting
from common.natsconn import NatsBus

log = logs.get("nodes")


class EmulatedNodes:
    """The GPU nodes of ``spec`` as fake nodes with real agents; ``run()`` until cancelled."""

    def __init__(
        self,
        spec: clusterspec.ClusterSpec,
        *,
        nats_url: str,
        nkey_seed: Path | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.spec = spec
        self.bus = NatsBus(
            servers=nats_url, name="quotient-emulated-nodes", nkey_seed=nkey_seed, on_reconnect=self._reconnected
        )
        self.fakes: dict[str, fakenode.FakeNode] = {}
        self.agents: dict[str, AgentLoop] = {}
        for node in spec.nodes:
            if not node.gpus:
                continue
            fake = fakenode.from_cluster_spec(spec, node=node.name, clock=clock)
            self.fakes[node.name] = fake
            self.agents[node.name] = AgentLoop(
                node=node.name,
                probe=fake.probe,
                pods=PodMapper(fake.proc_root),
                bus=self.bus,
                metrics=AgentMetrics(node=node.name),
                interval_s=interval_s,
                clock_ns=clock,
            )

    async def _reconnected(self) -> None:
        for agent in self.agents.values():
            await agent.on_reconnect()

    async def run(self) -> None:
        log.info("emulated_nodes_starting", nodes=len(self.agents))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(tasks.guard(self.bus.connect(), name="nats-connect"))
                for agent in self.agents.values():
                    group.create_task(agent.run())
        finally:
            await self.bus.close()

    def close(self) -> None:
        for fake in self.fakes.values():
            fake.close()


SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="nodes", parse=config.parse_str, default="2x8xA100-80GB", help="cluster spec: a file or inline form"),
    Setting(name="nats", parse=config.parse_nats_url, default="nats://127.0.0.1:4222", help="NATS server URL(s)"),
    Setting(
        name="nats_nkey_seed",
        parse=config.parse_existing_file,
        default=None,
        help="agent nkey seed file",
        metavar="FILE",
    ),
    Setting(name="interval", parse=config.parse_positive_duration_s, default=1.0, help="sampling interval"),
    *config.LOG_SETTINGS,
)


async def _serve(values: Mapping[str, object]) -> None:
    spec = clusterspec.resolve(str(values["nodes"]))
    seed = values["nats_nkey_seed"]
    nodes = EmulatedNodes(
        spec,
        nats_url=str(values["nats"]),
        nkey_seed=Path(str(seed)) if seed is not None else None,
        interval_s=float(str(values["interval"])),
    )
    try:
        await nodes.run()
    finally:
        nodes.close()


def main(argv: Sequence[str]) -> int:
    return command.run_service(
        argv,
        prog="quotient nodes",
        description=__doc__.split("\n")[0] if __doc__ else "",
        settings=SETTINGS,
        prepare=command.values_as_is,
        serve=_serve,
    )

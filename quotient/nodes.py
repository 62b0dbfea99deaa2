"""Emulated GPU nodes: real agents, each over fake GPUs and a proc tree of its own.

Every GPU node of a cluster spec gets a :class:`agent.fakenode.FakeNode` (the model of its GPUs, plus the /proc files
that attribute its processes to pods); the demo, the emulator and the tests drive the fakes: pods start and stop,
memory follows scripts, failures are injected. Its agent runs one of two ways:

- in this process (the default): an :class:`agent.loop.AgentLoop`, the production loop unchanged, over the node's
  ``FakeProbe``. The loops share one NATS connection (a real node has one agent and one connection; hundreds of
  emulated nodes in one process do not need hundreds of sockets) and publish on their own node's subjects. This is
  what benchmarks and tests with hundreds of nodes use.
- as its own ``quotient agent`` process over the mock NVML driver (``nvml_mock``), so the telemetry goes through the
  real pynvml and ``libnvidia-ml.so.1`` ABI (``quotient.nodes_processes``). The demo's few nodes run this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent import fakenode
from agent.loop import AgentLoop
from agent.metrics import AgentMetrics
from agent.podmap import PodMapper
from common import clusterspec, command, config, logs, tasks
from common.config import Setting
from common.errors import ConfigError
from common.natsconn import NatsBus
from quotient.nodes_processes import AgentProcesses
from quotient.nvmlmock import build

log = logs.get("nodes")


class EmulatedNodes:
    """The GPU nodes of ``spec`` as fake nodes with real agents; ``run()`` until cancelled, then ``close()``.

    With ``nvml_mock``, each node's agent is a process of its own over that mock driver; its state file, proc tree
    and log live in ``workdir`` (a temporary directory by default), and a node in ``token_files`` authenticates with
    the token in its file (its agent pod's, where NATS runs the auth callout).
    """

    def __init__(
        self,
        spec: clusterspec.ClusterSpec,
        *,
        nats_url: str,
        nkey_seed: Path | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], int] = time.time_ns,
        nvml_mock: build.MockLibrary | None = None,
        workdir: Path | None = None,
        token_files: Mapping[str, Path] | None = None,
        tls_ca: Path | None = None,
    ) -> None:
        self.spec = spec
        self._interval_s = interval_s
        self._clock = clock
        self._agent_tasks: dict[str, asyncio.Task[None]] = {}
        self._agent_group: asyncio.TaskGroup | None = None
        self.bus = NatsBus(
            servers=nats_url,
            name="quotient-emulated-nodes",
            nkey_seed=nkey_seed,
            on_reconnect=self._reconnected,
            tls_ca=tls_ca,
        )
        self.fakes: dict[str, fakenode.FakeNode] = {}
        self.agents: dict[str, AgentLoop] = {}
        self.processes: AgentProcesses | None = None
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        if nvml_mock is not None and workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="quotient-nodes-")
            workdir = Path(self._tempdir.name)
        for node in spec.nodes:
            if not node.gpus:
                continue
            proc_root = None if workdir is None or nvml_mock is None else workdir / f"{node.name}.proc"
            self.fakes[node.name] = fakenode.from_cluster_spec(spec, node=node.name, proc_root=proc_root, clock=clock)
        if nvml_mock is not None and workdir is not None:
            self.processes = AgentProcesses(
                nvml_mock,
                self.fakes,
                workdir=workdir,
                nats_url=nats_url,
                nkey_seed=nkey_seed,
                interval_s=interval_s,
                token_files=token_files,
                tls_ca=tls_ca,
            )
            return
        for name, fake in self.fakes.items():
            self.agents[name] = AgentLoop(
                node=name,
                probe=fake.probe,
                pods=PodMapper(fake.proc_root),
                bus=self.bus,
                metrics=AgentMetrics(node=name),
                interval_s=interval_s,
                clock_ns=clock,
            )

    @property
    def probe_description(self) -> str:
        """Which probe the agents use, in words (the demo's summary says it)."""
        if self.processes is not None:
            profile = self.processes.library.profile
            pids = ",".join(str(process.pid) for process in self.processes.processes.values())
            return (
                f"{len(self.fakes)} agent processes (pids {pids or 'none yet'}) through pynvml over the mock NVML "
                f"driver (profile {profile.name}, driver {profile.driver_version})"
            )
        return f"{len(self.agents)} agents in one process over FakeProbe"

    async def _reconnected(self) -> None:
        for agent in self.agents.values():
            await agent.on_reconnect()

    async def run(self) -> None:
        if self.processes is not None:
            log.info("emulated_nodes_starting", nodes=len(self.fakes), probe="nvml-mock")
            await self.processes.run()
            return
        log.info("emulated_nodes_starting", nodes=len(self.agents), probe="fake")
        try:
            async with asyncio.TaskGroup() as group:
                self._agent_group = group
                group.create_task(tasks.guard(self.bus.connect(), name="nats-connect"))
                for name, agent in self.agents.items():
                    self._agent_tasks[name] = group.create_task(agent.run())
        finally:
            self._agent_group = None
            self._agent_tasks.clear()
            await self.bus.close()

    async def restart_agent(self, node: str, *, down_s: float = 0.0) -> None:
        """Stop ``node``'s agent, wait ``down_s`` and start a new one in its place (a new boot, its health known
        afresh), as a restarted agent process comes back. In-process agents only, while ``run()`` runs."""
        task, group = self._agent_tasks.get(node), self._agent_group
        if task is None or group is None:
            raise ValueError(f"no in-process agent of node {node!r} is running")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(down_s)
        fake = self.fakes[node]
        agent = AgentLoop(
            node=node,
            probe=fake.probe,
            pods=PodMapper(fake.proc_root),
            bus=self.bus,
            metrics=AgentMetrics(node=node),
            interval_s=self._interval_s,
            clock_ns=self._clock,
        )
        self.agents[node] = agent
        self._agent_tasks[node] = group.create_task(agent.run())
        log.info("emulated_agent_restarted", node=node, boot=agent.boot)

    def close(self) -> None:
        for fake in self.fakes.values():
            fake.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None


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
    Setting(
        name="nats_ca",
        parse=config.parse_existing_file,
        default=None,
        help="the CA that NATS servers' certificates must be signed by (PEM); TLS is used whatever the URL says",
        metavar="FILE",
    ),
    Setting(name="interval", parse=config.parse_positive_duration_s, default=1.0, help="sampling interval"),
    Setting(
        name="nvml_mock",
        parse=config.parse_bool,
        default=False,
        help="run one agent process per node over the mock NVML driver (needs a C compiler) instead of FakeProbe",
    ),
    *config.LOG_SETTINGS,
)


async def _serve(values: Mapping[str, object]) -> None:
    spec = clusterspec.resolve(str(values["nodes"]))
    seed = values["nats_nkey_seed"]
    library = None
    if values["nvml_mock"]:
        built = build.build()
        if isinstance(built, build.Unavailable):
            raise ConfigError(f"--nvml-mock: {built.reason}")
        library = built
    nodes = EmulatedNodes(
        spec,
        nats_url=str(values["nats"]),
        nkey_seed=Path(str(seed)) if seed is not None else None,
        interval_s=float(str(values["interval"])),
        nvml_mock=library,
        tls_ca=Path(str(values["nats_ca"])) if values.get("nats_ca") is not None else None,
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

"""The local stack the chaos run shakes, composed as ``quotient demo`` composes it, with a handle on each part.

All on 127.0.0.1, in the run's work directory: a real ``nats-server``; the Kubernetes API emulator in this process
(its kubelets run the pods' processes on the emulated GPU nodes through ``GpuNodesRuntime``); ``EmulatedNodes``, the
real agent loop of each GPU node over its fake GPUs, in this process; and the real scheduler as its own process
(``python -m quotient.cli scheduler``), leader-elected under a fixed identity so that a restarted process with the
same flags and ports takes its lease back at once. ``stop`` stops everything it started, whatever state it is in.

The scheduler process is started in a session of its own (Ctrl-C on the terminal reaches this process, which stops
it) and, on Linux, asks the kernel for SIGTERM should this process die without stopping it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

from common import clusterspec, logs
from common.natsserver import NatsServer, free_port
from quotient.bench import children
from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.emulator.kubelets import KubeletConfig
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime

log = logs.get("bench.chaos")

SCHEDULER_IDENTITY: Final = "chaos-scheduler"
AGENT_INTERVAL_S: Final = 1.0
STALE_FLOOR: Final = "2s"
"""With one-second samples, a node's telemetry is stale after 3 s: a NATS outage of 5 s or more shows."""
STALE_GANG_GRACE: Final = "10s"
"""The scheduler evicts a gang that stays below minMember this long; the run's gang grace (30 s) is longer."""
_STOP_GRACE_S: Final = 10.0


class SchedulerProcess:
    """``quotient scheduler`` as its own process; started again with the same arguments after a kill."""

    def __init__(self, arguments: list[str], *, log_path: Path, metrics_port: int) -> None:
        self.arguments = arguments
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log_file:
            log_file.write(f"--- chaos: scheduler start #{self.starts}\n".encode())
            log_file.flush()
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "quotient.cli",
                "scheduler",
                *self.arguments,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                preexec_fn=children.die_with_parent(),
            )

    async def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; idempotent."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            await self.kill()

    def ready(self) -> bool:
        """``/readyz`` answers 200: leading and synced. Blocking."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    async def wait_ready(self, timeout_s: float) -> bool:
        """Poll ``/readyz`` until ready, the process exits or ``timeout_s`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.returncode is not None:
                return False
            if await asyncio.to_thread(self.ready):
                return True
            await asyncio.sleep(0.25)
        return False

    def log_tail(self, lines: int = 15) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]


class Stack:
    """NATS, the emulator, the emulated GPU nodes and the scheduler process; ``start`` then, always, ``stop``."""

    def __init__(self, spec: clusterspec.ClusterSpec, *, workdir: Path, log_level: str = "info") -> None:
        self.spec = spec
        self.workdir = workdir
        self.nats = NatsServer(workdir=workdir / "nats")
        (workdir / "nats").mkdir(parents=True, exist_ok=True)
        self.emulator = Emulator(
            spec, config=EmulatorConfig(scripted_pods=False, kubelet=KubeletConfig(start_delay_s=0.1))
        )
        self.nodes: EmulatedNodes | None = None
        self.scheduler: SchedulerProcess | None = None
        self._nodes_task: asyncio.Task[None] | None = None
        self._log_level = log_level

    async def start(self) -> None:
        await asyncio.to_thread(self.nats.start)
        await self.emulator.start()
        self.nodes = EmulatedNodes(self.spec, nats_url=self.nats.url, interval_s=AGENT_INTERVAL_S)
        runtime = GpuNodesRuntime(self.nodes)
        for name in self.nodes.fakes:
            self.emulator.add_runtime(runtime, node=name)
        self._nodes_task = asyncio.create_task(self.nodes.run(), name="emulated-nodes")
        port = free_port()
        self.scheduler = SchedulerProcess(
            [
                "--kube-server",
                self.emulator.url,
                "--scheduler-name",
                "quotient",
                "--identity",
                SCHEDULER_IDENTITY,
                "--leader-elect",
                "--no-webhook",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(port),
                "--nats",
                self.nats.url,
                "--telemetry-stale-floor",
                STALE_FLOOR,
                "--stale-gang-grace",
                STALE_GANG_GRACE,
                "--log-level",
                self._log_level,
            ],
            log_path=self.workdir / "scheduler.log",
            metrics_port=port,
        )
        await self.scheduler.start()

    def nodes_failed(self) -> BaseException | None:
        """The emulated nodes' failure, if their task ended."""
        task = self._nodes_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def stop(self) -> None:
        """Stop everything started, in reverse order; each step runs even when one before it failed."""
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                await self.scheduler.stop()
        if self._nodes_task is not None:
            self._nodes_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._nodes_task
        with contextlib.suppress(Exception):
            await self.emulator.stop()
        if self.nodes is not None:
            with contextlib.suppress(Exception):
                self.nodes.close()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.nats.stop)

"""Emulated GPU nodes whose agents go through the real NVML path: one ``quotient agent`` process per node, over the
mock driver library (``quotient.nvmlmock``).

NVML's state is global to a process (pynvml loads one ``libnvidia-ml.so.1`` and ``nvmlInit`` is process-wide), so
nodes that are to be read through NVML cannot share a process as ``FakeProbe`` nodes do. Each node keeps its
``FakeNode`` as the model the emulated kubelet drives (processes appear with the pods, memory follows their
scripts), a ``FakeProbeMirror`` writes that model into the node's own state file, and the node's agent process,
started with the mock's directory on ``LD_LIBRARY_PATH`` and the fake node's proc tree as its proc root, measures it
through the unpatched pynvml and publishes as a real node's agent does.

Every agent process is stopped with the nodes: ``AgentProcesses.run`` stops them (SIGTERM, then SIGKILL) however it
ends, and each is started so that the kernel sends it SIGTERM should this process die without a chance to
(``PR_SET_PDEATHSIG``, kept across the exec into the agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from agent.fakenode import FakeNode
from common import logs
from common.errors import QuotientError
from quotient.nvmlmock import build, mirror

log = logs.get("nodes.processes")

# How often each node's state file is brought up to date with its fake GPUs; the agents sample every interval.
SYNC_PERIOD_S: Final = 0.2
_STOP_GRACE_S: Final = 5.0

# Run the agent so that it gets SIGTERM when its parent dies (PR_SET_PDEATHSIG = 1 survives the exec), and not at
# all if the parent died before the request took effect.
_LAUNCHER: Final = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'quotient.cli', 'agent', *sys.argv[2:]])\n"
)


class AgentProcessFailed(QuotientError):
    """An emulated node's agent process exited while it should have run."""


def agent_arguments(
    *,
    node: str,
    nats_url: str,
    nkey_seed: Path | None,
    interval_s: float,
    proc_root: Path,
    metrics_port: int = 0,
    token_file: Path | None = None,
    tls_ca: Path | None = None,
) -> list[str]:
    """The ``quotient agent`` arguments of an emulated node, and the one place that says how such an agent connects
    and authenticates: with its node's own identity where NATS runs the auth callout (``token_file``, the projected
    token of the node's agent pod, ``quotient.agentpods``), else with the agent role's nkey seed where NATS asks for
    one."""
    arguments = [
        "--node",
        node,
        "--nats",
        nats_url,
        "--interval",
        f"{interval_s}s",
        "--proc-root",
        str(proc_root),
        "--metrics-port",
        str(metrics_port),
        "--metrics-host",
        "127.0.0.1",
    ]
    if token_file is not None:
        arguments += ["--nats-token-file", str(token_file)]
    elif nkey_seed is not None:
        arguments += ["--nats-nkey-seed", str(nkey_seed)]
    if tls_ca is not None:
        arguments += ["--nats-ca", str(tls_ca)]
    return arguments


class AgentProcesses:
    """The agent processes of ``fakes`` (node name -> fake node), each over its own state file in ``workdir``; a node
    in ``token_files`` connects with the token in its file, the others with ``nkey_seed``."""

    def __init__(
        self,
        library: build.MockLibrary,
        fakes: Mapping[str, FakeNode],
        *,
        workdir: Path,
        nats_url: str,
        nkey_seed: Path | None,
        interval_s: float,
        token_files: Mapping[str, Path] | None = None,
        tls_ca: Path | None = None,
    ) -> None:
        self.library = library
        self._workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._mirrors = {
            name: mirror.FakeProbeMirror(fake.probe, workdir / f"{name}.nvml-state") for name, fake in fakes.items()
        }
        self._arguments = {
            name: agent_arguments(
                node=name,
                nats_url=nats_url,
                nkey_seed=nkey_seed,
                interval_s=interval_s,
                proc_root=fake.proc_root,
                token_file=(token_files or {}).get(name),
                tls_ca=tls_ca,
            )
            for name, fake in fakes.items()
        }
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    def log_path(self, node: str) -> Path:
        return self._workdir / f"{node}.agent.log"

    def sync(self) -> None:
        """Bring every node's state file up to date with its fake GPUs."""
        for node_mirror in self._mirrors.values():
            node_mirror.sync()

    async def run(self) -> None:
        """Start every agent, keep their state files current until cancelled, and stop them all on the way out.
        Raises ``AgentProcessFailed`` when an agent exits by itself."""
        try:
            self.sync()
            for node in self._arguments:
                await self._start(node)
            log.info("agent_processes_started", nodes=len(self.processes), library=str(self.library.path))
            while True:
                await asyncio.to_thread(self.sync)  # file writes: off the event loop, which serves NATS and the API
                for node, process in self.processes.items():
                    if process.returncode is not None:
                        raise AgentProcessFailed(
                            f"the agent of emulated node {node} exited with {process.returncode}; "
                            f"its log: {self.log_path(node)}"
                        )
                await asyncio.sleep(SYNC_PERIOD_S)
        finally:
            await self.stop()

    async def _start(self, node: str) -> None:
        mirror_path = self._mirrors[node].path
        with self.log_path(node).open("wb") as log_file:
            self.processes[node] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _LAUNCHER,
                str(os.getpid()),
                *self._arguments[node],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env={**self.library.environment(state_file=mirror_path), "PYTHONUNBUFFERED": "1"},
            )

    async def stop(self) -> None:
        """Stop every agent process: SIGTERM, then SIGKILL after a grace period. Idempotent."""
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(_reap(process) for process in running))


async def _reap(process: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

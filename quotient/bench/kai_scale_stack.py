"""The processes and the API side of ``quotient bench kai-scale``: the emulator and the scheduler, each its own process.

As ``quotient bench e2e`` runs them: the emulator (``quotient emulator``, its nodes emulated, no agents; it runs the
Jobs' pods through its Job controller and marks bound pods Running) and the real scheduler (``quotient scheduler``
against it, no leader election, no webhook), both on 127.0.0.1 on free ports, each in a session of its own
and (on Linux) told to exit should this process die. This process creates the objects and watches pods and PodGroups
into ``Observations``. ``stop`` stops whatever was started, whatever state it is in; it is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from common import logs
from common.natsserver import free_port
from quotient.bench import children
from quotient.bench import kai_scale_world as world
from scheduler.kube import client, kubeapi
from scheduler.kube.errors import KubeError

log = logs.get("bench.kai_scale")

CREATE_CONCURRENCY: Final = 32
"""Creates in flight at once (KAI's test starts a goroutine per Job; the API server's own limits bound it)."""
_STOP_GRACE_S: Final = 10.0
WATCH_TIMEOUT_S: Final = 300


METRICS: Final = {
    "quotient_scheduling_cycles_total": "cycles",
    "quotient_scheduling_cycle_duration_seconds_sum": "cycle_s",
    "quotient_binds_total": "binds",
    "quotient_evictions_total": "evictions",
}
"""The scheduler's series a scenario reports (as differences over the scenario), by the name it reports them as."""


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def counters(text: str, wanted: Mapping[str, str]) -> dict[str, float]:
    """The ``wanted`` series of a Prometheus text exposition, each summed over its labels, by ``wanted``'s names."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in wanted:
            with contextlib.suppress(ValueError):
                found[wanted[name]] = found.get(wanted[name], 0.0) + float(value)
    return found


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Child:
    """One ``python -m quotient.cli ...`` process: its stderr (and stdout, unless read) appended to ``log_path``, in a
    session of its own, told (on Linux) to exit should this process die; ``stop`` is SIGTERM, then SIGKILL."""

    def __init__(self, arguments: Sequence[str], *, log_path: Path) -> None:
        self.arguments = list(arguments)
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, *, read_stdout: bool = False) -> None:
        with self.log_path.open("ab") as log_file:
            log_file.write(f"--- kai-scale: quotient {' '.join(self.arguments)}\n".encode())
            log_file.flush()
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "quotient.cli",
                *self.arguments,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if read_stdout else log_file,
                stderr=log_file if read_stdout else asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                preexec_fn=children.die_with_parent(),
            )

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

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
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    def log_tail(self, lines: int) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []


async def start_emulator(
    *, nodes: str, history_events: int, log_path: Path, timeout_s: float = 60.0
) -> tuple[Child, str]:
    """``quotient emulator`` on a port of the kernel's choosing, and its URL (the one line it prints)."""
    emulator = Child(
        [
            *("emulator", "--host", "127.0.0.1", "--port", "0", "--nodes", nodes),
            *("--history", str(history_events), "--log-level", "warning"),
        ],
        log_path=log_path,
    )
    await emulator.start(read_stdout=True)
    assert emulator.process is not None and emulator.process.stdout is not None
    try:
        line = await asyncio.wait_for(emulator.process.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"the emulator exited before it listened; see {log_path}")
        return emulator, str(json.loads(line)["url"])
    except BaseException:
        await emulator.stop()
        raise


class Stack:
    """The emulator, the scheduler (started and stopped by the scenarios), the API client and the watches."""

    def __init__(self, *, nodes: int, gpus_per_node: int, workdir: Path, scheduler_log_level: str) -> None:
        self.workdir = workdir
        self.scheduler_log_level = scheduler_log_level
        self.nodes = f"{nodes}x{gpus_per_node}xA100-80GB"
        # Every pod, Job and PodGroup is written several times; the watches must never fall off the history.
        self.history_events = max(200_000, nodes * gpus_per_node * 60)
        self.emulator: Child | None = None
        self.url = ""
        self.scheduler: Child | None = None
        self.metrics_url = ""
        self.api: client.KubeClient | None = None
        self.seen = world.Observations()
        self.relists = 0
        self._changed = asyncio.Event()
        self._watches: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.emulator, self.url = await start_emulator(
            nodes=self.nodes, history_events=self.history_events, log_path=self.workdir / "emulator.log"
        )
        _progress(f"kai-scale: emulator on {self.url}, logs in {self.workdir}")
        self.api = client.KubeClient.for_server(self.url)
        for resource, feed, relist in (
            (kubeapi.PODS, self.seen.pod, self.seen.relisted_pods),
            (kubeapi.POD_GROUPS, self.seen.podgroup, self.seen.relisted_groups),
        ):
            ready = asyncio.Event()
            self._watches.append(
                asyncio.create_task(self._watch(resource, feed, relist, ready), name=f"watch-{resource.plural}")
            )
            await asyncio.wait_for(ready.wait(), 60)

    def _client(self) -> client.KubeClient:
        if self.api is None:
            raise RuntimeError("the stack is not started")
        return self.api

    async def _watch(
        self,
        resource: kubeapi.Resource,
        feed: Callable[..., None],
        relist: Callable[..., None],
        ready: asyncio.Event,
    ) -> None:
        """List, then watch from the list's version; after a broken or expired watch, list again."""
        api = self._client()
        while True:
            try:
                listed = await api.list(resource)
                relist(listed.items, at=time.monotonic())
                if ready.is_set():
                    self.relists += 1
                ready.set()
                self._changed.set()
                version = listed.resource_version
                while True:
                    async with contextlib.aclosing(
                        api.watch(resource, resource_version=version, timeout_s=WATCH_TIMEOUT_S)
                    ) as stream:
                        async for event in stream:
                            meta = event.object.get("metadata") or {}
                            version = str(meta.get("resourceVersion") or version)
                            if event.type.value in ("ADDED", "MODIFIED", "DELETED"):
                                feed(event.type.value, event.object, at=time.monotonic())
                                self._changed.set()
            except asyncio.CancelledError:
                raise
            except (KubeError, OSError) as exc:
                log.warning("kai_scale_watch_broken", resource=resource.plural, error=str(exc))
                await asyncio.sleep(0.2)  # a back-off before the relist, not a synchronisation

    async def until(self, condition: Callable[[], bool], *, timeout_s: float) -> bool:
        """Wait until ``condition`` holds, re-checked after each batch of watch events; False after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._changed.clear()
            if condition():
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    # --- objects ---

    async def create(self, resource: kubeapi.Resource, body: Mapping[str, Any]) -> None:
        namespace = (body.get("metadata") or {}).get("namespace")
        await self._client().create(resource, body, namespace=namespace)

    async def create_all(self, resource: kubeapi.Resource, bodies: Sequence[Mapping[str, Any]]) -> None:
        """Create every object, ``CREATE_CONCURRENCY`` at a time; the first failure is raised."""
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(body: Mapping[str, Any]) -> None:
            async with gate:
                await self.create(resource, body)

        async with asyncio.TaskGroup() as group:
            for body in bodies:
                group.create_task(one(body))

    async def set_queue_gpu(self, name: str, *, quota: float, over_quota_weight: float, limit: float) -> None:
        gpu = world.queue_gpu(quota=quota, over_quota_weight=over_quota_weight, limit=limit)
        await self._client().patch(kubeapi.QUEUES, {"spec": {"resources": {"gpu": gpu}}}, name=name)

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._client().delete(kubeapi.JOBS, name=name, namespace=namespace)

    # --- the scheduler ---

    async def start_scheduler(self) -> None:
        """Start ``quotient scheduler`` against the emulator (returns once the process is spawned)."""
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.scheduler = Child(
            [
                *("scheduler", "--kube-server", self.url, "--scheduler-name", world.SCHEDULER_NAME),
                *("--no-leader-elect", "--no-webhook", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)),
                *("--log-level", self.scheduler_log_level),
            ],
            log_path=self.workdir / "scheduler.log",
        )
        await self.scheduler.start()

    async def scheduler_counters(self) -> dict[str, float]:
        """The scheduler's counters that say where a scenario's time went (cycles, their seconds, binds,
        evictions), summed over labels; empty when its metrics cannot be read."""
        scheduler = self.scheduler
        if scheduler is None:
            return {}
        try:
            text = await asyncio.to_thread(_fetch, self.metrics_url)
        except OSError:
            return {}
        return counters(text, METRICS)

    async def scheduler_sees_gpu_quota(self, queue: str, quota: float, *, timeout_s: float) -> bool:
        """Wait until the scheduler's ``quotient_queue_quota`` for ``queue``'s GPU is ``quota`` (it has read the
        Queue as changed): a Job created at once might otherwise be judged against the old quota, since the Queue and
        the Job's pods reach the scheduler on different watches. False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        wanted = f'quotient_queue_quota{{queue="{queue}",resource="gpu"}} {float(quota)}'
        while time.monotonic() < deadline:
            if self.scheduler is not None:
                with contextlib.suppress(OSError):
                    if wanted in (await asyncio.to_thread(_fetch, self.metrics_url)).splitlines():
                        return True
            await asyncio.sleep(0.05)
        return False

    async def stop_scheduler(self) -> None:
        scheduler, self.scheduler = self.scheduler, None
        if scheduler is not None:
            await scheduler.stop()

    def scheduler_exited(self) -> str | None:
        """Why the scheduler started last is not running (its exit code and log tail), else None."""
        scheduler = self.scheduler
        if scheduler is None or scheduler.returncode is None:
            return None
        return f"the scheduler exited with {scheduler.returncode}: {' | '.join(scheduler.log_tail(5))}"

    async def stop(self) -> None:
        """Stop everything started, in reverse order; each step runs even when one before it failed."""
        with contextlib.suppress(Exception):
            await self.stop_scheduler()
        for task in self._watches:
            task.cancel()
        for task in self._watches:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.api is not None:
            with contextlib.suppress(Exception):
                await self.api.close()
        if self.emulator is not None:
            with contextlib.suppress(Exception):
                await self.emulator.stop()

"""``quotient bench e2e``: pods per second through the real scheduler process and the emulator, end to end.

Three processes, as issue 5 specifies: the emulator (500 nodes, no agents), the scheduler (``quotient scheduler``
against it), and a loader that creates 2,000 ownerless pods (whole and fractional GPUs mixed) at a steady 250 pods/s.
The scheduler makes their PodGroups itself, as in production. This process watches the pods and records, for each,
when it was created (the loader's own clock, written into an annotation) and when its binding was seen.
Prints ``pods_per_second`` = bound pods / (last bound - first created), ``create_to_bound_p50_s`` and ``_p99_s``.
Budget (2-core machine, both processes on it): at least 200 pods/s, p99 under 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common import names
from common.natsserver import free_port


def _pod(index: int, rng: random.Random) -> dict[str, object]:
    annotations = {names.BENCH_CREATED_ANNOTATION: str(time.time_ns())}
    resources: dict[str, object] = {"requests": {"cpu": "1", "memory": "2Gi"}}
    if rng.random() < 0.4:
        annotations[names.GPU_FRACTION_ANNOTATION] = rng.choice(["0.25", "0.5", "0.5", "0.75", "0.3"])
    else:
        resources["limits"] = {names.GPU_RESOURCE: str(rng.choice([1, 1, 1, 1, 2]))}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bench-{index:05d}", "namespace": "default", "annotations": annotations},
        "spec": {
            "schedulerName": "quotient",
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }


async def _load(server: str, count: int, rate: float, seed: int) -> None:
    """The loader process: create ``count`` pods at ``rate`` per second, on a fixed schedule."""
    import aiohttp

    rng = random.Random(seed)
    interval = 1.0 / rate
    start = time.monotonic()
    sem = asyncio.Semaphore(64)
    async with aiohttp.ClientSession(base_url=server) as session:

        async def create(index: int) -> None:
            async with sem:
                body = _pod(index, rng)
                async with session.post("/api/v1/namespaces/default/pods", json=body) as response:
                    if response.status != 201:
                        print(f"create {index}: {response.status} {await response.text()}", file=sys.stderr)

        tasks = []
        for index in range(count):
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(create(index)))
        await asyncio.gather(*tasks)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


async def _watch_until(
    server: str, count: int, timeout_s: float, start_load: Callable[[], None]
) -> dict[str, tuple[int, int]]:
    """pod name -> (created ns, bound ns), from a watch on the emulator that starts before the first pod."""
    from scheduler.kube import client, kubeapi

    api = await client.KubeClient.connect(server=server)
    bound: dict[str, tuple[int, int]] = {}
    try:
        listed = await api.list(kubeapi.PODS, namespace="default")
        rv = listed.resource_version
        start_load()
        deadline = time.monotonic() + timeout_s
        while len(bound) < count and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                async with contextlib.aclosing(
                    api.watch(kubeapi.PODS, resource_version=rv, namespace="default", timeout_s=30)
                ) as stream:
                    async for event in stream:
                        obj = event.object
                        meta = obj.get("metadata") or {}
                        rv = str(meta.get("resourceVersion") or rv)
                        name = str(meta.get("name") or "")
                        created = (meta.get("annotations") or {}).get(names.BENCH_CREATED_ANNOTATION)
                        if created and (obj.get("spec") or {}).get("nodeName") and name not in bound:
                            bound[name] = (int(created), time.time_ns())
                            if len(bound) >= count:
                                break
                        if time.monotonic() > deadline:
                            break
    finally:
        await api.close()
    return bound


def run(argv: Sequence[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="quotient bench e2e")
    parser.add_argument("--nodes", default="500x8xA100-80GB")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(list(argv))
    port = free_port()
    metrics_port = free_port()
    server = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    quotient = [sys.executable, "-m", "quotient.cli"]
    logs_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    emulator_log = (logs_dir / f"quotient-bench-emulator-{port}.log").open("w")
    scheduler_log = (logs_dir / f"quotient-bench-scheduler-{port}.log").open("w")
    emulator = subprocess.Popen(
        [*quotient, "emulator", "--port", str(port), "--nodes", args.nodes, "--log-level", "warning"],
        stdout=emulator_log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    scheduler: subprocess.Popen[bytes] | None = None
    loader: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(server, 30)
        print(f"e2e bench: emulator on {server} with {args.nodes}", file=sys.stderr)
        scheduler = subprocess.Popen(
            [
                *quotient,
                "scheduler",
                "--kube-server",
                server,
                "--no-leader-elect",
                "--no-webhook",
                "--metrics-port",
                str(metrics_port),
                "--log-level",
                "warning",
            ],
            stdout=scheduler_log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        _wait_http(f"http://127.0.0.1:{metrics_port}", 60, path="/readyz")  # listed everything, watching
        loaders: list[subprocess.Popen[bytes]] = []

        def start_load() -> None:
            loaders.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import asyncio,sys; from quotient.bench import e2e; "
                        f"asyncio.run(e2e._load({server!r}, {args.pods}, {args.rate}, {args.seed}))",
                    ],
                    env=env,
                )
            )

        bound = asyncio.run(_watch_until(server, args.pods, args.timeout, start_load))
        loader = loaders[0] if loaders else None
        if loader is not None:
            loader.wait(timeout=30)
    finally:
        for process in (loader, scheduler, emulator):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
        emulator_log.close()
        scheduler_log.close()
    latencies = [(done - created) / 1e9 for created, done in bound.values()]
    if not latencies:
        return {"pods_per_second": 0.0, "bound": 0, "pods": args.pods, "error": "no pod was bound"}
    span_s = (max(done for _, done in bound.values()) - min(created for created, _ in bound.values())) / 1e9
    return {
        "pods_per_second": round(len(latencies) / max(span_s, 1e-9), 1),
        "bound": len(latencies),
        "pods": args.pods,
        "create_to_bound_p50_s": round(statistics.median(latencies), 3),
        "create_to_bound_p99_s": round(_percentile(latencies, 0.99), 3),
        "create_to_bound_max_s": round(max(latencies), 3),
        "rate": args.rate,
        "nodes": args.nodes,
        "budget": {"pods_per_second": 200, "create_to_bound_p99_s": 5.0},
    }


def _wait_http(server: str, timeout_s: float, *, path: str = "/version") -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{server}{path}", timeout=1) as response:
                response.read()
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{server}{path} did not answer within {timeout_s}s")

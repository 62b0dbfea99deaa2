"""``quotient demo``: the product on the embedded default, on one machine, in about two minutes.

What it starts (all on 127.0.0.1, all stopped on exit): a real ``nats-server`` secured as ``deploy/`` secures it
(fresh keys, deploy's users, and the auth callout that the scheduler serves: each agent process connects with the
projected token of its node's agent pod and may publish for that node only; ``quotient.demo_nats``); the Kubernetes
API emulator with the
demo cluster (``examples/clusters/demo.yaml``: two A100 nodes, an L4 node, a CPU node); emulated GPU nodes, which
run the processes of the pods the emulated kubelets start, each measured by its own ``quotient agent`` process through
pynvml over the mock NVML driver (``quotient.nvmlmock``; over ``FakeProbe`` in this process where no C compiler can
build the mock, which the demo says; under ``CI=true`` the mock is required); and the real scheduler as
its own process (``quotient scheduler``, serving ``quotient`` and ``kai-scheduler``, leader-elected under the
Lease ``quotient-system/quotient-scheduler`` as the pod ``quotient-scheduler-0``, whose ``/metrics`` the emulator's
pod proxy reaches, as on a cluster). Then it applies the users' workflows (the seeds' queues and pods from
``../shared/seeds``, else ``deploy/examples``) and plays the story the guides tell (``quotient.demo_story``: each pair
on its own GPU group, a gang that waits and binds whole, a reclaim, ``kubectl quotient explain`` and ``queues``, an
invalid ``gpu-fraction``, ``GpuMemoryOverconsumption``, a GPU's Xid, NATS going away and coming back), each step
with what KAI shows instead; ``kubectl quotient`` runs as installed (``quotient.demo_plugin``). A live view shows
where each pod landed and why the pending ones wait, and what a third-party NATS subscriber receives from the agents;
a summary of the story's facts ends it. ``--keep`` leaves everything running and prints the ``export PATH=...`` and
``export KUBECONFIG=...`` lines for ``kubectl quotient`` in the user's shell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from common import clusterspec, command, logs, names
from common.errors import QuotientError
from common.natsconn import NatsBus
from common.natsserver import free_port
from quotient import agentpods, demo_nats, demo_plugin, demo_scenario, demo_story, demo_view
from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from quotient.nvmlmock import build

LEADER = "quotient-scheduler-0"
"""The demo's scheduler as the Lease names it: the plugin finds its /metrics through this pod's proxy."""
LEASE_NAMESPACE = "quotient-system"


def leader_pod() -> dict[str, Any]:
    """The object the Lease's holder names, as deploy/ makes the scheduler's pod (port ``metrics``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": LEADER, "namespace": LEASE_NAMESPACE, "labels": {"app": "quotient-scheduler"}},
        "spec": {
            "containers": [
                {"name": "scheduler", "image": "quotient", "ports": [{"name": "metrics", "containerPort": 8080}]}
            ]
        },
    }


def nvml_mock(out: Callable[[str], None]) -> build.MockLibrary | None:
    """The mock NVML driver the emulated nodes' agents run over, built (or found cached) now. Without a C compiler
    (or the header) the agents run over ``FakeProbe`` instead, said once; under ``CI=true`` the mock is required."""
    built = build.build()
    if isinstance(built, build.MockLibrary):
        return built
    if os.environ.get("CI", "").lower() == "true":
        raise QuotientError(f"the mock NVML driver is required under CI=true and cannot be built: {built.reason}")
    out(f"no mock NVML driver ({built.reason}): the emulated nodes' agents run over FakeProbe in this process")
    return None


async def run_demo(*, duration_s: float, keep: bool, interval_s: float, out: Callable[[str], None]) -> int:
    spec = clusterspec.load(demo_scenario.DEFAULT_SPEC)
    library = nvml_mock(out)  # before anything starts: under CI=true its absence ends the demo here
    workdir = tempfile.TemporaryDirectory(prefix="quotient-demo-")
    # The agents as processes each hold their node's identity (the auth callout); in this process they share one.
    secured = demo_nats.start(Path(workdir.name), callout=library is not None)
    nats = secured.server
    emulator = Emulator(spec, config=EmulatorConfig(scripted_pods=True))
    await emulator.start()
    gpu_nodes = [node.name for node in spec.nodes if node.gpus]
    token_files = await agentpods.deploy(emulator, gpu_nodes) if secured.callout else None
    nodes = EmulatedNodes(
        spec,
        nats_url=nats.url,
        nkey_seed=None if secured.callout else secured.seed("agent"),
        interval_s=interval_s,
        nvml_mock=library,
        workdir=Path(workdir.name) / "nodes",
        token_files=token_files,
        tls_ca=secured.ca,
    )
    runtime = GpuNodesRuntime(nodes)
    for name in nodes.fakes:
        emulator.add_runtime(runtime, node=name)
    scheduler_log = Path(workdir.name) / "scheduler.log"
    metrics_port = free_port()  # the summary reads GpuUnhealthy off the scheduler's /metrics
    # The scheduler's pod as the Lease names it, its metrics port reached through the API server's pod proxy: how
    # ``kubectl quotient`` finds the leader's /metrics on a real cluster.
    await demo_scenario.apply(emulator, yaml.safe_dump(leader_pod()))
    emulator.route_pod(LEASE_NAMESPACE, LEADER, 8080, f"127.0.0.1:{metrics_port}")
    scheduler = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "quotient.cli",
            "scheduler",
            "--kube-server",
            emulator.url,
            "--scheduler-name",
            ",".join(demo_view.SCHEDULER_NAMES),
            "--leader-elect",
            "--identity",
            LEADER,
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--no-webhook",
            "--metrics-port",
            str(metrics_port),
            "--metrics-host",
            "127.0.0.1",
            # Live telemetry: measured headroom, and alerts on NATS that the viewer below prints; the auth callout.
            *secured.scheduler_arguments(),
            "--overuse-grace",
            "3s",
            "--telemetry-stale-floor",
            "5s",
        ],
        stdout=scheduler_log.open("w"),
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    telemetry = demo_view.Telemetry()
    viewer = NatsBus(servers=nats.url, name="demo-viewer", nkey_seed=secured.seed("reader"), tls_ca=secured.ca)
    kubectl = demo_plugin.Kubectl(emulator, Path(workdir.name))
    notes: list[str] = []
    shown: list[str] = []
    start = time.monotonic()
    tty = sys.stdout.isatty()

    def note(text: str) -> None:
        notes.append(f"[t={time.monotonic() - start:5.1f}s] {text}")
        if not tty:
            out(notes[-1])

    def show(command_line: str, text: str) -> None:
        """A command the user could type and what it printed: said at once, and kept in the frame on a tty."""
        shown[:] = [f"$ {command_line}", *text.splitlines()]
        if not tty:
            out("\n".join(f"    {line}" for line in shown))

    a100 = sorted(name for name in nodes.fakes if name.startswith("a100"))[0]
    story = demo_story.Story(
        emulator,
        kubectl,
        note=note,
        show=show,
        fail_a_gpu=lambda: fail_a_gpu(emulator, nodes, a100, note),
        nats_stop=nats.stop,
        nats_start=nats.start,
    )
    runner = asyncio.create_task(nodes.run())
    playing: asyncio.Task[None] | None = None
    try:
        for namespace in ("team-a", "team-b", "ai-workloads"):
            await demo_scenario.apply(emulator, f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n")
        source, texts = demo_scenario.workflow_texts()
        created = []
        for text in texts:
            created += await demo_scenario.apply(emulator, text)
        created += await demo_scenario.apply(emulator, demo_scenario.DEMO_QUEUES)
        note(
            f"nats-server {nats.url} (JetStream in {nats.workdir}), API emulator {emulator.url}, scheduler pid "
            f"{scheduler.pid} (log {scheduler_log})"
        )
        note(f"applied the users' workflows from {source}: {', '.join(created)}")
        note("  instead, KAI: the same objects, read unchanged (the guides' pods name schedulerName kai-scheduler)")
        note(f"kubectl quotient runs {kubectl.how}")
        await viewer.connect()
        await viewer.subscribe("quotient.v1.>", telemetry.on_message)
        playing = asyncio.create_task(story.run(story.steps(duration_s / 100), start))
        next_frame = 0.0
        while keep or time.monotonic() - start < duration_s or not playing.done():
            elapsed = time.monotonic() - start
            if playing.done():
                playing.result()  # a step that failed ends the demo with its error
            if runner.done():
                runner.result()
                return 1
            if scheduler.returncode is not None:
                note(f"the scheduler exited with {scheduler.returncode}; its log: {scheduler_log}")
                return 1
            if elapsed >= next_frame:
                frame = demo_view.render(
                    emulator,
                    telemetry,
                    elapsed_s=elapsed,
                    notes=notes,
                    nats_up=nats.running,
                    shown=shown if tty else (),
                )
                out(("\x1b[2J\x1b[H" if tty else "\n") + frame)
                next_frame = elapsed + (1.0 if tty else 20 * duration_s / 100)
            if keep and elapsed > duration_s and playing.done() and not notes[-1].startswith("--keep"):
                emulator.start_default_scheduler()  # for what a newcomer types (kubectl create deployment ...)
                notes.append(
                    "--keep: still running; Ctrl-C stops everything. In your shell, for kubectl and kubectl quotient:\n"
                    f"  export PATH={demo_plugin.VENV_BIN}:$PATH\n"
                    f"  export KUBECONFIG={kubectl.kubeconfig}\n"
                    "  kubectl get pods -A; kubectl quotient queues; kubectl quotient top; "
                    f"kubectl quotient explain team-b/greedy\n"
                    f"NATS at {nats.url}: nats sub 'quotient.v1.>' --server {nats.url} --tlsca {secured.ca} "
                    f"--nkey {secured.seed('reader')}"
                )
                out(notes[-1])
            await asyncio.sleep(0.1)
        out(
            "\n"
            + demo_view.render(
                emulator, telemetry, elapsed_s=time.monotonic() - start, notes=notes, nats_up=nats.running
            )
        )
        facts = story.facts
        told, happened = demo_story.summary(emulator, facts)
        out("\nWhat the story showed:\n" + "\n".join(f"  {line}" for line in told))
        bound = [p for p in emulator.list("v1", "Pod") if (p.get("spec") or {}).get("nodeName")]
        ok = happened and telemetry.counts.get("telemetry", 0) > 0 and telemetry.undecodable == 0
        overuse = [
            alert
            for alert in telemetry.alerts
            if alert.get("name") == "GpuMemoryOverconsumption" and alert.get("state") == "firing"
        ]
        greedy = [alert for alert in overuse if alert.get("pod_name") == "greedy"]
        out(
            "\nover-consumption alert received on NATS: "
            + (demo_view.alert_line((greedy or overuse)[0]) if overuse else "none")
        )
        if facts.failed:
            out("\n" + await gpu_unhealthy_summary(emulator, telemetry, metrics_port, *facts.failed[0]))
        answers = await asyncio.to_thread(_scrape_all, metrics_port, "quotient_nats_auth_total", ("outcome", "reason"))
        out(f"\nNATS identities: {demo_nats.auth_summary(answers, callout=secured.callout)}")
        out(
            f"\ndemo finished: {len(bound)} pods bound, "
            f"{telemetry.counts.get('telemetry', 0)} telemetry and {telemetry.counts.get('health', 0)} health "
            f"messages received, {len(telemetry.alerts)} alerts, {telemetry.undecodable} undecodable; "
            f"agents: {nodes.probe_description}; everything stopped."
        )
        return 0 if ok else 1
    finally:
        if playing is not None:
            playing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await playing
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner
        with contextlib.suppress(Exception):
            await viewer.close()
        if scheduler.returncode is None:
            scheduler.terminate()
            try:
                await asyncio.wait_for(scheduler.wait(), 10)
            except TimeoutError:
                scheduler.kill()
                await scheduler.wait()
        await emulator.stop()
        nodes.close()
        nats.close()
        workdir.cleanup()


def fail_a_gpu(
    emulator: Emulator, nodes: EmulatedNodes, fallback_node: str, note: Callable[[str], None]
) -> list[tuple[str, int]]:
    """Inject Xid 79 on a GPU a running whole-GPU pod uses (so its Event shows), else on ``fallback_node``'s GPU 3;
    the (node, GPU) it failed."""
    for pod in emulator.list("v1", "Pod"):
        meta, spec = demo_view.meta_of(pod), pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        devices = emulator.devices_of(str(meta.get("namespace")), str(meta.get("name"))) or ()
        if node in nodes.fakes and devices and meta.get("namespace") != names.RESERVATION_NAMESPACE:
            nodes.fakes[node].probe.inject_xid(devices[0], 79)
            note(f"  Xid 79 on {node} gpu {devices[0]}, used by {meta.get('namespace')}/{meta.get('name')}")
            return [(node, devices[0])]
    nodes.fakes[fallback_node].probe.inject_xid(3, 79)
    note(f"  Xid 79 on {fallback_node} gpu 3 (no whole-GPU pod was running)")
    return [(fallback_node, 3)]


async def gpu_unhealthy_summary(
    emulator: Emulator, telemetry: demo_view.Telemetry, metrics_port: int, node: str, gpu: int
) -> str:
    """What the injected Xid raised, three ways: the NATS alert, the Events (node and pods), the /metrics series."""
    alerts = [a for a in telemetry.alerts if a.get("name") == "GpuUnhealthy" and a.get("state") == "firing"]
    about = sorted(_involved(event) for event in emulator.list("v1", "Event") if event.get("reason") == "GpuUnhealthy")
    labels = {"alert": "GpuUnhealthy", "node": node, "gpu": str(gpu)}
    value = await asyncio.to_thread(_scrape, metrics_port, "quotient_alert", labels)
    series = "quotient_alert{" + ",".join(f'{key}="{val}"' for key, val in labels.items()) + "}"
    return (
        "GpuUnhealthy for the injected Xid:\n"
        f"  NATS:     {demo_view.alert_line(alerts[0]) if alerts else 'no alert received'}\n"
        f"  Events:   {', '.join(about) or 'none'}\n"
        f"  /metrics: {series} {'absent' if value is None else f'{value:g}'}"
    )


def _involved(event: Mapping[str, Any]) -> str:
    """The object an Event is about, as ``Kind namespace/name``."""
    ref = event.get("involvedObject") or {}
    where = "/".join(str(part) for part in (ref.get("namespace"), ref.get("name")) if part)
    return f"{ref.get('kind')} {where}"


def _scrape(port: int, name: str, labels: Mapping[str, str]) -> float | None:
    """The value of the series ``name`` whose labels include ``labels`` on the scheduler's /metrics, or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def _scrape_all(port: int, name: str, keys: Sequence[str]) -> dict[str, float]:
    """Every sample of ``name`` on the scheduler's /metrics, keyed by its ``keys`` labels joined with ``/``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    return {
        "/".join(sample.labels.get(key, "") for key in keys): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient demo", description="the local Quotient demo")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the scenario")
    parser.add_argument("--duration", type=float, default=100.0, help="length of the scenario in seconds (default 100)")
    parser.add_argument("--interval", type=float, default=1.0, help="agent sampling interval in seconds")
    args = parser.parse_args(list(argv))
    if not 10 <= args.duration <= 170:
        parser.error("--duration must be within 10..170 seconds (the demo ends within three minutes)")
    logs.setup(level="error")
    exit_status = [0]  # Ctrl-C or SIGTERM stops the demo (everything it started included) and exits 0

    stream = sys.stdout  # the demo's own lines, also while the in-process plugin's output is being captured

    async def demo() -> None:
        exit_status[0] = await run_demo(
            duration_s=args.duration,
            keep=args.keep,
            interval_s=args.interval,
            out=lambda t: print(t, file=stream, flush=True),
        )

    try:
        command.run_until_signalled(demo())
    except QuotientError as exc:
        print(f"quotient demo: {exc}", file=sys.stderr)
        return 1
    return exit_status[0]

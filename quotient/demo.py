"""``quotient demo``: the product on the embedded default, on one machine, in about two minutes.

What it starts (all on 127.0.0.1, all stopped on exit): a real ``nats-server``; the Kubernetes API emulator with the
demo cluster (``examples/clusters/demo.yaml``: two A100 nodes, an L4 node, a CPU node); emulated GPU nodes, the real
agent over fake GPUs, which run the processes of the pods the emulated kubelets start; and the real scheduler as
its own process (``quotient scheduler``, serving ``quotient`` and ``kai-scheduler``). Then it applies the users'
workflows (the seeds' queues and pods from ``../shared/seeds``, else ``deploy/examples``) and plays a scenario: a
gang that does not fit and binds when a GPU frees, a pod with an invalid ``gpu-fraction``, a GPU's Xid error, NATS
going away and coming back, and a pod that outgrows its quarter of a GPU until the scheduler raises
``GpuMemoryOverconsumption`` with its name (the scheduler runs with ``--nats``: live telemetry). A live view shows
where each pod landed and why the pending ones wait, and what a
third-party NATS subscriber receives from the agents. ``--keep`` leaves everything running and says how to connect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import yaml

from common import clusterspec, logs, subjects
from common.errors import QuotientError
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from common.quantities import GIB
from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime

log = logs.get("demo")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO / "examples" / "clusters" / "demo.yaml"
SEEDS = REPO.parent / "shared" / "seeds"
EXAMPLES = REPO / "deploy" / "examples"
SEED_FILES = (
    "queues.yaml",
    "cpu-pod.yaml",
    "gpu-pod.yaml",
    "gpu-sharing.yaml",
    "inference-pod.yaml",
    "research-pod.yaml",
)

DEMO_QUEUES = """
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: team-a}
spec:
  parentQueue: default
  resources:
    gpu: {quota: 4, limit: -1, overQuotaWeight: 1}
    cpu: {quota: -1, limit: -1, overQuotaWeight: 1}
    memory: {quota: -1, limit: -1, overQuotaWeight: 1}
---
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {name: team-b}
spec:
  parentQueue: default
  resources:
    gpu: {quota: 2, limit: -1, overQuotaWeight: 3}
    cpu: {quota: -1, limit: -1, overQuotaWeight: 1}
    memory: {quota: -1, limit: -1, overQuotaWeight: 1}
"""

GANG = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: big-train, namespace: team-a, labels: {kai.scheduler/queue: team-a}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 4
      restartPolicy: Never
      template:
        metadata:
          annotations: {quotient.dev/sim-gpu-memory: "20Gi@0s,60Gi@10s"}
        spec:
          schedulerName: quotient
          containers:
          - name: pytorch
            image: pytorch/pytorch
            resources: {limits: {nvidia.com/gpu: "1"}, requests: {cpu: "4", memory: 32Gi}}
"""

GREEDY = """
apiVersion: v1
kind: Pod
metadata:
  name: greedy
  namespace: team-b
  labels: {kai.scheduler/queue: team-b}
  annotations: {gpu-fraction: "0.25", quotient.dev/sim-gpu-memory: "4Gi@0s,30Gi@3s"}
spec:
  schedulerName: quotient
  containers: [{name: main, image: pytorch/pytorch}]
"""
"""A pod given a quarter of a GPU whose memory grows past it: the scheduler raises GpuMemoryOverconsumption."""

INVALID = """
apiVersion: v1
kind: Pod
metadata:
  name: bad-fraction
  namespace: team-b
  labels: {kai.scheduler/queue: team-b}
  annotations: {gpu-fraction: "1.7"}
spec:
  schedulerName: quotient
  containers: [{name: main, image: ubuntu}]
"""


@dataclasses.dataclass(slots=True)
class Telemetry:
    """What a third-party subscriber of ``quotient.v1.>`` has received, decoded with plain msgpack."""

    nodes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    health: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    undecodable: int = 0

    async def on_message(self, subject: str, data: bytes) -> None:
        kind = subject.split(".")[2] if subject.count(".") >= 3 else subject
        self.counts[kind] = self.counts.get(kind, 0) + 1
        try:
            message = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException):
            self.undecodable += 1
            return
        if kind == "alerts" and isinstance(message, dict):
            self.alerts.append(message)  # the scheduler's alerts: name, state, pod, node, device and numbers
            return
        node = subjects.node_of(subject)
        if not isinstance(message, dict) or node is None:
            return
        (self.nodes if kind == "telemetry" else self.health)[node] = message


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _gib(value: object) -> str:
    return f"{value / GIB:.1f}" if isinstance(value, int) else "?"


def render(emulator: Emulator, telemetry: Telemetry, *, elapsed_s: float, notes: Sequence[str], nats_up: bool) -> str:
    pods = sorted(emulator.list("v1", "Pod"), key=lambda p: (_meta(p).get("namespace", ""), _meta(p).get("name", "")))
    groups = {
        (_meta(g).get("namespace"), _meta(g).get("name")): g
        for g in emulator.list("scheduling.run.ai/v2alpha2", "PodGroup")
    }
    names = {str(_meta(p).get("uid")): f"{_meta(p).get('namespace')}/{_meta(p).get('name')}" for p in pods}
    lines = [
        f"Quotient demo   t={elapsed_s:5.1f}s   NATS {'up' if nats_up else 'DOWN'}   "
        f"agent messages: {', '.join(f'{k} {v}' for k, v in sorted(telemetry.counts.items())) or 'none yet'}",
        "",
        f"{'POD':<54} {'QUEUE':<13} {'STATUS':<9} {'NODE':<7} {'GPU':<16} WHY (for pending pods)",
    ]
    for pod in pods:
        meta, spec = _meta(pod), pod.get("spec") or {}
        if meta.get("namespace") == "kube-system":
            continue
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        gpu = ""
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        plugin = emulator.devices_of(namespace, name) if spec.get("nodeName") else None
        if "gpu-fraction" in annotations or "gpu-memory" in annotations:
            share = annotations.get("gpu-fraction") or f"{annotations.get('gpu-memory')}MiB"
            where = annotations.get("quotient.dev/gpu-devices") if spec.get("nodeName") else None
            gpu = f"{share} of gpu {where}" if where else share
        elif plugin:
            # Whole GPUs: the device plugin's allocation, which is what the containers really get.
            gpu = "gpu " + ",".join(str(index) for index in plugin)
        own_group = groups.get((meta.get("namespace"), annotations.get("pod-group-name")))
        queue = ((own_group or {}).get("spec") or {}).get("queue") or labels.get("kai.scheduler/queue") or "-"
        why = ""
        if not spec.get("nodeName"):
            conditions = ((own_group or {}).get("status") or {}).get("schedulingConditions") or []
            if spec.get("schedulerName") not in ("quotient", "kai-scheduler"):
                why = f"not ours (schedulerName {spec.get('schedulerName', 'default-scheduler')})"
            elif conditions:
                why = f"{conditions[-1].get('reason')}: {conditions[-1].get('message')}"
            else:
                why = emulator_event(emulator, meta) or "being scheduled"
        lines.append(
            f"{meta.get('namespace', '') + '/' + meta.get('name', ''):<54.54} {queue:<13.13} "
            f"{(pod.get('status') or {}).get('phase', ''):<9} {spec.get('nodeName') or '-':<7} {gpu:<16.16} {why}"[:220]
        )
    lines += ["", "GPU telemetry as a NATS subscriber receives it (pod names resolved from the pods' UIDs):"]
    for node in sorted(telemetry.nodes):
        message = telemetry.nodes[node]
        status = (telemetry.health.get(node) or {}).get("status", "?")
        for gpu in message.get("gpus") or []:
            procs = ", ".join(
                f"{names.get(p.get('pod_uid'), '(no pod)')} {_gib(p.get('used_memory_bytes'))}Gi"
                for p in gpu.get("processes") or []
            )
            lines.append(
                f"  {node:<7} gpu {gpu.get('index')}  {_gib(gpu.get('memory_used_bytes')):>5}/"
                f"{_gib(gpu.get('memory_total_bytes'))} GiB  {procs or '-'}"
            )
        problems = "; ".join(str(p.get("message")) for p in (telemetry.health.get(node) or {}).get("problems") or [])
        lines.append(f"  {node:<7} health {status}{': ' + problems if problems else ''}")
    lines += ["", "Alerts from the scheduler (quotient.v1.alerts.<name>, newest last):"]
    lines += [f"  {alert_line(alert)}" for alert in telemetry.alerts[-6:]] or ["  none yet"]
    lines += ["", *notes[-8:]]
    return "\n".join(lines)


def alert_line(alert: dict[str, Any]) -> str:
    """One alert as a line: state, name, subject and, for over-consumption, used against allotted."""
    pod = f"{alert.get('pod_namespace')}/{alert.get('pod_name')} " if alert.get("pod_name") else ""
    where = f"{pod}on {alert.get('node_name')}" + (
        f" gpu {alert.get('gpu_index')}" if alert.get("gpu_index") is not None else ""
    )
    numbers = ""
    if isinstance(alert.get("used_bytes"), int) and isinstance(alert.get("allotted_bytes"), int):
        numbers = f": uses {_gib(alert.get('used_bytes'))} GiB of {_gib(alert.get('allotted_bytes'))} GiB allotted"
    return f"{str(alert.get('state', '?')).upper():<8} {alert.get('name')} {where}{numbers}"


def emulator_event(emulator: Emulator, meta: dict[str, Any]) -> str:
    """The newest Warning event about a pod (the scheduler's reason for a pod it could not read)."""
    newest = ""
    stamp = ""
    for event in emulator.list("v1", "Event", str(meta.get("namespace") or "default")):
        involved = event.get("involvedObject") or {}
        if involved.get("name") == meta.get("name") and event.get("type") == "Warning":
            when = str(event.get("lastTimestamp") or "")
            if when >= stamp:
                stamp, newest = when, f"{event.get('reason')}: {event.get('message')}"
    return newest


async def apply(emulator: Emulator, text: str, *, namespace: str | None = None) -> list[str]:
    """Create every object of a YAML text through the emulator's API (admission and validation included)."""
    created = []
    for obj in yaml.safe_load_all(text):
        if not isinstance(obj, dict):
            continue
        if namespace and obj.get("kind") not in ("Queue", "Namespace"):
            obj.setdefault("metadata", {}).setdefault("namespace", namespace)
        result = await emulator.create(obj)
        if isinstance(result, dict):
            created.append(f"{obj.get('kind')}/{_meta(result).get('name')}")
        else:
            created.append(f"{obj.get('kind')}/{_meta(obj).get('name')} refused: {result.message}")
    return created


def _workflow_texts() -> tuple[str, list[str]]:
    """The talk guide's queues and pods: the seeds' own files, else our equivalents in deploy/examples."""
    if SEEDS.is_dir() and all((SEEDS / name).is_file() for name in SEED_FILES):
        return str(SEEDS), [(SEEDS / name).read_text() for name in SEED_FILES]
    files = [EXAMPLES / "queues.yaml", *sorted((EXAMPLES / "talk").glob("*.yaml"))]
    return str(EXAMPLES), [path.read_text() for path in files]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    at_s: float
    note: str
    action: Callable[[], Any]


async def run_demo(*, duration_s: float, keep: bool, interval_s: float, out: Callable[[str], None]) -> int:
    spec = clusterspec.load(DEFAULT_SPEC)
    workdir = tempfile.TemporaryDirectory(prefix="quotient-demo-")
    nats = NatsServer().start()
    emulator = Emulator(spec, config=EmulatorConfig(scripted_pods=True))
    await emulator.start()
    nodes = EmulatedNodes(spec, nats_url=nats.url, interval_s=interval_s)
    runtime = GpuNodesRuntime(nodes)
    for name in nodes.fakes:
        emulator.add_runtime(runtime, node=name)
    scheduler_log = Path(workdir.name) / "scheduler.log"
    scheduler = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "quotient.cli",
            "scheduler",
            "--kube-server",
            emulator.url,
            "--scheduler-name",
            "quotient,kai-scheduler",
            "--no-leader-elect",
            "--no-webhook",
            "--metrics-port",
            "0",
            # Live telemetry: measured headroom, and alerts on NATS that the viewer below prints.
            "--nats",
            nats.url,
            "--overuse-grace",
            "3s",
            "--telemetry-stale-floor",
            "5s",
        ],
        stdout=scheduler_log.open("w"),
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    telemetry = Telemetry()
    viewer = NatsBus(servers=nats.url, name="demo-viewer")
    notes: list[str] = []
    start = time.monotonic()
    tty = sys.stdout.isatty()

    def note(text: str) -> None:
        notes.append(f"[t={time.monotonic() - start:5.1f}s] {text}")
        if not tty:
            out(notes[-1])

    pending_creates: list[asyncio.Task[list[str]]] = []

    def later(text: str, namespace: str | None = None) -> None:
        pending_creates.append(asyncio.ensure_future(apply(emulator, text, namespace=namespace)))

    def free_a_gpu() -> None:
        pending_creates.append(asyncio.ensure_future(_delete(emulator, "default", "gpu-pod")))

    a100 = sorted(name for name in nodes.fakes if name.startswith("a100"))[0]
    scale = duration_s / 100
    steps = [
        Step(
            at_s=20 * scale,
            note="team-a submits a PyTorchJob of 4 one-GPU workers: a gang, all or nothing",
            action=lambda: later(GANG),
        ),
        Step(
            at_s=28 * scale,
            note='team-b submits a pod with gpu-fraction "1.7": refused with the reason',
            action=lambda: later(INVALID),
        ),
        Step(
            at_s=32 * scale,
            note="team-b's pod 'greedy' gets 0.25 of a GPU and grows to 30 GiB: GpuMemoryOverconsumption names it",
            action=lambda: later(GREEDY),
        ),
        Step(at_s=45 * scale, note="gpu-pod ends: a GPU frees, the gang fits and binds whole", action=free_a_gpu),
        Step(
            at_s=60 * scale,
            note=f"inject Xid 79 (GPU fell off the bus) on {a100} gpu 3",
            action=lambda: nodes.fakes[a100].probe.inject_xid(3, 79),
        ),
        Step(
            at_s=70 * scale,
            note="stop nats-server: agents keep sampling and keep only their newest sample",
            action=nats.stop,
        ),
        Step(
            at_s=78 * scale,
            note="start nats-server again on the same port: agents reconnect by themselves",
            action=nats.start,
        ),
    ]
    runner = asyncio.create_task(nodes.run())
    try:
        for namespace in ("team-a", "team-b"):
            await apply(emulator, f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n")
        source, texts = _workflow_texts()
        created = []
        for text in texts:
            created += await apply(emulator, text)
        created += await apply(emulator, DEMO_QUEUES)
        note(
            f"nats-server {nats.url} (JetStream in {nats.workdir}), API emulator {emulator.url}, scheduler pid "
            f"{scheduler.pid} (log {scheduler_log})"
        )
        note(f"applied the users' workflows from {source}: {', '.join(created)}")
        await viewer.connect()
        await viewer.subscribe("quotient.v1.>", telemetry.on_message)
        next_frame = 0.0
        while keep or time.monotonic() - start < duration_s:
            elapsed = time.monotonic() - start
            while steps and elapsed >= steps[0].at_s:
                step = steps.pop(0)
                note(step.note)
                step.action()
            for task in [t for t in pending_creates if t.done()]:
                pending_creates.remove(task)
                for line in task.result():
                    if "refused" in line:
                        note(line)
            if runner.done():
                runner.result()
                return 1
            if scheduler.returncode is not None:
                note(f"the scheduler exited with {scheduler.returncode}; its log: {scheduler_log}")
                return 1
            if elapsed >= next_frame:
                frame = render(emulator, telemetry, elapsed_s=elapsed, notes=notes, nats_up=nats.running)
                out(("\x1b[2J\x1b[H" if tty else "\n") + frame)
                next_frame = elapsed + (1.0 if tty else 20 * scale)
            if keep and elapsed > duration_s and not steps and not notes[-1].startswith("--keep"):
                notes.append(
                    f"--keep: still running. kubectl --server {emulator.url} get pods -A ; NATS at {nats.url} "
                    f"(nats sub 'quotient.v1.>' --server {nats.url}); Ctrl-C stops everything."
                )
                out(notes[-1])
            await asyncio.sleep(0.1)
        out("\n" + render(emulator, telemetry, elapsed_s=time.monotonic() - start, notes=notes, nats_up=nats.running))
        bound = [p for p in emulator.list("v1", "Pod") if (p.get("spec") or {}).get("nodeName")]
        gang = [p for p in bound if _meta(p).get("name", "").startswith("big-train-worker")]
        ok = telemetry.counts.get("telemetry", 0) > 0 and telemetry.undecodable == 0 and len(gang) == 4
        gang_state = "whole" if len(gang) == 4 else "NOT bound"
        overuse = [
            alert
            for alert in telemetry.alerts
            if alert.get("name") == "GpuMemoryOverconsumption" and alert.get("state") == "firing"
        ]
        if overuse:
            out(f"\nover-consumption alert received on NATS: {alert_line(overuse[0])}")
        out(
            f"\ndemo finished: {len(bound)} pods bound (the 4-worker gang {gang_state}), "
            f"{telemetry.counts.get('telemetry', 0)} telemetry and {telemetry.counts.get('health', 0)} health "
            f"messages received, {len(telemetry.alerts)} alerts, {telemetry.undecodable} undecodable; "
            "everything stopped."
        )
        return 0 if ok else 1
    finally:
        for task in pending_creates:
            task.cancel()
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


async def _delete(emulator: Emulator, namespace: str, name: str) -> list[str]:
    from quotient.emulator.api import DeleteOptions

    result = await emulator.api.delete(emulator.kind_of("v1", "Pod"), namespace, name, DeleteOptions(grace_period_s=0))
    return [] if isinstance(result, dict) else [f"Pod/{name} delete refused: {result.message}"]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient demo", description="the local Quotient demo")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the scenario")
    parser.add_argument("--duration", type=float, default=100.0, help="length of the scenario in seconds (default 100)")
    parser.add_argument("--interval", type=float, default=1.0, help="agent sampling interval in seconds")
    args = parser.parse_args(list(argv))
    if not 10 <= args.duration <= 170:
        parser.error("--duration must be within 10..170 seconds (the demo ends within three minutes)")
    logs.setup(level="error")
    try:
        import uvloop

        return uvloop.run(
            run_demo(
                duration_s=args.duration, keep=args.keep, interval_s=args.interval, out=lambda t: print(t, flush=True)
            )
        )
    except KeyboardInterrupt:
        return 0
    except QuotientError as exc:
        print(f"quotient demo: {exc}", file=sys.stderr)
        return 1

"""``quotient demo``: the local product demo on the embedded default.

What it starts, all on 127.0.0.1 and all stopped on exit: a real ``nats-server`` (the pinned binary) with
JetStream, and emulated GPU nodes (the real agent code over fake GPUs, with pods whose GPU memory grows and shrinks
and a process of no pod). A viewer subscribes to ``quotient.v1.>`` exactly as a third party would (plain ``msgpack``
into dicts, no Quotient code) and shows live what it receives. A short scenario plays: memory ramps, a critical Xid
on one GPU (the health message), NATS going away and coming back (the agents reconnect and carry on), a pod
exiting. It exits 0 within three minutes; ``--keep`` leaves everything running and prints how to connect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgpack

from agent import fakenode
from common import clusterspec, logs, subjects
from common.errors import QuotientError
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from common.quantities import GIB
from quotient.nodes import EmulatedNodes

log = logs.get("demo")

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "examples" / "clusters" / "telemetry-demo.yaml"


@dataclasses.dataclass(slots=True)
class ViewerState:
    """What a third-party subscriber has seen, decoded with plain msgpack."""

    telemetry: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    health: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes_received: int = 0
    undecodable: int = 0

    async def on_message(self, subject: str, data: bytes) -> None:
        self.bytes_received += len(data)
        kind = subject.split(".")[2] if subject.count(".") >= 3 else subject
        self.counts[kind] = self.counts.get(kind, 0) + 1
        try:
            message = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException):
            self.undecodable += 1
            return
        if not isinstance(message, dict):
            self.undecodable += 1
            return
        node = subjects.node_of(subject)
        if node is None:
            return
        if kind == "telemetry":
            self.telemetry[node] = message
        elif kind == "health":
            self.health[node] = message


def _gib(value: object) -> str:
    return f"{int(value) / GIB:5.1f}" if isinstance(value, int) else "    ?"


def render(state: ViewerState, *, names: dict[str, str], elapsed_s: float, notes: Sequence[str], nats_up: bool) -> str:
    lines = [
        f"Quotient demo: what a NATS subscriber of quotient.v1.> receives   t={elapsed_s:5.1f}s   "
        f"NATS {'up' if nats_up else 'DOWN'}   messages {sum(state.counts.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(state.counts.items()))})",
        "",
        f"{'node':<8} {'gpu':>3} {'used/total GiB':>15} {'util':>5}  processes (pod from the cgroup; name as the "
        "scheduler will know it)",
    ]
    for node in sorted(state.telemetry):
        message = state.telemetry[node]
        health = state.health.get(node, {})
        gpus = message.get("gpus")
        for gpu in gpus if isinstance(gpus, list) else []:
            if not isinstance(gpu, dict):
                continue
            procs = []
            listed = gpu.get("processes")
            for process in listed if isinstance(listed, list) else []:
                if not isinstance(process, dict):
                    continue
                uid = process.get("pod_uid")
                who = names.get(uid, uid[:8]) if isinstance(uid, str) else "(no pod)"
                procs.append(f"{who} {_gib(process.get('used_memory_bytes')).strip()}Gi")
            util = gpu.get("gpu_util_pct")
            used, total = _gib(gpu.get("memory_used_bytes")), _gib(gpu.get("memory_total_bytes"))
            lines.append(
                f"{node:<8} {gpu.get('index')!s:>3} {used} /{total}"
                f"  {util if util is not None else '-'!s:>3}%  {', '.join(procs) or '-'}"
            )
        problems = health.get("problems")
        problems = problems if isinstance(problems, list) else []
        status = health.get("status", "?")
        detail = "; ".join(str(p.get("message")) for p in problems if isinstance(p, dict))
        lines.append(f"{'':<8} health: {status}{' - ' + detail if detail else ''}   seq {message.get('seq')}")
    lines += ["", *notes[-6:]]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    at_s: float
    note: str
    action: Callable[[], None]


async def run_demo(
    *, spec_path: Path, duration_s: float, keep: bool, interval_s: float, out: Callable[[str], None]
) -> int:
    spec = clusterspec.load(spec_path)
    names = {fakenode.pod_uid_for(pod.namespace, pod.name): f"{pod.namespace}/{pod.name}" for pod in spec.pods}
    server = NatsServer().start()
    nodes = EmulatedNodes(spec, nats_url=server.url, interval_s=interval_s)
    viewer = NatsBus(servers=server.url, name="demo-viewer")
    state = ViewerState()
    notes: list[str] = [
        f"nats-server {server.url} (JetStream in {server.workdir}); {len(nodes.agents)} emulated GPU nodes"
    ]
    start = time.monotonic()
    gpu_nodes = sorted(nodes.fakes)
    tty = sys.stdout.isatty()

    def note(text: str) -> None:
        notes.append(f"[t={time.monotonic() - start:5.1f}s] {text}")
        if not tty:
            out(notes[-1])

    def inject_xid() -> None:
        nodes.fakes[gpu_nodes[0]].probe.inject_xid(1, 79)

    def stop_nats() -> None:
        server.stop()

    def start_nats() -> None:
        server.start()

    def pod_exits() -> None:
        uid = next(uid for uid, name in names.items() if name.endswith("batch-infer"))
        for fake in nodes.fakes.values():
            fake.stop_pod(uid)

    scale = duration_s / 90
    steps = [
        Step(at_s=25 * scale, note=f"inject Xid 79 (GPU fell off the bus) on {gpu_nodes[0]} gpu 1", action=inject_xid),
        Step(
            at_s=40 * scale,
            note="stop nats-server: agents keep sampling, keep only their newest sample",
            action=stop_nats,
        ),
        Step(
            at_s=48 * scale,
            note="start nats-server again on the same port: agents reconnect by themselves",
            action=start_nats,
        ),
        Step(at_s=60 * scale, note="team-a/batch-infer exits: its process and its series disappear", action=pod_exits),
    ]
    runner = asyncio.create_task(nodes.run())
    try:
        await viewer.connect()
        await viewer.subscribe("quotient.v1.>", state.on_message)
        next_frame = 0.0
        while keep or time.monotonic() - start < duration_s:
            elapsed = time.monotonic() - start
            while steps and elapsed >= steps[0].at_s:
                step = steps.pop(0)
                note(step.note)
                step.action()
            if runner.done():
                runner.result()  # surfaces the failure
                return 1
            if elapsed >= next_frame:
                frame = render(state, names=names, elapsed_s=elapsed, notes=notes, nats_up=server.running)
                if tty:
                    out("\x1b[2J\x1b[H" + frame)
                elif elapsed >= next_frame:
                    out(frame + "\n")
                next_frame = elapsed + (1.0 if tty else 10 * scale)
            await asyncio.sleep(0.1)
            if keep and elapsed > duration_s and not steps and not notes[-1].startswith("--keep"):
                notes.append(
                    f"--keep: still running. Subscribe with: nats sub 'quotient.v1.>' --server {server.url} "
                    "(or any NATS client); Ctrl-C stops everything."
                )
                if not tty:
                    out(notes[-1])
        out(render(state, names=names, elapsed_s=time.monotonic() - start, notes=notes, nats_up=server.running))
        received = state.counts.get("telemetry", 0)
        ok = received > 0 and state.undecodable == 0 and len(state.telemetry) == len(gpu_nodes)
        out(
            f"\ndemo finished: {received} telemetry and {state.counts.get('health', 0)} health messages from "
            f"{len(state.telemetry)} nodes, {state.undecodable} undecodable; everything stopped."
        )
        return 0 if ok else 1
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner
        await viewer.close()
        nodes.close()
        server.close()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient demo", description="the local Quotient demo")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the scenario")
    parser.add_argument("--duration", type=float, default=90.0, help="length of the scenario in seconds (default 90)")
    parser.add_argument("--interval", type=float, default=1.0, help="agent sampling interval in seconds")
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="cluster spec of the emulated nodes")
    args = parser.parse_args(list(argv))
    if not 5 <= args.duration <= 170:
        parser.error("--duration must be within 5..170 seconds (the demo ends within three minutes)")
    logs.setup(level="error")
    try:
        import uvloop

        return uvloop.run(
            run_demo(
                spec_path=args.spec,
                duration_s=args.duration,
                keep=args.keep,
                interval_s=args.interval,
                out=lambda text: print(text, flush=True),
            )
        )
    except KeyboardInterrupt:
        return 0
    except QuotientError as exc:
        print(f"quotient demo: {exc}", file=sys.stderr)
        return 1

"""The load of ``quotient bench telemetry``: realistic pre-encoded node messages, and the publisher process.

Messages are realistic (every GPU gauge set, pod UIDs and container ids on every process, ~8 KB) and pre-encoded;
the publisher runs as *another process* (``python -m quotient.bench.telemetryload PLAN``) and writes NATS's text
protocol to its socket in chunks, so the load generator stays cheap and the measuring process pays only for what
the scheduler pays for.

The publisher patches ``seq`` and ``ts_ns`` into each pre-encoded payload in place: both are encoded as 8-byte
msgpack integers (``seq`` starts at 2**40 for that reason), so every message is new to the sequence gate without
re-encoding; ``ts_ns`` is the wall clock when its chunk of messages is written to the socket. It paces itself at
the plan's rate (0: as fast as it can). Crossing nodes switch, at their planned time, to a pre-encoded sample where
their first pod's process uses more than the pod was given, and the publisher reports when it first sent each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from common import command, natstls, quantities, subjects, wire

GIB: Final = quantities.GIB
# Both are encoded as msgpack uint64 (0xcf and 8 bytes) when at least 2**32, so they can be patched in place.
SEQ_BASE: Final = 2**40
_SEQ_KEY: Final = b"\xa3seq\xcf"
_TS_KEY: Final = b"\xa5ts_ns\xcf"
_U64: Final = struct.Struct(">Q")
# Every pod is given this much on its device; the under-allotment samples use at most 9 GiB (see node_message).
ALLOTTED_BYTES: Final = 10 * GIB
_OVER_BYTES: Final = 16 * GIB
# Messages are written to the publisher's socket this many at a time; each chunk gets one ts_ns.
_CHUNK: Final = 250


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def pod_uid(i: int, p: int) -> str:
    return f"{i:08x}-{p:04x}-4000-8000-{i * 64 + p:012x}"


def node_message(
    i: int, *, devices: int = 8, processes: int = 32, ts_ns: int, interval_ms: int = 250, over: bool = False
) -> wire.NodeTelemetry:
    """A realistic sample of node ``i``: every gauge set, ``processes`` pod processes spread over ``devices``, each
    using 1 to 9 GiB; with ``over``, the first process (pod ``pod_uid(i, 0)`` on device 0) uses 16 GiB."""
    per_device: list[list[wire.ProcessReport]] = [[] for _ in range(devices)]
    for p in range(processes):
        per_device[p % devices].append(
            wire.ProcessReport(
                pid=10_000 + i % 1000 * 64 + p,
                used_memory_bytes=_OVER_BYTES if over and p == 0 else (1 + (i + p) % 9) * GIB,
                pod_uid=pod_uid(i, p),
                container_id=f"containerd://{(i * 64 + p):064x}",
            )
        )
    gpus = tuple(
        wire.GpuReport(
            index=d,
            uuid=gpu_uuid(i, d),
            model="NVIDIA A100-SXM4-80GB",
            memory_total_bytes=80 * GIB,
            memory_reserved_bytes=GIB // 2,
            memory_used_bytes=sum(p.used_memory_bytes or 0 for p in per_device[d]),
            memory_free_bytes=80 * GIB - GIB // 2 - sum(p.used_memory_bytes or 0 for p in per_device[d]),
            gpu_util_pct=(i + d) % 101,
            memory_util_pct=(i * 3 + d) % 101,
            temperature_c=40 + d,
            power_mw=250_000 + d * 1000,
            ecc_corrected=0,
            ecc_uncorrected=0,
            mig_mode=False,
            processes=tuple(per_device[d]),
        )
        for d in range(devices)
    )
    return wire.NodeTelemetry(
        v=1,
        node=node_name(i),
        boot=f"boot-{i:05d}",
        seq=SEQ_BASE,
        ts_ns=ts_ns,
        interval_ms=interval_ms,
        driver_version="550.54.15",
        gpus=gpus,
    )


def gpu_uuid(i: int, d: int) -> str:
    return f"GPU-{i:08x}-{d:04x}-4000-8000-000000000000"


def encoded_messages(nodes: int, *, devices: int, processes: int, interval_ms: int = 250) -> list[tuple[str, bytes]]:
    """One pre-encoded under-allotment sample per node, with its subject."""
    ts_ns = time.time_ns()
    return [
        (
            subjects.telemetry(node_name(i)),
            wire.encode(node_message(i, devices=devices, processes=processes, ts_ns=ts_ns, interval_ms=interval_ms)),
        )
        for i in range(nodes)
    ]


def crossing_nodes(nodes: int, crossings: int) -> list[int]:
    """The nodes whose first pod goes over its allotment, spread evenly over the node numbers."""
    count = min(crossings, nodes)
    return [k * nodes // count for k in range(count)] if count else []


def patched(template: bytes, seq_at: int, ts_at: int, *, seq: int, ts_ns: int) -> bytes:
    """``template`` with ``seq`` and ``ts_ns`` written over their 8-byte values (see :func:`patch_offsets`)."""
    buffer = bytearray(template)
    _U64.pack_into(buffer, seq_at, seq)
    _U64.pack_into(buffer, ts_at, ts_ns)
    return bytes(buffer)


def patch_offsets(payload: bytes) -> tuple[int, int]:
    """Where the 8-byte values of ``seq`` and ``ts_ns`` start in an encoded message."""
    seq_at = payload.index(_SEQ_KEY) + len(_SEQ_KEY)
    ts_at = payload.index(_TS_KEY) + len(_TS_KEY)
    return seq_at, ts_at


# --- the publisher (another process) ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PublisherPlan:
    """What the publisher sends: the nodes, the pace, and when each crossing node switches to its over sample
    (seconds after the start)."""

    url: str
    nodes: int
    devices: int
    processes: int
    rate: int  # messages per second; 0: as fast as possible
    interval_ms: int
    duration_s: float
    crossings: Mapping[int, float]
    ca: str | None = None
    """With a ``tls://`` URL: the CA to pin (the connection is upgraded after INFO, as every NATS client does)."""


async def publish(plan: PublisherPlan) -> None:
    """Publish the pre-encoded messages round after round, writing NATS's text protocol (``PUB subject size``)
    straight to the socket in chunks: the load generator must cost as little CPU as possible, so that on a small
    machine the consumer, not the publisher, is what the figure measures. Prints, as one JSON line, how many it
    sent and when each crossing node's first over-allotment sample left (its ``ts_ns``)."""
    under = encoded_messages(plan.nodes, devices=plan.devices, processes=plan.processes, interval_ms=plan.interval_ms)
    over = {
        i: wire.encode(
            node_message(
                i,
                devices=plan.devices,
                processes=plan.processes,
                ts_ns=time.time_ns(),  # at least 2**32, so encoded on 8 bytes like the others
                interval_ms=plan.interval_ms,
                over=True,
            )
        )
        for i in plan.crossings
    }
    templates = [payload for _, payload in under]
    offsets = [patch_offsets(payload) for payload in templates]
    headers = [f"PUB {subject} {len(payload)}\r\n".encode() for subject, payload in under]
    url = urlsplit(plan.url)
    host, port = url.hostname or "127.0.0.1", url.port or 4222
    # TLS as Quotient's clients speak it: the handshake first, the CA pinned (common.natstls).
    context = natstls.client_context(Path(plan.ca) if plan.ca else None) if url.scheme == "tls" else None
    reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host if context else None)
    info = await reader.readline()
    if not info.startswith(b"INFO "):
        raise RuntimeError(f"not a NATS server at {plan.url}: {info!r}")
    writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"bench-telemetry-publisher"}\r\n')
    await writer.drain()
    print("ready", flush=True)
    sys.stdin.readline()  # the consumer says when it listens
    pending_switch = sorted((at_s, i) for i, at_s in plan.crossings.items())
    first_over_ts: dict[int, int] = {}
    awaiting_first: set[int] = set()
    sent = 0
    start = time.perf_counter()
    deadline = start + plan.duration_s
    seq = SEQ_BASE
    ts_ns = time.time_ns()
    chunk: list[bytes] = []
    while time.perf_counter() < deadline:
        seq += 1
        elapsed = time.perf_counter() - start
        while pending_switch and pending_switch[0][0] <= elapsed:
            _, i = pending_switch.pop(0)
            templates[i] = over[i]
            offsets[i] = patch_offsets(over[i])
            headers[i] = f"PUB {under[i][0]} {len(over[i])}\r\n".encode()
            awaiting_first.add(i)
        for i in range(plan.nodes):
            if sent % _CHUNK == 0:
                ts_ns = time.time_ns()
            seq_at, ts_at = offsets[i]
            chunk += (headers[i], patched(templates[i], seq_at, ts_at, seq=seq, ts_ns=ts_ns), b"\r\n")
            if i in awaiting_first:
                awaiting_first.discard(i)
                first_over_ts[i] = ts_ns
            sent += 1
            if sent % _CHUNK == 0:
                writer.write(b"".join(chunk))
                chunk.clear()
                await writer.drain()
                if plan.rate > 0:
                    ahead_s = sent / plan.rate - (time.perf_counter() - start)
                    if ahead_s > 0:
                        await asyncio.sleep(ahead_s)
                if time.perf_counter() >= deadline:
                    break
    writer.write(b"".join(chunk) + b"PING\r\n")
    await writer.drain()
    while not (line := await reader.readline()).startswith(b"PONG") and line:
        pass
    elapsed = time.perf_counter() - start
    print(f"published {sent} in {elapsed:.2f}s ({sent / elapsed:.0f}/s)", file=sys.stderr, flush=True)
    report = {"sent": sent, "elapsed_s": elapsed, "first_over_ts_ns": {str(i): t for i, t in first_over_ts.items()}}
    print(json.dumps(report), flush=True)
    writer.close()
    await writer.wait_closed()


# --- the consumer and the detector (this process) ---


def main(argv: Sequence[str]) -> int:
    """``python -m quotient.bench.telemetryload PLAN``: publish as the JSON ``PLAN`` says."""
    (plan_json,) = argv
    fields = json.loads(plan_json)
    fields["crossings"] = {int(i): float(at_s) for i, at_s in fields["crossings"].items()}
    command.run_until_signalled(publish(PublisherPlan(**fields)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

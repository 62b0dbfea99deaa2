"""``quotient bench telemetry``: how many node telemetry messages per second the scheduler's consumer ingests.

The shape of issue 7's budget: 5,000 nodes of 8 GPUs with 32 GPU processes each, sampled at 4 Hz, is 20,000
messages per second, to be decoded, checked and applied on one core. Messages are pre-encoded (realistic ones: every
GPU gauge set, pod UIDs and container ids on every process) and published from *another process* (this module run
as ``python -m quotient.bench.telemetry --publish URL``, writing NATS's text protocol to its socket in chunks so the
load generator stays cheap) through a real nats-server with the ``QUOTIENT_TELEMETRY`` stream declared, so this
process pays only for what the scheduler pays for: reading the socket, nats-py's parsing, the consumer's batching,
msgspec decoding, the sequence gate and the state update.

The publisher patches ``seq`` and ``ts_ns`` into each pre-encoded payload in place: both are encoded as 8-byte
msgpack integers (``seq`` starts at 2**40 for that reason), so every message is new to the sequence gate without
re-encoding. ``--rate 0`` publishes as fast as it can (the default: it shows the ceiling); ``--rate 20000`` paces it
at the budget. ``msgs_per_second`` counts messages the consumer *accepted* during the window, measured after a
warm-up; ``cpu_us_per_msg`` is this process's CPU time per accepted message, and ``one_core_capacity_msgs_per_second``
its inverse: on a machine with few cores the publisher and nats-server take CPU from the consumer, and that figure is
what one core given to the consumer would ingest. Two in-process figures tell where the time goes: ``decode_only``
(msgspec alone on the same payloads) and ``ingest_only`` (the consumer's whole core, no NATS).

``sample_to_alert_p99_s`` needs the over-consumption detector wired to the consumer; until the scheduler does that it
is reported as ``null`` with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Final

from common import subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from scheduler.telemetry import consumer

GIB: Final = 1024**3
BUDGET_MSGS_PER_SECOND: Final = 20_000
# Both are encoded as msgpack uint64 (0xcf and 8 bytes) when at least 2**32, so they can be patched in place.
_SEQ_BASE: Final = 2**40
_SEQ_KEY: Final = b"\xa3seq\xcf"
_TS_KEY: Final = b"\xa5ts_ns\xcf"
_U64: Final = struct.Struct(">Q")


def _node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def node_message(i: int, *, devices: int = 8, processes: int = 32, ts_ns: int) -> wire.NodeTelemetry:
    """A realistic sample of node ``i``: every gauge set, ``processes`` pod processes spread over ``devices``."""
    per_device: list[list[wire.ProcessReport]] = [[] for _ in range(devices)]
    for p in range(processes):
        per_device[p % devices].append(
            wire.ProcessReport(
                pid=10_000 + i % 1000 * 64 + p,
                used_memory_bytes=(1 + (i + p) % 9) * GIB,
                pod_uid=f"{i:08x}-{p:04x}-4000-8000-{i * 64 + p:012x}",
                container_id=f"containerd://{(i * 64 + p):064x}",
            )
        )
    gpus = tuple(
        wire.GpuReport(
            index=d,
            uuid=f"GPU-{i:08x}-{d:04x}-4000-8000-000000000000",
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
        node=_node_name(i),
        boot=f"boot-{i:05d}",
        seq=_SEQ_BASE,
        ts_ns=ts_ns,
        interval_ms=250,
        driver_version="550.54.15",
        gpus=gpus,
    )


def encoded_messages(nodes: int, *, devices: int, processes: int) -> list[tuple[str, bytes]]:
    ts_ns = time.time_ns()
    return [
        (
            subjects.telemetry(_node_name(i)),
            wire.encode(node_message(i, devices=devices, processes=processes, ts_ns=ts_ns)),
        )
        for i in range(nodes)
    ]


def _patched(template: bytes, seq_at: int, ts_at: int, *, seq: int, ts_ns: int) -> bytes:
    buffer = bytearray(template)
    _U64.pack_into(buffer, seq_at, seq)
    _U64.pack_into(buffer, ts_at, ts_ns)
    return bytes(buffer)


def _offsets(payload: bytes) -> tuple[int, int]:
    seq_at = payload.index(_SEQ_KEY) + len(_SEQ_KEY)
    ts_at = payload.index(_TS_KEY) + len(_TS_KEY)
    return seq_at, ts_at


# --- the publisher (another process) ---


async def _publish(url: str, *, nodes: int, devices: int, processes: int, rate: int, duration_s: float) -> None:
    """Publish the pre-encoded messages round after round, writing NATS's text protocol (``PUB subject size``)
    straight to the socket in chunks: the load generator must cost as little CPU as possible, so that on a small
    machine the consumer, not the publisher, is what the figure measures."""
    messages = encoded_messages(nodes, devices=devices, processes=processes)
    offsets = [_offsets(payload) for _, payload in messages]
    headers = [f"PUB {subject} {len(payload)}\r\n".encode() for subject, payload in messages]
    host, _, port = url.removeprefix("nats://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    info = await reader.readline()
    if not info.startswith(b"INFO "):
        raise RuntimeError(f"not a NATS server at {url}: {info!r}")
    writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"bench-telemetry-publisher"}\r\n')
    await writer.drain()
    print("ready", flush=True)
    sys.stdin.readline()  # the consumer says when it listens
    sent = 0
    start = time.perf_counter()
    deadline = start + duration_s
    seq = _SEQ_BASE
    chunk = 250
    pending: list[bytes] = []
    while time.perf_counter() < deadline:
        seq += 1
        ts_ns = time.time_ns()
        for header, (_, template), (seq_at, ts_at) in zip(headers, messages, offsets, strict=True):
            pending += (header, _patched(template, seq_at, ts_at, seq=seq, ts_ns=ts_ns), b"\r\n")
            sent += 1
            if sent % chunk == 0:
                writer.write(b"".join(pending))
                pending.clear()
                await writer.drain()
                if rate > 0:
                    ahead_s = sent / rate - (time.perf_counter() - start)
                    if ahead_s > 0:
                        await asyncio.sleep(ahead_s)
                if time.perf_counter() >= deadline:
                    break
    writer.write(b"".join(pending) + b"PING\r\n")
    await writer.drain()
    while not (line := await reader.readline()).startswith(b"PONG") and line:
        pass
    elapsed = time.perf_counter() - start
    print(f"published {sent} in {elapsed:.2f}s ({sent / elapsed:.0f}/s)", file=sys.stderr, flush=True)
    print(f"sent {sent} {elapsed:.6f}", flush=True)
    writer.close()
    await writer.wait_closed()


# --- the consumer (this process) ---


def _in_process(messages: Sequence[tuple[str, bytes]], rounds: int) -> tuple[float, float]:
    """Messages per second for msgspec decoding alone and for the consumer's core (``ingest``), no NATS."""
    payloads = [payload for _, payload in messages]
    offsets = [_offsets(payload) for payload in payloads]
    ts_ns = time.time_ns()
    series = [
        [
            (subject, _patched(payload, seq_at, ts_at, seq=_SEQ_BASE + r + 1, ts_ns=ts_ns + r))
            for (subject, payload), (seq_at, ts_at) in zip(messages, offsets, strict=True)
        ]
        for r in range(rounds)
    ]
    start = time.process_time()
    for batch in series:
        wire.decode_telemetry_batch([payload for _, payload in batch])
    decode_rate = rounds * len(messages) / (time.process_time() - start)

    # ingest() never touches the bus, so an unconnected one will do.
    core = consumer.TelemetryConsumer(bus=NatsBus(servers="nats://127.0.0.1:4222", name="bench-unused"))
    start = time.process_time()
    for batch in series:
        core.ingest(batch)
    ingest_rate = rounds * len(messages) / (time.process_time() - start)
    if core.counters.accepted_telemetry != rounds * len(messages):
        raise RuntimeError(f"in-process ingest accepted {core.counters.accepted_telemetry} of {rounds * len(messages)}")
    return decode_rate, ingest_rate


async def _measure(args: argparse.Namespace) -> dict[str, object]:
    messages = encoded_messages(args.nodes, devices=args.devices, processes=args.processes)
    decode_rate, ingest_rate = _in_process(messages[: min(len(messages), 2000)], rounds=4)
    with NatsServer() as server:
        bus = NatsBus(servers=server.url, name="bench-telemetry-consumer")
        await bus.connect_once()
        telemetry = consumer.TelemetryConsumer(bus=bus)
        task = asyncio.create_task(telemetry.run())
        await asyncio.wait_for(telemetry.ready.wait(), 10)
        total_s = args.warmup_s + args.window_s + 1.0
        publisher = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "quotient.bench.telemetry",
            "--publish",
            server.url,
            f"--nodes={args.nodes}",
            f"--devices={args.devices}",
            f"--processes={args.processes}",
            f"--rate={args.rate}",
            f"--duration-s={total_s}",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert publisher.stdin is not None and publisher.stdout is not None
        try:
            line = await asyncio.wait_for(publisher.stdout.readline(), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"the publisher did not start: {line!r}")
            publisher.stdin.write(b"go\n")
            await publisher.stdin.drain()
            await asyncio.sleep(args.warmup_s)
            counters = telemetry.counters
            accepted0, received0, dropped0 = (
                counters.accepted_telemetry,
                counters.received,
                counters.dropped_buffer_full,
            )
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(args.window_s)
            accepted1, received1, dropped1 = (
                counters.accepted_telemetry,
                counters.received,
                counters.dropped_buffer_full,
            )
            cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
            sent_line = (await asyncio.wait_for(publisher.stdout.readline(), total_s + 60)).split()
            await publisher.wait()
            publisher_cpu_s = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            if publisher.returncode is None:
                publisher.kill()
                await publisher.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bus.close()
    sent, published_s = int(sent_line[1]), float(sent_line[2])
    publisher_cpu_fraction = (publisher_cpu_s.ru_utime + publisher_cpu_s.ru_stime) / published_s
    rate = (accepted1 - accepted0) / wall_s
    cpu_us_per_msg = cpu_s / max(1, accepted1 - accepted0) * 1e6
    return {
        "msgs_per_second": round(rate),
        "sample_to_alert_p99_s": None,
        "note": "sample_to_alert_p99_s needs the over-consumption detector wired to the consumer (not yet)",
        "within_budget": rate >= BUDGET_MSGS_PER_SECOND,
        "budget": {"msgs_per_second": BUDGET_MSGS_PER_SECOND},
        "consumer_cpu_fraction": round(cpu_s / wall_s, 3),
        "cpu_us_per_msg": round(cpu_us_per_msg, 2),
        # What one core of this machine would take if the consumer had it to itself (the publisher and nats-server
        # share the machine): the figure to compare with the budget when the consumer is not saturated.
        "one_core_capacity_msgs_per_second": round(1e6 / cpu_us_per_msg),
        "received_per_second": round((received1 - received0) / wall_s),
        "dropped_buffer_full_in_window": dropped1 - dropped0,
        "rejected_total": telemetry.counters.rejected_total,
        "published_per_second": round(sent / published_s),
        "publisher_cpu_fraction": round(publisher_cpu_fraction, 3),
        "cores": os.cpu_count(),
        "target_rate": args.rate or "max",
        "in_process": {
            "decode_only_msgs_per_second": round(decode_rate),
            "ingest_only_msgs_per_second": round(ingest_rate),
        },
        "nodes": args.nodes,
        "devices": args.devices,
        "processes": args.processes,
        "message_bytes": len(messages[0][1]),
        "window_s": args.window_s,
        "nodes_held": len(telemetry.latest()),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quotient bench telemetry")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--processes", type=int, default=32)
    parser.add_argument("--rate", type=int, default=0, help="messages per second to publish; 0: as fast as possible")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--publish", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--duration-s", type=float, default=10.0, help=argparse.SUPPRESS)
    return parser


def run(argv: Sequence[str]) -> dict[str, object]:
    args = _parser().parse_args(list(argv))
    print(
        f"telemetry bench: {args.nodes} nodes x {args.devices} GPUs x {args.processes} processes, "
        f"rate {args.rate or 'max'}, window {args.window_s}s",
        file=sys.stderr,
    )
    import uvloop  # the scheduler runs on uvloop: measure on the same loop

    return uvloop.run(_measure(args))


def _publisher_main(argv: Sequence[str]) -> int:
    import uvloop

    args = _parser().parse_args(list(argv))
    uvloop.run(
        _publish(
            args.publish,
            nodes=args.nodes,
            devices=args.devices,
            processes=args.processes,
            rate=args.rate,
            duration_s=args.duration_s,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_publisher_main(sys.argv[1:]))

"""``quotient bench agent``: CPU per sample and memory of one agent on an 8-GPU node with 32 GPU processes.

Everything on the sample path is real except the GPUs: pid -> pod attribution over a proc tree shaped like the
kubelet's, the msgpack encoding, and publishing to a real nats-server started for the run. The GPUs are the fake
probe (driven like a busy node) or, with ``--nvml-mock``, the same node written into the mock NVML driver's state
and read through ``NvmlProbe``, the unpatched pynvml and the ``libnvidia-ml.so.1`` ABI (``quotient.nvmlmock``;
loaded by absolute path into this process before pynvml initialises). CPU is process time (every thread of this
process; nats-server runs in its own process and is not counted), divided by the number of samples. The two modes
print the same keys. Budget (issue 2): under 2 ms CPU per sample, under 80 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from agent import fakenode, sampling
from agent.gpus.probe import GpuProbe
from agent.loop import AgentLoop
from agent.metrics import AgentMetrics
from agent.podmap import PodMapper
from common import clusterspec, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from quotient.nvmlmock import build, mirror, profiles

GIB = 1024**3


def _rss_mb() -> float:
    try:
        with Path("/proc/self/status").open() as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _node(devices: int, processes: int) -> fakenode.FakeNode:
    spec = clusterspec.parse_inline(f"1x{devices}xA100-80GB")
    node = fakenode.FakeNode(spec.nodes[0])
    for i in range(processes):
        node.run_pod(
            pod_uid=fakenode.pod_uid_for("bench", f"pod-{i}"),
            gpu_indices=[i % devices],
            memory=clusterspec.parse_memory_script(f"{1 + i % 7}Gi@0s,{2 + i % 5}Gi@30s"),
        )
    return node


def _nvml_probe(node: fakenode.FakeNode, profile: profiles.DriverProfile, state_file: Path) -> GpuProbe:
    """An ``NvmlProbe`` over the mock driver of ``profile``, whose state is ``node``'s fake GPUs."""
    library = build.build(profile)
    if isinstance(library, build.Unavailable):
        raise SystemExit(f"quotient bench agent --nvml-mock: {library.reason}")
    mirror.FakeProbeMirror(node.probe, state_file).sync()
    library.preload(state_file=state_file)
    from agent.gpus.nvml import NvmlProbe  # pynvml is imported only once the mock is loaded

    return NvmlProbe()


async def _measure(
    samples: int, devices: int, processes: int, mock: profiles.DriverProfile | None
) -> dict[str, object]:
    with NatsServer() as server, tempfile.TemporaryDirectory(prefix="quotient-bench-nvml-") as scratch:
        node = _node(devices, processes)
        probe: GpuProbe = node.probe
        probe_name = "fake"
        if mock is not None:
            probe = _nvml_probe(node, mock, Path(scratch) / "nvml-state")
            probe_name = f"nvml-mock {mock.name} (driver {mock.driver_version}) through pynvml"
        bus = NatsBus(servers=server.url, name="bench-agent")
        await bus.connect_once()
        received = 0
        warmup = 20
        all_arrived = asyncio.Event()

        async def count(_subject: str, _data: bytes) -> None:
            nonlocal received
            received += 1
            if received >= warmup:
                all_arrived.set()

        listener = NatsBus(servers=server.url, name="bench-listener")
        await listener.connect_once()
        await listener.subscribe("quotient.v1.telemetry.>", count)
        agent = AgentLoop(
            node=node.spec.name,
            probe=probe,
            pods=PodMapper(node.proc_root),
            bus=bus,
            metrics=AgentMetrics(node=node.spec.name, dcgm_names=True),
            interval_s=1.0,
        )
        for _ in range(warmup):  # warm up: imports, caches, the first connection's buffers
            await agent.tick()
        await bus.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_arrived.wait(), 5)
        # The listener proves delivery; it leaves before timing so its CPU is not charged to the agent.
        await listener.close()
        cpu_start = time.process_time()
        wall_start = time.perf_counter()
        for _ in range(samples):
            await agent.tick()
        cpu_s = time.process_time() - cpu_start
        wall_s = time.perf_counter() - wall_start
        await bus.flush()

        # Where the time goes, stage by stage, on the same node (outside the loop, so no thread hop).
        mapper = PodMapper(node.proc_root)
        stages = {"probe": 0.0, "attribution": 0.0, "build": 0.0, "encode": 0.0}
        for seq in range(samples):
            t0 = time.process_time()
            sample = probe.sample()
            t1 = time.process_time()
            pods = mapper.lookup_many(sampling.pids_of(sample))
            t2 = time.process_time()
            message = sampling.build_telemetry(
                sample=sample, pods=pods, node=node.spec.name, boot="bench", seq=seq, interval_ms=1000
            )
            t3 = time.process_time()
            payload = wire.encode(message)
            t4 = time.process_time()
            stages["probe"] += t1 - t0
            stages["attribution"] += t2 - t1
            stages["build"] += t3 - t2
            stages["encode"] += t4 - t3
        rss = _rss_mb()
        await bus.close()
        probe.close()
        node.close()
    return {
        "probe": probe_name,
        "cpu_ms_per_sample": round(cpu_s / samples * 1000, 3),
        "wall_ms_per_sample": round(wall_s / samples * 1000, 3),
        "stage_cpu_ms": {name: round(total / samples * 1000, 3) for name, total in stages.items()},
        "rss_mb": round(rss, 1),
        "samples": samples,
        "delivered_during_warmup": f"{received}/{warmup}",
        "devices": devices,
        "processes": processes,
        "message_bytes": len(payload),
        "budget": {"cpu_ms_per_sample": 2.0, "rss_mb": 80},
    }


def run(argv: Sequence[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="quotient bench agent")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--processes", type=int, default=32)
    parser.add_argument(
        "--nvml-mock",
        nargs="?",
        const=profiles.CURRENT.name,
        choices=sorted(profiles.PROFILES),
        default=None,
        metavar="PROFILE",
        help=f"sample through pynvml over the mock NVML driver (profile, default {profiles.CURRENT.name})",
    )
    args = parser.parse_args(list(argv))
    mock = None if args.nvml_mock is None else profiles.PROFILES[args.nvml_mock]
    print(
        f"agent bench: {args.samples} samples, {args.devices} devices, {args.processes} processes, "
        f"{'the fake probe' if mock is None else f'the NVML mock ({mock.name})'}",
        file=sys.stderr,
    )
    return asyncio.run(_measure(args.samples, args.devices, args.processes, mock))

"""Small builders for telemetry tests: samples, pods and node views in a line each, amounts in GiB and seconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common import quantities, wire
from scheduler.telemetry import overuse

GIB = quantities.GIB
S = quantities.NS_PER_S
NODE = "gpu-node-1"

SETTINGS = overuse.Settings(
    tolerance_bytes=GIB // 2,
    grace_ns=10 * S,
    evict_grace_ns=5 * S,
    ghost_threshold_ns=30 * S,
    unattributed_threshold_bytes=GIB,
)


def proc(pid: int, gib: float | None, pod: str | None = None) -> wire.ProcessReport:
    return wire.ProcessReport(pid=pid, used_memory_bytes=None if gib is None else int(gib * GIB), pod_uid=pod)


def gpu(
    index: int, *processes: wire.ProcessReport, total_gib: int = 80, used_gib: float | None = None
) -> wire.GpuReport:
    used = sum(p.used_memory_bytes or 0 for p in processes) if used_gib is None else int(used_gib * GIB)
    total = total_gib * GIB
    return wire.GpuReport(
        index=index,
        uuid=f"GPU-{index:04d}",
        model="NVIDIA H100 80GB HBM3",
        memory_total_bytes=total,
        memory_reserved_bytes=0,
        memory_used_bytes=used,
        memory_free_bytes=max(total - used, 0),
        processes=tuple(processes),
    )


def sample(*gpus: wire.GpuReport, node: str = NODE, at_s: float = 0, interval_ms: int = 250) -> overuse.NodeSample:
    received_ns = int(at_s * S)
    telemetry = wire.NodeTelemetry(
        v=1, node=node, boot="b00t", seq=received_ns, ts_ns=received_ns, interval_ms=interval_ms, gpus=tuple(gpus)
    )
    return overuse.NodeSample(telemetry=telemetry, received_ns=received_ns)


def pod(
    uid: str,
    *,
    devices: Sequence[tuple[int, float]] = ((0, 20),),
    node: str | None = NODE,
    phase: overuse.PodPhase = overuse.PodPhase.RUNNING,
    queue: str = "team-a",
) -> overuse.PodView:
    return overuse.PodView(
        uid=uid,
        namespace="ml",
        name=f"pod-{uid}",
        node=node,
        queue=queue,
        phase=phase,
        devices=tuple(
            overuse.PodDevice(index=index, uuid=f"GPU-{index:04d}", allotted_bytes=int(gib * GIB))
            for index, gib in devices
        ),
    )


def view(
    *pods: overuse.PodView,
    others: Sequence[overuse.PodView] = (),
    holders: Mapping[int, Sequence[str]] | None = None,
    policies: Mapping[str, overuse.OverusePolicy] | None = None,
    node: str = NODE,
) -> overuse.NodeView:
    known = {p.uid: p for p in (*pods, *others)}
    return overuse.NodeView(
        pods=[p for p in pods if p.node == node],
        holders=holders or {},
        known_pods=known,
        policies=policies or {},
    )

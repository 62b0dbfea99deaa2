"""``quotient bench engine``: how fast the placement core places a large seeded workload, on one core.

The workload is issue 3's: ``--nodes`` nodes (5,000) of ``--gpus`` GPUs (8), ``--pods`` pending pods (30,000): 40%
fractional, with shares drawn from the Alibaba openb trace (the ``gpu_milli`` column of
``../shared/data/openb/openb_pod_list_default.csv`` for single-GPU pods with a share below one GPU; where the file is
absent, ``_FALLBACK_SHARES``, the same column's distribution rounded to 5%), 50% whole GPUs (1 GPU 70%, 2 GPUs 15%,
4 GPUs 10%, 8 GPUs 5%), 10% in gangs of 8 to 64 one-GPU pods; 20 queues in two levels (4 departments of 5 teams).
``--pods 45000`` on 5,000 nodes asks for 138% of the GPUs, as a busy cluster does (issue 14).

The engine's config is the scheduler's: ``quotient scheduler``'s defaults and its ``--gpu-strategy`` (``--strategy``
here; default: the scheduler's default strategy), turned into the engine's config by the scheduler's own settings
code, so the bench measures what the scheduler runs; and so are the process's garbage-collector thresholds
(``scheduler.gcpolicy``, printed as ``gc_thresholds``) and its collection at the end of a cycle, timed with it.

Pods arrive in batches of ``--batch``; each cycle takes a snapshot with the new arrivals, runs the engine, and
applies the plan (as the binder would) before the next. Building snapshots and applying plans is the state layer's
work, not the engine's, and is not timed. Cycles run until nothing more is placed or evicted (or ``--max-cycles``).

Figures (issue 14): ``pods_per_second`` = distinct pods placed / ``wall_s``, the engine's time summed over all those
cycles (a pod evicted and placed again counts once; ``placements`` counts every placement); ``evictions`` and
``moves`` over all cycles; ``pending_groups_max``, the most groups left pending after one cycle; ``cycle_ms_p50`` and
``_p99`` over all cycles; ``backlog_idle_cycle_ms``: one more cycle at the end over the same snapshot with the full
backlog, the clock one second later and nothing else changed. ``idle_cycle_ms`` (issue 3) is the median of
``--idle-cycles`` cycles after a telemetry change that nothing pending can gain from (a GPU held by a whole-GPU pod
reports a higher peak). ``--profile FILE`` writes a cProfile of the timed cycles (``python -m pstats FILE``).

Prints nothing on stdout itself (the caller prints the returned dict as one JSON object); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import dataclasses
import gc
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common import config, names
from common.errors import ConfigError
from common.resources import Resources
from scheduler import gcpolicy, settings
from scheduler.placement import applying, engine, model, plan

GIB = 1024**3
_OPENB = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb" / "openb_pod_list_default.csv"
# openb_pod_list_default.csv, single-GPU pods with gpu_milli < 1000, rounded to 5% (weights are pod counts).
_FALLBACK_SHARES = (
    (50, 7), (100, 24), (150, 75), (200, 62), (250, 144), (300, 329), (350, 60),
    (450, 880), (500, 19), (550, 72), (600, 75), (650, 253), (800, 1078),
)  # fmt: skip
_WHOLE = ((1, 70), (2, 15), (4, 10), (8, 5))
_DEPARTMENTS = 4
_TEAMS = 5
NS = 1_000_000_000


def _share_distribution(path: Path) -> tuple[tuple[int, int], ...]:
    if not path.exists():
        return _FALLBACK_SHARES
    counts: dict[int, int] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("num_gpu") != "1":
                continue
            milli = int(row.get("gpu_milli") or 0)
            if 0 < milli < 1000:
                counts[milli] = counts.get(milli, 0) + 1
    return tuple(sorted(counts.items())) or _FALLBACK_SHARES


def _node(index: int, gpus: int) -> model.Node:
    name = model.NodeName(f"node-{index:05d}")
    return model.Node(
        name=name,
        allocatable=Resources(milli_cpu=128_000, memory_bytes=1024 * GIB, milli_gpu=gpus * 1000, pods=110),
        labels={names.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", names.HOSTNAME_LABEL: name},
        devices=tuple(
            model.Device(
                index=device,
                uuid=model.GpuUuid(f"GPU-{index:05d}-{device}"),
                model="NVIDIA-A100-SXM4-80GB",
                memory_bytes=80 * GIB,
            )
            for device in range(gpus)
        ),
    )


def _queues() -> list[model.Queue]:
    queues: list[model.Queue] = []
    for department in range(_DEPARTMENTS):
        parent = model.QueueName(f"dept-{department}")
        queues.append(model.Queue(name=parent, created_ns=department))
        for team in range(_TEAMS):
            queues.append(
                model.Queue(
                    name=model.QueueName(f"dept-{department}-team-{team}"),
                    parent=parent,
                    created_ns=team,
                    gpu=model.QueueResource(quota=1_500_000, limit=model.UNLIMITED, over_quota_weight=1 + team % 3),
                )
            )
    return queues


def _pod(uid: str, created: int, *, gpus: int = 0, share: int = 0) -> model.Pod:
    cpu, memory = (2_000, 8 * GIB) if share else (8_000 * gpus, 64 * GIB * gpus)
    return model.Pod(
        uid=model.PodUid(uid),
        name=uid,
        namespace="bench",
        requests=Resources(milli_cpu=cpu, memory_bytes=memory, milli_gpu=gpus * 1000, pods=1),
        share=model.GpuShare(milli_gpu=share) if share else None,
        created_ns=created,
    )


def workload(*, pods: int, seed: int, shares: Sequence[tuple[int, int]]) -> list[model.Group]:
    """The seeded groups, in arrival order."""
    rng = random.Random(seed)
    leaves = [model.QueueName(f"dept-{d}-team-{t}") for d in range(_DEPARTMENTS) for t in range(_TEAMS)]
    share_values = [value for value, _ in shares]
    share_weights = [weight for _, weight in shares]
    whole_values = [value for value, _ in _WHOLE]
    whole_weights = [weight for _, weight in _WHOLE]
    groups: list[model.Group] = []
    gang_pods = pods // 10
    made = 0
    while made < gang_pods:
        size = min(rng.randint(8, 64), gang_pods - made)
        uid = f"g{made:06d}"
        members = tuple(_pod(f"{uid}-{i:02d}", 0, gpus=1) for i in range(size))
        groups.append(model.Group(id=model.GroupId(uid), queue=rng.choice(leaves), min_member=size, members=members))
        made += size
    singles = pods - made
    for index in range(singles):
        uid = f"p{index:06d}"
        # 40% of all pods are shares and 50% whole: 4 in 9 of the pods outside gangs are shares.
        if rng.randrange(9) < 4:
            member = _pod(uid, 0, share=rng.choices(share_values, share_weights)[0])
        else:
            member = _pod(uid, 0, gpus=rng.choices(whole_values, whole_weights)[0])
        groups.append(model.Group(id=model.GroupId(uid), queue=rng.choice(leaves), members=(member,)))
    rng.shuffle(groups)
    # Arrival order is creation order.
    return [
        dataclasses.replace(
            group,
            created_ns=order,
            members=tuple(dataclasses.replace(pod, created_ns=order) for pod in group.members),
        )
        for order, group in enumerate(groups)
    ]


def _asked_milli(groups: Sequence[model.Group]) -> int:
    total = 0
    for group in groups:
        for pod in group.members:
            total += pod.share.milli_gpu if pod.share is not None else pod.requests.milli_gpu
    return total


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _touch_telemetry(snapshot: model.Snapshot, step: int) -> model.Snapshot:
    """A new telemetry sample from a GPU that a whole-GPU pod holds: its measured peak rises, nothing pending can
    gain from it. The most common event in a real cluster (every agent reports every device every second)."""
    held = [
        (name, device.index)
        for name in sorted(snapshot.nodes)
        for device in snapshot.nodes[name].devices
        if device.whole and device.gpu_group is None
    ] or [(name, 0) for name in sorted(snapshot.nodes) if snapshot.nodes[name].devices]
    name, index = held[step % len(held)]
    node = snapshot.nodes[name]
    device = node.devices[index]
    peak = min((device.peak_used_bytes or 0) + GIB, device.memory_bytes)
    devices = tuple(dataclasses.replace(d, peak_used_bytes=peak) if d.index == index else d for d in node.devices)
    nodes = dict(snapshot.nodes)
    nodes[name] = dataclasses.replace(node, devices=devices)
    return dataclasses.replace(snapshot, nodes=nodes)


def scheduler_config(gpu_strategy: str | None) -> model.Config:
    """The engine's config as ``quotient scheduler`` builds it from its defaults and ``--gpu-strategy`` (None: the
    scheduler's default strategy), through the scheduler's own settings code; a strategy it refuses raises
    ``ConfigError`` with the scheduler's message."""
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, settings.SETTINGS)
    argv = [] if gpu_strategy is None else ["--gpu-strategy", gpu_strategy]
    values = config.resolve(settings.SETTINGS, parser.parse_args(argv), environ={}, file_values={})
    return settings.settings_from(values).engine_config


@dataclasses.dataclass(slots=True)
class Tally:
    """What the cycles did, counted as they run (the pure part of the figures)."""

    placed: set[model.PodUid] = dataclasses.field(default_factory=set)
    placements: int = 0
    evictions: int = 0
    moves: int = 0
    pending_groups_max: int = 0
    cycle_ms: list[float] = dataclasses.field(default_factory=list)

    def add(self, result: plan.Plan, *, elapsed_s: float) -> None:
        self.placed.update(placement.pod for placement in result.placements)
        self.placements += len(result.placements)
        self.evictions += len(result.evictions)
        self.moves += len(result.moves)
        self.pending_groups_max = max(self.pending_groups_max, len(result.statuses))
        self.cycle_ms.append(elapsed_s * 1000)

    def figures(self) -> dict[str, object]:
        """``pods_per_second`` is distinct pods placed over the engine's time in all cycles."""
        wall_s = sum(self.cycle_ms) / 1000
        ordered = sorted(self.cycle_ms) or [0.0]
        return {
            "pods_per_second": round(len(self.placed) / wall_s, 1) if wall_s else 0.0,
            "wall_s": round(wall_s, 3),
            "placed": len(self.placed),
            "placements": self.placements,
            "evictions": self.evictions,
            "moves": self.moves,
            "pending_groups_max": self.pending_groups_max,
            "cycles": len(self.cycle_ms),
            "cycle_ms_p50": round(statistics.median(ordered), 2),
            "cycle_ms_p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        }


def _timed(warm: engine.Engine, snapshot: model.Snapshot, profiler: cProfile.Profile | None) -> tuple[plan.Plan, float]:
    if profiler is not None:
        profiler.enable()
    started = time.perf_counter()
    with gcpolicy.cycle():  # as the scheduler runs a cycle: its collection, if one is due, is the cycle's time
        result = warm.run(snapshot)
    elapsed = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
    return result, elapsed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quotient bench engine", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--pods", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=1000, help="pods arriving per cycle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--idle-cycles", type=int, default=9)
    parser.add_argument("--max-cycles", type=int, default=2000, help="stop after this many cycles (converged: false)")
    parser.add_argument(
        "--strategy",
        "--gpu-strategy",
        dest="strategy",
        default=None,
        help="the scheduler's --gpu-strategy, mapped onto the engine as the scheduler maps it (default: the "
        "scheduler's default)",
    )
    parser.add_argument("--openb", type=Path, default=_OPENB, help="openb pod list for the share distribution")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the timed cycles (pstats) here")
    return parser


def run(argv: Sequence[str]) -> dict[str, object]:
    """Run the benchmark; returns the figures (see the module docstring)."""
    with gcpolicy.applied():
        return _run(argv)


def _run(argv: Sequence[str]) -> dict[str, object]:
    parser = _parser()
    args = parser.parse_args(list(argv))
    try:
        engine_config = scheduler_config(args.strategy)
    except ConfigError as exc:
        parser.error(str(exc))

    shares = _share_distribution(args.openb)
    share_source = "fallback" if shares == _FALLBACK_SHARES else str(args.openb)
    groups = workload(pods=args.pods, seed=args.seed, shares=shares)
    nodes = {node.name: node for node in (_node(index, args.gpus) for index in range(args.nodes))}
    queues = {queue.name: queue for queue in _queues()}
    asked = _asked_milli(groups)
    offered = args.nodes * args.gpus * 1000
    _progress(
        f"engine bench: {args.nodes} nodes x {args.gpus} GPUs, {args.pods} pods in {len(groups)} groups, "
        f"{100 * asked / offered:.1f}% of GPU capacity asked for, gpu strategy {engine_config.gpu_strategy.value} "
        f"(devices {engine_config.device_strategy.value})"
    )

    warm = engine.Engine()
    profiler = cProfile.Profile() if args.profile is not None else None
    snapshot = model.Snapshot(nodes=nodes, queues=queues, groups={}, now_ns=0, config=engine_config)
    tally = Tally()
    arrived = 0
    position = 0
    step = 0
    converged = False
    while step < args.max_cycles:
        batch: list[model.Group] = []
        while position < len(groups) and arrived < (step + 1) * args.batch:
            batch.append(groups[position])
            arrived += len(groups[position].members)
            position += 1
        if batch:
            merged = dict(snapshot.groups)
            merged.update((group.id, group) for group in batch)
            snapshot = dataclasses.replace(snapshot, groups=merged)
        snapshot = dataclasses.replace(snapshot, now_ns=step * NS)
        result, elapsed = _timed(warm, snapshot, profiler)
        tally.add(result, elapsed_s=elapsed)
        _progress(
            f"cycle {step}: {len(batch)} groups arrived, {len(result.placements)} placed, "
            f"{len(result.evictions)} evicted, {len(result.moves)} moved, {len(result.statuses)} pending groups, "
            f"{elapsed * 1000:.1f} ms"
        )
        snapshot = applying.apply(snapshot, result)
        step += 1
        if position >= len(groups) and not result.placements and not result.evictions:
            converged = True
            break

    # The full backlog and nothing changed but the clock, as the next cycle would see it: one more cycle, timed.
    snapshot = dataclasses.replace(snapshot, now_ns=step * NS)
    result, backlog_idle_s = _timed(warm, snapshot, profiler)
    if result.placements or result.evictions:
        _progress("the backlog cycle placed or evicted something: the run had not settled")
    idle: list[float] = []
    for index in range(args.idle_cycles):
        snapshot = _touch_telemetry(snapshot, index)
        result, elapsed = _timed(warm, snapshot, None)
        idle.append(elapsed * 1000)
        if result.placements or result.evictions:
            _progress("idle cycle placed or evicted something: the telemetry change was not neutral")
    if profiler is not None and args.profile is not None:
        profiler.dump_stats(str(args.profile))
    unplaced = sum(
        1 for group in snapshot.groups.values() for pod in group.members if pod.phase is model.PodPhase.PENDING
    )
    return {
        **tally.figures(),
        "unplaced": unplaced,
        "converged": converged,
        "backlog_idle_cycle_ms": round(backlog_idle_s * 1000, 3),
        "idle_cycle_ms": round(statistics.median(idle), 3) if idle else 0.0,
        "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gc_thresholds": list(gc.get_threshold()),
        "gpu_strategy": engine_config.gpu_strategy.value,
        "device_strategy": engine_config.device_strategy.value,
        "gpu_asked_percent": round(100 * asked / offered, 1),
        "gpu_allocated_percent": round(100 * _allocated_milli(snapshot) / offered, 1),
        "share_source": share_source,
    }


def _allocated_milli(snapshot: model.Snapshot) -> int:
    return sum(device.allotted_milli_gpu for node in snapshot.nodes.values() for device in node.devices)

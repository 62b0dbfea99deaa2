"""The standard openb experiment of the FGD paper: one seed, one policy, allocation against arrived demand.

1. Start from the empty cluster of the node file; every device has 1000 milli-GPU.
2. Sort the trace's pods by name and shuffle them with the run's seed.
3. Inflate: append copies of pods drawn uniformly with replacement from the trace (sorted by name) until the next
   draw would take the total requested GPU past the target (130% of the cluster's GPU capacity); a trace that
   already asks for more is cut down instead by removing randomly chosen pods until it fits.
4. Place strictly one pod at a time in that order; a pod that fits nowhere fails and is dropped; pods never leave;
   no preemption, no retries. "Arrived" demand counts every pod attempted so far, failed ones included.
5. Record a point of the curve at every whole percent of arrived GPU demand (the first moment it is reached; the
   final state for a target the last draw stopped just short of): the GPU allocation ratio and the cluster's
   fragmentation, both in percent of the cluster's milli-GPU, the fragmentation measured against the typical pods of
   the trace before inflation whatever the policy.

Ties between equally scored choices go to the first node in the run's node order: the node file shuffled with the
seed, as the public simulator does by giving nodes random name prefixes (its published figures depend on that:
GpuPacking and GpuClustering leave CPU-only pods to the tie-break). Arrival order and node order depend on the seed
only, so every policy sees the same pods in the same order on the same nodes; the Random policy draws its node from
a source seeded from it as well.
"""

from __future__ import annotations

import dataclasses
import enum
import fractions
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from scheduler.placement import fragmentation
from scheduler.placement.fragmentation import NodeFree, WorkloadProfile
from scheduler.sim import enginereplay, policies, replay
from scheduler.sim.openb import POD_KINDS, TraceNode, TracePod

DEFAULT_INFLATE_PERCENT = 130
FIRST_POINT_PERCENT = 100
# The fast path places pods one by one; handing them over in small batches only saves calls into progress.
_FAST_BATCH = 64


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    arrived_percent: int
    allocated_percent: float
    fragmentation_percent: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SeedResult:
    """One seed of one policy: the curve from 0% to the target, and the failed pods by kind."""

    seed: int
    curve: tuple[CurvePoint, ...]
    failed_by_kind: Mapping[str, int]
    attempted: int
    placed: int
    moves: int = 0
    """Running pods moved by consolidation (a ``consolidate_budget`` run only; 0 under the experiment's rules)."""

    def allocated_at(self, arrived_percent: int) -> float:
        """Allocation at that arrived percent, or at the end of the run for a percent beyond its target."""
        index = min(arrived_percent, len(self.curve) - 1)
        return self.curve[index].allocated_percent


def capacity_milli_gpu(nodes: Sequence[TraceNode]) -> int:
    return sum(node.gpu_count for node in nodes) * fragmentation.MILLI_GPU_PER_DEVICE


def arrival_order(
    pods: Sequence[TracePod], *, seed: int, capacity_milli: int, target_percent: int = DEFAULT_INFLATE_PERCENT
) -> list[TracePod]:
    """The pods in the order the experiment submits them for ``seed``: shuffled, then inflated or cut down."""
    rng = random.Random(seed)
    by_name = sorted(pods, key=lambda pod: pod.name)
    order = list(by_name)
    rng.shuffle(order)
    target = capacity_milli * target_percent  # compared with demand x 100: integers only
    total = sum(pod.total_milli_gpu for pod in order)
    if total * 100 > target:
        while total * 100 > target:
            removed = order.pop(rng.randrange(len(order)))
            total -= removed.total_milli_gpu
        return order
    copies = 0
    while True:
        drawn = by_name[rng.randrange(len(by_name))]
        if (total + drawn.total_milli_gpu) * 100 > target:
            return order
        copies += 1
        order.append(dataclasses.replace(drawn, name=f"{drawn.name}-copy-{copies}"))
        total += drawn.total_milli_gpu


def typical_profile(pods: Sequence[TracePod]) -> WorkloadProfile:
    """The typical pods of a trace as FGD takes them (the most popular shapes covering 95% of the pods)."""
    return WorkloadProfile.from_shapes(replay.shape_of(pod) for pod in pods)


class Backend(enum.StrEnum):
    ENGINE = "engine"
    """``enginereplay.EngineCluster``: the real placement engine, one cycle per whole percent of arrived demand."""
    FAST = "fast"
    """``replay.ReplayCluster``: the rules written without the engine, one pod at a time (a cross-check)."""


class _Cluster(Protocol):
    @property
    def allocated_milli_gpu(self) -> int: ...

    def submit(self, pods: Sequence[TracePod]) -> list[bool]: ...

    def states(self) -> Iterable[tuple[NodeFree, int]]: ...


class _FastCluster:
    def __init__(self, nodes: Sequence[TraceNode], scorer: replay.Scorer, *, seed: int) -> None:
        self._cluster = replay.ReplayCluster(nodes, track_resident_kinds=scorer.needs_resident_kinds)
        self._scorer = scorer
        self._ties = random.Random(f"ties-{seed}") if scorer.breaks_ties_at_random else None

    @property
    def allocated_milli_gpu(self) -> int:
        return self._cluster.allocated_milli_gpu

    def submit(self, pods: Sequence[TracePod]) -> list[bool]:
        return [self._cluster.place(replay.shape_of(pod), self._scorer, self._ties) is not None for pod in pods]

    def states(self) -> Iterable[tuple[NodeFree, int]]:
        return self._cluster.states()


def node_order(nodes: Sequence[TraceNode], *, seed: int) -> list[TraceNode]:
    """The run's node order (ties between equally scored nodes go to the first): shuffled with the seed, as the
    public simulator does by giving nodes random name prefixes."""
    ordered = list(nodes)
    random.Random(f"nodes-{seed}").shuffle(ordered)
    return ordered


def run_seed(
    *,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: Callable[[policies.PolicyContext], replay.Scorer] | None,
    seed: int,
    target_percent: int = DEFAULT_INFLATE_PERCENT,
    backend: Backend = Backend.ENGINE,
    report_meter: fragmentation.FragmentationMeter | None = None,
    progress: Callable[[int, int], None] | None = None,
    consolidate_budget: fractions.Fraction | None = None,
) -> SeedResult:
    """Run the experiment for one seed and one policy (``policies.POLICIES[name]``; None: ``production``, the
    scheduler's own configuration, which knows nothing of the trace beforehand and runs on the engine only).

    ``report_meter`` measures the fragmentation of each curve point (FGD's measure over the trace's typical pods by
    default; pass one to share its memo between runs). ``progress(done, total)`` is called as pods are placed.
    ``consolidate_budget`` (production only) lets consolidation move running pods, at most that many moves per placed
    pod: beyond the experiment's rules, reported apart (``SeedResult.moves``).
    """
    capacity = capacity_milli_gpu(nodes)
    if capacity == 0:
        raise ValueError("the cluster has no GPU: the experiment measures GPU allocation")
    order = arrival_order(pods, seed=seed, capacity_milli=capacity, target_percent=target_percent)
    meter = report_meter or fragmentation.FragmentationMeter(typical_profile(pods))
    scorer = (
        None if policy is None else policy(policies.PolicyContext(shapes=tuple(replay.shape_of(pod) for pod in pods)))
    )
    ordered_nodes = node_order(nodes, seed=seed)
    cluster: _Cluster
    engine_cluster: enginereplay.EngineCluster | None = None
    if backend is Backend.ENGINE:
        cluster = engine_cluster = enginereplay.EngineCluster(
            ordered_nodes, scorer, seed=seed, consolidate_budget=consolidate_budget
        )
    elif scorer is None:
        raise ValueError("the production policy is the scheduler's own engine: run it with the engine backend")
    else:
        cluster = _FastCluster(ordered_nodes, scorer, seed=seed)

    curve: list[CurvePoint] = []
    failed = dict.fromkeys(POD_KINDS, 0)
    batch: list[TracePod] = []
    placed = 0
    done = 0

    def flush() -> None:
        nonlocal placed, done
        if not batch:
            return
        for pod, ok in zip(batch, cluster.submit(batch), strict=True):
            if ok:
                placed += 1
            else:
                failed[pod.kind] += 1
        done += len(batch)
        batch.clear()
        if progress is not None:
            progress(done, len(order))

    def record(percent: int) -> None:
        stranded = sum(meter.weighted(state) * count for state, count in cluster.states())
        curve.append(
            CurvePoint(
                arrived_percent=percent,
                allocated_percent=100.0 * cluster.allocated_milli_gpu / capacity,
                fragmentation_percent=100.0 * stranded / meter.total_weight / capacity,
            )
        )

    arrived = 0
    next_percent = 0
    for pod in order:
        if arrived * 100 >= next_percent * capacity and next_percent <= target_percent:
            flush()
            while next_percent <= target_percent and arrived * 100 >= next_percent * capacity:
                record(next_percent)
                next_percent += 1
        batch.append(pod)
        arrived += pod.total_milli_gpu
        if backend is Backend.FAST and len(batch) >= _FAST_BATCH:
            flush()
    flush()
    while next_percent <= target_percent:  # reached by the last pod, or just short of the target: the final state
        record(next_percent)
        next_percent += 1
    return SeedResult(
        seed=seed,
        curve=tuple(curve),
        failed_by_kind=failed,
        attempted=len(order),
        placed=placed,
        moves=engine_cluster.moves if engine_cluster is not None else 0,
    )

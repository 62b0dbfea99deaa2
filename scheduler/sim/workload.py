"""What-if studies: a cluster spec whose pods arrive and leave over simulated time, through the placement engine.

The spec (``common.clusterspec``) gives the nodes and, per pod, when it arrives (``arrive``), how long it runs once
started (``duration``; absent: until the end) and its queue (``queue``; absent: KAI's ``default-queue``); ``arrivals``
turns it into the engine's model, gangs included. Every queue is a leaf with KAI's defaults for an unconfigured
queue (no quota, no limit, over-quota weight 1), so fair share divides the cluster equally among the queues that
want it, capped by what each asks for.

Time advances from event to event (arrivals and completions); after each, an engine cycle runs over the snapshot
with every action (allocate, consolidate, reclaim, preempt) and its plan is applied. Evicted pods are gone at once
(no termination grace is simulated), so while a cycle evicts, another follows at the same instant to place what the
evictions made room for; an evicted pod waits again and starts over when placed anew. What the run measured is a
``workloadreport.WorkloadReport``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from common import clusterspec, quantities
from common.errors import ClusterSpecError
from scheduler.placement import applying, decisions, engine, model, plan
from scheduler.sim import arrivals, workloadreport

_OPEN_QUEUE = model.QueueResource(quota=0, limit=model.UNLIMITED, over_quota_weight=1)
# An engine cycle runs after every event; a spec whose pods keep evicting each other must still end.
_MAX_CYCLES = 200_000


class _Timeline:
    """Piecewise-constant series (GPU and CPU use, per-queue GPU allocation and fair share), integrated over time."""

    def __init__(self) -> None:
        self.points: list[tuple[int, int, int]] = []
        self.queue_allocated: dict[str, int] = {}
        self.queue_fair: dict[str, int] = {}
        self._last_ns = 0
        self._state: tuple[int, int, Mapping[str, int], Mapping[str, int]] = (0, 0, {}, {})

    def advance(self, now_ns: int) -> None:
        span = now_ns - self._last_ns
        if span > 0:
            _, _, allocated, fair = self._state
            for name, milli in allocated.items():
                self.queue_allocated[name] = self.queue_allocated.get(name, 0) + milli * span
            for name, milli in fair.items():
                self.queue_fair[name] = self.queue_fair.get(name, 0) + milli * span
        self._last_ns = now_ns

    def set(self, now_ns: int, gpu: int, cpu: int, allocated: Mapping[str, int], fair: Mapping[str, int]) -> None:
        self.advance(now_ns)
        self._state = (gpu, cpu, dict(allocated), dict(fair))
        self.points.append((now_ns, gpu, cpu))


def run(spec: clusterspec.ClusterSpec, *, step_ns: int, source: str = "<spec>") -> workloadreport.WorkloadReport:
    """Replay ``spec`` through the engine; see the module docstring for what the report holds."""
    if step_ns <= 0:
        raise ClusterSpecError("the sampling step must be positive")
    if not spec.pods:
        raise ClusterSpecError(f"{source}: no pods to replay")
    nodes = [arrivals.engine_node(node) for node in spec.nodes]
    capacity_gpu = sum(len(node.devices) for node in nodes) * model.MILLI_GPU_PER_DEVICE
    capacity_cpu = sum(node.allocatable.milli_cpu for node in nodes)
    gangs = arrivals.gangs(spec)
    queue_names = sorted({str(gang.group.queue) for gang in gangs})
    queues = [
        model.Queue(name=model.QueueName(name), gpu=_OPEN_QUEUE, cpu=_OPEN_QUEUE, memory=_OPEN_QUEUE)
        for name in queue_names
    ]
    pod_count = dict.fromkeys(queue_names, 0)
    for gang in gangs:
        pod_count[gang.group.queue] += len(gang.group.members)
    durations = {uid: duration for gang in gangs for uid, duration in gang.durations.items()}
    arrived_at = {pod.uid: gang.arrive_ns for gang in gangs for pod in gang.group.members}

    warm = engine.Engine()
    snapshot = model.snapshot(nodes=nodes, queues=queues, groups=[], now_ns=0)
    ends: dict[model.PodUid, int] = {}
    first_start: dict[model.PodUid, int] = {}
    timeline = _Timeline()
    next_arrival = 0
    cycles = 0
    evictions = 0
    now = 0
    while True:
        upcoming = [gangs[next_arrival].arrive_ns] if next_arrival < len(gangs) else []
        upcoming += list(ends.values())
        if not upcoming:
            break
        now = max(now, min(upcoming))
        finished = sorted(uid for uid, end in ends.items() if end <= now)
        for uid in finished:
            del ends[uid]
        if finished:
            snapshot = _complete(snapshot, finished, now)
        groups = dict(snapshot.groups)
        while next_arrival < len(gangs) and gangs[next_arrival].arrive_ns <= now:
            group = gangs[next_arrival].group
            groups[group.id] = group
            next_arrival += 1
        snapshot = dataclasses.replace(snapshot, groups=groups, now_ns=now)
        while True:  # evicted pods are gone at once here, so the pods they made room for go in the next cycle
            result = warm.run(snapshot)
            cycles += 1
            if cycles > _MAX_CYCLES:
                raise ClusterSpecError(
                    f"{source}: more than {_MAX_CYCLES} cycles; do its pods keep evicting each other?"
                )
            snapshot = applying.apply(snapshot, result)
            evictions += len(result.evictions)
            for eviction in result.evictions:
                ends.pop(eviction.pod, None)
            for placement in result.placements:
                first_start.setdefault(placement.pod, now)
                duration = durations.get(placement.pod)
                if duration is not None:
                    ends[placement.pod] = now + duration
            if not result.evictions:
                break
        allocated, fair = _queue_gpu(snapshot, result)
        timeline.set(now, *_use(snapshot), allocated, fair)
    end = now
    timeline.advance(end)
    samples = _samples(timeline.points, end, step_ns, capacity_gpu, capacity_cpu)
    span = max(1, end)
    reports = tuple(
        workloadreport.QueueReport(
            name=name,
            pods=pod_count[name],
            started=sum(1 for uid in first_start if _queue_of(gangs, uid) == name),
            waits_s=tuple(
                (first_start[uid] - arrived_at[uid]) / quantities.NS_PER_S
                for uid in sorted(first_start)
                if _queue_of(gangs, uid) == name
            ),
            allocated_gpus=timeline.queue_allocated.get(name, 0) / span / model.MILLI_GPU_PER_DEVICE,
            fair_gpus=timeline.queue_fair.get(name, 0) / span / model.MILLI_GPU_PER_DEVICE,
        )
        for name in queue_names
    )
    return workloadreport.WorkloadReport(
        source=source,
        duration_s=end / quantities.NS_PER_S,
        samples=samples,
        queues=reports,
        cycles=cycles,
        evictions=evictions,
    )


def _queue_of(gangs: Sequence[arrivals.Gang], uid: model.PodUid) -> str:
    for gang in gangs:
        if uid in gang.durations:
            return str(gang.group.queue)
    raise KeyError(uid)


def _complete(snapshot: model.Snapshot, finished: Sequence[model.PodUid], now: int) -> model.Snapshot:
    """``snapshot`` once ``finished`` pods have completed: their resources go back, they count as done."""
    by_pod = {
        pod.uid: (group, pod) for group in snapshot.groups.values() for pod in group.members if pod.uid in finished
    }
    # The engine's own bookkeeping gives the resources back (an eviction releases exactly what a pod holds).
    released = applying.apply(
        snapshot,
        plan.Plan(
            placements=(),
            evictions=tuple(
                decisions.Eviction(
                    pod=uid,
                    group=group.id,
                    node=pod.node or model.NodeName(""),
                    reason=decisions.EvictionReason.STALE_GANG,
                    beneficiary=None,
                    message="completed",
                )
                for uid, (group, pod) in sorted(by_pod.items())
            ),
            statuses={},
        ),
        now_ns=now,
    )
    groups: dict[model.GroupId, model.Group] = {}
    for group_id, group in released.groups.items():
        members = tuple(
            dataclasses.replace(pod, phase=model.PodPhase.SUCCEEDED) if pod.uid in by_pod else pod
            for pod in group.members
        )
        if all(pod.phase is model.PodPhase.SUCCEEDED for pod in members):
            continue  # a finished group leaves the snapshot
        groups[group_id] = dataclasses.replace(group, members=members, below_min_since_ns=None)
    return dataclasses.replace(released, groups=groups)


def _use(snapshot: model.Snapshot) -> tuple[int, int]:
    gpu = sum(device.allotted_milli_gpu for node in snapshot.nodes.values() for device in node.devices)
    cpu = sum(node.used.milli_cpu for node in snapshot.nodes.values())
    return gpu, cpu


def _queue_gpu(snapshot: model.Snapshot, result: plan.Plan) -> tuple[dict[str, int], dict[str, int]]:
    allocated: dict[str, int] = {}
    for group in snapshot.groups.values():
        for pod in group.members:
            if pod.phase is model.PodPhase.RUNNING:
                allocated[group.queue] = allocated.get(group.queue, 0) + plan.held_milli_gpu(pod)
    fair = {str(name): share.fair.milli_gpu for name, share in result.queues.items()}
    return allocated, fair


def _samples(
    points: Sequence[tuple[int, int, int]], end_ns: int, step_ns: int, capacity_gpu: int, capacity_cpu: int
) -> tuple[workloadreport.Sample, ...]:
    samples: list[workloadreport.Sample] = []
    index = 0
    gpu = cpu = 0
    at = 0
    while at <= end_ns:
        while index < len(points) and points[index][0] <= at:
            _, gpu, cpu = points[index]
            index += 1
        samples.append(
            workloadreport.Sample(
                at_s=at / quantities.NS_PER_S,
                gpu_percent=100.0 * gpu / capacity_gpu if capacity_gpu else 0.0,
                cpu_percent=100.0 * cpu / capacity_cpu if capacity_cpu else 0.0,
            )
        )
        at += step_ns
    return tuple(samples)


def run_file(path: str, *, step: str) -> workloadreport.WorkloadReport:
    """Load a cluster spec file and replay it; ``step`` is a duration such as ``10s``."""
    try:
        step_ns = quantities.parse_duration_ns(step)
    except ValueError as exc:
        raise ClusterSpecError(f"--step {step!r}: {exc}") from exc
    return run(clusterspec.load(path), step_ns=step_ns, source=path)

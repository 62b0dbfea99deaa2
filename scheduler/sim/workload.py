"""What-if studies: a cluster spec whose pods arrive and leave over simulated time, through the placement engine.

The spec (``common.clusterspec``) gives the nodes and, per pod, when it arrives (``arrive``), how long it runs once
started (``duration``; absent: until the end) and its queue (``queue``; absent: KAI's ``default-queue``). Shares
come from KAI's ``gpu-fraction`` / ``gpu-memory`` annotations, read by the scheduler's own parser; pods that carry
the same ``pod-group-name`` annotation form one gang that needs all of them at once (it arrives with its last
member). A pod pinned with ``node:`` is held to that node by its hostname label. Every pod of the spec is
scheduled here, whatever its ``scheduler_name``. Every queue is a leaf with KAI's
defaults for an unconfigured queue (no quota, no limit, over-quota weight 1), so fair share divides the cluster
equally among the queues that want it, capped by what each asks for.

Time advances from event to event (arrivals and completions); after each, an engine cycle runs over the snapshot
with every action (allocate, consolidate, reclaim, preempt) and its plan is applied. Evicted pods are gone at once
(no termination grace is simulated), so while a cycle evicts, another follows at the same instant to place what the
evictions made room for; an evicted pod waits again and starts over when placed anew. The report gives:

- utilisation over time: allocated GPU and CPU in percent of capacity, sampled every ``step``;
- per queue: how long pods waited from arrival to their first start (mean, median, 95th percentile, max; pods that
  never started are counted apart), the queue's time-averaged GPU allocation and fair share, and their ratio;
- Jain's fairness index of those ratios over the queues with a fair share: 1 when every queue got the same
  proportion of what it deserved, 1/n when one queue got everything.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import IO, TypedDict

from common import clusterspec, quantities
from common.errors import ClusterSpecError
from common.resources import Resources
from scheduler.kube import gpurequest
from scheduler.placement import applying, decisions, engine, model, plan

DEFAULT_QUEUE = "default-queue"
POD_GROUP_ANNOTATION = "pod-group-name"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_OPEN_QUEUE = model.QueueResource(quota=0, limit=model.UNLIMITED, over_quota_weight=1)
# An engine cycle runs after every event; a spec whose pods keep evicting each other must still end.
_MAX_CYCLES = 200_000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    at_s: float
    gpu_percent: float
    cpu_percent: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueReport:
    name: str
    pods: int
    started: int
    waits_s: tuple[float, ...]
    """Arrival to first start, for every pod that started, in seconds."""
    allocated_gpus: float
    """Time-averaged GPUs held by the queue's pods."""
    fair_gpus: float
    """Time-averaged fair share of GPUs the engine computed for the queue."""

    @property
    def never_started(self) -> int:
        return self.pods - self.started

    @property
    def ratio(self) -> float | None:
        """Allocation over fair share; None without a fair share."""
        return self.allocated_gpus / self.fair_gpus if self.fair_gpus > 0 else None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadReport:
    source: str
    duration_s: float
    samples: tuple[Sample, ...]
    queues: tuple[QueueReport, ...]
    cycles: int
    evictions: int

    @property
    def jain_index(self) -> float | None:
        """Jain's index of the queues' allocation-to-fair-share ratios, or None with no queue to compare."""
        return jain([queue.ratio for queue in self.queues if queue.ratio is not None])


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1 for equal values, 1/n when one value holds everything."""
    if not values:
        return None
    squares = sum(value * value for value in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


# --- from the spec to the engine's model ------------------------------------------------------------------------


def engine_node(spec: clusterspec.NodeSpec) -> model.Node:
    return model.Node(
        name=model.NodeName(spec.name),
        allocatable=spec.capacity,
        labels=dict(spec.labels),
        taints=tuple(
            model.Taint(key=taint.key, value=taint.value, effect=model.TaintEffect(taint.effect.value))
            for taint in spec.taints
        ),
        devices=tuple(
            model.Device(
                index=gpu.index,
                uuid=model.GpuUuid(gpu.uuid),
                model=clusterspec.product_label(gpu.product),
                memory_bytes=gpu.memory_bytes,
            )
            for gpu in spec.gpus
        ),
    )


def engine_pod(spec: clusterspec.PodSpec) -> model.Pod:
    """The pod as the engine sees it; its GPU annotations are read with the scheduler's own parser."""
    share = _share(spec)
    selector = dict(spec.node_selector)
    if spec.node is not None:
        selector[HOSTNAME_LABEL] = spec.node
    return model.Pod(
        uid=model.PodUid(f"{spec.namespace}/{spec.name}"),
        name=spec.name,
        namespace=spec.namespace,
        requests=Resources(
            milli_cpu=spec.milli_cpu,
            memory_bytes=spec.memory_bytes,
            milli_gpu=0 if share is not None else spec.gpus * model.MILLI_GPU_PER_DEVICE,
            pods=1,
        ),
        share=share,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(
            model.Toleration(
                key=toleration.key,
                operator=model.TolerationOperator(toleration.operator.value),
                value=toleration.value,
                effect=None if toleration.effect is None else model.TaintEffect(toleration.effect.value),
            )
            for toleration in spec.tolerations
        ),
        created_ns=spec.arrive_ns,
    )


def _share(spec: clusterspec.PodSpec) -> model.GpuShare | None:
    annotations = spec.annotations
    fraction = annotations.get(gpurequest.GPU_FRACTION)
    memory = annotations.get(gpurequest.GPU_MEMORY)
    if fraction is None and memory is None:
        return None
    where = f"pod {spec.namespace}/{spec.name}"
    if fraction is not None and memory is not None:
        raise ClusterSpecError(f"{where}: gpu-fraction and gpu-memory together; give one of them")
    if spec.gpus:
        raise ClusterSpecError(f"{where}: a GPU share together with nvidia.com/gpu; give one of them")
    devices = 1
    if gpurequest.NUM_DEVICES in annotations:
        text = annotations[gpurequest.NUM_DEVICES]
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise ClusterSpecError(f"{where}: {gpurequest.NUM_DEVICES} {text!r} is not a whole number >= 1")
        devices = int(text)
    parsed = gpurequest.parse_fraction(fraction) if fraction is not None else gpurequest.parse_gpu_memory(memory or "")
    if isinstance(parsed, gpurequest.AnnotationProblem):
        raise ClusterSpecError(f"{where}: {parsed.message}")
    if fraction is not None:
        return model.GpuShare(milli_gpu=parsed, devices=devices)
    return model.GpuShare(memory_bytes=parsed, devices=devices)


@dataclasses.dataclass(slots=True, kw_only=True)
class _Gang:
    group: model.Group
    arrive_ns: int
    durations: Mapping[model.PodUid, int | None]


def gangs(spec: clusterspec.ClusterSpec) -> list[_Gang]:
    """The spec's pods as groups: one per ``pod-group-name`` (all members needed at once), else one per pod."""
    members: dict[str, list[clusterspec.PodSpec]] = {}
    for pod in spec.pods:
        key = pod.annotations.get(POD_GROUP_ANNOTATION)
        members.setdefault(f"{pod.namespace}/{key}" if key else f"{pod.namespace}/{pod.name}", []).append(pod)
    found: list[_Gang] = []
    for key, pods in members.items():
        queues = {pod.queue or DEFAULT_QUEUE for pod in pods}
        if len(queues) > 1:
            raise ClusterSpecError(f"pod group {key}: its pods name different queues ({', '.join(sorted(queues))})")
        arrive = max(pod.arrive_ns for pod in pods)
        engine_pods = tuple(sorted((engine_pod(pod) for pod in pods), key=lambda pod: pod.uid))
        group = model.Group(
            id=model.GroupId(key),
            queue=model.QueueName(queues.pop()),
            min_member=len(pods),
            created_ns=arrive,
            members=engine_pods,
        )
        durations = {model.PodUid(f"{pod.namespace}/{pod.name}"): pod.duration_ns for pod in pods}
        found.append(_Gang(group=group, arrive_ns=arrive, durations=durations))
    found.sort(key=lambda gang: (gang.arrive_ns, gang.group.id))
    return found


# --- the run ----------------------------------------------------------------------------------------------------


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


def run(spec: clusterspec.ClusterSpec, *, step_ns: int, source: str = "<spec>") -> WorkloadReport:
    """Replay ``spec`` through the engine; see the module docstring for what the report holds."""
    if step_ns <= 0:
        raise ClusterSpecError("the sampling step must be positive")
    if not spec.pods:
        raise ClusterSpecError(f"{source}: no pods to replay")
    nodes = [engine_node(node) for node in spec.nodes]
    capacity_gpu = sum(len(node.devices) for node in nodes) * model.MILLI_GPU_PER_DEVICE
    capacity_cpu = sum(node.allocatable.milli_cpu for node in nodes)
    arrivals = gangs(spec)
    queue_names = sorted({str(gang.group.queue) for gang in arrivals})
    queues = [
        model.Queue(name=model.QueueName(name), gpu=_OPEN_QUEUE, cpu=_OPEN_QUEUE, memory=_OPEN_QUEUE)
        for name in queue_names
    ]
    pod_count = dict.fromkeys(queue_names, 0)
    for gang in arrivals:
        pod_count[gang.group.queue] += len(gang.group.members)
    durations = {uid: duration for gang in arrivals for uid, duration in gang.durations.items()}
    arrived_at = {pod.uid: gang.arrive_ns for gang in arrivals for pod in gang.group.members}

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
        upcoming = [arrivals[next_arrival].arrive_ns] if next_arrival < len(arrivals) else []
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
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrive_ns <= now:
            group = arrivals[next_arrival].group
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
        QueueReport(
            name=name,
            pods=pod_count[name],
            started=sum(1 for uid in first_start if _queue_of(arrivals, uid) == name),
            waits_s=tuple(
                (first_start[uid] - arrived_at[uid]) / quantities.NS_PER_S
                for uid in sorted(first_start)
                if _queue_of(arrivals, uid) == name
            ),
            allocated_gpus=timeline.queue_allocated.get(name, 0) / span / model.MILLI_GPU_PER_DEVICE,
            fair_gpus=timeline.queue_fair.get(name, 0) / span / model.MILLI_GPU_PER_DEVICE,
        )
        for name in queue_names
    )
    return WorkloadReport(
        source=source,
        duration_s=end / quantities.NS_PER_S,
        samples=samples,
        queues=reports,
        cycles=cycles,
        evictions=evictions,
    )


def _queue_of(arrivals: Sequence[_Gang], uid: model.PodUid) -> str:
    for gang in arrivals:
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
                held = pod.allotted_milli_gpu * len(pod.devices) if pod.share is not None else pod.requests.milli_gpu
                allocated[group.queue] = allocated.get(group.queue, 0) + held
    fair = {str(name): share.fair.milli_gpu for name, share in result.queues.items()}
    return allocated, fair


def _samples(
    points: Sequence[tuple[int, int, int]], end_ns: int, step_ns: int, capacity_gpu: int, capacity_cpu: int
) -> tuple[Sample, ...]:
    samples: list[Sample] = []
    index = 0
    gpu = cpu = 0
    at = 0
    while at <= end_ns:
        while index < len(points) and points[index][0] <= at:
            _, gpu, cpu = points[index]
            index += 1
        samples.append(
            Sample(
                at_s=at / quantities.NS_PER_S,
                gpu_percent=100.0 * gpu / capacity_gpu if capacity_gpu else 0.0,
                cpu_percent=100.0 * cpu / capacity_cpu if capacity_cpu else 0.0,
            )
        )
        at += step_ns
    return tuple(samples)


def run_file(path: str, *, step: str) -> WorkloadReport:
    """Load a cluster spec file and replay it; ``step`` is a duration such as ``10s``."""
    try:
        step_ns = quantities.parse_duration_ns(step)
    except ValueError as exc:
        raise ClusterSpecError(f"--step {step!r}: {exc}") from exc
    return run(clusterspec.load(path), step_ns=step_ns, source=path)


# --- output -----------------------------------------------------------------------------------------------------


class _QueueJson(TypedDict):
    pods: int
    started: int
    never_started: int
    wait_mean_s: float | None
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_max_s: float | None
    allocated_gpus: float
    fair_share_gpus: float
    allocation_over_fair_share: float | None


class ReportJson(TypedDict):
    source: str
    duration_s: float
    cycles: int
    evictions: int
    jain_index: float | None
    utilisation: list[list[float]]
    queues: dict[str, _QueueJson]


def report_json(report: WorkloadReport) -> ReportJson:
    queues: dict[str, _QueueJson] = {}
    for queue in report.queues:
        waits = queue.waits_s
        queues[queue.name] = {
            "pods": queue.pods,
            "started": queue.started,
            "never_started": queue.never_started,
            "wait_mean_s": statistics.fmean(waits) if waits else None,
            "wait_p50_s": percentile(waits, 0.5) if waits else None,
            "wait_p95_s": percentile(waits, 0.95) if waits else None,
            "wait_max_s": max(waits) if waits else None,
            "allocated_gpus": round(queue.allocated_gpus, 4),
            "fair_share_gpus": round(queue.fair_gpus, 4),
            "allocation_over_fair_share": None if queue.ratio is None else round(queue.ratio, 4),
        }
    return {
        "source": report.source,
        "duration_s": report.duration_s,
        "cycles": report.cycles,
        "evictions": report.evictions,
        "jain_index": report.jain_index,
        "utilisation": [
            [sample.at_s, round(sample.gpu_percent, 3), round(sample.cpu_percent, 3)] for sample in report.samples
        ],
        "queues": queues,
    }


def print_report(report: WorkloadReport, *, out: IO[str]) -> None:
    out.write(
        f"{report.source}: {report.duration_s:.0f}s simulated, {report.cycles} cycles, {report.evictions} evictions\n\n"
    )
    out.write(f"{'time':>8} {'GPU %':>7} {'CPU %':>7}\n")
    for sample in report.samples:
        out.write(f"{sample.at_s:>7.0f}s {sample.gpu_percent:>7.1f} {sample.cpu_percent:>7.1f}\n")
    out.write(
        f"\n{'queue':<20} {'pods':>5} {'never':>6} {'wait mean':>10} {'p50':>8} {'p95':>8} {'max':>8}"
        f" {'GPUs':>7} {'fair':>7} {'ratio':>6}\n"
    )
    for queue in report.queues:
        waits = queue.waits_s

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f}s"

        out.write(
            f"{queue.name:<20} {queue.pods:>5} {queue.never_started:>6}"
            f" {seconds(statistics.fmean(waits) if waits else None):>10}"
            f" {seconds(percentile(waits, 0.5) if waits else None):>8}"
            f" {seconds(percentile(waits, 0.95) if waits else None):>8}"
            f" {seconds(max(waits) if waits else None):>8}"
            f" {queue.allocated_gpus:>7.2f} {queue.fair_gpus:>7.2f}"
            f" {'-' if queue.ratio is None else f'{queue.ratio:.2f}':>6}\n"
        )
    index = report.jain_index
    out.write(f"\nJain's index of allocation over fair share: {'-' if index is None else f'{index:.3f}'}\n")

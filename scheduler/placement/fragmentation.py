"""GPU fragmentation as the workload sees it, and the placement scores built on it.

A free GPU share is only worth something if a pod that will actually arrive can use it. Following FGD (Weng et al.,
"Beware of Fragmentation", USENIX ATC 2023), the *typical pods* of a workload are its most popular shapes; a node's
fragmentation, seen from one shape, is the free milli-GPU on it that a pod of that shape could not use (the node
lacks CPU or memory for it, has the wrong GPU model, or its devices' remainders are smaller than the pod's share);
the node's fragmentation is the popularity-weighted sum over the typical shapes. FGD places each pod where that sum
grows the least.

Everything here is plain integers over plain values (free CPU, memory and per-device milli-GPU of one node, and a
pod's request), so the placement engine, the trace simulator and tests share it. Weights are integer counts, so a
node's measure is an exact integer (``weighted``) and the division by the total weight happens only when a person
reads it. Node states repeat a great deal during a replay (most nodes are empty, full, or in one of a few common
states), so the measure is memoised per (GPU model, free CPU, free memory, free devices).

``FgdScorer`` is FGD as its published plugin scores; ``QuotientScorer`` is our own placement score, FGD plus a
look-ahead on CPU and memory (``Appetite``), which its docstring explains. Both rate one (node, devices) choice for
one pod, the form of the engine's scoring seam (``scoring.GpuPlacementScorer``) and of the trace simulator's.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from common import quantities

MILLI_GPU_PER_DEVICE = quantities.MILLI_GPU_PER_GPU

# FGD's published configuration: the most popular shapes covering 95% of the pods are typical
# (hkust-adsl/kubernetes-scheduler-simulator, scripts/generate_config_and_run.py, --pod-popularity-threshold 95).
TYPICAL_COVERAGE_PERCENT = 95

# The kube-scheduler framework's node score range, which FGD's plugin maps its fragmentation change into.
_MAX_NODE_SCORE = 100

# The memo is bounded so a long-running scheduler cannot grow it without limit; a replay of the Alibaba trace
# visits well under this many distinct node states.
_MEMO_LIMIT = 400_000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodShape:
    """What one pod asks for: CPU, memory, and ``gpu_count`` devices with ``milli_gpu`` on each.

    ``milli_gpu`` is 1000 for whole devices and below 1000 for a share of one device. ``gpu_models`` lists the GPU
    models the pod accepts; empty means any.
    """

    milli_cpu: int
    memory_bytes: int
    gpu_count: int = 0
    milli_gpu: int = 0
    gpu_models: frozenset[str] = frozenset()

    @property
    def total_milli_gpu(self) -> int:
        return self.gpu_count * self.milli_gpu


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeFree:
    """What is left on one node: its GPU model, free CPU and memory, and free milli-GPU per device (by index)."""

    gpu_model: str
    milli_cpu: int
    memory_bytes: int
    devices: tuple[int, ...]
    resident_kinds: frozenset[str] = frozenset()
    """The GPU request classes of the pods already on the node (``share``, ``1-gpu``, ``2-gpu``...), for scorers
    that keep alike pods together; left empty where no scorer needs it."""

    @property
    def free_milli_gpu(self) -> int:
        return sum(self.devices)

    def whole_devices(self) -> int:
        return sum(1 for free in self.devices if free == MILLI_GPU_PER_DEVICE)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TypicalPod:
    shape: PodShape
    weight: int


class Weighting(enum.StrEnum):
    """How a shape's popularity is counted when the typical pods are chosen."""

    PODS = "pods"  # one per pod, as FGD does
    GPU_DEMAND = "gpu-demand"  # the milli-GPU each pod asks for (CPU-only pods count nothing)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadProfile:
    """The typical pods of a workload with integer weights; ``total_weight`` is their sum."""

    typical: tuple[TypicalPod, ...]

    @property
    def total_weight(self) -> int:
        return sum(t.weight for t in self.typical)

    @staticmethod
    def from_shapes(
        shapes: Iterable[PodShape],
        *,
        coverage_percent: int = TYPICAL_COVERAGE_PERCENT,
        weighting: Weighting = Weighting.PODS,
    ) -> WorkloadProfile:
        """The most popular shapes that together reach ``coverage_percent`` of the total popularity.

        Ties in popularity are broken by the shape's own order (CPU, share, device count, models), so the profile
        does not depend on the order of the input.
        """
        counts: Counter[PodShape] = Counter()
        for shape in shapes:
            if weighting is Weighting.PODS:
                counts[shape] += 1
            elif shape.total_milli_gpu:
                counts[shape] += shape.total_milli_gpu
        return WorkloadProfile.from_counts(counts, coverage_percent=coverage_percent)

    @staticmethod
    def from_counts(
        counts: Mapping[PodShape, int], *, coverage_percent: int = TYPICAL_COVERAGE_PERCENT
    ) -> WorkloadProfile:
        """The same choice from integer popularity weights per shape (a learned, decayed distribution)."""
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda item: (-item[1], _shape_order(item[0])))
        chosen: list[TypicalPod] = []
        covered = 0
        for shape, weight in ranked:
            if covered * 100 >= coverage_percent * total:
                break
            chosen.append(TypicalPod(shape=shape, weight=weight))
            covered += weight
        return WorkloadProfile(typical=tuple(chosen))


def _shape_order(shape: PodShape) -> tuple[int, int, int, tuple[str, ...]]:
    return (-shape.milli_cpu, -shape.milli_gpu, -shape.gpu_count, tuple(sorted(shape.gpu_models)))


class FragmentationMeter:
    """A node's fragmentation against a workload profile, memoised by node state.

    ``weighted(node)`` is the exact integer sum, over the typical pods, of the pod's weight times the free milli-GPU
    on the node that a pod of its shape could not use (*stranded*): all of it when the shape asks for no GPU, cannot
    have this GPU model, or does not fit the node's CPU (and memory, when ``memory_aware``) or devices; otherwise
    the remainders of the devices too small for its share. Divided by ``total_weight`` it is the node's stranded
    milli-GPU. FGD ignores memory (its shapes carry none); ``memory_aware`` also counts a shape's GPUs as stranded
    on a node without the memory for it.
    """

    def __init__(self, profile: WorkloadProfile, *, memory_aware: bool = False) -> None:
        self.profile = profile
        self.memory_aware = memory_aware
        self.total_weight = max(1, profile.total_weight)
        self._shapes = [
            (
                t.weight,
                t.shape.milli_cpu,
                t.shape.memory_bytes if memory_aware else 0,
                t.shape.gpu_count,
                t.shape.milli_gpu,
                t.shape.gpu_models,
            )
            for t in profile.typical
        ]
        self._memo: dict[tuple[str, int, int, tuple[int, ...]], int] = {}

    def weighted(self, node: NodeFree) -> int:
        return self.weighted_of(node.gpu_model, node.milli_cpu, node.memory_bytes, node.devices)

    def weighted_of(self, gpu_model: str, milli_cpu: int, memory_bytes: int, devices: tuple[int, ...]) -> int:
        """``weighted`` of a node given by its values (no ``NodeFree`` made: a scorer asks this twice per choice)."""
        key = (gpu_model, milli_cpu, memory_bytes if self.memory_aware else 0, devices)
        found = self._memo.get(key)
        if found is not None:
            return found
        value = self._compute(gpu_model, milli_cpu, key[2], devices)
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = value
        return value

    def _compute(self, model: str, cpu: int, memory: int, devices: tuple[int, ...]) -> int:
        # Over plain tuples: this runs once per new node state of a replay.
        total = sum(devices)
        if total == 0:
            return 0
        acc = 0
        # Per share size, the devices it fits and the free milli-GPU of the others (typical shapes share sizes).
        by_share: dict[int, tuple[int, int]] = {}
        for weight, shape_cpu, shape_memory, count, milli, models in self._shapes:
            if milli == 0 or shape_cpu > cpu or shape_memory > memory or (models and model not in models):
                acc += weight * total
                continue
            found = by_share.get(milli)
            if found is None:
                fitting = 0
                small = 0
                for free in devices:
                    if free >= milli:
                        fitting += 1
                    else:
                        small += free
                found = by_share[milli] = (fitting, small)
            acc += weight * (found[1] if found[0] >= count else total)
        return acc


def after(node: NodeFree, pod: PodShape, devices: Sequence[int]) -> NodeFree:
    """``node`` once ``pod`` holds ``devices`` (indices) on it."""
    free = list(node.devices)
    for index in devices:
        free[index] -= pod.milli_gpu
    return NodeFree(
        gpu_model=node.gpu_model,
        milli_cpu=node.milli_cpu - pod.milli_cpu,
        memory_bytes=node.memory_bytes - pod.memory_bytes,
        devices=tuple(free),
        resident_kinds=node.resident_kinds,
    )


def whole_device_choice(node: NodeFree, count: int) -> tuple[int, ...] | None:
    """The first ``count`` completely free devices by index, or None when there are fewer."""
    chosen = tuple(i for i, free in enumerate(node.devices) if free == MILLI_GPU_PER_DEVICE)[:count]
    return chosen if len(chosen) == count else None


def device_options(node: NodeFree, pod: PodShape) -> list[tuple[int, ...]]:
    """Every distinct way to put ``pod``'s GPUs on ``node``: for a share one device per distinct free amount, the
    tightest first (the lowest index among equals); the first free devices for whole GPUs; nothing to choose for a
    CPU-only pod. Empty when the GPUs do not fit."""
    if pod.gpu_count == 0:
        return [()]
    if pod.milli_gpu >= MILLI_GPU_PER_DEVICE:
        whole = whole_device_choice(node, pod.gpu_count)
        return [whole] if whole is not None else []
    first: dict[int, int] = {}
    for index, free in enumerate(node.devices):
        if free >= pod.milli_gpu and free not in first:
            first[free] = index
    return [(first[free],) for free in sorted(first)]


def _sigmoid(x: float) -> float:
    if x < -60.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score(growth: int, total_weight: int, *, scale_milli: int = MILLI_GPU_PER_DEVICE) -> int:
    """The integer node score FGD's plugin gives a fragmentation growth of ``growth / total_weight`` milli-GPU:
    ``int(100 * sigmoid(-growth / scale))``. Growths within a few tens of milli-GPU of each other score the same,
    and so do all large growths, so ties are common and go to the first node in node order."""
    return int(_MAX_NODE_SCORE * _sigmoid(-growth / total_weight / scale_milli))


class FgdScorer:
    """FGD: the placement (node and devices) whose fragmentation grows the least, scored as its plugin does."""

    def __init__(self, meter: FragmentationMeter) -> None:
        self.meter = meter

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        growth = self.meter.weighted(after(node, pod, devices)) - self.meter.weighted(node)
        return fgd_score(growth, self.meter.total_weight)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Appetite:
    """What the workload's GPU pods ask for besides GPUs, per whole GPU they ask for: CPU and memory.

    A node whose CPU or memory runs out before its GPUs strands them; at the workload's appetite, a node can feed
    ``min(free GPU, free CPU / CPU per GPU, free memory / memory per GPU)`` of its free GPU.
    """

    milli_cpu_per_gpu: int
    memory_bytes_per_gpu: int

    @staticmethod
    def of(shapes: Iterable[PodShape]) -> Appetite:
        """The GPU-demand-weighted appetite of the GPU pods among ``shapes`` (zero when none asks for a GPU)."""
        counts: Counter[PodShape] = Counter(shapes)
        return Appetite.of_counts(counts)

    @staticmethod
    def of_counts(counts: Mapping[PodShape, int]) -> Appetite:
        """The same from integer weights per shape (a pod of weight w counts w times)."""
        cpu = memory = gpu = 0
        for shape, weight in counts.items():
            if shape.total_milli_gpu:
                cpu += shape.milli_cpu * weight
                memory += shape.memory_bytes * weight
                gpu += shape.total_milli_gpu * weight
        if gpu == 0:
            return Appetite(milli_cpu_per_gpu=0, memory_bytes_per_gpu=0)
        return Appetite(
            milli_cpu_per_gpu=cpu * MILLI_GPU_PER_DEVICE // gpu,
            memory_bytes_per_gpu=memory * MILLI_GPU_PER_DEVICE // gpu,
        )

    def starved_milli_gpu(self, node: NodeFree) -> int:
        """The free milli-GPU of ``node`` that its free CPU or memory cannot feed at this appetite."""
        return self.starved_of(sum(node.devices), node.milli_cpu, node.memory_bytes)

    def starved_of(self, free: int, milli_cpu: int, memory_bytes: int) -> int:
        """``starved_milli_gpu`` of a node with ``free`` milli-GPU and this free CPU and memory."""
        fed = free
        if self.milli_cpu_per_gpu:
            fed = min(fed, max(0, milli_cpu) * MILLI_GPU_PER_DEVICE // self.milli_cpu_per_gpu)
        if self.memory_bytes_per_gpu:
            fed = min(fed, max(0, memory_bytes) * MILLI_GPU_PER_DEVICE // self.memory_bytes_per_gpu)
        return free - fed


class QuotientScorer:
    """Our placement score: FGD's fragmentation growth plus the growth of the GPU a node will starve.

    FGD looks at the node as the next pod of each typical shape would find it: it sees a device remainder too small
    for a share, or a node with too little CPU left for one more pod. It does not see a node being drained of CPU or
    memory faster than of GPUs: on the trace's 8-GPU nodes (12 cores and 48 GiB per GPU, against 10.9 cores and
    40 GiB per GPU that GPU pods ask for on average), two CPU-hungry pods leave the node unable to feed its last
    GPUs long before any single typical pod is refused, and by then it is too late. So the growth of
    ``Appetite.starved_milli_gpu`` (the fluid look-ahead: fill the node with the average GPU pod until CPU, memory
    or GPUs run out) is added to FGD's growth, milli-GPU for milli-GPU, and the sum scored on FGD's integer scale,
    whose coarse steps make near-equal choices tie and go to the first node in node order (which concentrates work
    and keeps whole nodes free, as FGD's own published results depend on).
    """

    def __init__(self, meter: FragmentationMeter, appetite: Appetite) -> None:
        self.meter = meter
        self.appetite = appetite

    @staticmethod
    def for_workload(shapes: Iterable[PodShape]) -> QuotientScorer:
        known = tuple(shapes)
        return QuotientScorer(
            FragmentationMeter(WorkloadProfile.from_shapes(known), memory_aware=True), Appetite.of(known)
        )

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        return self.score_of(
            node.gpu_model,
            node.milli_cpu,
            node.memory_bytes,
            node.devices,
            pod_cpu=pod.milli_cpu,
            pod_memory=pod.memory_bytes,
            pod_milli_gpu=pod.milli_gpu,
            chosen=devices,
        )

    def score_of(
        self,
        gpu_model: str,
        milli_cpu: int,
        memory_bytes: int,
        devices: tuple[int, ...],
        *,
        pod_cpu: int,
        pod_memory: int,
        pod_milli_gpu: int,
        chosen: tuple[int, ...],
    ) -> int:
        """The score of a pod asking ``pod_milli_gpu`` on each of ``chosen`` (and this CPU and memory) on a node given
        by its values: ``__call__`` without a ``NodeFree`` or ``PodShape`` made (the engine's scorer asks this for
        every look a search meets; ``after`` says what the node looks like then)."""
        free = list(devices)
        for index in chosen:
            free[index] -= pod_milli_gpu
        moved = tuple(free)
        cpu_after, memory_after = milli_cpu - pod_cpu, memory_bytes - pod_memory
        meter, appetite = self.meter, self.appetite
        weight = meter.total_weight
        growth = meter.weighted_of(gpu_model, cpu_after, memory_after, moved) - meter.weighted_of(
            gpu_model, milli_cpu, memory_bytes, devices
        )
        growth += weight * (
            appetite.starved_of(sum(moved), cpu_after, memory_after)
            - appetite.starved_of(sum(devices), milli_cpu, memory_bytes)
        )
        return fgd_score(growth, weight)

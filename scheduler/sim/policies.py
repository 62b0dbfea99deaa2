"""The baseline placement policies of the FGD paper, as scorers, so one run compares them side by side.

Written from the paper's section 6 and the score plugins of its public simulator (hkust-adsl/kubernetes-scheduler-
simulator), which is what produced the published figures; where the short descriptions and the plugins differ, the
plugins win, since the goal is to replicate the experiment. Each scorer returns the kube-scheduler integer score the
plugin computes (0..100, higher is better); the cluster breaks ties uniformly at random as kube-scheduler does.
Inside the chosen node every policy but Random and FGD takes the device with the least share left that still fits
(the simulator's "best" GPU selection), and whole GPUs go on completely free devices.

- random: every feasible node scores the same; a random fitting device.
- dotprod: Tetris alignment; node and pod vectors are (CPU, total GPU) normalised by the largest node spec
  (128 cores, 8 GPUs); the score is 100 x (1 - dot / 2), so the node whose free vector has the *smallest* dot product
  with the request wins (that is what the plugin computes, in spite of Tetris' wording).
- clustering: keep alike GPU requests together: nodes already holding only the pod's class score 75..100, nodes
  holding it among others 50..75, nodes with no GPU pod 25..50, nodes holding only other classes 0..25, each band
  rising as the node's free GPU falls; CPU-only pods score 0 everywhere.
- packing: a share on an already shared device scores 50..100 (less left after it, higher), work on a used node's
  free devices 33..50, an idle node 25..33 (fewer devices, higher); CPU-only pods score 0 everywhere.
- bestfit: 100 x (1 - the node's free CPU and total GPU after the pod, each normalised by the largest spec and
  weighted 1/2).
- fgd: ``fragmentation.FgdScorer`` over the typical pods of the trace before inflation, as published.
- quotient: ours, ``fragmentation.QuotientScorer``.

``production`` (``PRODUCTION``) is not one of these scorers: it is the scheduler's own default configuration
(``--gpu-strategy fragmentation``: ``QuotientScorer`` over a workload learned online from the pods already seen,
``placement.learning``), run by ``enginereplay`` one pod per cycle.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping

from scheduler.placement import fragmentation
from scheduler.placement.fragmentation import MILLI_GPU_PER_DEVICE, NodeFree, PodShape, WorkloadProfile
from scheduler.sim import replay

# The largest node spec the plugins normalise by (open-gpu-share/utils/const.go: MaxSpecCpu, MaxSpecGpu).
MAX_SPEC_MILLI_CPU = 128_000
MAX_SPEC_MILLI_GPU = 8_000
MAX_NODE_SCORE = 100


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PolicyContext:
    """What a policy may know before the replay: the trace's pod shapes, before inflation."""

    shapes: tuple[PodShape, ...]


def best_fit_devices(node: NodeFree, pod: PodShape) -> tuple[int, ...] | None:
    """The simulator's "best" GPU selection: for a share the device with the least left that fits (the lowest index
    among equals), the first completely free devices for whole GPUs, nothing for a CPU-only pod; None if no fit."""
    if pod.gpu_count == 0:
        return ()
    if pod.milli_gpu >= MILLI_GPU_PER_DEVICE:
        return fragmentation.whole_device_choice(node, pod.gpu_count)
    best: int | None = None
    for index, free in enumerate(node.devices):
        if free >= pod.milli_gpu and (best is None or free < node.devices[best]):
            best = index
    return None if best is None else (best,)


class _NodeThenBestDevice(abc.ABC):
    """A plugin that scores nodes and then takes the best-fitting device inside the chosen node.

    The engine and the replay rate (node, devices) choices; to keep the plugin's meaning, every choice on a node
    carries the node's score (computed with the device the plugin would take) and the plugin's own device gets a
    half point more, so nodes compare by their score alone and, inside the chosen node, its device wins.
    """

    needs_resident_kinds = False
    breaks_ties_at_random = False

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        chosen = best_fit_devices(node, pod)
        if chosen is None:
            return 0
        return 2 * self.node_score(node, pod, chosen) + (1 if devices == chosen else 0)

    @abc.abstractmethod
    def node_score(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        """The policy's score of the node when the pod takes ``devices`` there (higher is better)."""


class RandomScorer:
    """Every choice scores the same; the cluster draws the node (and the device choice) at random."""

    needs_resident_kinds = False
    breaks_ties_at_random = True

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        return 0


class DotProductScorer(_NodeThenBestDevice):
    def node_score(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        dot = (node.milli_cpu / MAX_SPEC_MILLI_CPU) * (pod.milli_cpu / MAX_SPEC_MILLI_CPU) + (
            node.free_milli_gpu / MAX_SPEC_MILLI_GPU
        ) * (pod.total_milli_gpu / MAX_SPEC_MILLI_GPU)
        return int(MAX_NODE_SCORE * (1 - dot / 2))


class GpuClusteringScorer(_NodeThenBestDevice):
    needs_resident_kinds = True

    def node_score(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        kind = replay.request_kind(pod)
        if kind is None:
            return 0
        quarter = MAX_NODE_SCORE // 4
        fullness = quarter * (MAX_SPEC_MILLI_GPU - node.free_milli_gpu) // MAX_SPEC_MILLI_GPU
        kinds = node.resident_kinds
        if kind in kinds:  # (75, 100]: only this class on the node; (50, 75]: this class among others
            return fullness + (3 if len(kinds) == 1 else 2) * quarter
        return fullness + (1 if not kinds else 0) * quarter  # (25, 50]: no GPU pod yet; (0, 25]: other classes


class GpuPackingScorer(_NodeThenBestDevice):
    def node_score(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        if pod.gpu_count == 0:
            return 0
        whole_free = node.whole_devices()
        if whole_free == len(node.devices):
            return max(MAX_NODE_SCORE // 3 - whole_free, whole_free)
        fresh = sum(1 for index in devices if node.devices[index] == MILLI_GPU_PER_DEVICE)
        if fresh:
            return max(MAX_NODE_SCORE // 2 - fresh, MAX_NODE_SCORE // 3)
        left_percent = sum(node.devices[index] * 100 // MILLI_GPU_PER_DEVICE for index in devices)
        return max(MAX_NODE_SCORE - left_percent // 10, MAX_NODE_SCORE // 2)


class BestFitScorer(_NodeThenBestDevice):
    def node_score(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        left = (node.milli_cpu - pod.milli_cpu) / MAX_SPEC_MILLI_CPU * 0.5 + (
            node.free_milli_gpu - pod.total_milli_gpu
        ) / MAX_SPEC_MILLI_GPU * 0.5
        return int((1.0 - left) * MAX_NODE_SCORE)


class FgdPolicyScorer:
    """FGD over the typical pods of the trace, as its published plugin scores (see ``fragmentation.FgdScorer``)."""

    needs_resident_kinds = False
    breaks_ties_at_random = False

    def __init__(self, profile: WorkloadProfile) -> None:
        self._inner = fragmentation.FgdScorer(fragmentation.FragmentationMeter(profile))

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        return self._inner(node, pod, devices)


class QuotientPolicyScorer:
    """Ours: ``fragmentation.QuotientScorer`` over the trace's shapes."""

    needs_resident_kinds = False
    breaks_ties_at_random = False

    def __init__(self, shapes: tuple[PodShape, ...]) -> None:
        self._inner = fragmentation.QuotientScorer.for_workload(shapes)

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int:
        return self._inner(node, pod, devices)


POLICIES: Mapping[str, Callable[[PolicyContext], replay.Scorer]] = {
    "random": lambda context: RandomScorer(),
    "dotprod": lambda context: DotProductScorer(),
    "clustering": lambda context: GpuClusteringScorer(),
    "packing": lambda context: GpuPackingScorer(),
    "bestfit": lambda context: BestFitScorer(),
    "fgd": lambda context: FgdPolicyScorer(WorkloadProfile.from_shapes(context.shapes)),
    "quotient": lambda context: QuotientPolicyScorer(context.shapes),
}
"""Every policy by its command-line name."""

PRODUCTION = "production"
"""Not a scorer: the scheduler's own default configuration, which learns the workload from the pods it has seen
(``enginereplay.PRODUCTION``); it runs on the engine backend only."""

NAMES: tuple[str, ...] = (*POLICIES, PRODUCTION)
"""Every name ``quotient simulate openb --policy`` takes."""

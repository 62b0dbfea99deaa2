"""The fragmentation strategy's knowledge of the workload: a pod shape distribution learned online, and the scorer
it feeds.

``--gpu-strategy fragmentation`` (the scheduler's default) places with ``fragmentation.QuotientScorer``, the policy
that beats FGD on the Alibaba trace (``quotient simulate openb``): FGD's fragmentation growth over the workload's
typical pods, plus the GPU a node will starve because its CPU or memory runs out first. The simulator feeds that
scorer the whole trace; the scheduler cannot, so it learns the typical pods from the pods it sees:

- every pod the engine sees for the first time (a new group, or a new member of a known one), pending or running,
  is an *arrival* and adds one unit of weight to its shape; after a restart the first snapshot's running and pending
  pods are the arrivals, so the distribution is rebuilt from them;
- weights halve every ``HALF_LIFE_ARRIVALS`` arrivals (integers throughout), so the distribution follows what
  arrives now, not what arrived last month;
- the profile in use (typical shapes and appetite) is replaced only when the learned distribution has drifted from
  it by more than ``DRIFT_PERMILLE`` (total variation), so the searcher's per-look answers and the meter's memo
  survive from one cycle to the next instead of being thrown away at every arrival.

A GPU cluster is taken to run whole-GPU pods until it shows otherwise: the profile always holds one whole-GPU pod
of weight one arrival (``WHOLE_GPU_PRIOR``). On a young cluster that weight decides: without it, a workload seen so
far as a 0.5 and a 0.25 share alone would put them on two devices (FGD keeps the 0.75 left whole for the next 0.5),
where every KAI guide shows them sharing one and keeping the other devices whole; on a busy cluster (thousands of
arrivals) it weighs nothing and falls out of the profile's coverage.

With no history at all the strategy is ``binpack`` (``Learner.scorer`` is None and the engine uses the built-in
binpack scorer and its indexed search). With history the score is the fragmentation score first and the built-in
binpack score second: FGD's integer scale makes near-equal choices tie, and those ties then go where binpack would put
them (a share joins a shared GPU, whole GPUs stay whole, the fuller node first), not merely to the first node. The
scorer reads the node as ``scoring.NodeState`` shows it, whose free share per device already takes measured headroom
into account where telemetry is live.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.placement import fragmentation, model, scoring
from scheduler.placement.fragmentation import PodShape

HALF_LIFE_ARRIVALS = 4096
"""Weights halve after this many arrivals: a few thousand pods is about one openb trace, and a busy cluster's hour."""
DRIFT_PERMILLE = 20
"""The profile in use is rebuilt when the learned distribution is more than 2% (total variation) away from it."""
_UNIT = 1 << 12
"""One arrival's weight before any halving (halving integers needs room below the unit)."""
WHOLE_GPU_PRIOR = PodShape(milli_cpu=0, memory_bytes=0, gpu_count=1, milli_gpu=1000)
"""The pod the profile always holds with one arrival's weight (see the module docstring); not in the appetite."""
_BINPACK_BITS = 4 * 21
"""The built-in score packs four 21-bit parts (``scoring.lexicographic``): the fragmentation score goes above them."""


def shape_of(pod: model.Pod, reference_memory_bytes: int) -> PodShape:
    """A pod as the fragmentation measure sees it; a gpu-memory share counted on the largest device."""
    share = pod.share
    models = frozenset(pod.gpu_models)
    if share is not None:
        milli = min(model.share_milli_on(share, reference_memory_bytes), model.MILLI_GPU_PER_DEVICE)
        return PodShape(
            milli_cpu=pod.requests.milli_cpu,
            memory_bytes=pod.requests.memory_bytes,
            gpu_count=share.devices,
            milli_gpu=milli,
            gpu_models=models,
        )
    whole = pod.whole_gpus
    return PodShape(
        milli_cpu=pod.requests.milli_cpu,
        memory_bytes=pod.requests.memory_bytes,
        gpu_count=whole,
        milli_gpu=model.MILLI_GPU_PER_DEVICE if whole else 0,
        gpu_models=models if whole else frozenset(),
    )


class LearnedScorer:
    """The fragmentation score over a learned profile, then the built-in binpack score (``scoring`` seam).

    Pure: the same profile always gives the same score for the same arguments (the engine memoises it by value).
    """

    def __init__(self, profile: fragmentation.WorkloadProfile, appetite: fragmentation.Appetite) -> None:
        self.profile = profile
        self._inner = fragmentation.QuotientScorer(
            fragmentation.FragmentationMeter(profile, memory_aware=True), appetite
        )
        self._binpack = scoring.builtin(node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK)

    def __call__(self, state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        # The node and the pod as ``fragmentation`` sees them (``NodeFree``, ``PodShape``), passed as plain values.
        whole = model.MILLI_GPU_PER_DEVICE if request.whole_gpus else 0
        milli = request.share_milli if request.is_share else whole
        inner = self._inner.score_of(
            state.device_models[0] if state.device_models else "",
            state.free_milli_cpu,
            state.free_memory_bytes,
            state.device_free_milli,
            pod_cpu=request.milli_cpu,
            pod_memory=request.memory_bytes,
            pod_milli_gpu=milli,
            chosen=devices,
        )
        return (inner << _BINPACK_BITS) + self._binpack(state, request, devices)


class Learner:
    """The learned shape distribution (see the module docstring); the engine keeps one for its whole life."""

    def __init__(self, *, half_life_arrivals: int = HALF_LIFE_ARRIVALS) -> None:
        if half_life_arrivals < 1:
            raise ValueError("half_life_arrivals must be at least 1")
        self.half_life = half_life_arrivals
        self.weights: dict[PodShape, int] = {}
        self.arrivals = 0
        self._in_use: dict[PodShape, int] = {}
        self._scorer: LearnedScorer | None = None
        self._checked = -1

    def observe(self, pods: Iterable[model.Pod], *, reference_memory_bytes: int) -> None:
        """Count ``pods`` as arrivals, in the order given."""
        weights = self.weights
        for pod in pods:
            shape = shape_of(pod, reference_memory_bytes)
            weights[shape] = weights.get(shape, 0) + _UNIT
            self.arrivals += 1
            if self.arrivals % self.half_life == 0:
                self.weights = weights = {key: value >> 1 for key, value in weights.items() if value > 1}

    def scorer(self) -> LearnedScorer | None:
        """The scorer of the profile in use, rebuilt only when the distribution drifted (None: no history yet)."""
        if self._checked == self.arrivals:
            return self._scorer
        self._checked = self.arrivals
        if not self.weights:
            self._in_use, self._scorer = {}, None
            return None
        if self._scorer is None or _drift_permille(self._in_use, self.weights) > DRIFT_PERMILLE:
            self._in_use = dict(self.weights)
            with_prior = dict(self._in_use)
            with_prior[WHOLE_GPU_PRIOR] = with_prior.get(WHOLE_GPU_PRIOR, 0) + _UNIT
            self._scorer = LearnedScorer(
                fragmentation.WorkloadProfile.from_counts(with_prior),
                fragmentation.Appetite.of_counts(self._in_use),
            )
        return self._scorer


def _drift_permille(old: dict[PodShape, int], new: dict[PodShape, int]) -> int:
    """The total variation distance between two weightings, in thousandths (rounded down)."""
    old_total = sum(old.values())
    new_total = sum(new.values())
    if not old_total or not new_total:
        return 1000
    gap = sum(abs(old.get(shape, 0) * new_total - new.get(shape, 0) * old_total) for shape in old.keys() | new.keys())
    # TV = gap / (2 * old_total * new_total)
    return gap * 1000 // (2 * old_total * new_total)

"""A simulated cluster that places pods one at a time with a placement scorer: the simulator's cross-check.

A pod goes where the scorer rates the (node, devices) choice highest among the feasible ones, with the engine's
rules: CPU, memory and GPU model must fit, a share goes on one device with enough left, k whole GPUs on k completely
free devices; ties go to the first node in node order, then to the first device choice. ``enginereplay`` drives the
real placement engine with the same scorers and the same node order, and is what ``quotient simulate`` runs; this
module is a second implementation of the experiment's rules written without the engine, kept as ``--backend fast``
so the two can be checked against each other (they agree where nothing ties, see ``enginereplay``).

Speed comes from grouping: nodes in the same state (GPU model, free CPU, free memory, free share of each device in
descending order, since which index a device has does not matter here) are interchangeable, so each state is
checked and scored once per pod whatever the number of nodes in it; the first node of the best state in node order
gets the pod. A replay of 10,000 pods on 1,213 nodes visits a few hundred states per pod.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Iterable, Sequence
from typing import Protocol

from scheduler.placement import fragmentation
from scheduler.placement.fragmentation import MILLI_GPU_PER_DEVICE, NodeFree, PodShape
from scheduler.sim.openb import TraceNode, TracePod


class Scorer(Protocol):
    """Scores putting ``pod`` on ``devices`` (indices into ``node.devices``) of a node in state ``node``.

    Higher is better. Must be deterministic for equal arguments (implementations memoise freely). Attributes:
    ``needs_resident_kinds`` asks the cluster to keep ``NodeFree.resident_kinds`` up to date (it splits groups, so
    only scorers that read it ask); ``breaks_ties_at_random`` asks for ties to go to a node drawn uniformly at
    random instead of the first one (the Random baseline, whose scores are all equal).
    """

    needs_resident_kinds: bool
    breaks_ties_at_random: bool

    def __call__(self, node: NodeFree, pod: PodShape, devices: tuple[int, ...]) -> int: ...


def shape_of(pod: TracePod) -> PodShape:
    return PodShape(
        milli_cpu=pod.milli_cpu,
        memory_bytes=pod.memory_bytes,
        gpu_count=pod.gpu_count,
        milli_gpu=pod.milli_gpu,
        gpu_models=pod.gpu_models,
    )


def request_kind(pod: PodShape) -> str | None:
    """The GPU request class GpuClustering keeps together: ``share``, ``1-gpu``, ``2-gpu``...; None without GPUs."""
    if pod.gpu_count == 0:
        return None
    if pod.milli_gpu < MILLI_GPU_PER_DEVICE:
        return "share"
    return f"{pod.gpu_count}-gpu"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    node: str
    devices: tuple[int, ...]
    """Indices into the node's devices in descending order of free share at the time of placement."""


class ReplayCluster:
    """The nodes of a simulated cluster in node order, grouped by identical state, and what is allocated on them."""

    def __init__(self, nodes: Sequence[TraceNode], *, track_resident_kinds: bool = False) -> None:
        self.names = [node.name for node in nodes]
        self.track_resident_kinds = track_resident_kinds
        self.total_milli_gpu = sum(node.gpu_count for node in nodes) * MILLI_GPU_PER_DEVICE
        self.allocated_milli_gpu = 0
        self.groups: dict[NodeFree, list[int]] = {}
        """Each distinct state with the positions (in node order, ascending) of the nodes in it."""
        for position, node in enumerate(nodes):
            free = NodeFree(
                gpu_model=node.gpu_model,
                milli_cpu=node.milli_cpu,
                memory_bytes=node.memory_bytes,
                devices=(MILLI_GPU_PER_DEVICE,) * node.gpu_count,
            )
            self.groups.setdefault(free, []).append(position)

    def states(self) -> Iterable[tuple[NodeFree, int]]:
        """Each distinct node state with the number of nodes in it."""
        return ((state, len(members)) for state, members in self.groups.items())

    def place(self, pod: PodShape, scorer: Scorer, rng: random.Random | None = None) -> Placement | None:
        """Place ``pod`` on the best-scored feasible choice, or return None when nothing fits.

        Ties go to the first node in node order, or, with ``rng``, to a node drawn uniformly among the tied ones.
        """
        cpu = pod.milli_cpu
        memory = pod.memory_bytes
        count = pod.gpu_count
        milli = pod.milli_gpu
        models = pod.gpu_models
        whole = milli >= MILLI_GPU_PER_DEVICE
        best_score = 0
        best: list[tuple[NodeFree, tuple[int, ...]]] = []
        for state in self.groups:
            if state.milli_cpu < cpu or state.memory_bytes < memory:
                continue
            if count:
                devices = state.devices
                if len(devices) < count or (models and state.gpu_model not in models):
                    continue
                if whole:
                    if devices[count - 1] != MILLI_GPU_PER_DEVICE:
                        continue
                elif devices[0] < milli:
                    continue
            state_best: tuple[int, tuple[int, ...]] | None = None
            for option in fragmentation.device_options(state, pod):
                score = scorer(state, pod, option)
                if state_best is None or score > state_best[0]:
                    state_best = (score, option)
            if state_best is None:
                continue
            score, option = state_best
            if not best or score > best_score:
                best_score = score
                best = [(state, option)]
            elif score == best_score:
                best.append((state, option))
        if not best:
            return None
        if rng is None:
            state, option = min(best, key=lambda item: self.groups[item[0]][0])
            return self._apply(state, option, pod, self.groups[state][0])
        sizes = [len(self.groups[state]) for state, _ in best]
        pick = rng.randrange(sum(sizes))
        for (state, option), size in zip(best, sizes, strict=True):
            if pick < size:
                return self._apply(state, option, pod, self.groups[state][pick])
            pick -= size
        raise AssertionError("the tie draw fell outside the tied nodes")

    def _apply(self, state: NodeFree, devices: tuple[int, ...], pod: PodShape, position: int) -> Placement:
        members = self.groups[state]
        del members[bisect.bisect_left(members, position)]
        if not members:
            del self.groups[state]
        moved = fragmentation.after(state, pod, devices)
        kinds = state.resident_kinds
        if self.track_resident_kinds:
            kind = request_kind(pod)
            if kind is not None and kind not in kinds:
                kinds = kinds | {kind}
        new = NodeFree(
            gpu_model=moved.gpu_model,
            milli_cpu=moved.milli_cpu,
            memory_bytes=moved.memory_bytes,
            devices=tuple(sorted(moved.devices, reverse=True)),
            resident_kinds=kinds,
        )
        bisect.insort(self.groups.setdefault(new, []), position)
        self.allocated_milli_gpu += pod.total_milli_gpu
        return Placement(node=self.names[position], devices=devices)

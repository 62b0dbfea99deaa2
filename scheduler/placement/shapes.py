"""What a search is asked and what it answers: a pod's ``Shape`` and the ``Choice`` of node and devices for it.

A shape is everything placement reads from a pod (requests, share, constraints) and nothing else, so pods of equal
shape are placed alike and share every cache keyed by it (the searcher's per-look answers, the engine's messages).
A choice names the node's working state (``nodework.NodeWork``), its devices and, for a share, the milli-GPU taken
on each; ``plan.Draft.place`` carries it out.
"""

from __future__ import annotations

import dataclasses

from scheduler.placement import filters, model, nodework


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """Everything placement reads from a pod; pods of equal shape are placed alike (and share memo entries)."""

    milli_cpu: int
    memory_bytes: int
    pods: int
    whole_gpus: int
    share: model.GpuShare | None
    constraints: filters.Constraints

    @property
    def wants_gpu(self) -> bool:
        return self.whole_gpus > 0 or self.share is not None


def shape_of(pod: model.Pod) -> Shape:
    return Shape(
        milli_cpu=pod.requests.milli_cpu,
        memory_bytes=pod.requests.memory_bytes,
        pods=pod.requests.pods,
        whole_gpus=pod.whole_gpus,
        share=pod.share,
        constraints=filters.constraints(pod),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """Where a pod goes: a node and its devices, with the milli-GPU taken on each for a share."""

    work: nodework.NodeWork
    devices: tuple[int, ...]
    share_milli: tuple[int, ...] = ()

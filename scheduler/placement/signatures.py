"""Which room-making attempts are pointless after one that failed: KAI's scheduling signatures.

KAI (``--use-scheduling-signatures``, on by default) remembers, per action and per queue, the smallest job for which
the action failed, per set of scheduling constraints; a later job of that queue with the same constraints is skipped
for the rest of the action unless it is *easier* (``jobEasierToScheduleComparison``): fewer pending pods, or, pod by
pod in ascending order of requests, one that asks for no more in every resource and less in one. Consolidate,
reclaim and preempt do the same here, over the pods room is made for (a group's minimum, or an elastic step).
Preemption depends on the group's priority (its victims are strictly lower), so there the priority is part of the
key, and a later group of higher priority is tried.

The comparison is KAI's, including its quirk: a pod that asks for more in some resource does not make the job harder
by itself, the next pods are compared as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scheduler.placement import filters, model, shapes

Vector = tuple[int, int, int]
"""What one pending pod asks for: milli-GPU (a share counts its milli-GPU per device times its devices; a gpu-memory
share its bytes as milli-GPU of the largest device), millicores, bytes of memory."""


def _vector(shape: shapes.Shape, reference_memory_bytes: int) -> Vector:
    share = shape.share
    if share is None:
        gpu = shape.whole_gpus * model.MILLI_GPU_PER_DEVICE
    else:
        gpu = min(model.share_milli_on(share, reference_memory_bytes), model.MILLI_GPU_PER_DEVICE) * share.devices
    return (gpu, shape.milli_cpu, shape.memory_bytes)


def _le(left: Vector, right: Vector) -> bool:
    return left[0] <= right[0] and left[1] <= right[1] and left[2] <= right[2]


def _easier(job: Sequence[Vector], representative: Sequence[Vector]) -> bool:
    """KAI's ``jobEasierToScheduleComparison``: is ``job`` easier to schedule than ``representative``?"""
    if not job or not representative:
        return False
    if len(representative) > len(job):
        return True
    for index, mine in enumerate(job):
        if index >= len(representative):
            return False
        theirs = representative[index]
        if _le(mine, theirs):
            if _le(theirs, mine):
                continue
            return True
    return False


def _smaller(job: Sequence[Vector], representative: Sequence[Vector]) -> bool:
    """KAI's ``isPodGroupFootprintSmaller``: no more pods, each no bigger than its counterpart."""
    if not job or not representative or len(job) > len(representative):
        return False
    return all(_le(mine, theirs) for mine, theirs in zip(job, representative, strict=False))


@dataclasses.dataclass(frozen=True, slots=True)
class Signature:
    """What the signatures read of an attempt: its queue, its pods' scheduling constraints, its group's priority,
    and its pods' requests in ascending order. Found once per group and cycle (``of``): each action asks it."""

    queue: model.QueueName
    constraints: tuple[filters.Constraints, ...]
    priority: int
    vectors: tuple[Vector, ...]


def of(group: model.Group, pod_shapes: Sequence[shapes.Shape], reference_memory_bytes: int) -> Signature:
    """The signature of an attempt for ``pod_shapes`` (the pods room is made for) of ``group``."""
    # A one-pod group (most of them) sorts nothing.
    found = {shape.constraints for shape in pod_shapes}
    constraints = tuple(found) if len(found) == 1 else tuple(sorted(found, key=repr))
    if len(pod_shapes) == 1:
        vectors: tuple[Vector, ...] = (_vector(pod_shapes[0], reference_memory_bytes),)
    else:
        # KAI sorts by its partial order; ascending by (GPU, CPU, memory) orders every comparable pair alike.
        vectors = tuple(sorted(_vector(shape, reference_memory_bytes) for shape in pod_shapes))
    return Signature(queue=group.queue, constraints=constraints, priority=group.priority, vectors=vectors)


class FailedAttempts:
    """One action's smallest failed attempts per queue and signature (lives for one action of one cycle)."""

    def __init__(self, *, by_priority: bool) -> None:
        self._by_priority = by_priority
        self._representatives: dict[tuple[object, ...], tuple[tuple[Vector, ...], str | None]] = {}

    def _key(self, signature: Signature) -> tuple[object, ...]:
        return (signature.queue, signature.constraints, signature.priority if self._by_priority else None)

    def skip(self, signature: Signature) -> tuple[bool, str | None]:
        """Is an attempt with this signature pointless after an earlier failure? Also why the earlier one failed."""
        found = self._representatives.get(self._key(signature))
        if found is None or _easier(signature.vectors, found[0]):
            return False, None
        return True, found[1]

    def failed(self, signature: Signature, refusal: str | None) -> None:
        """Record a failed attempt; it represents its signature when it is smaller than the one before."""
        key = self._key(signature)
        found = self._representatives.get(key)
        if found is None or _smaller(signature.vectors, found[0]):
            self._representatives[key] = (signature.vectors, refusal)

"""The decisions a cycle hands to the binder: placements and evictions, each saying why.

These are the records of a ``plan.Plan``; they carry names and numbers only (no references into the snapshot), so
they can be logged, published on ``quotient.v1.decisions`` and replayed.
"""

from __future__ import annotations

import dataclasses
import enum

from scheduler.placement import model


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Bind ``pod`` to ``node``; for GPUs, on ``devices`` (indexes on the node).

    For a share, ``share_milli`` is the milli-GPU taken on each device and ``gpu_groups`` the GPU group of each
    device; ``opens_groups`` says where this placement creates the group (the binder creates its reservation pod).
    """

    pod: model.PodUid
    group: model.GroupId
    node: model.NodeName
    devices: tuple[int, ...] = ()
    share_milli: tuple[int, ...] = ()
    gpu_groups: tuple[model.GpuGroupId, ...] = ()
    opens_groups: tuple[bool, ...] = ()


class EvictionReason(enum.StrEnum):
    RECLAIM = "reclaim"
    PREEMPT = "preempt"
    CONSOLIDATE = "consolidate"
    STALE_GANG = "stale-gang"
    OVERUSE = "overuse"
    """Used more GPU memory than allotted past the evict grace, in a queue whose overuse policy is ``evict``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Eviction:
    """Evict ``pod`` (of ``group``, running on ``node``) for ``beneficiary`` (None for a stale gang).

    A consolidation names where the planner would place the moved pod again (``moved_to``): the move is only
    planned when every moved pod has such a place.
    """

    pod: model.PodUid
    group: model.GroupId
    node: model.NodeName
    reason: EvictionReason
    beneficiary: model.GroupId | None
    message: str
    moved_to: model.NodeName | None = None

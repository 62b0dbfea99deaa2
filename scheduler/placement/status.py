"""Why a group is still pending: a reason code a program can act on and a message a person can act on.

Every group left pending after a cycle gets one ``Status``. The reason codes are KAI's where KAI has one
(``OverLimit``, ``NonPreemptibleOverQuota``, ``QueueDoesNotExist``, ...) so tools written for KAI's PodGroup
conditions keep working; messages name the queue, the limit, the best candidate node and what was missing there,
in numbers.
"""

from __future__ import annotations

import dataclasses
import enum

from common import quantities
from scheduler.placement import fairshare


class Code(enum.StrEnum):
    """How the scheduler will treat the group next."""

    UNSCHEDULABLE = "Unschedulable"
    """Does not fit now; tried again when something changes."""
    WAITING = "Waiting"
    """Evictions were issued for it; it is placed once they complete."""
    UNSCHEDULABLE_AT_ALL = "UnschedulableAtAll"
    """Can never fit as things are (bigger than its queue's limit or the cluster); looked at again only when nodes,
    queues or limits change."""


class Reason(enum.StrEnum):
    OVER_LIMIT = "OverLimit"
    OVER_QUOTA = "OverQuota"
    NON_PREEMPTIBLE_OVER_QUOTA = "NonPreemptibleOverQuota"
    GANG_DOES_NOT_FIT = "GangDoesNotFit"
    NO_NODE_FITS = "NoNodeFits"
    NO_GPU_FITS = "NoGpuFits"
    WAITING_FOR_RECLAIM = "WaitingForReclaim"
    WAITING_FOR_PREEMPTION = "WaitingForPreemption"
    WAITING_FOR_CONSOLIDATION = "WaitingForConsolidation"
    QUEUE_DOES_NOT_EXIST = "QueueDoesNotExist"
    SCHEDULING_ERROR = "SchedulingError"
    """The cycle failed with this group: retried at once, and left out for a while after three failures in a row (the
    shell's containment, ``scheduler.containment``)."""
    NEVER_FITS = "NeverFits"
    NOT_ENOUGH_PODS = "NotEnoughPods"
    """Fewer members exist than the gang's minimum (the owner has not created them yet)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    code: Code
    reason: Reason
    message: str


def unschedulable(reason: Reason, message: str) -> Status:
    return Status(code=Code.UNSCHEDULABLE, reason=reason, message=message)


def waiting(reason: Reason, message: str) -> Status:
    return Status(code=Code.WAITING, reason=reason, message=message)


def never(message: str) -> Status:
    return Status(code=Code.UNSCHEDULABLE_AT_ALL, reason=Reason.NEVER_FITS, message=message)


def amount_text(kind: fairshare.Kind, value: int) -> str:
    """An amount of one resource as a person reads it (``value`` in milli-GPU, millicores or bytes)."""
    if kind is fairshare.Kind.GPU:
        return quantities.format_milli_gpu(value)
    if kind is fairshare.Kind.CPU:
        cores, milli = divmod(value, quantities.MILLICORES_PER_CORE)
        return f"{cores} CPU" if milli == 0 else f"{value}m CPU"
    return quantities.format_bytes(value)

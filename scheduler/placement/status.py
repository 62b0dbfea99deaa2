"""Why a group is still pending: a reason code a program can act on and a message a person can act on.

Every group left pending after a cycle gets one ``Status``. The reason codes are KAI's where KAI has one
(``OverLimit``, ``NonPreemptibleOverQuota``, ``QueueDoesNotExist``, ...) so tools written for KAI's PodGroup
conditions keep working; messages name the queue, the limit, the best candidate node and what was missing there,
in numbers. A ``Detail`` carries the same in structure (the blocking resource, the best few nodes and their
shortfall, what would unblock it) for the PodGroup's ``status.quotient`` and ``quotient explain``.
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


class Resource(enum.StrEnum):
    """What a node or a queue lacked, in the unit of each: milli-GPU, millicores, bytes, pod slots."""

    GPU = "gpu"
    CPU = "cpu"
    MEMORY = "memory"
    PODS = "pods"
    GPU_MEMORY = "gpu-memory"
    """A share by memory, in bytes per device."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Lack:
    """One thing a candidate node did not have enough of: ``requested`` against ``free`` (milli-GPU, millicores,
    bytes or pod slots, by ``resource``)."""

    resource: Resource
    requested: int
    free: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One of the best nodes for the blocking pod, and what it lacked there (nothing: it fits on its own, the gang
    as a whole does not)."""

    node: str
    gpu: int | None = None
    """The device a share would go to."""
    lacks: tuple[Lack, ...] = ()
    measured_free_bytes: int | None = None
    """That device's measured free memory after the margin, where telemetry is live."""
    unattributed_bytes: int = 0
    """GPU memory held there by processes of no pod (on that device, or on the node's busy devices)."""
    unhealthy_gpus: tuple[int, ...] = ()


class Remedy(enum.StrEnum):
    """What would unblock a group, as a program reads it (the hint's message says it to a person)."""

    EVICTIONS_PENDING = "EvictionsPending"
    """Pods are being evicted for it (reclaim, preempt, consolidate); it is placed once they go."""
    PREEMPTION_DELAY = "PreemptionDelay"
    """Its preemption delay runs: it may evict others from ``at_ns`` on."""
    NOT_RECLAIMED = "NotReclaimed"
    """Reclaim looked and did not act; the message says why, in numbers."""
    RAISE_LIMIT = "RaiseLimit"
    """A queue's limit stops it: ``current`` is the limit, ``needed`` what would let it in."""
    RAISE_QUOTA = "RaiseQuota"
    """Non-preemptible work must fit in the queue's quota: ``current`` is the quota, ``needed`` what would do."""
    SPARE_ROOM = "SpareRoom"
    """The queue is at or over its fair share: it runs on room nobody else wants."""
    FREE_ROOM = "FreeRoom"
    """Room on the nodes: running pods finishing, or more nodes."""
    LARGER_NODE = "LargerNode"
    """One pod asks for more than any node it may use offers even empty (``current``: the most one node offers)."""
    MORE_NODES = "MoreNodes"
    """The gang's minimum needs more whole GPUs than its nodes have in all (``current``: what they have)."""
    CREATE_QUEUE = "CreateQueue"
    CREATE_PODS = "CreatePods"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Hint:
    remedy: Remedy
    message: str
    queue: str | None = None
    resource: Resource | None = None
    current: int | None = None
    needed: int | None = None
    at_ns: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Detail:
    """The structured side of a status (``Status.message`` says the same in words): the resource that blocks, the
    best few nodes with what each lacked, and what would unblock the group. Written to the PodGroup's status."""

    resource: Resource | None = None
    requested: int | None = None
    """How much of ``resource`` the blocking pod, or the gang's minimum, asks for (its unit)."""
    candidates: tuple[Candidate, ...] = ()
    hints: tuple[Hint, ...] = ()


NO_DETAIL = Detail()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    code: Code
    reason: Reason
    message: str
    detail: Detail = NO_DETAIL


def unschedulable(reason: Reason, message: str, detail: Detail = NO_DETAIL) -> Status:
    return Status(code=Code.UNSCHEDULABLE, reason=reason, message=message, detail=detail)


def waiting(reason: Reason, message: str, detail: Detail = NO_DETAIL) -> Status:
    return Status(code=Code.WAITING, reason=reason, message=message, detail=detail)


def never(message: str, detail: Detail = NO_DETAIL) -> Status:
    return Status(code=Code.UNSCHEDULABLE_AT_ALL, reason=Reason.NEVER_FITS, message=message, detail=detail)


def resource_of(kind: fairshare.Kind) -> Resource:
    return Resource(kind.value)


def amount_text(kind: fairshare.Kind, value: int) -> str:
    """An amount of one resource as a person reads it (``value`` in milli-GPU, millicores or bytes)."""
    if kind is fairshare.Kind.GPU:
        return quantities.format_milli_gpu(value)
    if kind is fairshare.Kind.CPU:
        cores, milli = divmod(value, quantities.MILLICORES_PER_CORE)
        return f"{cores} CPU" if milli == 0 else f"{value}m CPU"
    return quantities.format_bytes(value)


def setting_detail(remedy: Remedy, queue: str, kind: fairshare.Kind, current: int, needed: int, want: int) -> Detail:
    """A queue's limit or quota that stops the group: raised to ``needed`` it would let the group in."""
    what = "limit" if remedy is Remedy.RAISE_LIMIT else "quota"
    resource = resource_of(kind)
    return Detail(
        resource=resource,
        requested=want,
        hints=(
            Hint(
                remedy=remedy,
                message=f"raise queue {queue}'s {kind.value} {what} to at least {amount_text(kind, needed)} "
                f"(now {amount_text(kind, current)}), or wait for its running work to finish",
                queue=str(queue),
                resource=resource,
                current=current,
                needed=needed,
            ),
        ),
    )


def never_detail(resource: Resource, *, requested: int, most: int, message: str, remedy: Remedy) -> Detail:
    """More of ``resource`` asked (``requested``) than the nodes offer even when empty (``most``)."""
    return Detail(
        resource=resource,
        requested=requested,
        hints=(
            Hint(
                remedy=remedy,
                message=message,
                resource=resource,
                current=most,
                needed=requested,
            ),
        ),
    )

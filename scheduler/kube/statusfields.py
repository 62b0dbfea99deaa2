"""Quotient's own status fields, beside KAI's: ``status.quotient`` on a PodGroup and on a Queue.

KAI's fields stay as KAI writes them (``schedulingConditions`` with the reason code and a message; the Queue's
``allocated``, ``requested``, ...). What a tool such as ``quotient explain`` needs beyond them goes into one object
of our own, so a KAI tool never meets a field it does not know and ours never collides with a field KAI adds:

- on a PodGroup that waits: the reason code, the resource that blocks it and how much of it is asked, the best few
  nodes with what each lacked in numbers (and the device's measured free memory where telemetry is live), and what
  would unblock it (the evictions under way for it, its preemption delay, a limit or quota to raise, ...);
- on a Queue: its deserved quota and fair share per resource, how many of its groups wait and since when.

Amounts are Kubernetes quantities in each resource's unit (``gpu`` in devices, ``cpu`` in cores or ``m``,
``memory`` and ``gpu-memory`` in bytes as ``Gi``/``Mi``, ``pods`` a count), as the Queue's KAI fields are. Times are
RFC 3339. Nothing here changes from one cycle to the next unless the situation does (no "seconds left", no
timestamps of the write), so an unchanged status is not written again. Pure: records in, JSON out.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from common import quantities
from common.resources import Resources
from scheduler.kube import kubeapi
from scheduler.objects.records import PodRecord
from scheduler.placement import decisions, fairshare, model, status

SCHEMA_VERSION = 1
"""``status.quotient.version``: raised when a field changes meaning; new fields keep it."""


def rfc3339_ns(at_ns: int) -> str:
    return kubeapi.rfc3339(datetime.datetime.fromtimestamp(at_ns / quantities.NS_PER_S, datetime.UTC))


def _gpu(milli: int) -> str:
    whole, rest = divmod(milli, quantities.MILLI_GPU_PER_GPU)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def quantity(resource: status.Resource, amount: int) -> str:
    """An amount of ``resource`` (milli-GPU, millicores, bytes or a count) as a Kubernetes quantity."""
    if resource is status.Resource.GPU:
        return _gpu(amount)
    if resource is status.Resource.CPU:
        return (
            f"{amount}m" if amount % quantities.MILLICORES_PER_CORE else str(amount // quantities.MILLICORES_PER_CORE)
        )
    if resource in (status.Resource.MEMORY, status.Resource.GPU_MEMORY):
        return quantities.format_bytes_quantity(amount)
    return str(amount)


def resource_list(amounts: Resources) -> dict[str, str]:
    """GPU, CPU and memory as a resource map, as the Queue's KAI fields write them."""
    return {
        "gpu": quantity(status.Resource.GPU, amounts.milli_gpu),
        "cpu": quantity(status.Resource.CPU, amounts.milli_cpu),
        "memory": quantity(status.Resource.MEMORY, amounts.memory_bytes),
    }


def _candidate(candidate: status.Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {"node": candidate.node}
    if candidate.gpu is not None:
        out["gpu"] = candidate.gpu
    out["lacking"] = [
        {
            "resource": lack.resource.value,
            "requested": quantity(lack.resource, lack.requested),
            "free": quantity(lack.resource, lack.free),
        }
        for lack in candidate.lacks
    ]
    if candidate.measured_free_bytes is not None:
        out["measuredFreeMemory"] = quantities.format_bytes_quantity(candidate.measured_free_bytes)
    if candidate.unattributed_bytes:
        out["unattributedMemory"] = quantities.format_bytes_quantity(candidate.unattributed_bytes)
    if candidate.unhealthy_gpus:
        out["unhealthyGpus"] = list(candidate.unhealthy_gpus)
    return out


def _hint(hint: status.Hint) -> dict[str, Any]:
    out: dict[str, Any] = {"remedy": hint.remedy.value, "message": hint.message}
    if hint.queue is not None:
        out["queue"] = hint.queue
    if hint.resource is not None:
        out["resource"] = hint.resource.value
        if hint.current is not None:
            out["current"] = quantity(hint.resource, hint.current)
        if hint.needed is not None:
            out["needed"] = quantity(hint.resource, hint.needed)
    if hint.at_ns is not None:
        out["at"] = rfc3339_ns(hint.at_ns)
    return out


def _victim(eviction: decisions.Eviction, pods: Mapping[str, PodRecord]) -> dict[str, Any] | None:
    pod = pods.get(str(eviction.pod))
    if pod is None:
        return None
    out: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name, "node": str(eviction.node)}
    if eviction.moved_to is not None:
        out["movedTo"] = str(eviction.moved_to)
    return out


def shell_hints(current: status.Status, group: model.Group | None, *, now_ns: int) -> tuple[status.Hint, ...]:
    """What would unblock the group that only the shell can say: its preemption delay (the engine's refusal says
    it in seconds left, which change every cycle; this is the moment it ends), a queue or pods to create."""
    found: list[status.Hint] = []
    if group is None:
        return ()
    delay_ends = group.evictions_from_ns
    if delay_ends is not None and delay_ends > now_ns and current.code is not status.Code.WAITING:
        found.append(
            status.Hint(
                remedy=status.Remedy.PREEMPTION_DELAY,
                message="its preemption delay runs: it takes free room only, and may evict others once it ends",
                at_ns=delay_ends,
            )
        )
    if current.reason is status.Reason.QUEUE_DOES_NOT_EXIST:
        found.append(
            status.Hint(
                remedy=status.Remedy.CREATE_QUEUE,
                message=f"create queue {group.queue} as a leaf queue, or move the workload to one",
                queue=str(group.queue),
            )
        )
    if current.reason is status.Reason.NOT_ENOUGH_PODS:
        found.append(
            status.Hint(
                remedy=status.Remedy.CREATE_PODS,
                message="its owner has not created all the pods of its minimum yet; it waits for them",
            )
        )
    return tuple(found)


def group_fields(
    current: status.Status,
    *,
    group: model.Group | None,
    evictions: Sequence[decisions.Eviction],
    pods: Mapping[str, PodRecord],
    now_ns: int,
) -> dict[str, Any]:
    """A pending PodGroup's ``status.quotient``. ``evictions`` are the plan's evictions made for this group."""
    detail = current.detail
    out: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "code": current.code.value,
        "reason": current.reason.value,
    }
    if group is not None:
        out["queue"] = str(group.queue)
    if detail.resource is not None:
        out["resource"] = detail.resource.value
        if detail.requested is not None:
            out["requested"] = quantity(detail.resource, detail.requested)
    out["candidates"] = [_candidate(candidate) for candidate in detail.candidates]
    unblock = [_hint(hint) for hint in (*detail.hints, *shell_hints(current, group, now_ns=now_ns))]
    victims = [found for eviction in evictions if (found := _victim(eviction, pods)) is not None]
    if victims:
        reasons = sorted({eviction.reason.value for eviction in evictions})
        unblock.insert(
            0,
            {
                "remedy": status.Remedy.EVICTIONS_PENDING.value,
                "message": f"{len(victims)} pod(s) are being evicted to make room for it ({', '.join(reasons)}); "
                "it is placed once they are gone",
                "pods": sorted(victims, key=lambda victim: (victim["namespace"], victim["name"])),
            },
        )
    out["unblock"] = unblock
    return out


def evictions_for(plan_evictions: Sequence[decisions.Eviction]) -> dict[model.GroupId, list[decisions.Eviction]]:
    """The plan's evictions by the group they make room for."""
    found: dict[model.GroupId, list[decisions.Eviction]] = {}
    for eviction in plan_evictions:
        if eviction.beneficiary is not None:
            found.setdefault(eviction.beneficiary, []).append(eviction)
    return found


def queue_fields(
    share: fairshare.Share | None, *, pending_groups: int, oldest_pending_ns: int | None
) -> dict[str, Any]:
    """A Queue's ``status.quotient``: deserved quota and fair share per resource (absent for a queue the plan gave
    no share, an orphan), how many of its groups wait, and since when the oldest has."""
    out: dict[str, Any] = {"version": SCHEMA_VERSION}
    if share is not None:
        out["deserved"] = resource_list(share.deserved)
        out["fairShare"] = resource_list(share.fair)
    out["pendingGroups"] = pending_groups
    if oldest_pending_ns is not None:
        out["oldestPendingSince"] = rfc3339_ns(oldest_pending_ns)
    return out

"""Explaining a pod that found no room: the best candidate node, and what was missing there, in numbers.

Called once per distinct pod shape for the groups left pending at the end of a cycle, against the working state
as the plan leaves it. The best candidate comes from the capacity indexes (the node with the most free devices, the
device with the most room), so explaining does not scan every node, except for CPU-only pods. ``candidates``
gives the best few nodes in structure (``status.Candidate``) for the PodGroup's status and ``quotient explain``.
"""

from __future__ import annotations

import heapq

from common import quantities
from scheduler.placement import capacity, fairshare, model, nodework, search, shapes, status


def explain(searcher: search.Searcher, shape: shapes.Shape) -> tuple[status.Reason, str]:
    """Why a pod of ``shape`` fits nowhere now: ``NoNodeFits`` (filters, CPU, memory, pod slots) or ``NoGpuFits``."""
    cap = searcher.capacity
    eligible = searcher.eligible(shape.constraints)
    if not eligible:
        return status.Reason.NO_NODE_FITS, _filters_text(searcher, shape)
    if shape.whole_gpus:
        return _explain_whole(cap, shape, eligible)
    if shape.share is not None:
        return _explain_share(cap, shape, eligible)
    best = max(
        (cap.by_order[order] for cls in eligible for order in cap.classes[cls].members),
        key=lambda work: (work.free_cpu, work.free_mem, -work.order),
    )
    return status.Reason.NO_NODE_FITS, "best candidate " + _basics_text(best, shape, pods=shape.pods)


def _filters_text(searcher: search.Searcher, shape: shapes.Shape) -> str:
    cap = searcher.capacity
    counts: dict[str, int] = {}
    for cls, index in enumerate(cap.classes):
        if not index.members:
            continue
        why = searcher.verdict(cls, shape.constraints) or "fits"
        counts[why] = counts.get(why, 0) + len(index.members)
    if not counts:
        return "the cluster has no nodes"
    parts = [f"{count} node(s): {why}" for why, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return "no node passes the filters; " + "; ".join(parts)


def _basics_text(work: nodework.NodeWork, shape: shapes.Shape, *, pods: int) -> str:
    missing: list[str] = []
    if work.free_cpu < shape.milli_cpu:
        free = status.amount_text(fairshare.Kind.CPU, max(0, work.free_cpu))
        missing.append(f"{free} free, {status.amount_text(fairshare.Kind.CPU, shape.milli_cpu)} requested")
    if work.free_mem < shape.memory_bytes:
        missing.append(
            f"{quantities.format_bytes(max(0, work.free_mem))} memory free, "
            f"{quantities.format_bytes(shape.memory_bytes)} requested"
        )
    if work.free_pods < pods:
        missing.append(f"{max(0, work.free_pods)} pod slot(s) free, {pods} needed")
    return f"{work.name}: " + ("; ".join(missing) if missing else "fits now")


def _explain_whole(cap: capacity.Capacity, shape: shapes.Shape, eligible: tuple[int, ...]) -> tuple[status.Reason, str]:
    # A node with enough free devices that lacks CPU, memory or slots is the most useful thing to name.
    for count in sorted({count for cls in eligible for count in cap.classes[cls].whole}):
        if count < shape.whole_gpus:
            continue
        for cls in eligible:
            for order in cap.classes[cls].whole.get(count, ()):
                work = cap.by_order[order]
                if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods):
                    text = _basics_text(work, shape, pods=shape.pods)
                    return status.Reason.NO_NODE_FITS, f"best candidate {text} ({count} GPU free)"
    best = max(
        (cap.by_order[order] for cls in eligible for order in cap.classes[cls].members),
        key=lambda work: (work.whole_count, -work.order),
    )
    text = f"best candidate {best.name}: {best.whole_count} GPU free, {shape.whole_gpus} requested"
    held = [
        f"gpu {device}: {quantities.format_bytes(best.node.devices[device].unattributed_bytes)} held by a process of "
        "no pod"
        for device in range(len(best.dev_mem))
        if best.node.devices[device].unattributed_bytes > 0 and not best.dev_whole[device]
    ]
    if held:
        text += "; " + "; ".join(held)
    return status.Reason.NO_GPU_FITS, text + _unhealthy_text(cap, eligible)


def _explain_share(cap: capacity.Capacity, shape: shapes.Shape, eligible: tuple[int, ...]) -> tuple[status.Reason, str]:
    share = shape.share
    assert share is not None
    best: tuple[int, int, int] | None = None  # (room minus need, -order, -device)
    for cls in eligible:
        for order in _share_candidates(cap, cls, share):
            work = cap.by_order[order]
            per_device = work.share_on_each(share)
            for device, free in enumerate(work.dev_free):
                if work.dev_group[device] is None and not work.dev_whole[device]:
                    continue
                key = (free - per_device[device], -order, -device)
                if best is None or key > best:
                    best = key
    if best is None:
        text = "no GPU is free or shared on any node the pod may use"
        return status.Reason.NO_GPU_FITS, text + _unhealthy_text(cap, eligible)
    work = cap.by_order[-best[1]]
    device = -best[2]
    need = work.share_on_each(share)[device]
    if work.dev_free[device] >= need:
        text = _basics_text(work, shape, pods=shape.pods + (0 if work.dev_group[device] else 1))
        return status.Reason.NO_NODE_FITS, f"best candidate {text} (gpu {device} has room)"
    text = (
        f"best candidate {work.name} gpu {device}: {quantities.format_milli_gpu(work.dev_free[device])} free, "
        f"{quantities.format_milli_gpu(need)} requested"
    )
    measured = work.dev_meas[device]
    if measured is not None:
        text += f"; measured free {quantities.format_bytes(max(0, measured))} after the margin"
    unattributed = work.node.devices[device].unattributed_bytes
    if unattributed > 0:
        text += f"; {quantities.format_bytes(unattributed)} held by a process of no pod"
    if share.devices > 1:
        text += f" ({share.devices} devices needed)"
    return status.Reason.NO_GPU_FITS, text + _unhealthy_text(cap, eligible)


def _unhealthy_text(cap: capacity.Capacity, eligible: tuple[int, ...]) -> str:
    """The devices the pod may use that are out of placement as unhealthy (an Xid, a lost GPU), by node."""
    out = [
        f"{work.name} gpu {','.join(str(device) for device, healthy in enumerate(work.dev_healthy) if not healthy)}"
        for cls in eligible
        for work in (cap.by_order[order] for order in cap.classes[cls].members)
        if not all(work.dev_healthy)
    ]
    if not out:
        return ""
    shown = "; ".join(out[:3]) + (f"; and {len(out) - 3} more node(s)" if len(out) > 3 else "")
    return f"; out of placement as unhealthy: {shown}"


def free_summary(searcher: search.Searcher, shape: shapes.Shape) -> str:
    """How much of what the pod needs is free in all, over the nodes it may use (for gang messages)."""
    cap = searcher.capacity
    works = [cap.by_order[order] for cls in searcher.eligible(shape.constraints) for order in cap.classes[cls].members]
    if shape.whole_gpus:
        free = sum(work.whole_count for work in works)
        return (
            f"{free} whole GPU{'' if free == 1 else 's'} free on {len(works)} node(s) it may use, "
            f"{shape.whole_gpus} per pod"
        )
    if shape.share is not None:
        free = sum(sum(work.dev_free) for work in works)
        return f"{quantities.format_milli_gpu(free)} of GPU shares free on {len(works)} node(s) it may use"
    cpu = sum(max(0, work.free_cpu) for work in works)
    return f"{status.amount_text(fairshare.Kind.CPU, cpu)} free on {len(works)} node(s) it may use"


def _share_candidates(cap: capacity.Capacity, cls: int, share: model.GpuShare) -> list[int]:
    """Nodes that may hold the device with the most room: from the indexes for a fraction, all for gpu-memory."""
    index = cap.classes[cls]
    if share.memory_bytes:
        return index.members
    found = {entry[1] for bucket in index.shared.values() for entry in bucket[-8:]}
    found.update(bucket[0] for bucket in index.whole.values() if bucket)
    return sorted(found)


def gpu_model_hint(shape: shapes.Shape) -> str:
    models = shape.constraints.gpu_models
    return f" (GPU model {', '.join(models)})" if models else ""


def describe_pod(pod: model.Pod) -> str:
    return f"pod {pod.namespace}/{pod.name}"


CANDIDATES = 3
"""How many of the best nodes a status names in structure (the message names the best one)."""


def candidates(
    searcher: search.Searcher, shape: shapes.Shape, *, count: int = CANDIDATES
) -> tuple[status.Candidate, ...]:
    """The best few nodes for a pod of ``shape`` now, best first, each with what it lacked in numbers: the most free
    devices for whole GPUs, the device with the most room for a share, the most free CPU and memory otherwise.
    Nothing when no node passes the filters (``explain`` names each class's reason then)."""
    cap = searcher.capacity
    works = [cap.by_order[order] for cls in searcher.eligible(shape.constraints) for order in cap.classes[cls].members]
    if not works:
        return ()
    if shape.share is not None:
        return _share_candidates_detail(cap, shape, searcher.eligible(shape.constraints), count)
    if shape.whole_gpus:
        need = shape.whole_gpus
        best = heapq.nlargest(
            count,
            works,
            key=lambda work: (
                min(work.whole_count, need),
                work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods),
                -work.order,
            ),
        )
    else:
        best = heapq.nlargest(count, works, key=lambda work: (work.free_cpu, work.free_mem, -work.order))
    return tuple(_candidate(work, shape, pods=shape.pods) for work in best)


def _candidate(work: nodework.NodeWork, shape: shapes.Shape, *, pods: int, gpu: int | None = None) -> status.Candidate:
    lacks = list(_gpu_lacks(work, shape, gpu))
    if work.free_cpu < shape.milli_cpu:
        lacks.append(status.Lack(resource=status.Resource.CPU, requested=shape.milli_cpu, free=max(0, work.free_cpu)))
    if work.free_mem < shape.memory_bytes:
        lacks.append(
            status.Lack(resource=status.Resource.MEMORY, requested=shape.memory_bytes, free=max(0, work.free_mem))
        )
    if work.free_pods < pods:
        lacks.append(status.Lack(resource=status.Resource.PODS, requested=pods, free=max(0, work.free_pods)))
    devices = work.node.devices
    if gpu is not None:
        unattributed = devices[gpu].unattributed_bytes
    else:
        unattributed = sum(
            devices[index].unattributed_bytes for index in range(len(devices)) if not work.dev_whole[index]
        )
    return status.Candidate(
        node=str(work.name),
        gpu=gpu,
        lacks=tuple(lacks),
        measured_free_bytes=max(0, meas) if gpu is not None and (meas := work.dev_meas[gpu]) is not None else None,
        unattributed_bytes=unattributed,
        unhealthy_gpus=tuple(index for index, healthy in enumerate(work.dev_healthy) if not healthy),
    )


def _gpu_lacks(work: nodework.NodeWork, shape: shapes.Shape, gpu: int | None) -> tuple[status.Lack, ...]:
    if shape.whole_gpus and work.whole_count < shape.whole_gpus:
        free = work.whole_count * model.MILLI_GPU_PER_DEVICE
        return (
            status.Lack(
                resource=status.Resource.GPU, requested=shape.whole_gpus * model.MILLI_GPU_PER_DEVICE, free=free
            ),
        )
    if shape.share is not None and gpu is not None:
        need = work.share_on_each(shape.share)[gpu]
        if work.dev_free[gpu] < need:
            return (status.Lack(resource=status.Resource.GPU, requested=need, free=max(0, work.dev_free[gpu])),)
    return ()


def _share_candidates_detail(
    cap: capacity.Capacity, shape: shapes.Shape, eligible: tuple[int, ...], count: int
) -> tuple[status.Candidate, ...]:
    """Per node the device with the most room for the share (``_explain_share``'s measure), the best ``count``."""
    share = shape.share
    assert share is not None
    best: dict[int, tuple[int, int]] = {}  # order -> (room minus need, -device)
    for cls in eligible:
        for order in _share_candidates(cap, cls, share):
            work = cap.by_order[order]
            per_device = work.share_on_each(share)
            for device, free in enumerate(work.dev_free):
                if work.dev_group[device] is None and not work.dev_whole[device]:
                    continue
                key = (free - per_device[device], -device)
                if order not in best or key > best[order]:
                    best[order] = key
    top = heapq.nlargest(count, best.items(), key=lambda item: (item[1][0], -item[0], item[1][1]))
    out = []
    for order, (_, neg_device) in top:
        work = cap.by_order[order]
        pods = shape.pods + (0 if work.dev_group[-neg_device] else 1)
        out.append(_candidate(work, shape, pods=pods, gpu=-neg_device))
    return tuple(out)


def largest_node_detail(searcher: search.Searcher, shape: shapes.Shape) -> status.Detail:
    """A pod bigger than any node it may use: the most of what it asks that one node offers (``9 GPUs asked, at
    most 8 on any node``)."""
    cap = searcher.capacity
    works = [cap.by_order[order] for cls in searcher.eligible(shape.constraints) for order in cap.classes[cls].members]
    pairs = (
        (
            status.Resource.GPU,
            shape.whole_gpus * model.MILLI_GPU_PER_DEVICE,
            max((len(w.dev_mem) for w in works), default=0) * model.MILLI_GPU_PER_DEVICE,
        ),
        (status.Resource.CPU, shape.milli_cpu, max((w.alloc_cpu for w in works), default=0)),
        (status.Resource.MEMORY, shape.memory_bytes, max((w.alloc_mem for w in works), default=0)),
        (
            status.Resource.GPU_MEMORY,
            shape.share.memory_bytes if shape.share is not None else 0,
            max((memory for w in works for memory in w.dev_mem), default=0),
        ),
    )
    for resource, asked, most in pairs:
        if asked > most:
            message = "more than any node it may use offers when empty: ask for less, or add a larger node"
            return status.never_detail(
                resource, requested=asked, most=most, message=message, remedy=status.Remedy.LARGER_NODE
            )
    return status.NO_DETAIL

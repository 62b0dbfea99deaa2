"""Whole and fractional GPUs on one node: free shares, measured headroom, device choice, taking and giving back.

A device is in one of three situations: free (a whole-GPU pod or a new GPU group may take it), shared (it belongs to
a GPU group; shares of that group fit while room is left) or held whole (by one pod, or by anything the scheduler
does not know, which shows as an allotment without a group). A share's room on a device is the smaller of

- the request-based free share, ``1000 - allotted``, and
- where telemetry is fresh, the measured free memory (total minus the measured peak minus the margin) as a share
  of the device, rounded down: memory held by processes nobody placed (another scheduler's pods, zombies, the
  driver) is respected. Stale or missing telemetry falls back to requests alone.

A ``gpu-memory`` share becomes ``ceil(bytes * 1000 / device memory)`` milli-GPU on each device, so the same request
is a smaller share of a larger GPU. Opening a new group costs the node one pod slot: the reservation pod that holds
the device (its own CPU and memory requests are negligible and not counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.placement import model

if TYPE_CHECKING:
    from scheduler.placement.capacity import NodeWork

FULL = model.MILLI_GPU_PER_DEVICE


def measured_free_bytes(device: model.Device, margin_bytes: int) -> int | None:
    """Free memory by measurement minus the margin, or None where telemetry is missing or stale."""
    if device.peak_used_bytes is None or device.telemetry_stale:
        return None
    return device.memory_bytes - device.peak_used_bytes - margin_bytes


def free_share(
    *,
    healthy: bool,
    whole_free: bool,
    group: model.GpuGroupId | None,
    allotted_milli: int,
    measured_free_bytes: int | None,
    memory_bytes: int,
) -> int:
    """The milli-GPU a share could still take on a device (0 where the device is held whole or unhealthy)."""
    if not healthy or (group is None and not whole_free):
        return 0
    free = FULL - allotted_milli
    if measured_free_bytes is not None and memory_bytes > 0:
        free = min(free, max(0, measured_free_bytes) * FULL // memory_bytes)
    return max(0, free)


def share_bytes(milli: int, memory_bytes: int) -> int:
    """The memory a share of ``milli`` is entitled to on a device of ``memory_bytes`` (rounded up)."""
    return -(-milli * memory_bytes // FULL)


def model_allowed(work: NodeWork, device: int, models: tuple[str, ...]) -> bool:
    return not models or work.dev_model[device] in models


def pick_whole(work: NodeWork, count: int, models: tuple[str, ...]) -> tuple[int, ...] | None:
    """The ``count`` lowest-indexed free devices of an allowed model, or None if there are fewer."""
    chosen: list[int] = []
    for device, whole in enumerate(work.dev_whole):
        if whole and model_allowed(work, device, models):
            chosen.append(device)
            if len(chosen) == count:
                return tuple(chosen)
    return None


def share_on_each(share: model.GpuShare, work: NodeWork) -> tuple[int, ...]:
    """The milli-GPU ``share`` takes on each device of the node, in device order."""
    if share.milli_gpu:
        return (share.milli_gpu,) * len(work.dev_mem)
    return tuple(model.share_milli_on(share, memory) for memory in work.dev_mem)


def share_candidates(work: NodeWork, per_device: tuple[int, ...], models: tuple[str, ...]) -> list[int]:
    """Devices where a share fits now: shared with room, or free; equal devices collapse to the lowest index."""
    seen: set[tuple[int, bool, int]] = set()
    found: list[int] = []
    for device, free in enumerate(work.dev_free):
        need = per_device[device]
        if need > FULL or free < need or not model_allowed(work, device, models):
            continue
        if work.dev_group[device] is None and not work.dev_whole[device]:
            continue
        key = (free, work.dev_group[device] is not None, work.dev_mem[device])
        if key in seen:
            continue
        seen.add(key)
        found.append(device)
    return found


def take_whole(work: NodeWork, chosen: tuple[int, ...]) -> None:
    for device in chosen:
        work.dev_whole[device] = False
        work.dev_allotted[device] = FULL
        work.refresh_device(device)
    work.whole_count = sum(work.dev_whole)


def give_back_whole(work: NodeWork, chosen: tuple[int, ...]) -> None:
    for device in chosen:
        work.dev_allotted[device] = 0
        work.dev_whole[device] = work.dev_healthy[device] and work.dev_group[device] is None
        work.refresh_device(device)
    work.whole_count = sum(work.dev_whole)


def take_share(work: NodeWork, device: int, milli: int, group: model.GpuGroupId) -> bool:
    """Put a share on ``device`` of ``group``; returns True when this opens the group (a reservation pod)."""
    opens = work.dev_group[device] is None
    if opens:
        work.dev_whole[device] = False
        work.dev_group[device] = group
        work.free_pods -= 1
    work.dev_allotted[device] += milli
    measured = work.dev_meas[device]
    if measured is not None:
        work.dev_meas[device] = measured - share_bytes(milli, work.dev_mem[device])
    work.refresh_device(device)
    work.whole_count = sum(work.dev_whole)
    return opens


def give_back_share(work: NodeWork, device: int, milli: int) -> None:
    """Remove a share; the last share of a group frees the device (its reservation pod goes too)."""
    work.dev_allotted[device] = max(0, work.dev_allotted[device] - milli)
    measured = work.dev_meas[device]
    if measured is not None:
        work.dev_meas[device] = measured + share_bytes(milli, work.dev_mem[device])
    if work.dev_allotted[device] == 0 and work.dev_group[device] is not None:
        work.dev_group[device] = None
        work.dev_whole[device] = work.dev_healthy[device]
        work.free_pods += 1
    work.refresh_device(device)
    work.whole_count = sum(work.dev_whole)


def new_group_id(node: model.NodeName, device: int, pod: model.PodUid) -> model.GpuGroupId:
    """A new GPU group is named after the node, the device and the pod that opens it: unique and deterministic."""
    return model.GpuGroupId(f"{node}-gpu{device}-{pod}")

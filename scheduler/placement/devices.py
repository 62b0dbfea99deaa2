"""The arithmetic of one GPU: free share, measured headroom, the memory a share is entitled to, GPU group ids.

A device is in one of three situations: free (a whole-GPU pod or a new GPU group may take it), shared (it belongs to
a GPU group; shares of that group fit while room is left) or held whole (by one pod, or by anything the scheduler
does not know, which shows as an allotment without a group). A share's room on a device is the smaller of

- the request-based free share, ``1000 - allotted``, and
- where telemetry is fresh, the measured free memory (total minus the measured peak minus the margin) as a share
  of the device, rounded down: memory held by processes nobody placed (another scheduler's pods, zombies, the
  driver) is respected. Stale or missing telemetry falls back to requests alone.

These rules read plain values only; ``nodework.NodeWork`` applies them to the devices of a node as a cycle takes
and gives back room, and the scheduler shell uses ``share_bytes`` for what a share may use.
"""

from __future__ import annotations

from scheduler.placement import model

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


def new_group_id(node: model.NodeName, device: int, pod: model.PodUid) -> model.GpuGroupId:
    """A new GPU group is named after the node, the device and the pod that opens it: unique and deterministic."""
    return model.GpuGroupId(f"{node}-gpu{device}-{pod}")

"""What a pod holds and where: one reading for the snapshot, the telemetry analysis and the reservation keeper.

A pod's place has two sources: the API (``spec.nodeName`` and the devices, share and GPU groups the binder recorded on
the pod) and, while a bind is in flight, the binder's ``Assumption``, which counts first. The milli-GPU a share takes
on each device is the assumption's, else the one the binder recorded, else what the request comes to on that device
(a ``gpu-memory`` request is a larger share of a smaller device). Its memory allotment is the ``gpu-memory`` bytes it
asked for, else its share of the device's memory; placement reserves that, and only the over-consumption detector
reads a per-container memory limit above it (``limit_bytes``). Every reader of "what does this pod hold" goes
through here, so the placement's accounting and the over-consumption detector cannot disagree about a pod.
"""

from __future__ import annotations

import dataclasses

from scheduler.objects import gpurequest
from scheduler.objects.records import PodRecord
from scheduler.placement import devices, model
from scheduler.state.cache import Assumption


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """Where a pod is accounted and what it holds there."""

    node: str | None
    devices: tuple[int, ...] = ()
    recorded_share_milli: int = 0
    """The milli-GPU per device the assumption or the binder recorded; 0 when neither did."""
    gpu_groups: tuple[str, ...] = ()


def of(pod: PodRecord, assumption: Assumption | None) -> Holding:
    """The pod's holding: the assumption while a bind is in flight, else what the API shows."""
    if assumption is not None:
        return Holding(
            node=assumption.node,
            devices=assumption.devices,
            recorded_share_milli=assumption.share_milli or pod.share_milli,
            gpu_groups=assumption.gpu_groups,
        )
    return Holding(node=pod.node, devices=pod.devices, recorded_share_milli=pod.share_milli, gpu_groups=pod.gpu_groups)


def holds_gpus(request: gpurequest.GpuRequest | gpurequest.AnnotationProblem) -> bool:
    """Whether a request takes any GPU (whole or shared); an unreadable one takes none."""
    return isinstance(request, gpurequest.GpuRequest) and (request.whole > 0 or request.is_share)


def share_milli(request: gpurequest.GpuRequest, holding: Holding, device_memory_bytes: int) -> int:
    """The milli-GPU a share takes on a device of ``device_memory_bytes``: as recorded, else as requested there."""
    if holding.recorded_share_milli:
        return holding.recorded_share_milli
    share = model.GpuShare(milli_gpu=request.milli_gpu, memory_bytes=request.memory_bytes)
    return model.share_milli_on(share, device_memory_bytes)


def allotted_bytes(request: gpurequest.GpuRequest, share: int, device_memory_bytes: int) -> int:
    """The GPU memory a share is entitled to on its device: its ``gpu-memory``, else its share of the device."""
    return request.memory_bytes or devices.share_bytes(share, device_memory_bytes)


def limit_bytes(request: gpurequest.GpuRequest, allotted: int) -> int:
    """The most a share may use on its device while the device has headroom: KAI's per-container memory limit
    (NvFractions' dynamic fractions) where it is above the allotment; else 0, held to its allotment."""
    return request.memory_limit_bytes if request.memory_limit_bytes > allotted else 0

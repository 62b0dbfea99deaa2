"""The working state of one node during a cycle: what is free on it, which devices a pod may take, taking and
giving back.

``capacity.Capacity`` keeps one ``NodeWork`` per node, mirroring the ``model.Node`` outside cycles; a cycle's
tentative placements and evictions change it (between ``Capacity.begin`` and ``Capacity.end``, which save and
restore it through ``save``/``restore``). Per device it keeps the allotment, whether the device is free whole, its
GPU group, the measured free memory and the free share that follows (``devices.free_share``).

A ``gpu-memory`` share becomes ``ceil(bytes * 1000 / device memory)`` milli-GPU on each device, so the same request
is a smaller share of a larger GPU. Opening a new group costs the node one pod slot: the reservation pod that holds
the device (its own CPU and memory requests are negligible and not counted). A GPU group takes the compute mode of
its first share, and a share joins only a group of its own mode (``joinable``); groups of KAI's default mode,
time-slicing, are not recorded (``modes`` holds the others), so a node without SM sharing pays nothing for modes.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduler.placement import devices, model, scoring


class Saved(NamedTuple):
    """What ``NodeWork.save`` keeps for undo: everything a placement or an eviction changes on a node."""

    free_cpu: int
    free_mem: int
    free_pods: int
    dev_allotted: list[int]
    dev_whole: list[bool]
    dev_group: list[model.GpuGroupId | None]
    dev_meas: list[int | None]
    dev_free: list[int]
    dev_pod_gpus: list[int]
    whole_count: int


class NodeWork:
    """The mutable working state of one node during a cycle (mirrors the node outside cycles)."""

    __slots__ = (
        "alloc_cpu",
        "alloc_mem",
        "cls",
        "dev_allotted",
        "dev_free",
        "dev_group",
        "dev_healthy",
        "dev_meas",
        "dev_mem",
        "dev_model",
        "dev_pod_gpus",
        "dev_whole",
        "fixed",
        "free_cpu",
        "free_mem",
        "free_pods",
        "modes",
        "name",
        "node",
        "order",
        "whole_count",
    )

    def __init__(self, node: model.Node, *, order: int, cls: int, margin_bytes: int) -> None:
        self.node = node
        self.name = node.name
        self.order = order
        self.cls = cls
        self.alloc_cpu = node.allocatable.milli_cpu
        self.alloc_mem = node.allocatable.memory_bytes
        self.free_cpu = node.allocatable.milli_cpu - node.used.milli_cpu
        self.free_mem = node.allocatable.memory_bytes - node.used.memory_bytes
        self.free_pods = node.allocatable.pods - node.used.pods
        self.dev_mem = tuple(device.memory_bytes for device in node.devices)
        self.dev_model = tuple(device.model for device in node.devices)
        self.dev_healthy = tuple(device.healthy for device in node.devices)
        self.dev_allotted = [device.allotted_milli_gpu for device in node.devices]
        self.dev_whole = [device.is_free for device in node.devices]
        self.dev_group: list[model.GpuGroupId | None] = [device.gpu_group for device in node.devices]
        self.modes: dict[model.GpuGroupId, model.ComputeMode] = {
            device.gpu_group: device.compute_mode
            for device in node.devices
            if device.gpu_group is not None
            and device.compute_mode is not None
            and device.compute_mode is not model.ComputeMode.TIME_SLICING
        }
        """The compute mode of each GPU group not in KAI's default (time-slicing). Only ever grows during a cycle: a
        group id names one group for good, so an entry outliving its group is never read again."""
        self.dev_pod_gpus = [_pod_gpus(device, node.devices) for device in node.devices]
        """Per device held whole by a pod we know, how many devices of the node that pod holds; else 0."""
        self.fixed = (self.alloc_cpu, self.alloc_mem, self.dev_mem, self.dev_model)
        """What never changes during a cycle, part of every look key."""
        # Measured memory matters only where a share could go; held devices keep None, so their telemetry samples
        # change nothing the engine reads (and a cycle after such a sample is recognised as unchanged).
        self.dev_meas = [
            devices.measured_free_bytes(device, margin_bytes)
            if device.healthy and (device.gpu_group or device.is_free)
            else None
            for device in node.devices
        ]
        self.dev_free = [0] * len(node.devices)
        for index in range(len(node.devices)):
            self.refresh_device(index)
        self.whole_count = sum(self.dev_whole)

    def refresh_device(self, index: int) -> None:
        """Recompute the free share of one device from its allotment and measured headroom."""
        self.dev_free[index] = devices.free_share(
            healthy=self.dev_healthy[index],
            whole_free=self.dev_whole[index],
            group=self.dev_group[index],
            allotted_milli=self.dev_allotted[index],
            measured_free_bytes=self.dev_meas[index],
            memory_bytes=self.dev_mem[index],
        )

    def fits_basics(self, milli_cpu: int, memory_bytes: int, pods: int) -> bool:
        return self.free_cpu >= milli_cpu and self.free_mem >= memory_bytes and self.free_pods >= pods

    def save(self) -> Saved:
        return Saved(
            free_cpu=self.free_cpu,
            free_mem=self.free_mem,
            free_pods=self.free_pods,
            dev_allotted=self.dev_allotted.copy(),
            dev_whole=self.dev_whole.copy(),
            dev_group=self.dev_group.copy(),
            dev_meas=self.dev_meas.copy(),
            dev_free=self.dev_free.copy(),
            dev_pod_gpus=self.dev_pod_gpus.copy(),
            whole_count=self.whole_count,
        )

    def restore(self, saved: Saved) -> None:
        self.free_cpu = saved.free_cpu
        self.free_mem = saved.free_mem
        self.free_pods = saved.free_pods
        self.dev_allotted = saved.dev_allotted
        self.dev_whole = saved.dev_whole
        self.dev_group = saved.dev_group
        self.dev_meas = saved.dev_meas
        self.dev_free = saved.dev_free
        self.dev_pod_gpus = saved.dev_pod_gpus
        self.whole_count = saved.whole_count

    def mode_of(self, device: int) -> model.ComputeMode | None:
        """The compute mode of the device's GPU group; None when the device is not shared."""
        group = self.dev_group[device]
        return None if group is None else self.modes.get(group, model.ComputeMode.TIME_SLICING)

    def joinable(self, device: int, mode: model.ComputeMode) -> bool:
        """May a share of ``mode`` join the device's GPU group (or open one on it)? Modes never mix on a device."""
        group = self.dev_group[device]
        return group is None or self.modes.get(group, model.ComputeMode.TIME_SLICING) == mode

    def device_modes(self) -> tuple[str, ...]:
        """Per device, the compute mode of its GPU group, "" where it is not shared."""
        return tuple(self.mode_of(device) or "" for device in range(len(self.dev_group)))

    def build_state(self) -> scoring.NodeState:
        """The node as a scorer sees it."""
        return scoring.NodeState(
            free_milli_cpu=self.free_cpu,
            free_memory_bytes=self.free_mem,
            allocatable_milli_cpu=self.alloc_cpu,
            allocatable_memory_bytes=self.alloc_mem,
            device_free_milli=tuple(self.dev_free),
            device_memory_bytes=self.dev_mem,
            device_models=self.dev_model,
            device_whole_free=tuple(self.dev_whole),
            device_shared=tuple(group is not None for group in self.dev_group),
            device_pod_gpus=tuple(self.dev_pod_gpus),
            device_modes=self.device_modes() if self.modes else (),
        )

    # --- device choice ------------------------------------------------------------------------------------------

    def model_allowed(self, device: int, models: tuple[str, ...]) -> bool:
        return not models or self.dev_model[device] in models

    def pick_whole(self, count: int, models: tuple[str, ...]) -> tuple[int, ...] | None:
        """The ``count`` lowest-indexed free devices of an allowed model, or None if there are fewer."""
        chosen: list[int] = []
        for device, whole in enumerate(self.dev_whole):
            if whole and self.model_allowed(device, models):
                chosen.append(device)
                if len(chosen) == count:
                    return tuple(chosen)
        return None

    def share_on_each(self, share: model.GpuShare) -> tuple[int, ...]:
        """The milli-GPU ``share`` takes on each device of the node, in device order."""
        if share.milli_gpu:
            return (share.milli_gpu,) * len(self.dev_mem)
        return tuple(model.share_milli_on(share, memory) for memory in self.dev_mem)

    def share_candidates(
        self, per_device: tuple[int, ...], models: tuple[str, ...], mode: model.ComputeMode
    ) -> list[int]:
        """Devices where a share of ``mode`` fits now: shared (in that mode) with room, or free; equal devices
        collapse to the lowest index."""
        seen: set[tuple[int, bool, int]] = set()
        found: list[int] = []
        check_modes = bool(self.modes) or mode is not model.ComputeMode.TIME_SLICING
        for device, free in enumerate(self.dev_free):
            need = per_device[device]
            if need > devices.FULL or free < need or not self.model_allowed(device, models):
                continue
            if self.dev_group[device] is None and not self.dev_whole[device]:
                continue
            if check_modes and not self.joinable(device, mode):
                continue
            key = (free, self.dev_group[device] is not None, self.dev_mem[device])
            if key in seen:
                continue
            seen.add(key)
            found.append(device)
        return found

    # --- taking and giving back -----------------------------------------------------------------------------------

    def take_whole(self, chosen: tuple[int, ...]) -> None:
        for device in chosen:
            self.dev_whole[device] = False
            self.dev_allotted[device] = devices.FULL
            self.refresh_device(device)
        self.whole_count = sum(self.dev_whole)

    def give_back_whole(self, chosen: tuple[int, ...]) -> None:
        for device in chosen:
            self.dev_allotted[device] = 0
            self.dev_whole[device] = self.dev_healthy[device] and self.dev_group[device] is None
            self.refresh_device(device)
        self.whole_count = sum(self.dev_whole)

    def take_share(
        self, device: int, milli: int, group: model.GpuGroupId, mode: model.ComputeMode = model.ComputeMode.TIME_SLICING
    ) -> bool:
        """Put a share of ``mode`` on ``device`` of ``group``; returns True when this opens the group (a reservation
        pod), which then takes the share's mode."""
        opens = self.dev_group[device] is None
        if opens:
            self.dev_whole[device] = False
            self.dev_group[device] = group
            self.free_pods -= 1
            if mode is not model.ComputeMode.TIME_SLICING:
                self.modes[group] = mode
        self.dev_allotted[device] += milli
        measured = self.dev_meas[device]
        if measured is not None:
            self.dev_meas[device] = measured - devices.share_bytes(milli, self.dev_mem[device])
        self.refresh_device(device)
        self.whole_count = sum(self.dev_whole)
        return opens

    def give_back_share(self, device: int, milli: int) -> None:
        """Remove a share; the last share of a group frees the device (its reservation pod goes too)."""
        self.dev_allotted[device] = max(0, self.dev_allotted[device] - milli)
        measured = self.dev_meas[device]
        if measured is not None:
            self.dev_meas[device] = measured + devices.share_bytes(milli, self.dev_mem[device])
        if self.dev_allotted[device] == 0 and self.dev_group[device] is not None:
            self.dev_group[device] = None
            self.dev_whole[device] = self.dev_healthy[device]
            self.free_pods += 1
        self.refresh_device(device)
        self.whole_count = sum(self.dev_whole)

    def note_pod_gpus(self, whole_before: list[bool]) -> None:
        """After one placement or eviction: the devices it took whole went to one pod (so they count each other),
        and devices it freed or shared are held by no whole pod any more."""
        taken = [
            device
            for device, was_free in enumerate(whole_before)
            if was_free and not self.dev_whole[device] and self.dev_group[device] is None
        ]
        pod_gpus = self.dev_pod_gpus
        for device in range(len(pod_gpus)):
            if self.dev_whole[device] or self.dev_group[device] is not None or not self.dev_allotted[device]:
                pod_gpus[device] = 0
        for device in taken:
            pod_gpus[device] = len(taken)


def _pod_gpus(device: model.Device, on_node: tuple[model.Device, ...]) -> int:
    if not device.whole or not device.holders:
        return 0
    return sum(1 for other in on_node if other.whole and other.holders == device.holders)

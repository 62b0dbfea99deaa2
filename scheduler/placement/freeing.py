"""What evicting pods would free on a node, and whether that gives the pods room is made for more room there.

Room-making (``roommaking``) pools victims per node and evicts a node's pool once the node would hold more pods of
the group than it does now. These are the estimates it asks, by requests alone (an upper bound: GPU models and
measured memory are left to the real placement that follows): the room a node would have free once given pods leave
it (``free_after``: a device held whole is freed, a shared device gets its shares back and becomes whole again when
its last share leaves), how many pods of a shape that room holds (``pods_that_fit``), and, per node, whether a victim
frees something the node is short of (``Room.helps``) and whether a pool gives the node room for one more pod
(``Room.gains``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

from scheduler.placement import capacity, devices, model, nodework, search, shapes


@dataclasses.dataclass(slots=True)
class Free:
    """What a node would have free once some pods leave it (by requests: an upper bound)."""

    cpu: int
    memory: int
    slots: int
    room: list[int]
    """Per device, the share a pod could take there."""
    whole: list[bool]
    """Per device, free for a whole-GPU pod or a new GPU group."""


def free_after(work: nodework.NodeWork, leaving: Sequence[model.Pod]) -> Free:
    """The node's free room once ``leaving`` (pods on it) are gone. A device held whole becomes free when its pod
    leaves; a shared device gets its share back, and becomes free for a whole-GPU pod (its reservation pod going
    too) when the last share of its group leaves. GPU models and measured memory are left to the real placement."""
    state = Leaving(work)
    for pod in leaving:
        state.add(pod)
    return state.free


class Leaving:
    """``free_after`` kept up to date as pods leave a node one by one (``add``), for a search that asks again after
    each: the node itself must not change meanwhile. A pod counts once, however often it is added: victim units
    overlap (a gang's extras one by one, then together, then the whole gang), and a pod freeing its room twice
    would make a node look ready that is not."""

    __slots__ = ("_allotted", "_gone", "_work", "free")

    def __init__(self, work: nodework.NodeWork) -> None:
        self._work = work
        self.free = Free(
            cpu=work.free_cpu,
            memory=work.free_mem,
            slots=work.free_pods,
            room=list(work.dev_free),
            whole=list(work.dev_whole),
        )
        self._allotted: list[int] | None = None
        """The devices' allotments as the pods so far left them, copied only once a GPU pod leaves."""
        self._gone: set[model.PodUid] = set()

    def add(self, pod: model.Pod) -> bool:
        """``pod`` (on the node) leaves too; False when it had already (nothing changes then)."""
        gone = self._gone
        if pod.uid in gone:
            return False
        gone.add(pod.uid)
        free, work = self.free, self._work
        requests = pod.requests
        free.cpu += requests.milli_cpu
        free.memory += requests.memory_bytes
        free.slots += requests.pods
        room, whole = free.room, free.whole
        for device in pod.devices:
            if device >= len(room) or not work.dev_healthy[device]:
                continue
            allotted = self._allotted
            if allotted is None:
                allotted = self._allotted = list(work.dev_allotted)
            if pod.share is None:
                allotted[device] = 0
                room[device], whole[device] = devices.FULL, work.dev_group[device] is None
                continue
            allotted[device] = max(0, allotted[device] - pod.allotted_milli_gpu)
            if allotted[device] == 0 and work.dev_group[device] is not None:
                room[device], whole[device] = devices.FULL, True
                free.slots += 1  # the group's reservation pod goes with its last share
            else:
                room[device] = min(devices.FULL, room[device] + pod.allotted_milli_gpu)
        return True


def pods_that_fit(work: nodework.NodeWork, free: Free, shape: shapes.Shape, limit: int) -> int:
    """How many pods of ``shape`` (at most ``limit``) the free room holds, by requests."""
    count = _gpu_fit(work, free, shape, limit)
    if shape.milli_cpu > 0:
        count = min(count, max(0, free.cpu) // shape.milli_cpu)
    if shape.memory_bytes > 0:
        count = min(count, max(0, free.memory) // shape.memory_bytes)
    if shape.pods > 0:
        count = min(count, max(0, free.slots) // shape.pods)
    return count


def _gpu_fit(work: nodework.NodeWork, free: Free, shape: shapes.Shape, limit: int) -> int:
    """How many pods of ``shape`` (at most ``limit``) the node's devices hold, by GPU alone."""
    if shape.whole_gpus:
        return min(limit, free.whole.count(True) // shape.whole_gpus)
    if shape.share is None:
        return limit
    share = shape.share
    room = free.room
    if share.milli_gpu and not work.modes and share.compute_mode is model.ComputeMode.TIME_SLICING:
        # The common share: the same milli-GPU on every device, one mode (read without the per-device tuple).
        need = share.milli_gpu
        if share.devices == 1:
            return min(limit, sum(left // need for left in room if left >= need))
        return min(limit, sum(1 for left in room if left >= need) // share.devices)
    per_device = work.share_on_each(share)
    if work.modes or shape.share.compute_mode is not model.ComputeMode.TIME_SLICING:
        # A group of another compute mode is no room for this share unless its last share leaves (free.whole).
        mode = shape.share.compute_mode
        room = [left if free.whole[device] or work.joinable(device, mode) else 0 for device, left in enumerate(room)]
    if shape.share.devices == 1:
        held = 0
        for left, need in zip(room, per_device, strict=True):
            if 0 < need <= left:
                held += left // need
    else:
        held = sum(1 for left, need in zip(room, per_device, strict=True) if left >= need) // shape.share.devices
    return min(limit, held)


class Room:
    """Where the minimum's pods may go, and whether evicting given pods gives a node room for more of them."""

    def __init__(self, searcher: search.Searcher, wanted: Sequence[shapes.Shape]) -> None:
        """``wanted``: the shapes of the pods room is made for, one per pod."""
        self._capacity = searcher.capacity
        needed = collections.Counter(wanted)
        self._wanted = list(needed.items())
        self._eligible = [frozenset(searcher.eligible(shape.constraints)) for shape in needed]
        self._classes = frozenset(cls for classes in self._eligible for cls in classes)
        self._short_by_look: dict[
            tuple[capacity.Look | None, int], tuple[list[tuple[shapes.Shape, int, int]], Free]
        ] = {}

    def nodes_of(self, pods: Iterable[model.Pod]) -> list[model.NodeName]:
        """The nodes of ``pods`` that some pod of the minimum may use, in first-seen order."""
        found: list[model.NodeName] = []
        for pod in pods:
            name = pod.node
            if name is None or name in found:
                continue
            work = self._capacity.by_name.get(name)
            if work is not None and work.cls in self._classes:
                found.append(name)
        return found

    def usable(self, name: model.NodeName) -> bool:
        """May some pod of the minimum use the node?"""
        work = self._capacity.by_name.get(name)
        return work is not None and work.cls in self._classes

    def _short(self, name: model.NodeName) -> tuple[nodework.NodeWork, list[tuple[shapes.Shape, int, int]], Free]:
        """The node, the shapes it lacks room for (it holds fewer of them than the minimum has): each with that
        minimum count and the count it holds now, and its free room now. Kept per look and free pod slots (a look
        counts slots only up to ``capacity.LOOK_POD_SLOTS``, a minimum may need more), which also tells when the
        node changed: it is then filed under another look. (Nodes of one look differ in nothing ``Free`` holds.)"""
        work = self._capacity.by_name[name]
        look = self._capacity.look_of[work.order]
        key = (look, work.free_pods)
        found = self._short_by_look.get(key) if look is not None else None
        if found is None:
            now = free_after(work, ())
            short: list[tuple[shapes.Shape, int, int]] = []
            for (shape, needed), classes in zip(self._wanted, self._eligible, strict=True):
                if work.cls in classes:
                    count = pods_that_fit(work, now, shape, needed)
                    if count < needed:
                        short.append((shape, needed, count))
            found = (short, now)
            if look is not None:
                self._short_by_look[key] = found
        return work, found[0], found[1]

    def short(self, name: model.NodeName) -> bool:
        """Does the node hold fewer pods of some shape of the minimum than the minimum has (room-making's case)?"""
        return bool(self._short(name)[1])

    def helps(self, name: model.NodeName, pooled: Sequence[model.Pod], pods: Sequence[model.Pod]) -> bool:
        """Do ``pods`` free something the node is short of for one more pod of the minimum, ``pooled`` gone?"""
        work, short, now = self._short(name)
        if not short:
            return False
        leaving = [pod for pod in pooled if pod.node == name]
        # A pod the pool holds already frees nothing more.
        gone = {pod.uid for pod in leaving}
        on_node = [pod for pod in pods if pod.node == name and pod.uid not in gone]
        free = free_after(work, leaving) if leaving else now
        for shape, needed, _ in short:
            target = pods_that_fit(work, free, shape, needed) + 1
            if _gpu_fit(work, free, shape, target) < target and any(pod.devices for pod in on_node):
                return True
            short_of = (
                (free.cpu < target * shape.milli_cpu, sum(pod.requests.milli_cpu for pod in on_node)),
                (free.memory < target * shape.memory_bytes, sum(pod.requests.memory_bytes for pod in on_node)),
                (free.slots < target * shape.pods, len(on_node)),
            )
            if any(lacking and given > 0 for lacking, given in short_of):
                return True
        return False

    def gains_with(self, name: model.NodeName, free: Free) -> bool:
        """Would the node hold more pods of the minimum with ``free`` room (``free_after`` of some of its pods)?"""
        work, short, _ = self._short(name)
        return any(pods_that_fit(work, free, shape, needed) > before for shape, needed, before in short)

    def gains(self, name: model.NodeName, leaving: Sequence[model.Pod]) -> bool:
        """Would the node hold more pods of the minimum once ``leaving`` are gone?"""
        work, short, _ = self._short(name)
        if not short:
            return False
        free = free_after(work, [pod for pod in leaving if pod.node == name])
        return any(pods_that_fit(work, free, shape, needed) > before for shape, needed, before in short)

"""What is free where, indexed so that a pod finds its node without a scan over every node.

The engine keeps one ``Capacity`` for its whole life. Each cycle it is brought in step with the snapshot (only
nodes whose ``Node`` object changed are rebuilt), then the cycle's tentative placements and evictions mutate it
between ``Capacity.begin`` and ``Capacity.end``, which record the previous state of the node in an undo log, and at
the end of the cycle everything is undone, so the index mirrors the snapshot again. Nothing is copied wholesale.

Indexes, per node class (nodes that the static filters cannot tell apart, see ``filters.NodeClass``):

- ``whole[W]``: the nodes with exactly W free whole devices, sorted by node order (name order);
- ``shared``: every shared device with room left, as ``(free milli-GPU, free whole devices of its node, node order,
  device index)`` sorted, so a share finds its best fitting device by bisection;
- ``cpu``: every node as ``(free whole devices, free millicores, node order)`` sorted, for CPU-only pods;
- ``members``: every node of the class in node order;
- ``looks``: the nodes of the class grouped by how they look to placement (``Look``: the scorer's ``NodeState`` and
  the free pod slots), each group in node order, so a scored search scores each distinct look once and gives the pod
  to the look's first node instead of scoring every node. Looks that lost their last node are kept aside
  (``idle``, oldest out first, no more of them than live ones) with what the searcher learned about them, since a
  look that a cycle's tentative placements emptied usually fills again when the plan is applied.

Per-device accounting (``devices``) keeps the request-based free share and, where telemetry is fresh, the measured
free memory minus the margin; a share fits only where both allow it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import NamedTuple

from scheduler.placement import devices, filters, model, scoring

LOOK_POD_SLOTS = 16
"""A look records free pod slots up to this many. A pod takes one slot plus one per GPU group it opens (at most one
per device it asks for), so nodes with at least this many free slots are alike to every pod that needs fewer; the
searcher takes the rare pod that needs more node by node."""

# Idle looks kept beyond the number of live ones (see the module docstring).
_IDLE_LOOKS = 64

LookBest = tuple[int, tuple[int, ...], tuple[int, ...]]
"""The searcher's answer for one look and one pod shape: the best score, its devices, the share taken on each."""


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
        "look",
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
        self.look: Look | None = None
        """The look the node is indexed under (None while ``Capacity.begin`` has it out of the indexes)."""

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

    def look_key(self) -> tuple[object, ...]:
        """Equal for two nodes of a class exactly when placement cannot tell them apart (see ``Look``)."""
        return (
            self.free_cpu,
            self.free_mem,
            min(self.free_pods, LOOK_POD_SLOTS),
            tuple(self.dev_free),
            tuple(self.dev_whole),
            tuple(group is not None for group in self.dev_group),
            tuple(self.dev_pod_gpus),
            self.fixed,
        )

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
        )


def _pod_gpus(device: model.Device, on_node: tuple[model.Device, ...]) -> int:
    if not device.whole or not device.holders:
        return 0
    return sum(1 for other in on_node if other.whole and other.holders == device.holders)


def _note_pod_gpus(work: NodeWork, whole_before: list[bool]) -> None:
    """After one placement or eviction on ``work``: the devices it took whole went to one pod (so they count each
    other), and devices it freed or shared are held by no whole pod any more."""
    taken = [
        device
        for device, was_free in enumerate(whole_before)
        if was_free and not work.dev_whole[device] and work.dev_group[device] is None
    ]
    pod_gpus = work.dev_pod_gpus
    for device in range(len(pod_gpus)):
        if work.dev_whole[device] or work.dev_group[device] is not None or not work.dev_allotted[device]:
            pod_gpus[device] = 0
    for device in taken:
        pod_gpus[device] = len(taken)


class Look:
    """The nodes of one class that placement cannot tell apart, in node order, and what the searcher knows of them.

    Two nodes look alike when the scorer's ``NodeState`` is equal and so are their free pod slots (counted up to
    ``LOOK_POD_SLOTS``): the filters, the device choice and the scorer then treat them the same, so a search scores
    the look once and, as ties go to node order, only its first member can win. The quick-reject fields copy what
    the search checks first. ``best`` is the searcher's answer per pod shape id, valid while ``epoch`` matches its
    own (a new scorer or a new numbering of shapes starts a new epoch).
    """

    __slots__ = (
        "best",
        "epoch",
        "free_cpu",
        "free_mem",
        "free_pods",
        "key",
        "members",
        "most_share",
        "state",
        "whole_count",
    )

    def __init__(self, work: NodeWork, key: tuple[object, ...]) -> None:
        self.key = key
        self.members: list[int] = []
        self.free_cpu = work.free_cpu
        self.free_mem = work.free_mem
        self.free_pods = min(work.free_pods, LOOK_POD_SLOTS)
        self.whole_count = work.whole_count
        self.most_share = max(work.dev_free, default=0)
        self.state: scoring.NodeState | None = None
        self.best: dict[int, LookBest] = {}
        self.epoch = -1

    def scoring_state(self, work: NodeWork) -> scoring.NodeState:
        """The look's ``NodeState`` (built from ``work``, one of its members, the first time it is asked for)."""
        if self.state is None:
            self.state = work.build_state()
        return self.state


class ClassIndex:
    """The capacity indexes of one node class."""

    __slots__ = ("cpu", "idle", "looks", "members", "node_class", "shared", "whole")

    def __init__(self, node_class: filters.NodeClass) -> None:
        self.node_class = node_class
        self.whole: dict[int, list[int]] = {}
        self.shared: list[tuple[int, int, int, int]] = []
        self.cpu: list[tuple[int, int, int]] = []
        self.members: list[int] = []
        self.looks: dict[tuple[object, ...], Look] = {}
        """The looks with nodes, by key."""
        self.idle: dict[tuple[object, ...], Look] = {}
        """Looks without nodes now, by key, the longest idle first."""


UndoEntry = tuple[NodeWork, Saved]


class Capacity:
    """All nodes' working state and the indexes over it; see the module docstring for the life cycle."""

    def __init__(self) -> None:
        self.by_name: dict[model.NodeName, NodeWork] = {}
        self.by_order: list[NodeWork] = []
        self.classes: list[ClassIndex] = []
        self._class_ids: dict[filters.NodeClass, int] = {}
        self._margin_bytes: int | None = None
        self.undo: list[UndoEntry] = []
        self.structure_version = 0
        """Bumped when nodes come or go, or a node's class or allocatable changes: what NeverFits depends on."""
        self.state_version = 0
        """Bumped whenever anything the engine reads from a node changed: the same version means the same plan."""
        self.offered = [0, 0, 0]
        """GPU (milli), CPU (milli), memory (bytes) of ready nodes (healthy devices only), as the snapshot has it."""
        self.used = [0, 0, 0]
        """What every pod on ready nodes holds (ours and other schedulers'), as the snapshot has it."""
        self.max_device_memory = 0
        self.label_keys: frozenset[str] = frozenset()
        """The node label keys some pod's constraints read: only these distinguish node classes."""

    # --- keeping in step with the snapshot ------------------------------------------------------------------

    def sync(
        self, nodes: Mapping[model.NodeName, model.Node], *, margin_bytes: int, label_keys: frozenset[str]
    ) -> None:
        """Bring the index in step with ``nodes``, rebuilding only nodes whose object changed.

        ``label_keys`` only ever grows between rebuilds: a key that pods stop asking about keeps splitting classes
        until the next full rebuild, which costs a little speed and nothing else.
        """
        if self.undo:
            raise RuntimeError("Capacity.sync during a cycle: roll back first")
        if not label_keys <= self.label_keys:
            self.label_keys = self.label_keys | label_keys
            self._rebuild(nodes, margin_bytes)
            return
        if margin_bytes != self._margin_bytes or len(nodes) != len(self.by_name):
            self._rebuild(nodes, margin_bytes)
            return
        by_name = self.by_name
        changed: list[tuple[NodeWork, model.Node]] = []
        for name, node in nodes.items():
            work = by_name.get(name)
            if work is None:
                self._rebuild(nodes, margin_bytes)
                return
            if work.node is not node:
                changed.append((work, node))
        for work, node in changed:
            self._replace(work, node)

    def _rebuild(self, nodes: Mapping[model.NodeName, model.Node], margin_bytes: int) -> None:
        self._margin_bytes = margin_bytes
        self.structure_version += 1
        self.state_version += 1
        self.classes = []
        self._class_ids = {}
        self.by_name = {}
        self.by_order = []
        self.offered = [0, 0, 0]
        self.used = [0, 0, 0]
        self.max_device_memory = max(
            (device.memory_bytes for node in nodes.values() for device in node.devices), default=0
        )
        for order, name in enumerate(sorted(nodes)):
            node = nodes[name]
            work = NodeWork(node, order=order, cls=self._class_id(node), margin_bytes=margin_bytes)
            self.by_name[name] = work
            self.by_order.append(work)
            self.classes[work.cls].members.append(order)
            self._index(work)
            self._count(node, 1)

    def _class_id(self, node: model.Node) -> int:
        key = filters.node_class(node, self.label_keys)
        found = self._class_ids.get(key)
        if found is None:
            found = len(self.classes)
            self._class_ids[key] = found
            self.classes.append(ClassIndex(key))
        return found

    def _replace(self, work: NodeWork, node: model.Node) -> None:
        old = work.node
        margin = self._margin_bytes or 0
        fresh = NodeWork(node, order=work.order, cls=self._class_id(node), margin_bytes=margin)
        if fresh.cls != work.cls or old.allocatable != node.allocatable or len(old.devices) != len(node.devices):
            self.structure_version += 1
        if _visible(fresh) != _visible(work):
            self.state_version += 1
        self._unindex(work)
        if fresh.cls != work.cls:
            members = self.classes[work.cls].members
            del members[bisect.bisect_left(members, work.order)]
            bisect.insort(self.classes[fresh.cls].members, fresh.order)
        self.by_name[fresh.name] = fresh
        self.by_order[fresh.order] = fresh
        self._index(fresh)
        self._count(old, -1)
        self._count(node, 1)
        for device in node.devices:
            self.max_device_memory = max(self.max_device_memory, device.memory_bytes)

    def _count(self, node: model.Node, sign: int) -> None:
        if not node.ready:
            return
        offered, used = self.offered, self.used
        offered[0] += sign * model.MILLI_GPU_PER_DEVICE * sum(1 for device in node.devices if device.healthy)
        offered[1] += sign * node.allocatable.milli_cpu
        offered[2] += sign * node.allocatable.memory_bytes
        used[0] += sign * sum(device.allotted_milli_gpu for device in node.devices if device.healthy)
        used[1] += sign * node.used.milli_cpu
        used[2] += sign * node.used.memory_bytes

    # --- indexes --------------------------------------------------------------------------------------------

    def _index(self, work: NodeWork) -> None:
        index = self.classes[work.cls]
        bisect.insort(index.cpu, (work.whole_count, work.free_cpu, work.order))
        if work.whole_count:
            bisect.insort(index.whole.setdefault(work.whole_count, []), work.order)
        for device, group in enumerate(work.dev_group):
            if group is not None and work.dev_free[device] > 0:
                bisect.insort(index.shared, (work.dev_free[device], work.whole_count, work.order, device))
        key = work.look_key()
        look = index.looks.get(key)
        if look is None:
            look = index.idle.pop(key, None) or Look(work, key)
            index.looks[key] = look
        bisect.insort(look.members, work.order)
        work.look = look

    def _unindex(self, work: NodeWork) -> None:
        index = self.classes[work.cls]
        del index.cpu[bisect.bisect_left(index.cpu, (work.whole_count, work.free_cpu, work.order))]
        if work.whole_count:
            bucket = index.whole[work.whole_count]
            del bucket[bisect.bisect_left(bucket, work.order)]
        for device, group in enumerate(work.dev_group):
            if group is not None and work.dev_free[device] > 0:
                entry = (work.dev_free[device], work.whole_count, work.order, device)
                del index.shared[bisect.bisect_left(index.shared, entry)]
        look = work.look
        if look is None:
            raise RuntimeError(f"node {work.name} is not indexed")
        work.look = None
        members = look.members
        del members[bisect.bisect_left(members, work.order)]
        if not members:
            del index.looks[look.key]
            idle = index.idle
            idle[look.key] = look
            if len(idle) > len(index.looks) + _IDLE_LOOKS:
                del idle[next(iter(idle))]

    # --- tentative changes ------------------------------------------------------------------------------------

    def begin(self, work: NodeWork) -> None:
        """Call before changing ``work``: takes it out of the indexes and remembers its state for undo."""
        self._unindex(work)
        self.undo.append((work, work.save()))

    def end(self, work: NodeWork) -> None:
        """Call after changing ``work`` (one placement or eviction since ``begin``): puts it back into the indexes."""
        began, saved = self.undo[-1]
        if began is not work:
            raise RuntimeError(f"Capacity.end({work.name}) without its begin")
        _note_pod_gpus(work, saved.dev_whole)
        self._index(work)

    def checkpoint(self) -> int:
        return len(self.undo)

    def rollback(self, checkpoint: int) -> None:
        """Undo every change made after ``checkpoint`` (the newest first)."""
        undo = self.undo
        while len(undo) > checkpoint:
            work, saved = undo.pop()
            self._unindex(work)
            work.restore(saved)
            self._index(work)


def _visible(work: NodeWork) -> tuple[object, ...]:
    """Everything the engine can read from a node, plans and messages alike: equal means interchangeable."""
    return (
        work.cls,
        work.alloc_cpu,
        work.alloc_mem,
        work.save(),
        work.dev_mem,
        work.dev_model,
        work.dev_healthy,
        work.node.used.pods,
        tuple(device.unattributed_bytes for device in work.node.devices),
    )

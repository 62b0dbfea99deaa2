"""What is free where, indexed so that a pod finds its node without a scan over every node.

The engine keeps one ``Capacity`` for its whole life. Each cycle it is brought in step with the snapshot (only
nodes whose ``Node`` object changed are rebuilt), then the cycle's tentative placements and evictions mutate it
through ``Capacity.mutate``, which records the previous state of the node in an undo log, and at the end of the
cycle everything is undone, so the index mirrors the snapshot again. Nothing is ever copied wholesale.

Indexes, per node class (nodes that the static filters cannot tell apart, see ``filters.NodeClass``):

- ``whole[W]``: the nodes with exactly W free whole devices, sorted by node order (name order);
- ``shared``: every shared device with room left, as ``(free milli-GPU, free whole devices of its node, node order,
  device index)`` sorted, so a share finds its best fitting device by bisection;
- ``cpu``: every node as ``(free whole devices, free millicores, node order)`` sorted, for CPU-only pods;
- ``members``: every node of the class in node order (for the scored search).

Per-device accounting (``devices``) keeps the request-based free share and, where telemetry is fresh, the measured
free memory minus the margin; a share fits only where both allow it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from scheduler.placement import devices, filters, model, scoring


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
        "dev_whole",
        "free_cpu",
        "free_mem",
        "free_pods",
        "name",
        "node",
        "order",
        "scored_state",
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
        self.scored_state: scoring.NodeState | None = None

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

    def save(self) -> tuple[object, ...]:
        return (
            self.free_cpu,
            self.free_mem,
            self.free_pods,
            self.dev_allotted.copy(),
            self.dev_whole.copy(),
            self.dev_group.copy(),
            self.dev_meas.copy(),
            self.dev_free.copy(),
            self.whole_count,
        )

    def restore(self, saved: tuple[object, ...]) -> None:
        (
            self.free_cpu,
            self.free_mem,
            self.free_pods,
            self.dev_allotted,
            self.dev_whole,
            self.dev_group,
            self.dev_meas,
            self.dev_free,
            self.whole_count,
        ) = saved  # type: ignore[assignment]

    def state(self) -> scoring.NodeState:
        """The node as a scorer sees it (cached until the node changes)."""
        if self.scored_state is None:
            self.scored_state = self._build_state()
        return self.scored_state

    def _build_state(self) -> scoring.NodeState:
        return scoring.NodeState(
            free_milli_cpu=self.free_cpu,
            free_memory_bytes=self.free_mem,
            allocatable_milli_cpu=self.alloc_cpu,
            allocatable_memory_bytes=self.alloc_mem,
            device_free_milli=tuple(self.dev_free),
            device_memory_bytes=self.dev_mem,
            device_whole_free=tuple(self.dev_whole),
            device_shared=tuple(group is not None for group in self.dev_group),
        )


class ClassIndex:
    """The capacity indexes of one node class."""

    __slots__ = ("cpu", "members", "node_class", "shared", "whole")

    def __init__(self, node_class: filters.NodeClass) -> None:
        self.node_class = node_class
        self.whole: dict[int, list[int]] = {}
        self.shared: list[tuple[int, int, int, int]] = []
        self.cpu: list[tuple[int, int, int]] = []
        self.members: list[int] = []


UndoEntry = tuple[NodeWork, tuple[object, ...]]


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

    # --- tentative changes ------------------------------------------------------------------------------------

    def begin(self, work: NodeWork) -> None:
        """Call before changing ``work``: takes it out of the indexes and remembers its state for undo."""
        self._unindex(work)
        self.undo.append((work, work.save()))
        work.scored_state = None

    def end(self, work: NodeWork) -> None:
        """Call after changing ``work``: puts it back into the indexes."""
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
            work.scored_state = None
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

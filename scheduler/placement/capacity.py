"""What is free where, indexed so that a pod finds its node without a scan over every node.

The engine keeps one ``Capacity`` for its whole life. Each cycle it is brought in step with the snapshot (only
nodes whose ``Node`` object changed are rebuilt), then the cycle's tentative placements and evictions mutate it
between ``Capacity.begin`` and ``Capacity.end``, which record the previous state of the node in an undo log, and at
the end of the cycle everything is undone, so the index mirrors the snapshot again. Nothing is copied wholesale.

Indexes, per node class (nodes that the static filters cannot tell apart, see ``filters.NodeClass``):

- ``whole[W]``: the nodes with exactly W free whole devices, sorted by node order (name order);
- ``shared[W]``: every shared device with room left on the nodes with exactly W free whole devices, as ``(free
  milli-GPU, node order, device index)`` sorted, so a share finds the best fitting device of the best nodes by
  bisection;
- ``cpu``: every node as ``(free whole devices, free millicores, node order)`` sorted, for CPU-only pods;
- ``members``: every node of the class in node order;
- ``looks``: the nodes of the class grouped by how they look to placement (``Look``: the scorer's ``NodeState`` and
  the free pod slots), each group in node order, so a scored search scores each distinct look once and gives the pod
  to the look's first node instead of scoring every node. Looks that lost their last node are kept aside
  (``idle``, oldest out first, no more of them than live ones) with what the searcher learned about them, since a
  look that a cycle's tentative placements emptied usually fills again when the plan is applied.

Each node's working state is a ``nodework.NodeWork``: per device the request-based free share and, where telemetry
is fresh, the measured free memory minus the margin (``devices``); a share fits only where both allow it. The index
keeps which look each node is filed under (``look_of``), so a node's state holds no pointer back into the index.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from common.resources import Resources
from scheduler.placement import filters, model, nodework, scoring

LOOK_POD_SLOTS = 16
"""A look records free pod slots up to this many. A pod takes one slot plus one per GPU group it opens (at most one
per device it asks for), so nodes with at least this many free slots are alike to every pod that needs fewer; the
searcher takes the rare pod that needs more node by node."""

# Idle looks kept beyond the number of live ones (see the module docstring).
_IDLE_LOOKS = 64
# The log of nodes that gained room starts afresh past this many entries (every "fits nowhere" verdict then expires).
_GROWN_LIMIT = 100_000
# The log of looks that came to have nodes starts afresh past this many entries (every ranking then starts afresh).
_LOOK_LOG_LIMIT = 200_000

LookBest = tuple[int, tuple[int, ...], tuple[int, ...]]
"""The searcher's answer for one look and one pod shape: the best score, its devices, the share taken on each."""


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
        "cls",
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

    def __init__(self, work: nodework.NodeWork, key: tuple[object, ...]) -> None:
        self.key = key
        self.cls = work.cls
        self.members: list[int] = []
        self.free_cpu = work.free_cpu
        self.free_mem = work.free_mem
        self.free_pods = min(work.free_pods, LOOK_POD_SLOTS)
        self.whole_count = work.whole_count
        self.most_share = max(work.dev_free, default=0)
        self.state: scoring.NodeState | None = None
        self.best: dict[int, LookBest] = {}
        self.epoch = -1

    def scoring_state(self, work: nodework.NodeWork) -> scoring.NodeState:
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
        self.shared: dict[int, list[tuple[int, int, int]]] = {}
        self.cpu: list[tuple[int, int, int]] = []
        self.members: list[int] = []
        self.looks: dict[tuple[object, ...], Look] = {}
        """The looks with nodes, by key."""
        self.idle: dict[tuple[object, ...], Look] = {}
        """Looks without nodes now, by key, the longest idle first."""


UndoEntry = tuple[nodework.NodeWork, nodework.Saved]


class Capacity:
    """All nodes' working state and the indexes over it; see the module docstring for the life cycle."""

    def __init__(self) -> None:
        self.by_name: dict[model.NodeName, nodework.NodeWork] = {}
        self.by_order: list[nodework.NodeWork] = []
        self.classes: list[ClassIndex] = []
        self._class_ids: dict[filters.NodeClass, int] = {}
        self._margin_bytes: int | None = None
        self.undo: list[UndoEntry] = []
        self.structure_version = 0
        """Bumped when nodes come or go, or a node's class or allocatable changes: what NeverFits depends on."""
        self.state_version = 0
        """Bumped whenever anything the engine reads from a node changed: the same version means the same plan."""
        self.look_of: list[Look | None] = []
        """The look each node (by order) is indexed under; None while ``begin`` has it out of the indexes."""
        self.offered = model.ZERO
        """GPU, CPU and memory of ready nodes (healthy devices only), as the snapshot has it; no pod slots."""
        self.used = model.ZERO
        """What every pod on ready nodes holds (ours and other schedulers'), as the snapshot has it; no pod slots."""
        self.max_device_memory = 0
        self.label_keys: frozenset[str] = frozenset()
        """The node label keys some pod's constraints read: only these distinguish node classes."""
        self.grown: list[int] = []
        """The nodes (by order) that may have gained room, in the order it happened, since a search last found
        nothing for a pod (``nowhere``): an eviction, a rollback past such a search, a node that changed in the
        snapshot. Placements only take room, so a pod that fitted nowhere can fit only on a node logged since."""
        self.generation = 0
        """Bumped when the log starts afresh (nodes rebuilt, or the log grew long): older positions mean nothing."""
        self.look_log: list[Look] = []
        """Every look that came to have nodes (new, or back from idle) or whose first node came earlier (a node
        before its others joined it), in order: what ``lookrank`` heaps read."""
        self.look_generation = 0
        """Bumped when ``look_log`` starts afresh (nodes rebuilt, or the log grew long)."""
        self._noted_depth = -1
        """The deepest point of the undo log at which a search found nothing since the last rollback past it."""
        self.changes: list[int] = []
        """Every node (by order) changed in this cycle (a placement, an eviction, a rollback), in order and with
        repeats: what ``earliest`` reads to bring its answers up to date. ``sync`` starts it afresh."""
        self.changes_epoch = 0
        """Bumped when ``changes`` starts afresh: an older position in it means nothing."""

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
        self.changes = []
        self.changes_epoch += 1
        if not label_keys <= self.label_keys:
            self.label_keys = self.label_keys | label_keys
            self._rebuild(nodes, margin_bytes)
            return
        if margin_bytes != self._margin_bytes or len(nodes) != len(self.by_name):
            self._rebuild(nodes, margin_bytes)
            return
        by_name = self.by_name
        changed: list[tuple[nodework.NodeWork, model.Node]] = []
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
        self.generation += 1
        self.grown = []
        self.look_generation += 1
        self.look_log = []
        self._margin_bytes = margin_bytes
        self.structure_version += 1
        self.state_version += 1
        self.classes = []
        self._class_ids = {}
        self.by_name = {}
        self.by_order = []
        self.look_of = [None] * len(nodes)
        self.offered = model.ZERO
        self.used = model.ZERO
        self.max_device_memory = max(
            (device.memory_bytes for node in nodes.values() for device in node.devices), default=0
        )
        for order, name in enumerate(sorted(nodes)):
            node = nodes[name]
            work = nodework.NodeWork(node, order=order, cls=self._class_id(node), margin_bytes=margin_bytes)
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

    def _replace(self, work: nodework.NodeWork, node: model.Node) -> None:
        self.grew(work.order)
        old = work.node
        margin = self._margin_bytes or 0
        fresh = nodework.NodeWork(node, order=work.order, cls=self._class_id(node), margin_bytes=margin)
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
        offered = Resources(
            milli_gpu=model.MILLI_GPU_PER_DEVICE * sum(1 for device in node.devices if device.healthy),
            milli_cpu=node.allocatable.milli_cpu,
            memory_bytes=node.allocatable.memory_bytes,
        )
        used = Resources(
            milli_gpu=sum(device.allotted_milli_gpu for device in node.devices if device.healthy),
            milli_cpu=node.used.milli_cpu,
            memory_bytes=node.used.memory_bytes,
        )
        if sign > 0:
            self.offered, self.used = self.offered + offered, self.used + used
        else:
            self.offered, self.used = self.offered - offered, self.used - used

    # --- indexes --------------------------------------------------------------------------------------------

    def _index(self, work: nodework.NodeWork) -> None:
        index = self.classes[work.cls]
        bisect.insort(index.cpu, (work.whole_count, work.free_cpu, work.order))
        if work.whole_count:
            bisect.insort(index.whole.setdefault(work.whole_count, []), work.order)
        for device, group in enumerate(work.dev_group):
            if group is not None and work.dev_free[device] > 0:
                bisect.insort(
                    index.shared.setdefault(work.whole_count, []), (work.dev_free[device], work.order, device)
                )
        key = _look_key(work)
        look = index.looks.get(key)
        members: list[int] | None = None
        if look is None:
            look = index.idle.pop(key, None) or Look(work, key)
            index.looks[key] = look
        else:
            members = look.members
        bisect.insort(look.members, work.order)
        self.look_of[work.order] = look
        if members is None or members[0] == work.order:
            # A look with nodes again, or one whose first node comes earlier: a ranking keyed by it reads it again.
            log = self.look_log
            if len(log) >= _LOOK_LOG_LIMIT:
                self.look_generation += 1
                self.look_log = log = []
            log.append(look)

    def _unindex(self, work: nodework.NodeWork) -> None:
        index = self.classes[work.cls]
        del index.cpu[bisect.bisect_left(index.cpu, (work.whole_count, work.free_cpu, work.order))]
        if work.whole_count:
            bucket = index.whole[work.whole_count]
            del bucket[bisect.bisect_left(bucket, work.order)]
        for device, group in enumerate(work.dev_group):
            if group is not None and work.dev_free[device] > 0:
                shared = index.shared[work.whole_count]
                del shared[bisect.bisect_left(shared, (work.dev_free[device], work.order, device))]
        look = self.look_of[work.order]
        if look is None:
            raise RuntimeError(f"node {work.name} is not indexed")
        self.look_of[work.order] = None
        members = look.members
        del members[bisect.bisect_left(members, work.order)]
        if not members:
            del index.looks[look.key]
            idle = index.idle
            idle[look.key] = look
            if len(idle) > len(index.looks) + _IDLE_LOOKS:
                del idle[next(iter(idle))]

    # --- tentative changes ------------------------------------------------------------------------------------

    def begin(self, work: nodework.NodeWork) -> None:
        """Call before changing ``work``: takes it out of the indexes and remembers its state for undo."""
        self._unindex(work)
        self.undo.append((work, work.save()))

    def end(self, work: nodework.NodeWork) -> None:
        """Call after changing ``work`` (one placement or eviction since ``begin``): puts it back into the indexes."""
        began, saved = self.undo[-1]
        if began is not work:
            raise RuntimeError(f"Capacity.end({work.name}) without its begin")
        work.note_pod_gpus(saved.dev_whole)
        self._index(work)
        self.changes.append(work.order)

    def checkpoint(self) -> int:
        return len(self.undo)

    def grew(self, order: int) -> None:
        """The node ``order`` may have more room than before (see ``grown``)."""
        grown = self.grown
        if len(grown) >= _GROWN_LIMIT:
            self.generation += 1
            self.grown = grown = []
        grown.append(order)

    def nowhere(self) -> tuple[int, int]:
        """A search found nothing for a pod now: where that verdict stands in the log (``generation``, position)."""
        self._noted_depth = max(self._noted_depth, len(self.undo))
        return self.generation, len(self.grown)

    def rollback(self, checkpoint: int) -> None:
        """Undo every change made after ``checkpoint`` (the newest first)."""
        undo = self.undo
        if len(undo) > checkpoint and self._noted_depth > checkpoint:
            # a search that found nothing saw less room on these nodes than they have once this is undone
            for work, _ in undo[checkpoint:]:
                self.grew(work.order)
            self._noted_depth = checkpoint
        while len(undo) > checkpoint:
            work, saved = undo.pop()
            self._unindex(work)
            work.restore(saved)
            self._index(work)
            self.changes.append(work.order)


def _look_key(work: nodework.NodeWork) -> tuple[object, ...]:
    """Equal for two nodes of a class exactly when placement cannot tell them apart (see ``Look``)."""
    return (
        work.free_cpu,
        work.free_mem,
        min(work.free_pods, LOOK_POD_SLOTS),
        tuple(work.dev_free),
        tuple(work.dev_whole),
        # Which devices are shared, and in which compute mode where some group is not in the default one.
        work.device_modes() if work.modes else tuple(group is not None for group in work.dev_group),
        tuple(work.dev_pod_gpus),
        work.fixed,
    )


def _visible(work: nodework.NodeWork) -> tuple[object, ...]:
    """Everything the engine can read from a node, plans and messages alike: equal means interchangeable."""
    return (
        work.cls,
        work.alloc_cpu,
        work.alloc_mem,
        work.save(),
        work.device_modes() if work.modes else (),
        work.dev_mem,
        work.dev_model,
        work.dev_healthy,
        work.node.used.pods,
        tuple(device.unattributed_bytes for device in work.node.devices),
    )

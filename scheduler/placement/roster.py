"""What the engine knows about the groups between cycles: who waits and who runs in each queue, and what they add up
to.

The engine keeps one ``Roster`` for its whole life and brings it in step with each snapshot's groups, reading only
the groups whose object changed (and nothing at all when the snapshot reuses the last ``groups`` mapping): each
group's *contribution* (what it asks for and holds, in the three resources queues account, whether it waits, runs,
is stale or nominated, the share sizes and node label keys its pending pods read) is computed once and added to or
taken from the per-queue aggregates. A cycle (``cycle.Cycle``) reads the sorted views (pending groups per queue by
priority then age, running groups per queue by id) and the per-pod ``shapes.Shape`` cache, and records here the
groups that can never fit (``NeverFits``), which stay recorded until the group or the queues change.

A gpu-memory share is counted against the largest device of the cluster before it is placed (``gangs.pending_gpu``),
so a new largest device changes every contribution: the roster then forgets everything and reads every group again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from common.resources import Resources
from scheduler.placement import filters, gangs, model, ordering, plan, shapes, status

_PRESENT = (model.PodPhase.PENDING, model.PodPhase.RUNNING)


class NeverFits(NamedTuple):
    """Whether a group can never fit as the cluster and queues stood: the group, those versions, and its status
    (None: it may fit; kept too, so that a backlog's groups are not checked again every cycle)."""

    group: model.Group
    key: tuple[int, int]
    status: status.Status | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Contribution:
    """What one group adds to its queue's aggregates (pending and running requests, running holdings)."""

    requested: Resources
    allocated: Resources
    nonpreemptible: Resources
    pending: bool
    running: bool
    stale: bool
    share_sizes: tuple[int, ...]
    label_keys: frozenset[str]
    nominated: bool


def _contribution(group: model.Group, reference_memory: int) -> _Contribution:
    # Summed in plain integers: this runs for every pod of every changed group, each cycle.
    requested_gpu = requested_cpu = requested_memory = 0
    held_gpu = held_cpu = held_memory = 0
    pending = running = nominated = False
    sizes: list[int] = []
    keys: set[str] = set()
    for pod in group.members:
        if pod.phase is model.PodPhase.PENDING:
            pending = True
            nominated = nominated or pod.nominated_node is not None
            if pod.node_selector or pod.affinity:
                keys.update(filters.label_keys(pod))
            gpu = gangs.pending_gpu(pod, reference_memory)
            if pod.share is not None and pod.share.milli_gpu:
                sizes.append(pod.share.milli_gpu)
        elif pod.phase is model.PodPhase.RUNNING:
            running = True
            gpu = plan.held_milli_gpu(pod)
            held_gpu += gpu
            held_cpu += pod.requests.milli_cpu
            held_memory += pod.requests.memory_bytes
        else:
            continue
        requested_gpu += gpu
        requested_cpu += pod.requests.milli_cpu
        requested_memory += pod.requests.memory_bytes
    held = Resources(milli_gpu=held_gpu, milli_cpu=held_cpu, memory_bytes=held_memory)
    return _Contribution(
        requested=Resources(milli_gpu=requested_gpu, milli_cpu=requested_cpu, memory_bytes=requested_memory),
        allocated=held,
        nonpreemptible=model.ZERO if group.preemptible else held,
        pending=pending,
        running=running,
        stale=group.below_min_since_ns is not None,
        share_sizes=tuple(sizes),
        label_keys=frozenset(keys),
        nominated=nominated,
    )


def _add(totals: dict[model.QueueName, Resources], queue: model.QueueName, amounts: Resources, sign: int) -> None:
    before = totals.get(queue, model.ZERO)
    totals[queue] = before + amounts if sign > 0 else before - amounts


class Roster:
    """The groups of the last snapshot, indexed per queue; see the module docstring."""

    def __init__(self) -> None:
        self._seen: dict[model.GroupId, model.Group] = {}
        self._contrib: dict[model.GroupId, _Contribution] = {}
        self.requested: dict[model.QueueName, Resources] = {}
        """Per leaf queue, what its pending and running pods ask for."""
        self.allocated: dict[model.QueueName, Resources] = {}
        """Per leaf queue, what its running pods hold."""
        self.nonpreemptible: dict[model.QueueName, Resources] = {}
        """Per leaf queue, what its non-preemptible running pods hold."""
        self._pending: dict[model.QueueName, dict[model.GroupId, model.Group]] = {}
        self._running: dict[model.QueueName, dict[model.GroupId, model.Group]] = {}
        self._stale: dict[model.GroupId, model.Group] = {}
        self._nominated: dict[model.GroupId, model.Group] = {}
        self._sizes: dict[int, int] = {}
        self._sorted_pending: dict[model.QueueName, list[model.Group]] = {}
        self._sorted_running: dict[model.QueueName, list[model.Group]] = {}
        self._dirty_pending: set[model.QueueName] = set()
        self._dirty_running: set[model.QueueName] = set()
        self._groups_mapping: Mapping[model.GroupId, model.Group] | None = None
        self._shapes: dict[model.PodUid, tuple[model.Pod, shapes.Shape]] = {}
        self.reference_memory = -1
        """The largest device memory: gpu-memory shares are counted against it before placement."""
        self.label_keys: frozenset[str] = frozenset()
        """The node label keys some pending pod's selector or affinity reads (only ever grows)."""
        self.version = 0
        """Bumped whenever a group came, went or changed."""
        self.never: dict[model.GroupId, NeverFits] = {}
        """The never-fits verdict of each group checked (``NeverFits``); a group's entry goes when the group changes."""
        self._per_queue: dict[model.QueueName, int] = {}
        self._queue_names: tuple[int, frozenset[model.QueueName]] = (0, frozenset())
        self._members: dict[model.GroupId, frozenset[model.PodUid]] = {}
        """Per group, the pods seen in it so far: a pod not among them is an arrival."""
        self.arrivals: list[model.Pod] = []
        """Pending and running pods seen for the first time since the engine last took them (``take_arrivals``)."""

    def sync(self, groups: Mapping[model.GroupId, model.Group], *, reference_memory: int) -> None:
        """Bring the roster in step with ``groups``, reading only the groups whose object changed."""
        if reference_memory != self.reference_memory:
            # gpu-memory shares are counted against the largest device: a new largest device changes every count
            self.reference_memory = reference_memory
            for group in list(self._seen.values()):
                self._forget(group)
            self._groups_mapping = None
        if groups is self._groups_mapping:
            return  # the same mapping as last cycle: snapshots are never mutated, so nothing changed
        self._groups_mapping = groups
        seen = self._seen
        changed = [group for key, group in groups.items() if seen.get(key) is not group]
        if not changed and len(groups) == len(seen):
            return
        new = sum(1 for group in changed if group.id not in seen)
        if len(seen) + new != len(groups):
            for key in [key for key in seen if key not in groups]:
                self._forget(seen[key])
        self.version += 1
        known = self._members
        for group in changed:
            old = seen.get(group.id)
            if old is not None:
                self._forget(old)
            self._remember(group)
            before = known.get(group.id, frozenset())
            uids = frozenset(pod.uid for pod in group.members)
            if uids != before:
                self.arrivals.extend(pod for pod in group.members if pod.uid not in before and pod.phase in _PRESENT)
                known[group.id] = uids
        if len(known) > len(groups):
            for key in [key for key in known if key not in groups]:
                del known[key]

    def take_arrivals(self) -> list[model.Pod]:
        """The arrivals since the last call, oldest first (creation time, then uid), and forget them."""
        found = sorted(self.arrivals, key=lambda pod: (pod.created_ns, pod.uid))
        self.arrivals = []
        return found

    def _remember(self, group: model.Group) -> None:
        contribution = _contribution(group, self.reference_memory)
        self._seen[group.id] = group
        self._contrib[group.id] = contribution
        queue = group.queue
        self._per_queue[queue] = self._per_queue.get(queue, 0) + 1
        _add(self.requested, queue, contribution.requested, 1)
        _add(self.allocated, queue, contribution.allocated, 1)
        _add(self.nonpreemptible, queue, contribution.nonpreemptible, 1)
        if contribution.pending:
            self._pending.setdefault(queue, {})[group.id] = group
            self._dirty_pending.add(queue)
        if contribution.running:
            self._running.setdefault(queue, {})[group.id] = group
            self._dirty_running.add(queue)
        if contribution.stale:
            self._stale[group.id] = group
        if contribution.nominated:
            self._nominated[group.id] = group
        for size in contribution.share_sizes:
            self._sizes[size] = self._sizes.get(size, 0) + 1
        if not contribution.label_keys <= self.label_keys:
            self.label_keys = self.label_keys | contribution.label_keys

    def _forget(self, group: model.Group) -> None:
        contribution = self._contrib.pop(group.id)
        del self._seen[group.id]
        self.never.pop(group.id, None)
        for pod in group.members:
            self._shapes.pop(pod.uid, None)
        queue = group.queue
        self._per_queue[queue] -= 1
        if not self._per_queue[queue]:
            del self._per_queue[queue]
        _add(self.requested, queue, contribution.requested, -1)
        _add(self.allocated, queue, contribution.allocated, -1)
        _add(self.nonpreemptible, queue, contribution.nonpreemptible, -1)
        if contribution.pending:
            del self._pending[queue][group.id]
            self._dirty_pending.add(queue)
        if contribution.running:
            del self._running[queue][group.id]
            self._dirty_running.add(queue)
        if contribution.stale:
            del self._stale[group.id]
        if contribution.nominated:
            del self._nominated[group.id]
        for size in contribution.share_sizes:
            self._sizes[size] -= 1

    # --- views a cycle reads --------------------------------------------------------------------------------------

    def queue_names(self) -> frozenset[model.QueueName]:
        """The queues the groups name (existing or not)."""
        if self._queue_names[0] != self.version:
            self._queue_names = (self.version, frozenset(self._per_queue))
        return self._queue_names[1]

    def demanded_shares(self) -> tuple[int, ...]:
        """The share sizes (milli-GPU) pending pods ask for, ascending."""
        return tuple(sorted(size for size, count in self._sizes.items() if count > 0))

    def pending_queues(self) -> list[model.QueueName]:
        """Queues (existing or not) that have pending groups, sorted."""
        return sorted(queue for queue, groups in self._pending.items() if groups)

    def nominated_groups(self) -> list[model.Group]:
        """Pending groups with a pod nominated to room made for it earlier, by priority then age."""
        return sorted(self._nominated.values(), key=ordering.group_key)

    def stale_groups(self) -> list[model.Group]:
        """Running groups marked below their minimum, by id."""
        return sorted(self._stale.values(), key=lambda group: group.id)

    def pending_groups(self, queue: model.QueueName) -> list[model.Group]:
        if queue in self._dirty_pending or queue not in self._sorted_pending:
            self._sorted_pending[queue] = sorted(self._pending.get(queue, {}).values(), key=ordering.group_key)
            self._dirty_pending.discard(queue)
        return self._sorted_pending[queue]

    def running_groups(self) -> dict[model.QueueName, Sequence[model.Group]]:
        for queue in sorted(self._dirty_running):
            self._sorted_running[queue] = sorted(self._running.get(queue, {}).values(), key=lambda group: group.id)
        self._dirty_running.clear()
        return {queue: groups for queue, groups in sorted(self._sorted_running.items()) if groups}

    def shape(self, pod: model.Pod) -> shapes.Shape:
        cached = self._shapes.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        found = shapes.shape_of(pod)
        self._shapes[pod.uid] = (pod, found)
        return found

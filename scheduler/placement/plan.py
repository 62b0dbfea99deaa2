"""The plan of a cycle: built append-only with checkpoint and rollback, returned as an immutable value.

A gang is a transaction (KAI's Statement, without mutating the snapshot): the engine takes a ``checkpoint()``, places
member after member on the ``Draft``, and either keeps them or ``rollback(checkpoint)``s. Each change is also applied
to the working state (capacity indexes and queue usage), with an undo entry, so the next member sees the room the
previous ones took; rolling back pops undo entries, newest first. Nothing is ever copied wholesale: a rollback costs
what the rolled-back members changed.

At the end of the cycle ``Draft.finish`` returns the ``Plan`` and undoes everything, so the engine's working state
mirrors the snapshot again for the next cycle.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from common.resources import Resources
from scheduler.placement import capacity, decisions, devices, fairshare, model, shapes, status


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The outcome of one cycle: what to bind, what to evict, why each pending group waits, and every queue's
    deserved and fair share (for the Queue status and the per-queue metrics)."""

    placements: tuple[decisions.Placement, ...]
    evictions: tuple[decisions.Eviction, ...]
    statuses: Mapping[model.GroupId, status.Status]
    queues: Mapping[model.QueueName, fairshare.Share] = dataclasses.field(default_factory=dict)
    nominations: tuple[decisions.Placement, ...] = ()
    """Where the room made by this plan's evictions is meant to go: the binder records each as the pod's
    nominated node, and the next cycles place those groups first."""
    moves: tuple[decisions.Placement, ...] = ()
    """Where each moved pod (an eviction with ``moved_to``) would be placed again: proof that the move is possible.
    Nothing binds them; the pod is placed afresh when its owner recreates it."""
    wake_ns: int | None = None
    """The earliest time at which the same state would give another plan (a preemption delay or a stale gang's grace
    ending, a victim reaching its min-runtime); None when no decision waited on the clock. The scheduler runs a
    cycle then, whatever else happens."""


def pod_amounts(pod: model.Pod) -> Resources:
    """What a running pod holds, as queues count it: GPU, CPU and memory (queues account no pod slots: 0)."""
    return Resources(
        milli_gpu=held_milli_gpu(pod), milli_cpu=pod.requests.milli_cpu, memory_bytes=pod.requests.memory_bytes
    )


def held_milli_gpu(pod: model.Pod) -> int:
    """The GPU a running pod holds, as queues count it: its whole devices, or its share on each of its devices."""
    if pod.share is not None:
        return pod.allotted_milli_gpu * max(1, len(pod.devices))
    return pod.requests.milli_gpu


class Usage:
    """Allocated resources per queue, subtree sums (a placement counts for its queue and every ancestor)."""

    __slots__ = ("allocated", "chains", "nonpreemptible")

    def __init__(self, chains: Mapping[model.QueueName, tuple[model.QueueName, ...]]) -> None:
        self.chains = chains
        self.allocated: dict[model.QueueName, Resources] = dict.fromkeys(chains, model.ZERO)
        self.nonpreemptible: dict[model.QueueName, Resources] = dict.fromkeys(chains, model.ZERO)

    def hold(self, queue: model.QueueName, *, allocated: Resources, nonpreemptible: Resources) -> None:
        """Count what a queue's groups hold as the cycle starts, for the queue and every ancestor."""
        for name in self.chains.get(queue, ()):
            self.allocated[name] = self.allocated[name] + allocated
            self.nonpreemptible[name] = self.nonpreemptible[name] + nonpreemptible

    def add(self, queue: model.QueueName, amounts: Resources, *, nonpreemptible: bool, sign: int = 1) -> None:
        allocated = self.allocated
        fixed = self.nonpreemptible
        for name in self.chains.get(queue, ()):
            if sign > 0:
                allocated[name] = allocated[name] + amounts
                if nonpreemptible:
                    fixed[name] = fixed[name] + amounts
            else:
                allocated[name] = allocated[name] - amounts
                if nonpreemptible:
                    fixed[name] = fixed[name] - amounts


class Kind(enum.Enum):
    """What a tentative placement is for."""

    BIND = "bind"
    """Emitted: the binder binds the pod."""
    RESERVE = "reserve"
    """Held for a group whose victims are being evicted: the room stays taken for the rest of the cycle, and the
    group is placed for real in a later cycle, once the victims are gone."""
    MOVE = "move"
    """A consolidated pod's new place: proves the move is possible; the pod is re-placed when it is recreated."""


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    capacity: int
    placements: int
    evictions: int
    usage: int
    version: int


class Draft:
    """The append-only plan under construction; see the module docstring."""

    def __init__(self, cap: capacity.Capacity, usage: Usage) -> None:
        self.capacity = cap
        self.usage = usage
        self.placements: list[decisions.Placement] = []
        self.kinds: list[Kind] = []
        self.evictions: list[decisions.Eviction] = []
        self.placed: dict[model.PodUid, decisions.Placement] = {}
        self.evicted: dict[model.PodUid, decisions.Eviction] = {}
        self._usage_undo: list[tuple[model.QueueName, Resources, bool, int]] = []
        self.version = 0
        """Names the draft's state: each placement and eviction gives it a new number, a rollback gives it back the
        number it had at the checkpoint (the state is the same again). The same version means the same room and
        usage, so an answer about them may be kept while the version holds."""
        self._versions = 0
        self._start = cap.checkpoint()
        self._usage_start = (dict(usage.allocated), dict(usage.nonpreemptible))

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            capacity=self.capacity.checkpoint(),
            placements=len(self.placements),
            evictions=len(self.evictions),
            usage=len(self._usage_undo),
            version=self.version,
        )

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Forget everything placed or evicted after ``checkpoint``."""
        self.version = checkpoint.version
        self.capacity.rollback(checkpoint.capacity)
        while len(self.placements) > checkpoint.placements:
            self.kinds.pop()
            del self.placed[self.placements.pop().pod]
        while len(self.evictions) > checkpoint.evictions:
            del self.evicted[self.evictions.pop().pod]
        undo = self._usage_undo
        while len(undo) > checkpoint.usage:
            queue, amounts, nonpreemptible, sign = undo.pop()
            self.usage.add(queue, amounts, nonpreemptible=nonpreemptible, sign=-sign)

    def _account(self, queue: model.QueueName, amounts: Resources, *, nonpreemptible: bool, sign: int) -> None:
        self.usage.add(queue, amounts, nonpreemptible=nonpreemptible, sign=sign)
        self._usage_undo.append((queue, amounts, nonpreemptible, sign))

    def place(
        self, pod: model.Pod, group: model.Group, choice: shapes.Choice, *, kind: Kind = Kind.BIND
    ) -> decisions.Placement:
        """Put ``pod`` where ``choice`` says, taking the room on the working state."""
        work = choice.work
        cap = self.capacity
        cap.begin(work)
        work.free_cpu -= pod.requests.milli_cpu
        work.free_mem -= pod.requests.memory_bytes
        work.free_pods -= pod.requests.pods
        gpu_groups: list[model.GpuGroupId] = []
        opens: list[bool] = []
        if choice.share_milli:
            mode = pod.share.compute_mode if pod.share is not None else model.ComputeMode.TIME_SLICING
            for device, milli in zip(choice.devices, choice.share_milli, strict=True):
                gpu_group = work.dev_group[device] or devices.new_group_id(work.name, device, pod.uid)
                opens.append(work.take_share(device, milli, gpu_group, mode))
                gpu_groups.append(gpu_group)
            gpu = sum(choice.share_milli)
        else:
            work.take_whole(choice.devices)
            gpu = len(choice.devices) * devices.FULL
        cap.end(work)
        self._account(
            group.queue,
            Resources(milli_gpu=gpu, milli_cpu=pod.requests.milli_cpu, memory_bytes=pod.requests.memory_bytes),
            nonpreemptible=not group.preemptible,
            sign=1,
        )
        placement = decisions.Placement(
            pod=pod.uid,
            group=group.id,
            node=work.name,
            devices=choice.devices,
            share_milli=choice.share_milli,
            gpu_groups=tuple(gpu_groups),
            opens_groups=tuple(opens),
        )
        self._versions += 1
        self.version = self._versions
        self.placements.append(placement)
        self.kinds.append(kind)
        self.placed[pod.uid] = placement
        return placement

    def bound(self, kind: Kind = Kind.BIND) -> list[decisions.Placement]:
        return [placement for placement, of in zip(self.placements, self.kinds, strict=True) if of is kind]

    def evict(
        self,
        pod: model.Pod,
        group: model.Group,
        *,
        reason: decisions.EvictionReason,
        beneficiary: model.GroupId | None,
        message: str,
        moved_to: model.NodeName | None = None,
    ) -> decisions.Eviction:
        """Evict a running pod, giving its room back on the working state."""
        self._give_back(pod, group)
        eviction = decisions.Eviction(
            pod=pod.uid,
            group=group.id,
            node=pod.node or model.NodeName(""),
            reason=reason,
            beneficiary=beneficiary,
            message=message,
            moved_to=moved_to,
        )
        self._versions += 1
        self.version = self._versions
        self.evictions.append(eviction)
        self.evicted[pod.uid] = eviction
        return eviction

    def release(self, pod: model.Pod, group: model.Group) -> None:
        """Give back the room of a pod already leaving (its eviction or deletion under way) for the rest of the cycle,
        recording no eviction: it is going anyway. For room held for the group it leaves for (pipelining)."""
        self._give_back(pod, group)
        self._versions += 1
        self.version = self._versions

    def block(self, node: model.NodeName) -> None:
        """Take every free pod slot of ``node`` for the rest of the cycle, so nothing more is placed there: for a node
        whose leaving pods were ``release``d, whose room is not free yet beyond what was held on it."""
        work = self.capacity.by_name.get(node)
        if work is None:
            return
        self.capacity.begin(work)
        work.free_pods = 0
        self.capacity.end(work)
        self._versions += 1
        self.version = self._versions

    def _give_back(self, pod: model.Pod, group: model.Group) -> None:
        if pod.node is not None and (work := self.capacity.by_name.get(pod.node)) is not None:
            cap = self.capacity
            cap.grew(work.order)
            cap.begin(work)
            work.free_cpu += pod.requests.milli_cpu
            work.free_mem += pod.requests.memory_bytes
            work.free_pods += pod.requests.pods
            valid = tuple(device for device in pod.devices if device < len(work.dev_free))
            if pod.share is not None:
                for device in valid:
                    work.give_back_share(device, pod.allotted_milli_gpu)
            elif pod.whole_gpus:
                work.give_back_whole(valid)
            cap.end(work)
        self._account(group.queue, pod_amounts(pod), nonpreemptible=not group.preemptible, sign=-1)

    def finish(
        self,
        statuses: Mapping[model.GroupId, status.Status],
        queues: Mapping[model.QueueName, fairshare.Share],
        *,
        wake_ns: int | None = None,
    ) -> Plan:
        """The plan as a value; undoes every change on the working state."""
        moves = self.bound(Kind.MOVE)
        moved_to = {placement.pod: placement.node for placement in moves}
        plan = Plan(
            placements=tuple(self.bound()),
            evictions=tuple(
                dataclasses.replace(eviction, moved_to=moved_to[eviction.pod]) if eviction.pod in moved_to else eviction
                for eviction in self.evictions
            ),
            statuses=dict(statuses),
            queues=queues,
            nominations=tuple(self.bound(Kind.RESERVE)),
            moves=tuple(moves),
            wake_ns=wake_ns,
        )
        self.capacity.rollback(self._start)
        # Undoing every entry would give the same sums; putting the starting ones back is cheaper.
        allocated, nonpreemptible = self._usage_start
        self.usage.allocated.update(allocated)
        self.usage.nonpreemptible.update(nonpreemptible)
        self._usage_undo.clear()
        return plan

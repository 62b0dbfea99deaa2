"""Gangs: which members a group needs now, the queue checks they must pass, and the all-or-nothing transaction.

A group needs enough pending members to bring it to ``min_member`` (running and completed members count), and
enough in each subgroup to bring that subgroup to its own minimum; those are its *minimum*. The other pending
members are elastic *extras*, placed one by one after every group's minimum. Members are taken in creation order,
then uid, so the same snapshot always picks the same members.

Before a minimum is tried, the queue checks run for the queue and each ancestor: the limit (KAI's ``OverLimit``,
with ``0`` allowing nothing of a requested resource) and, for non-preemptible groups, the quota
(``NonPreemptibleOverQuota``). A minimum that can never pass (bigger than a limit on its own, or than every node
it may use) is reported as such and not retried until nodes or queues change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping, Sequence

from common.resources import Resources
from scheduler.placement import fairshare, model, plan, search, shapes, status

GPU, CPU, MEMORY = fairshare.Kind.GPU, fairshare.Kind.CPU, fairshare.Kind.MEMORY


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Needs:
    """The pending members a group must place together now, and the elastic extras after them."""

    minimum: tuple[model.Pod, ...]
    extras: tuple[model.Pod, ...]
    missing: int
    """Members the minimum would need that do not exist (yet)."""


def _satisfied(pod: model.Pod, evicted: Container[model.PodUid]) -> bool:
    if pod.phase is model.PodPhase.SUCCEEDED:
        return True
    return pod.phase is model.PodPhase.RUNNING and pod.uid not in evicted


def needs(group: model.Group, evicted: Container[model.PodUid] = ()) -> Needs:
    """Split a group's pending members into its minimum and its extras (see the module docstring)."""
    pending = sorted(
        (pod for pod in group.members if pod.phase is model.PodPhase.PENDING), key=lambda pod: (pod.created_ns, pod.uid)
    )
    satisfied = sum(1 for pod in group.members if _satisfied(pod, evicted))
    chosen: list[model.Pod] = []
    taken: set[model.PodUid] = set()
    missing = 0
    for subgroup in sorted(group.subgroups, key=lambda sub: sub.name):
        have = sum(1 for pod in group.members if pod.subgroup == subgroup.name and _satisfied(pod, evicted))
        want = max(0, subgroup.min_member - have)
        candidates = [pod for pod in pending if pod.subgroup == subgroup.name][:want]
        missing += want - len(candidates)
        chosen.extend(candidates)
        taken.update(pod.uid for pod in candidates)
    rest = [pod for pod in pending if pod.uid not in taken]
    want = max(0, group.min_member - satisfied - len(chosen))
    chosen.extend(rest[:want])
    missing += max(0, want - len(rest))
    minimum = tuple(sorted(chosen, key=lambda pod: (pod.created_ns, pod.uid)))
    return Needs(minimum=minimum, extras=tuple(rest[want:]), missing=missing)


def below_minimum(group: model.Group, evicted: Container[model.PodUid] = ()) -> str | None:
    """How a group's running and completed members fall short of its minimum, or of a subgroup's own minimum (KAI
    checks every pod set), as a phrase for messages; None when every minimum holds. Pods in ``evicted`` count as
    gone."""
    satisfied = sum(1 for pod in group.members if _satisfied(pod, evicted))
    if satisfied < group.min_member:
        return f"{satisfied} of its {group.min_member} members"
    for subgroup in sorted(group.subgroups, key=lambda sub: sub.name):
        have = sum(1 for pod in group.members if pod.subgroup == subgroup.name and _satisfied(pod, evicted))
        if have < subgroup.min_member:
            return f"{have} of the {subgroup.min_member} members subgroup {subgroup.name} needs"
    return None


def pending_gpu(pod: model.Pod, reference_memory_bytes: int) -> int:
    """The milli-GPU a pending pod will take, as queues count it; a gpu-memory share is judged on the largest
    device of the cluster (the least it can take), since its device is not known before placement."""
    share = pod.share
    if share is None:
        return pod.requests.milli_gpu
    per_device = model.share_milli_on(share, reference_memory_bytes)
    return min(per_device, model.MILLI_GPU_PER_DEVICE) * share.devices


def total(pods: Sequence[model.Pod], reference_memory_bytes: int) -> Resources:
    """What pending ``pods`` will take, as queues count it."""
    gpu = cpu = memory = 0
    for pod in pods:
        gpu += pending_gpu(pod, reference_memory_bytes)
        cpu += pod.requests.milli_cpu
        memory += pod.requests.memory_bytes
    return Resources(milli_gpu=gpu, milli_cpu=cpu, memory_bytes=memory)


def queue_check(
    *,
    group: model.Group,
    amounts: Resources,
    chain: Sequence[model.QueueName],
    queues: Mapping[model.QueueName, model.Queue],
    usage: plan.Usage,
) -> status.Status | None:
    """The limit and non-preemptible quota checks of ``amounts`` more for the group's queue and its ancestors."""
    for name in chain:
        queue = queues[name]
        for kind in fairshare.KINDS:
            want = fairshare.amount(amounts, kind)
            if want <= 0:
                continue
            setting = fairshare.setting(queue, kind)
            allocated = fairshare.amount(usage.allocated[name], kind)
            if setting.limit != model.UNLIMITED and allocated + want > setting.limit:
                return status.unschedulable(
                    status.Reason.OVER_LIMIT,
                    f"queue {name} {kind.value} limit is {status.amount_text(kind, setting.limit)}: "
                    f"{status.amount_text(kind, allocated)} allocated, "
                    f"{status.amount_text(kind, want)} more requested",
                )
            if not group.preemptible and setting.quota != model.UNLIMITED:
                fixed = fairshare.amount(usage.nonpreemptible[name], kind)
                if fixed + want > setting.quota:
                    return status.unschedulable(
                        status.Reason.NON_PREEMPTIBLE_OVER_QUOTA,
                        f"non-preemptible work must fit in the quota of queue {name}: {kind.value} quota "
                        f"{status.amount_text(kind, setting.quota)}, {status.amount_text(kind, fixed)} held by "
                        f"non-preemptible work, {status.amount_text(kind, want)} more requested",
                    )
    return None


def never_fits(
    *,
    group: model.Group,
    minimum: Sequence[model.Pod],
    amounts: Resources,
    chain: Sequence[model.QueueName],
    queues: Mapping[model.QueueName, model.Queue],
    searcher: search.Searcher,
    pod_shapes: Mapping[model.PodUid, shapes.Shape],
) -> status.Status | None:
    """Why the minimum can never be placed as the cluster and queues stand, or None."""
    for name in chain:
        queue = queues[name]
        for kind in fairshare.KINDS:
            want = fairshare.amount(amounts, kind)
            if want <= 0:
                continue
            setting = fairshare.setting(queue, kind)
            if setting.limit != model.UNLIMITED and want > setting.limit:
                return status.never(
                    f"the gang's minimum needs {status.amount_text(kind, want)} of {kind.value}, more than the "
                    f"limit {status.amount_text(kind, setting.limit)} of queue {name}"
                )
            if not group.preemptible and setting.quota != model.UNLIMITED and want > setting.quota:
                return status.never(
                    f"non-preemptible work must fit in the quota: the gang's minimum needs "
                    f"{status.amount_text(kind, want)} of {kind.value}, queue {name} has a quota of "
                    f"{status.amount_text(kind, setting.quota)}"
                )
    gpu_total = 0
    for pod in minimum:
        shape = pod_shapes[pod.uid]
        if not searcher.eligible(shape.constraints):
            return None  # no node passes the filters: reported as NoNodeFits with each node class's reason
        if not searcher.could_ever_hold(shape):
            return status.never(
                f"pod {pod.name} asks for {_shape_text(shape)}, more than any node it may use offers when empty"
            )
        gpu_total += shape.whole_gpus * model.MILLI_GPU_PER_DEVICE
    if gpu_total:
        offered = searcher.devices_offered(pod_shapes[minimum[0].uid].constraints) * model.MILLI_GPU_PER_DEVICE
        if gpu_total > offered:
            return status.never(
                f"the gang's minimum needs {status.amount_text(GPU, gpu_total)} in whole GPUs; the nodes it may use "
                f"have {status.amount_text(GPU, offered)} in all"
            )
    return None


def _shape_text(shape: shapes.Shape) -> str:
    parts = [f"{status.amount_text(CPU, shape.milli_cpu)}", status.amount_text(MEMORY, shape.memory_bytes)]
    if shape.whole_gpus:
        parts.append(f"{shape.whole_gpus} GPU")
    if shape.share is not None:
        size = (
            status.amount_text(GPU, shape.share.milli_gpu)
            if shape.share.milli_gpu
            else status.amount_text(MEMORY, shape.share.memory_bytes) + " of GPU memory"
        )
        parts.append(f"{size} on {shape.share.devices} device(s)")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A minimum that did not fit: the member that found no room, and how many were placed before it."""

    pod: model.Pod
    placed: int
    of: int


def try_place(
    *,
    draft: plan.Draft,
    searcher: search.Searcher,
    group: model.Group,
    pods: Sequence[model.Pod],
    pod_shapes: Mapping[model.PodUid, shapes.Shape],
    kind: plan.Kind = plan.Kind.BIND,
) -> Failure | None:
    """Place ``pods`` all together or none of them; None on success."""
    checkpoint = draft.checkpoint()
    for count, pod in enumerate(pods):
        choice = searcher.find(pod_shapes[pod.uid])
        if choice is None:
            draft.rollback(checkpoint)
            return Failure(pod=pod, placed=count, of=len(pods))
        draft.place(pod, group, choice, kind=kind)
    return None


def place_within_limits(
    *,
    draft: plan.Draft,
    searcher: search.Searcher,
    group: model.Group,
    pods: Sequence[model.Pod],
    pod_shapes: Mapping[model.PodUid, shapes.Shape],
    amounts: Resources,
    chain: Sequence[model.QueueName],
    queues: Mapping[model.QueueName, model.Queue],
) -> Failure | status.Status | None:
    """Place ``pods`` as one transaction (``try_place``); a gpu-memory share is checked against the limits once its
    device, and so its real share, is known (``amounts``, checked before, estimated it on the largest device)."""
    start = draft.checkpoint()
    failure = try_place(draft=draft, searcher=searcher, group=group, pods=pods, pod_shapes=pod_shapes)
    if failure is not None or not any(pod.share is not None and pod.share.memory_bytes for pod in pods):
        return failure
    actual = sum(
        sum(placement.share_milli) or len(placement.devices) * model.MILLI_GPU_PER_DEVICE
        for placement in draft.placements[start.placements :]
    )
    if actual <= amounts.milli_gpu:
        return None
    draft.rollback(start)
    real = dataclasses.replace(amounts, milli_gpu=actual)
    checked = queue_check(group=group, amounts=real, chain=chain, queues=queues, usage=draft.usage)
    if checked is not None:
        return checked
    return try_place(draft=draft, searcher=searcher, group=group, pods=pods, pod_shapes=pod_shapes)

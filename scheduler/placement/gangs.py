"""Gangs: which members a group needs now, the queue checks they must pass, and the all-or-nothing transaction.

A group needs enough pending members to bring it to ``min_member`` (running and completed members count): those
are its *minimum*; with subgroups, the pods that satisfy its tree (``subgroups``: each leaf its own minimum, each
level ``minSubGroup`` of its children), and ``min_member`` is a floor on the total beside it. ``min_member`` 0
without subgroups is KAI's "no gang requirement": no minimum at all. The other pending members are elastic
*extras*, placed in steps after every group's minimum: one pod at a time, or a whole subgroup that its parent can do
without but that needs its own minimum at once. Pending members are taken in KAI's task order
(``kai.scheduler/task-priority``, higher first, labelled before unlabelled), then creation order, then uid, so the
same snapshot always picks the same members.

Before a minimum is tried, the queue checks run for the queue and each ancestor: the limit (KAI's ``OverLimit``,
with ``0`` allowing nothing of a requested resource) and, for non-preemptible groups, the quota
(``NonPreemptibleOverQuota``). A minimum that can never pass (bigger than a limit on its own, or than every node
it may use) is reported as such and not retried until nodes or queues change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping, Sequence

from common.resources import Resources
from scheduler.placement import diagnosis, fairshare, model, plan, search, shapes, status, subgroups

GPU, CPU, MEMORY = fairshare.Kind.GPU, fairshare.Kind.CPU, fairshare.Kind.MEMORY

Step = subgroups.Step
"""Pods placed together as one elastic step: one pod, or a subgroup's own minimum."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Needs:
    """The pending members a group must place together now, and the elastic steps after them."""

    minimum: tuple[model.Pod, ...]
    extras: tuple[Step, ...]
    missing: int
    """Members the minimum would need that do not exist (yet)."""


def task_key(pod: model.Pod) -> tuple[int, int, str]:
    """KAI's task order: the pod's task priority, then creation time, then uid."""
    return (pod.task_order, pod.created_ns, pod.uid)


def needs(group: model.Group, evicted: Container[model.PodUid] = ()) -> Needs:
    """Split a group's pending members into its minimum and its elastic steps (see the module docstring)."""
    pending = sorted((pod for pod in group.members if pod.phase is model.PodPhase.PENDING), key=task_key)
    satisfied = sum(1 for pod in group.members if subgroups.satisfied(pod, evicted))
    if not group.subgroups:
        want = max(0, group.min_member - satisfied)
        return Needs(
            minimum=tuple(pending[:want]),
            extras=tuple((pod,) for pod in pending[want:]),
            missing=max(0, want - len(pending)),
        )
    chosen, steps, loose, missing = subgroups.split(subgroups.of(group), group.members, pending, evicted)
    taken = {pod.uid for pod in chosen}
    rest = [pod for pod in pending if pod.uid not in taken]
    # The floor of min_member on the total, from any pending pod (the tree's own choice first).
    want = max(0, group.min_member - satisfied - len(chosen))
    if want:
        floor = rest[:want]
        missing += want - len(floor)
        chosen += floor
        taken.update(pod.uid for pod in floor)
        steps = [kept for step in steps if (kept := tuple(pod for pod in step if pod.uid not in taken))]
        loose = [pod for pod in loose if pod.uid not in taken]
    extras = (*steps, *((pod,) for pod in loose))
    return Needs(minimum=tuple(sorted(chosen, key=task_key)), extras=extras if not missing else (), missing=missing)


def below_minimum(group: model.Group, evicted: Container[model.PodUid] = ()) -> str | None:
    """How a group's running and completed members fall short of its minimum, or of its subgroup tree (KAI checks
    every pod set), as a phrase for messages; None when every minimum holds. Pods in ``evicted`` count as gone."""
    satisfied = sum(1 for pod in group.members if subgroups.satisfied(pod, evicted))
    if satisfied < group.min_member:
        return f"{satisfied} of its {group.min_member} members"
    if not group.subgroups:
        return None
    shape = subgroups.of(group)
    return subgroups.shortfall(shape, subgroups.leaf_counts(shape, group.members, evicted))


def requirement(group: model.Group) -> str:
    """What the group's minimum is, for messages."""
    if not group.subgroups:
        return f"minMember {group.min_member}"
    top = "all" if group.min_subgroup is None else str(group.min_subgroup)
    floor = f", and {group.min_member} pods in all" if group.min_member else ""
    return f"{top} of its top-level subgroups satisfied, each at its own minimum{floor}"


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


def _no_limit(queue: model.Queue) -> bool:
    unlimited = model.UNLIMITED
    return queue.gpu.limit == unlimited and queue.cpu.limit == unlimited and queue.memory.limit == unlimited


def queue_check(
    *,
    group: model.Group,
    amounts: Resources,
    chain: Sequence[model.QueueName],
    queues: Mapping[model.QueueName, model.Queue],
    usage: plan.Usage,
) -> status.Status | None:
    """The limit and non-preemptible quota checks of ``amounts`` more for the group's queue and its ancestors."""
    preemptible = group.preemptible
    for name in chain:
        queue = queues[name]
        if preemptible and _no_limit(queue):
            continue  # nothing to check there (asked for every group a cycle tries: most queues set no limit)
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
                    status.setting_detail(status.Remedy.RAISE_LIMIT, name, kind, setting.limit, allocated + want, want),
                )
            if not preemptible and setting.quota != model.UNLIMITED:
                fixed = fairshare.amount(usage.nonpreemptible[name], kind)
                if fixed + want > setting.quota:
                    return status.unschedulable(
                        status.Reason.NON_PREEMPTIBLE_OVER_QUOTA,
                        f"non-preemptible work must fit in the quota of queue {name}: {kind.value} quota "
                        f"{status.amount_text(kind, setting.quota)}, {status.amount_text(kind, fixed)} held by "
                        f"non-preemptible work, {status.amount_text(kind, want)} more requested",
                        status.setting_detail(status.Remedy.RAISE_QUOTA, name, kind, setting.quota, fixed + want, want),
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
                    f"limit {status.amount_text(kind, setting.limit)} of queue {name}",
                    status.setting_detail(status.Remedy.RAISE_LIMIT, name, kind, setting.limit, want, want),
                )
            if not group.preemptible and setting.quota != model.UNLIMITED and want > setting.quota:
                return status.never(
                    f"non-preemptible work must fit in the quota: the gang's minimum needs "
                    f"{status.amount_text(kind, want)} of {kind.value}, queue {name} has a quota of "
                    f"{status.amount_text(kind, setting.quota)}",
                    status.setting_detail(status.Remedy.RAISE_QUOTA, name, kind, setting.quota, want, want),
                )
    gpu_total = 0
    for pod in minimum:
        shape = pod_shapes[pod.uid]
        if not searcher.eligible(shape.constraints):
            return None  # no node passes the filters: reported as NoNodeFits with each node class's reason
        if not searcher.could_ever_hold(shape):
            return status.never(
                f"pod {pod.name} asks for {_shape_text(shape)}, more than any node it may use offers when empty",
                diagnosis.largest_node_detail(searcher, shape),
            )
        gpu_total += shape.whole_gpus * model.MILLI_GPU_PER_DEVICE
    if gpu_total:
        offered = searcher.devices_offered(pod_shapes[minimum[0].uid].constraints) * model.MILLI_GPU_PER_DEVICE
        if gpu_total > offered:
            return status.never(
                f"the gang's minimum needs {status.amount_text(GPU, gpu_total)} in whole GPUs; the nodes it may use "
                f"have {status.amount_text(GPU, offered)} in all",
                status.never_detail(
                    status.Resource.GPU,
                    requested=gpu_total,
                    most=offered,
                    message="more whole GPUs than the nodes it may use have in all: add nodes, or ask for fewer",
                    remedy=status.Remedy.MORE_NODES,
                ),
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
    if not pods:
        return None
    # The first pod is looked for before anything is placed: when it finds no room (most tries on a busy cluster),
    # there is nothing to undo.
    first = pods[0]
    choice = searcher.find(pod_shapes[first.uid])
    if choice is None:
        return Failure(pod=first, placed=0, of=len(pods))
    checkpoint = draft.checkpoint()
    draft.place(first, group, choice, kind=kind)
    for count in range(1, len(pods)):
        pod = pods[count]
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
    if not any(pod.share is not None and pod.share.memory_bytes for pod in pods):
        return try_place(draft=draft, searcher=searcher, group=group, pods=pods, pod_shapes=pod_shapes)
    start = draft.checkpoint()
    failure = try_place(draft=draft, searcher=searcher, group=group, pods=pods, pod_shapes=pod_shapes)
    if failure is not None:
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

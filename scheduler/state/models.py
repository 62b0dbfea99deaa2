"""The placement model's values from the cluster state's records: a node and its devices' allotments, a pod as a
member of its group, the queue tree, and a PodGroup's queue, priority and preemptibility.

Pure functions over records, used by the snapshot builder (``snapshot``) for the nodes and groups that changed.
What a pod holds comes from ``holdings``, the reading the telemetry analysis shares. What cannot be read becomes a
``Problem`` or a ``QueueIssue``, never an exception: a Queue with a malformed spec, a missing parent or a parent
cycle is left out with a condition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from common import names
from common.resources import Resources
from scheduler.objects import gpurequest, podgroups
from scheduler.objects.records import NodeRecord, Phase, PodGroupRecord, PodRecord, Problem, QueueRecord
from scheduler.placement import model
from scheduler.state import holdings
from scheduler.state.cache import Assumption


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueIssue:
    queue: str
    condition: str
    """``Orphan`` (parent missing), ``Cycle`` or ``Invalid``."""
    message: str


def group_id(namespace: str, name: str) -> model.GroupId:
    return model.GroupId(f"{namespace}/{name}")


def _group_id(text: str | None) -> model.GpuGroupId | None:
    return model.GpuGroupId(text) if text else None


def build_node(node: NodeRecord, pods: Sequence[PodRecord], assumed: Mapping[str, Assumption]) -> model.Node | Problem:
    """One node with what its pods (bound and assumed) use, and its devices' allotments."""
    if isinstance(node.capacity, Problem):
        return node.capacity
    allocatable, gpu_count = node.capacity, node.gpu_count
    memory = node.device_memory_bytes
    product = node.labels.get(names.GPU_PRODUCT_LABEL, "")
    allotted = [0] * gpu_count
    holders: list[list[str]] = [[] for _ in range(gpu_count)]
    whole = [False] * gpu_count
    groups: list[str | None] = [None] * gpu_count
    modes: list[model.ComputeMode | None] = [None] * gpu_count
    used = Resources()
    unplaced_whole: list[tuple[str, int]] = []
    reservations: list[tuple[str, str]] = []
    for pod in pods:
        uid = pod.uid
        if not isinstance(pod.requests, Problem):
            used = used + pod.requests
        request = pod.gpu
        if not holdings.holds_gpus(request):
            continue
        assert isinstance(request, gpurequest.GpuRequest)
        group_label = pod.labels.get(names.RESERVATION_GROUP_LABEL)
        if group_label:
            reservations.append((uid, group_label))
            continue  # the device it holds is accounted through the shares of its group
        holding = holdings.of(pod, assumed.get(uid))
        devices = tuple(index for index in holding.devices if 0 <= index < gpu_count)
        if request.is_share:
            share = holdings.share_milli(request, holding, memory)
            for position, index in enumerate(devices):
                allotted[index] += share
                holders[index].append(uid)
                if position < len(holding.gpu_groups):
                    groups[index] = holding.gpu_groups[position]
                # The group's mode is its shares' (modes never mix on a device: the first one read stands).
                modes[index] = modes[index] or model.ComputeMode(request.compute_mode)
        elif devices:
            for index in devices:
                allotted[index] = model.MILLI_GPU_PER_DEVICE
                holders[index].append(uid)
                whole[index] = True
        else:
            unplaced_whole.append((uid, request.whole))
    # A reservation pod whose group has no share left (draining, or its bind failed) still holds a whole device.
    held = {group for group in groups if group is not None}
    for uid, group in reservations:
        if group not in held:
            unplaced_whole.insert(0, (uid, 1))
    # Pods whose devices nobody recorded (another scheduler's, or bound before we annotated) take the lowest free ones.
    for uid, count in unplaced_whole:
        free = [i for i in range(gpu_count) if allotted[i] == 0 and groups[i] is None][:count]
        for index in free:
            allotted[index] = model.MILLI_GPU_PER_DEVICE
            holders[index].append(uid)
            whole[index] = True
    node_devices = tuple(
        model.Device(
            index=index,
            uuid=model.GpuUuid(f"{node.name}/gpu{index}"),
            model=product,
            memory_bytes=memory,
            allotted_milli_gpu=min(allotted[index], model.MILLI_GPU_PER_DEVICE),
            holders=tuple(model.PodUid(uid) for uid in sorted(holders[index])),
            whole=whole[index],
            gpu_group=_group_id(groups[index]),
            compute_mode=modes[index] if groups[index] is not None else None,
        )
        for index in range(gpu_count)
    )
    return model.Node(
        name=model.NodeName(node.name),
        allocatable=allocatable,
        used=dataclasses.replace(used, milli_gpu=sum(allotted)),
        labels=node.labels,
        taints=node.taints,
        ready=node.ready,
        unschedulable=node.unschedulable,
        devices=node_devices,
    )


def pod_from(pod: PodRecord) -> model.Pod | Problem:
    """A pod of ours as a member of its group (pending, or running on its node with its devices)."""
    if isinstance(pod.requests, Problem):
        return pod.requests
    if isinstance(pod.scheduling.affinity, Problem):
        return pod.scheduling.affinity
    request = pod.gpu
    assert isinstance(request, gpurequest.GpuRequest)
    requests = pod.requests
    share = None
    if request.is_share:
        share = model.GpuShare(
            milli_gpu=request.milli_gpu,
            memory_bytes=request.memory_bytes,
            devices=request.devices,
            compute_mode=model.ComputeMode(request.compute_mode),
        )
    else:
        requests = dataclasses.replace(requests, milli_gpu=request.whole * model.MILLI_GPU_PER_DEVICE)
    if pod.phase is Phase.SUCCEEDED:
        phase = model.PodPhase.SUCCEEDED
    elif pod.node:
        phase = model.PodPhase.RUNNING
    else:
        phase = model.PodPhase.PENDING
    return model.Pod(
        uid=model.PodUid(pod.uid),
        name=pod.name,
        namespace=pod.namespace,
        requests=requests,
        share=share,
        node_selector=pod.scheduling.node_selector,
        affinity=pod.scheduling.affinity,
        tolerations=pod.scheduling.tolerations,
        created_ns=pod.created_ns,
        phase=phase,
        subgroup=pod.subgroup,
        node=model.NodeName(pod.node) if pod.node else None,
        devices=pod.devices if pod.node else (),
        gpu_groups=tuple(model.GpuGroupId(group) for group in pod.gpu_groups) if share is not None else (),
        allotted_milli_gpu=(pod.share_milli or share.milli_gpu) if share is not None and pod.node else 0,
        started_ns=pod.started_ns,
        nominated_node=model.NodeName(pod.nominated_node) if pod.nominated_node else None,
        task_order=_task_order(pod.task_priority),
        leaving=pod.deleting and phase is model.PodPhase.RUNNING,
    )


def _task_order(priority: int | Problem | None) -> int:
    """KAI's task order from the ``kai.scheduler/task-priority`` label: an unreadable label goes after the readable
    ones (KAI's ``taskorder`` plugin)."""
    if isinstance(priority, Problem):
        return model.task_order(None, unreadable=True)
    return model.task_order(priority)


def build_queues(queues: Mapping[str, QueueRecord]) -> tuple[dict[model.QueueName, model.Queue], list[QueueIssue]]:
    """Every valid queue whose ancestors all exist and form no cycle; an issue for each one left out."""
    parsed: dict[str, model.Queue] = {}
    issues: list[QueueIssue] = []
    for name, record in sorted(queues.items()):
        if isinstance(record.queue, Problem):
            message = f"{record.queue.field}: {record.queue.message}"
            issues.append(QueueIssue(queue=name, condition="Invalid", message=message))
        else:
            parsed[name] = record.queue
    kept: dict[model.QueueName, model.Queue] = {}
    for name, queue in parsed.items():
        seen = [name]
        parent = queue.parent
        problem: QueueIssue | None = None
        while parent is not None:
            if parent in seen:
                problem = QueueIssue(
                    queue=name, condition="Cycle", message=f"parent chain loops: {' -> '.join([*seen, parent])}"
                )
                break
            if parent not in parsed:
                reason = "is invalid" if parent in queues else "does not exist"
                problem = QueueIssue(queue=name, condition="Orphan", message=f"ancestor queue {parent!r} {reason}")
                break
            seen.append(parent)
            parent = parsed[parent].parent
        if problem is None:
            kept[model.QueueName(name)] = queue
        else:
            issues.append(problem)
    return kept, issues


def group_settings(podgroup: PodGroupRecord, priority_classes: Mapping[str, int]) -> tuple[str, int, bool]:
    """A PodGroup's queue, numeric priority and preemptibility, as KAI decides them."""
    queue = podgroup.queue or names.DEFAULT_QUEUE
    priority = podgroups.priority_value(podgroup.priority_class, priority_classes)
    return queue, priority, podgroups.is_preemptible(podgroup.preemptibility, priority)

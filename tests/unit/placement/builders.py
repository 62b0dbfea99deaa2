"""Small constructors for placement tests: a node, a pod, a group, a queue, in a line each."""

from __future__ import annotations

from common.resources import Resources
from scheduler.placement import model, plan

GIB = 1024**3


def node(
    name: str,
    *,
    gpus: int = 0,
    gpu_memory: int = 40 * GIB,
    cpu: int = 64_000,
    memory: int = 256 * GIB,
    pods: int = 110,
    labels: dict[str, str] | None = None,
    gpu_model: str = "A100",
) -> model.Node:
    return model.Node(
        name=model.NodeName(name),
        allocatable=Resources(milli_cpu=cpu, memory_bytes=memory, milli_gpu=gpus * 1000, pods=pods),
        labels=labels or {},
        devices=tuple(
            model.Device(index=i, uuid=model.GpuUuid(f"{name}-{i}"), model=gpu_model, memory_bytes=gpu_memory)
            for i in range(gpus)
        ),
    )


def pod(
    uid: str,
    *,
    gpus: int = 0,
    fraction: int = 0,
    gpu_memory: int = 0,
    devices: int = 1,
    cpu: int = 1000,
    memory: int = GIB,
    created: int = 0,
) -> model.Pod:
    share = None
    if fraction or gpu_memory:
        share = model.GpuShare(milli_gpu=fraction, memory_bytes=gpu_memory, devices=devices)
    return model.Pod(
        uid=model.PodUid(uid),
        name=uid,
        requests=Resources(milli_cpu=cpu, memory_bytes=memory, milli_gpu=gpus * 1000, pods=1),
        share=share,
        created_ns=created,
    )


def group(
    gid: str, *members: model.Pod, queue: str = "test", min_member: int = 1, priority: int = 50, created: int = 0
) -> model.Group:
    return model.Group(
        id=model.GroupId(gid),
        queue=model.QueueName(queue),
        min_member=min_member,
        priority=priority,
        preemptible=priority < 100,
        created_ns=created,
        members=members,
    )


def open_queues() -> list[model.Queue]:
    """The seeds' queues: ``default`` with child ``test``, every value -1."""
    return [
        model.Queue(name=model.QueueName("default")),
        model.Queue(name=model.QueueName("test"), parent=model.QueueName("default")),
    ]


def decisions(result: plan.Plan) -> tuple[object, ...]:
    """What a plan places, evicts, moves and nominates, in a form two plans can be compared by (statuses aside)."""
    return (
        sorted((p.pod, p.node, p.devices, p.share_milli) for p in result.placements),
        sorted((e.pod, e.node, e.reason, e.beneficiary, e.moved_to) for e in result.evictions),
        sorted((p.pod, p.node, p.devices) for p in result.nominations),
        sorted((p.pod, p.node, p.devices) for p in result.moves),
    )

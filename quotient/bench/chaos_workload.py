"""The chaos run's load: jobs of every kind, drawn from a seeded random generator, as the manifests a user applies.

A job is one pod (whole GPUs, a ``gpu-fraction`` or ``gpu-memory`` share, or CPU only) or a gang (a ``PodGroup`` of
``scheduling.run.ai/v2alpha2`` with ``minMember`` > 1 and its one-GPU pods). Each lives a random while, then its
user deletes it. Jobs go to three leaf queues whose GPU quotas add up to less than the cluster, and the load asks for
more GPUs than there are, so queues run over their quota and reclaim takes GPUs back; a fifth of the pods have a
higher priority class than the rest of their queue (``build-preemptible`` over ``train``), so preemption happens
inside a queue too. Pure: manifests in, no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

from common import names

NAMESPACE: Final = "chaos"
LIFETIME_S: Final = (15.0, 60.0)
"""How long a job lives before its user deletes it (drawn uniformly)."""
DEMAND_FACTOR: Final = 1.3
"""The load keeps the GPUs its live jobs ask for at this multiple of the cluster's: more than fits, queues compete."""


class JobKind(enum.StrEnum):
    WHOLE_1 = "whole-1"
    WHOLE_2 = "whole-2"
    FRACTION = "fraction"
    MEMORY = "memory"
    GANG = "gang"
    CPU = "cpu"


# How often each kind comes (relative weights): mostly one-GPU pods and shares, some gangs and CPU-only pods.
WEIGHTS: Final[Mapping[JobKind, float]] = {
    JobKind.WHOLE_1: 3.0,
    JobKind.WHOLE_2: 1.5,
    JobKind.FRACTION: 2.0,
    JobKind.MEMORY: 1.0,
    JobKind.GANG: 1.0,
    JobKind.CPU: 1.5,
}
FRACTIONS: Final = ("0.25", "0.5", "0.5", "0.75")
GPU_MEMORY: Final = ("10Gi", "20Gi", "40Gi")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueSpec:
    name: str
    gpu_quota: int
    """Whole GPUs; the quotas of the run's queues add up to less than the cluster (the rest is over-quota room)."""
    over_quota_weight: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    name: str
    kind: JobKind
    queue: str
    lifetime_s: float
    milli_gpu: int
    """What the job asks for, in milli-GPU (a ``gpu-memory`` share counted at its part of an 80 GiB device)."""
    pods: tuple[dict[str, Any], ...]
    podgroup: dict[str, Any] | None = None

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(str(pod["metadata"]["name"]) for pod in self.pods)


def queues_for(total_gpus: int) -> tuple[QueueSpec, ...]:
    """Three leaf queues sharing about 90% of ``total_gpus`` as quota, 5:4:2."""
    quota = max(3, total_gpus * 9 // 10)
    a, b = quota * 5 // 11, quota * 4 // 11
    return (
        QueueSpec(name="chaos-a", gpu_quota=max(1, a), over_quota_weight=1),
        QueueSpec(name="chaos-b", gpu_quota=max(1, b), over_quota_weight=1),
        QueueSpec(name="chaos-c", gpu_quota=max(1, quota - a - b), over_quota_weight=2),
    )


def queue_manifest(queue: QueueSpec) -> dict[str, Any]:
    """A top-level leaf Queue with a GPU quota, no limit, and CPU and memory open."""
    open_resource = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": names.QUEUE_API_VERSION,
        "kind": "Queue",
        "metadata": {"name": queue.name},
        "spec": {
            "resources": {
                "gpu": {"quota": queue.gpu_quota, "limit": -1, "overQuotaWeight": queue.over_quota_weight},
                "cpu": open_resource,
                "memory": open_resource,
            }
        },
    }


def namespace_manifest() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def _pod(
    name: str,
    *,
    queue: str,
    priority_class: str,
    limits: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "2Gi"}}
    if limits:
        resources["limits"] = dict(limits)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {names.QUEUE_LABEL: queue},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "schedulerName": "quotient",
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "ubuntu", "resources": resources}],
        },
    }


def draw(rng: random.Random, *, index: int, queues: Sequence[QueueSpec]) -> Job:
    """The ``index``-th job: its kind, queue, priority and lifetime drawn from ``rng``."""
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    queue = rng.choices([q.name for q in queues], weights=[q.gpu_quota for q in queues])[0]
    priority_class = "build-preemptible" if rng.random() < 0.2 else names.DEFAULT_PRIORITY_CLASS
    lifetime_s = round(rng.uniform(*LIFETIME_S), 1)
    name = f"{kind.value}-{index:05d}"
    if kind in (JobKind.WHOLE_1, JobKind.WHOLE_2):
        gpus = 1 if kind is JobKind.WHOLE_1 else 2
        pod = _pod(
            name,
            limits={names.GPU_RESOURCE: str(gpus)},
            annotations={names.SIM_GPU_MEMORY_ANNOTATION: "4Gi@0s"},
            queue=queue,
            priority_class=priority_class,
        )
        return Job(name=name, kind=kind, queue=queue, lifetime_s=lifetime_s, milli_gpu=gpus * 1000, pods=(pod,))
    if kind is JobKind.FRACTION:
        fraction = rng.choice(FRACTIONS)
        annotations = {names.GPU_FRACTION_ANNOTATION: fraction, names.SIM_GPU_MEMORY_ANNOTATION: "1Gi@0s"}
        pod = _pod(name, annotations=annotations, queue=queue, priority_class=priority_class)
        milli = round(float(fraction) * 1000)
        return Job(name=name, kind=kind, queue=queue, lifetime_s=lifetime_s, milli_gpu=milli, pods=(pod,))
    if kind is JobKind.MEMORY:
        memory = rng.choice(GPU_MEMORY)
        annotations = {names.GPU_MEMORY_ANNOTATION: memory, names.SIM_GPU_MEMORY_ANNOTATION: "1Gi@0s"}
        pod = _pod(name, annotations=annotations, queue=queue, priority_class=priority_class)
        milli = int(memory.removesuffix("Gi")) * 1000 // 80
        return Job(name=name, kind=kind, queue=queue, lifetime_s=lifetime_s, milli_gpu=milli, pods=(pod,))
    if kind is JobKind.GANG:
        size = rng.choice((2, 3))
        group = {
            "apiVersion": names.POD_GROUP_API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"minMember": size, "queue": queue, "priorityClassName": priority_class},
        }
        pods = tuple(
            _pod(
                f"{name}-{member}",
                limits={names.GPU_RESOURCE: "1"},
                annotations={names.POD_GROUP_ANNOTATION: name},
                queue=queue,
                priority_class=priority_class,
            )
            for member in range(size)
        )
        return Job(
            name=name, kind=kind, queue=queue, lifetime_s=lifetime_s, milli_gpu=size * 1000, pods=pods, podgroup=group
        )
    pod = _pod(name, queue=queue, priority_class=priority_class)
    return Job(name=name, kind=kind, queue=queue, lifetime_s=lifetime_s, milli_gpu=0, pods=(pod,))

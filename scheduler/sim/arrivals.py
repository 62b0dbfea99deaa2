"""A cluster spec as the placement engine's model: its nodes, and its pods grouped into gangs that arrive together.

Shares come from KAI's ``gpu-fraction`` / ``gpu-memory`` annotations, read by the scheduler's own parser; pods that
carry the same ``pod-group-name`` annotation form one gang that needs all of them at once (it arrives with its last
member). A pod pinned with ``node:`` is held to that node by its hostname label. Every pod of the spec is
scheduled, whatever its ``scheduler_name``; a pod without a queue goes to KAI's ``default-queue``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from common import clusterspec, names
from common.errors import ClusterSpecError
from common.resources import Resources
from scheduler.objects import gpurequest
from scheduler.placement import model

"""The kubelet's node label (a pinned pod selects its node by it)."""


def engine_node(spec: clusterspec.NodeSpec) -> model.Node:
    return model.Node(
        name=model.NodeName(spec.name),
        allocatable=spec.capacity,
        labels=dict(spec.labels),
        taints=tuple(
            model.Taint(key=taint.key, value=taint.value, effect=model.TaintEffect(taint.effect.value))
            for taint in spec.taints
        ),
        devices=tuple(
            model.Device(
                index=gpu.index,
                uuid=model.GpuUuid(gpu.uuid),
                model=clusterspec.product_label(gpu.product),
                memory_bytes=gpu.memory_bytes,
            )
            for gpu in spec.gpus
        ),
    )


def engine_pod(spec: clusterspec.PodSpec) -> model.Pod:
    """The pod as the engine sees it; its GPU annotations are read with the scheduler's own parser."""
    share = _share(spec)
    selector = dict(spec.node_selector)
    if spec.node is not None:
        selector[names.HOSTNAME_LABEL] = spec.node
    return model.Pod(
        uid=model.PodUid(f"{spec.namespace}/{spec.name}"),
        name=spec.name,
        namespace=spec.namespace,
        requests=Resources(
            milli_cpu=spec.milli_cpu,
            memory_bytes=spec.memory_bytes,
            milli_gpu=0 if share is not None else spec.gpus * model.MILLI_GPU_PER_DEVICE,
            pods=1,
        ),
        share=share,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(
            model.Toleration(
                key=toleration.key,
                operator=model.TolerationOperator(toleration.operator.value),
                value=toleration.value,
                effect=None if toleration.effect is None else model.TaintEffect(toleration.effect.value),
            )
            for toleration in spec.tolerations
        ),
        created_ns=spec.arrive_ns,
    )


def _share(spec: clusterspec.PodSpec) -> model.GpuShare | None:
    annotations = spec.annotations
    fraction = annotations.get(names.GPU_FRACTION_ANNOTATION)
    memory = annotations.get(names.GPU_MEMORY_ANNOTATION)
    if fraction is None and memory is None:
        return None
    where = f"pod {spec.namespace}/{spec.name}"
    if fraction is not None and memory is not None:
        raise ClusterSpecError(f"{where}: gpu-fraction and gpu-memory together; give one of them")
    if spec.gpus:
        raise ClusterSpecError(f"{where}: a GPU share together with nvidia.com/gpu; give one of them")
    devices = 1
    if names.GPU_FRACTION_NUM_DEVICES_ANNOTATION in annotations:
        text = annotations[names.GPU_FRACTION_NUM_DEVICES_ANNOTATION]
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise ClusterSpecError(
                f"{where}: {names.GPU_FRACTION_NUM_DEVICES_ANNOTATION} {text!r} is not a whole number >= 1"
            )
        devices = int(text)
    parsed = gpurequest.parse_fraction(fraction) if fraction is not None else gpurequest.parse_gpu_memory(memory or "")
    if isinstance(parsed, gpurequest.AnnotationProblem):
        raise ClusterSpecError(f"{where}: {parsed.message}")
    if fraction is not None:
        return model.GpuShare(milli_gpu=parsed, devices=devices)
    return model.GpuShare(memory_bytes=parsed, devices=devices)


@dataclasses.dataclass(slots=True, kw_only=True)
class Gang:
    """A group of the spec, when it arrives, and how long each of its pods runs once started (None: to the end)."""

    group: model.Group
    arrive_ns: int
    durations: Mapping[model.PodUid, int | None]


def gangs(spec: clusterspec.ClusterSpec) -> list[Gang]:
    """The spec's pods as groups: one per ``pod-group-name`` (all members needed at once), else one per pod."""
    members: dict[str, list[clusterspec.PodSpec]] = {}
    for pod in spec.pods:
        key = pod.annotations.get(names.POD_GROUP_ANNOTATION)
        members.setdefault(f"{pod.namespace}/{key}" if key else f"{pod.namespace}/{pod.name}", []).append(pod)
    found: list[Gang] = []
    for key, pods in members.items():
        queues = {pod.queue or names.DEFAULT_QUEUE for pod in pods}
        if len(queues) > 1:
            raise ClusterSpecError(f"pod group {key}: its pods name different queues ({', '.join(sorted(queues))})")
        arrive = max(pod.arrive_ns for pod in pods)
        engine_pods = tuple(sorted((engine_pod(pod) for pod in pods), key=lambda pod: pod.uid))
        group = model.Group(
            id=model.GroupId(key),
            queue=model.QueueName(queues.pop()),
            min_member=len(pods),
            created_ns=arrive,
            members=engine_pods,
        )
        durations = {model.PodUid(f"{pod.namespace}/{pod.name}"): pod.duration_ns for pod in pods}
        found.append(Gang(group=group, arrive_ns=arrive, durations=durations))
    found.sort(key=lambda gang: (gang.arrive_ns, gang.group.id))
    return found

"""What a fresh emulated cluster holds before anyone writes: nodes from the cluster spec, the system namespaces,
the system and KAI priority classes, Quotient's CRDs (with their schemas), and KAI's default queues; and the spec's
scripted pods as pod objects.

Nodes are registered as a kubelet and GPU Feature Discovery would register them: labels, taints, capacity and
allocatable (``cpu``, ``memory``, ``pods``, ``nvidia.com/gpu``), ``Ready=True`` and the pressure conditions,
addresses, a pod CIDR and nodeInfo. The defaults Quotient's install brings (KAI-COMPAT.md) are there too, so
unlabelled pods have ``default-queue`` to go to and pods naming ``train`` or ``inference`` are admitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from common import clusterspec, names, quantities
from quotient.emulator.objects import Obj

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_KAI_CLASS_DESCRIPTIONS = {
    "train": "KAI: preemptible training workloads.",
    "build-preemptible": "KAI: preemptible interactive build workloads.",
    "build": "KAI: interactive build workloads (non-preemptible).",
    "inference": "KAI: inference workloads (non-preemptible).",
}
# scheduling.k8s.io built-ins, and the classes KAI ships (KAI-COMPAT.md).
PRIORITY_CLASSES = (
    (
        "system-node-critical",
        2000001000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2000000000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
    *((name, value, _KAI_CLASS_DESCRIPTIONS[name]) for name, value in names.KAI_PRIORITY_CLASSES.items()),
)
KUBELET_VERSION = "v1.32.0"


def _cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def node_object(node: clusterspec.NodeSpec, index: int) -> Obj:
    """The Node a kubelet would register for ``node`` (``index`` picks its addresses and pod CIDR)."""
    resources = {
        "cpu": _cpu(node.milli_cpu),
        "memory": quantities.format_bytes_quantity(node.memory_bytes),
        "pods": str(node.pods),
        "ephemeral-storage": "500Gi",
    }
    if node.gpus:
        resources[names.GPU_RESOURCE] = str(len(node.gpus))
    host = index + 1
    ip = f"172.{16 + ((host >> 16) & 0x0F)}.{(host >> 8) & 0xFF}.{host & 0xFF}"
    cidr = f"10.{64 + (index >> 8) % 192}.{index & 0xFF}.0/24"
    taints = [
        {"key": taint.key, "effect": str(taint.effect), **({"value": taint.value} if taint.value else {})}
        for taint in node.taints
    ]
    spec: Obj = {"podCIDR": cidr, "podCIDRs": [cidr]}
    if taints:
        spec["taints"] = taints
    ready_message = {
        "Ready": ("True", "KubeletReady", "kubelet is posting ready status"),
        "MemoryPressure": ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        "DiskPressure": ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        "PIDPressure": ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": dict(node.labels),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", names.EMULATED_LABEL: "true"},
        },
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {"type": kind, "status": value, "reason": reason, "message": message}
                for kind, (value, reason, message) in ready_message.items()
            ],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": clusterspec.gpu_uuid(node.name, -1)[4:].replace("-", ""),
                "systemUUID": clusterspec.gpu_uuid(node.name, -2)[4:],
                "bootID": clusterspec.gpu_uuid(node.name, -3)[4:],
                "kernelVersion": "6.1.0-emulated",
                "osImage": "Quotient emulated node",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def namespace_object(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def crd_objects(directory: Path | None) -> list[Obj]:
    """The CustomResourceDefinitions in ``directory`` (Quotient's install: ``deploy/base/crds``), so custom resources
    are checked against the schemas a real cluster would have; none when there is no such directory (an installed
    package without the repository's ``deploy/``)."""
    if directory is None or not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                found.append(document)
    return found


def priority_class_objects() -> list[Obj]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "globalDefault": False,
            "description": description,
        }
        for name, value, description in PRIORITY_CLASSES
    ]


def _queue_resources() -> Obj:
    return {resource: {"quota": 0, "limit": -1, "overQuotaWeight": 1} for resource in ("cpu", "gpu", "memory")}


def default_queue_objects() -> list[Obj]:
    """KAI's install defaults: ``default-parent-queue`` and its leaf ``default-queue`` (quota 0, limit -1)."""
    return [
        {
            "apiVersion": names.QUEUE_API_VERSION,
            "kind": "Queue",
            "metadata": {"name": names.DEFAULT_PARENT_QUEUE},
            "spec": {"resources": _queue_resources()},
        },
        {
            "apiVersion": names.QUEUE_API_VERSION,
            "kind": "Queue",
            "metadata": {"name": names.DEFAULT_QUEUE},
            "spec": {"parentQueue": names.DEFAULT_PARENT_QUEUE, "resources": _queue_resources()},
        },
    ]


def _duration(ns: int) -> str:
    for unit, size in (("s", quantities.NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def pod_object(pod: clusterspec.PodSpec) -> Obj:
    """A scripted pod of the cluster spec as a Pod (its arrival time is the caller's business)."""
    requests: Obj = {}
    if pod.milli_cpu:
        requests["cpu"] = _cpu(pod.milli_cpu)
    if pod.memory_bytes:
        requests["memory"] = quantities.format_bytes_quantity(pod.memory_bytes)
    resources: Obj = {}
    if pod.gpus:
        requests[names.GPU_RESOURCE] = str(pod.gpus)
        resources["limits"] = {names.GPU_RESOURCE: str(pod.gpus)}
    if requests:
        resources["requests"] = requests
    annotations = dict(pod.annotations)
    if pod.duration_ns is not None:
        annotations[names.SIM_DURATION_ANNOTATION] = _duration(pod.duration_ns)
    spec: Obj = {
        "schedulerName": pod.scheduler_name,
        "restartPolicy": "Never" if pod.duration_ns is not None else "Always",
        "containers": [{"name": "main", "image": "quotient.dev/sim:latest", "resources": resources}],
    }
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spec["tolerations"] = [
            {
                key: value
                for key, value in (
                    ("key", toleration.key),
                    ("operator", str(toleration.operator)),
                    ("value", toleration.value),
                    ("effect", str(toleration.effect) if toleration.effect is not None else ""),
                )
                if value
            }
            for toleration in pod.tolerations
        ]
    if pod.node is not None:
        spec["nodeName"] = pod.node
    meta: Obj = {"name": pod.name, "namespace": pod.namespace, "labels": dict(pod.labels)}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpu_uuids(spec: clusterspec.ClusterSpec) -> dict[str, tuple[str, ...]]:
    return {node.name: tuple(gpu.uuid for gpu in node.gpus) for node in spec.nodes}


def namespaces_of(pods: Sequence[clusterspec.PodSpec]) -> list[str]:
    return sorted({pod.namespace for pod in pods} - set(SYSTEM_NAMESPACES))

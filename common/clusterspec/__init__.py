"""The one cluster spec format: the nodes of a cluster, their GPUs, and scripted pods.

The fake GPUs, the Kubernetes emulator and the trace simulator all need to be told what cluster to pretend to be.
They read it here and only here, so a file means the same to all three, and every check (names, quantities, GPU
models, scripts) is made once, with an error that names the file, the line and the field. The results are frozen
values in integer units (millicores, bytes, nanoseconds). Only ``load`` and ``resolve`` touch the file system.

YAML form (only ``nodes`` is required)::

    nodes:
      - name: a100                  # one node "a100"; with count: N, the N nodes a100-0 .. a100-<N-1>
        count: 2                    # (without a name: node-0, node-1, ... as in the inline form)
        cpu: 96                     # cores, or a CPU quantity such as 95500m
        memory: 1Ti                 # a Kubernetes quantity or a number of bytes
        pods: 110                   # pod slots
        labels: {topology.kubernetes.io/zone: zone-a}
        taints:
          - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
          - dedicated=research:NoExecute          # kubectl's KEY[=VALUE]:EFFECT works too
        gpus: {count: 8, model: A100-80GB}        # memory: 80Gi overrides the model's; unknown models need it
        unowned_processes:          # GPU memory held by processes of no pod: another tenant, a zombie, a daemon
          - {gpu: 0, memory: 6Gi}
          - {gpu: 1, memory: "1Gi@0s,4Gi@30s"}
    pods:
      - name: train                 # with count: N, the N pods train-0 .. train-<N-1>
        namespace: team-a           # default "default"
        queue: team-a               # sets the label kai.scheduler/queue
        scheduler_name: quotient    # default "quotient"
        requests: {cpu: 8, memory: 64Gi, nvidia.com/gpu: 2}   # each default 0
        labels: {app: train}
        annotations: {gpu-fraction: "0.5"}
        node_selector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
        tolerations:                # operator: Equal (the default, with a value) or Exists; effect: any if absent
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        node: a100-0                # pre-bound to this node
        gpu_memory: "2Gi@0s,30Gi@20s"                # or [{at: 0s, memory: 2Gi}, {at: 20s, memory: 30Gi}]
        arrive: 30s                 # offset from the start of the run; default 0s
        duration: 10m               # how long it runs once started; default: until the end

Entries with ``count`` number on where an earlier entry with the same name (and, for pods, namespace) stopped, so
names never collide. Anchors and merge keys (``- <<: *a100``) work, so alike entries need not be repeated. Unknown
keys (with a suggestion), duplicate keys, wrong types, malformed or negative quantities, invalid Kubernetes names or
labels, duplicate node or pod names, a pod bound to an unknown node, an unowned process on a GPU the node lacks (or
holding more than it has) and an unknown GPU model without ``memory`` are errors. Label and annotation values are
taken as written (``true``, ``0.50``), never re-spelled by YAML's typing.

Inline form, for the command line: groups ``NODESxGPUS[xMODEL][:KEY=VALUE,...]`` joined by ``+``, for example
``2x8xA100-80GB`` (two nodes of eight A100-80GB), ``2x8xA100-80GB+4x0`` (and four CPU-only nodes), ``1x4xT4`` or
``2x8xA100-80GB:cpu=96,mem=768Gi,pods=110,gpumem=80Gi,prefix=gpu-a``. Nodes are named PREFIX-0, PREFIX-1, ...
(prefix ``node``), numbered on across the groups that share a prefix, so names are unique.

Defaults for both forms: CPU max(64, 16 x GPUs) cores, memory max(512Gi, 128Gi x GPUs), 110 pod slots (the
kubelet's default ``maxPods``). A CPU-only or four-GPU node gets 64 cores and 512Gi; an eight-GPU node 128 cores and
1Ti, the shape of a DGX A100 (128 cores, 1 to 2 TiB).

GPU models (``KNOWN_GPU_MODELS``, matched case-insensitively, also by NVML name or its label form): the memory is the
total NVML reports (what ``nvidia-smi`` shows and GPU Feature Discovery writes to ``nvidia.com/gpu.memory``), not the
size on the box: an H100 has 81559 MiB, so a pod asking for 80Gi does not fit here either, as on the real card. The
Alibaba trace's names (P100, T4, V100M16, V100M32, A10) map to those cards; its G1, G2 and G3 are undisclosed, and
we give them 32 GiB (about a V100M32, the trace's largest disclosed card) so that memory-based shares have a size;
say ``memory`` to choose otherwise. Each device gets a UUID derived from the node name and index (stable across
runs), and each node the labels GPU Feature Discovery and the kubelet would set: ``kubernetes.io/hostname``,
``kubernetes.io/os``, ``kubernetes.io/arch`` and, with GPUs, ``nvidia.com/gpu.product`` (the NVML name, spaces as
dashes), ``nvidia.com/gpu.memory`` (MiB) and ``nvidia.com/gpu.count``. Labels written in the spec win over these, to
model a mislabelled node.

Memory scripts say how much GPU memory a process holds over time, piecewise constant: ``2Gi@0s,30Gi@20s`` is nothing
before 0s, 2Gi from 0s, 30Gi from 20s on. A point without ``@`` starts at 0s, so ``6Gi`` is a constant. The same text
is the pod annotation ``quotient.dev/sim-gpu-memory``; a pod's ``gpu_memory`` is always written into its annotations
in that canonical form, so what the emulator creates carries it to the fake GPUs.

Modules by topic, in the order they build on each other: ``checking`` (names, labels, bounded quantities, the
``Invalid`` problem every reader turns into a located ``ClusterSpecError``), ``catalogue`` (GPU models, device
UUIDs), ``memoryscripts``, ``spec`` (the frozen values), ``building`` (nodes, their defaults and standard labels),
``inline`` (the inline form), ``yamlreading`` (YAML shapes with lines) and ``schema`` (the YAML form's keys), and
``loading`` (text, files and command-line arguments). The names below are the public API; callers write
``clusterspec.load(...)``, never a submodule.
"""

from __future__ import annotations

from common.clusterspec.building import default_node_resources, make_node
from common.clusterspec.catalogue import KNOWN_GPU_MODELS, GpuModel, gpu_uuid, lookup_gpu_model, product_label
from common.clusterspec.inline import INLINE_FORM, parse_inline
from common.clusterspec.loading import load, loads, resolve
from common.clusterspec.memoryscripts import MEMORY_SCRIPT_FORM, MemoryScript, parse_memory_script
from common.clusterspec.spec import (
    ClusterSpec,
    GpuSpec,
    NodeSpec,
    PodSpec,
    Taint,
    TaintEffect,
    Toleration,
    TolerationOperator,
    UnownedProcess,
)

__all__ = [
    "INLINE_FORM",
    "KNOWN_GPU_MODELS",
    "MEMORY_SCRIPT_FORM",
    "ClusterSpec",
    "GpuModel",
    "GpuSpec",
    "MemoryScript",
    "NodeSpec",
    "PodSpec",
    "Taint",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "UnownedProcess",
    "default_node_resources",
    "gpu_uuid",
    "load",
    "loads",
    "lookup_gpu_model",
    "make_node",
    "parse_inline",
    "parse_memory_script",
    "product_label",
    "resolve",
]

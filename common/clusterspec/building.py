"""Building nodes: their defaults, devices, UUIDs and standard labels, the same for every way of describing them.

The YAML form, the inline form and ``make_node`` (public for readers of other formats, such as the trace) all end in
``build_node``, so a node has the same devices and labels however it was written. The labels are those GPU Feature
Discovery and the kubelet would set; labels written in the spec win over them, to model a mislabelled node.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

from common import names, quantities
from common.clusterspec import catalogue, checking, spec
from common.errors import ClusterSpecError

DEFAULT_NODE_PREFIX = "node"
DEFAULT_POD_SLOTS = 110  # the kubelet's default maxPods
# A CPU-only or four-GPU node gets 64 cores and 512Gi; an eight-GPU node 128 cores and 1Ti, the shape of a DGX A100
# (128 cores, 1 to 2 TiB).
DEFAULT_MIN_CORES = 64
DEFAULT_CORES_PER_GPU = 16
DEFAULT_MIN_MEMORY_BYTES = 512 * quantities.GIB
DEFAULT_MEMORY_PER_GPU_BYTES = 128 * quantities.GIB
# Bounds that keep a typo ("20000000x8xH100") from eating the machine; far above any cluster we model.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64


def default_node_resources(gpu_count: int) -> tuple[int, int]:
    """(milli_cpu, memory_bytes) of a node with ``gpu_count`` devices whose spec does not say."""
    cores = max(DEFAULT_MIN_CORES, DEFAULT_CORES_PER_GPU * gpu_count)
    memory_bytes = max(DEFAULT_MIN_MEMORY_BYTES, DEFAULT_MEMORY_PER_GPU_BYTES * gpu_count)
    return cores * quantities.MILLICORES_PER_CORE, memory_bytes


def make_node(
    name: str,
    *,
    milli_cpu: int | None = None,
    memory_bytes: int | None = None,
    pods: int = DEFAULT_POD_SLOTS,
    gpu_count: int = 0,
    gpu_model: str | None = None,
    gpu_memory_bytes: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[spec.Taint] = (),
    unowned_processes: Sequence[spec.UnownedProcess] = (),
) -> spec.NodeSpec:
    """A node with its devices, UUIDs and standard labels, defaults filled in; ClusterSpecError when invalid."""
    try:
        checking.check_name(name, "node name")
        model = gpu_group(gpu_count, gpu_model, gpu_memory_bytes)
        for process in unowned_processes:
            check_unowned(process, gpu_count, model)
        for key, value in (labels or {}).items():
            checking.check_label(key, value)
    except checking.Invalid as exc:
        raise ClusterSpecError(f"node {name!r}: {exc}") from exc
    default_cpu, default_memory = default_node_resources(gpu_count)
    return build_node(
        name,
        milli_cpu=default_cpu if milli_cpu is None else milli_cpu,
        memory_bytes=default_memory if memory_bytes is None else memory_bytes,
        pods=pods,
        gpu_count=gpu_count,
        model=model,
        labels=labels or {},
        taints=tuple(taints),
        unowned=tuple(unowned_processes),
    )


def gpu_group(count: int, model: str | None, memory_bytes: int | None) -> catalogue.GpuModel | None:
    """The model of a node's ``count`` devices (None for a node without), as the spec names it and its memory."""
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        raise checking.Invalid(f"{count} GPUs per node; between 0 and {MAX_GPUS_PER_NODE} are supported")
    if count == 0:
        if model is not None or memory_bytes is not None:
            raise checking.Invalid("a node without GPUs takes no GPU model or memory")
        return None
    if model is None:
        raise checking.Invalid(
            f"{count} GPUs need a model ({', '.join(catalogue.KNOWN_GPU_MODELS)}, or any name with its memory)"
        )
    return catalogue.resolve_model(model, memory_bytes)


def check_unowned(process: spec.UnownedProcess, gpu_count: int, model: catalogue.GpuModel | None) -> None:
    """An unowned process must sit on a device the node has, and hold no more than that device's memory."""
    if not 0 <= process.gpu_index < gpu_count:
        raise checking.Invalid(f"GPU {process.gpu_index} does not exist; the node has {gpu_count} (indices from 0)")
    if model is not None and process.memory.peak_bytes > model.memory_bytes:
        raise checking.Invalid(
            f"the process holds up to {quantities.format_bytes(process.memory.peak_bytes)}, more than the "
            f"device's {quantities.format_bytes(model.memory_bytes)}"
        )


def build_node(
    name: str,
    *,
    milli_cpu: int,
    memory_bytes: int,
    pods: int,
    gpu_count: int,
    model: catalogue.GpuModel | None,
    labels: Mapping[str, str] = types.MappingProxyType({}),
    taints: tuple[spec.Taint, ...] = (),
    unowned: tuple[spec.UnownedProcess, ...] = (),
) -> spec.NodeSpec:
    """The node of checked parts: devices numbered from 0 with their UUIDs, the standard labels under ``labels``."""
    standard = {names.HOSTNAME_LABEL: name, names.OS_LABEL: "linux", names.ARCH_LABEL: "amd64"}
    gpus: tuple[spec.GpuSpec, ...] = ()
    if model is not None:
        gpus = tuple(
            spec.GpuSpec(
                index=index,
                uuid=catalogue.gpu_uuid(name, index),
                model=model.name,
                product=model.product,
                memory_bytes=model.memory_bytes,
            )
            for index in range(gpu_count)
        )
        standard[names.GPU_PRODUCT_LABEL] = model.product_label
        standard[names.GPU_MEMORY_LABEL] = str(model.memory_bytes // quantities.MIB)
        standard[names.GPU_COUNT_LABEL] = str(gpu_count)
    return spec.NodeSpec(
        name=name,
        milli_cpu=milli_cpu,
        memory_bytes=memory_bytes,
        pods=pods,
        labels=types.MappingProxyType(standard | dict(labels)),
        taints=taints,
        gpus=gpus,
        unowned_processes=unowned,
    )


class NameAllocator:
    """Hands out PREFIX-0, PREFIX-1, ... numbering on per prefix, so groups that share a prefix never collide."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, prefix: str, *, scope: str = "") -> str:
        key = f"{scope}/{prefix}"
        index = self._next.get(key, 0)
        self._next[key] = index + 1
        return f"{prefix}-{index}"

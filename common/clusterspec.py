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
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import enum
import hashlib
import itertools
import re
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

import yaml

from common import quantities
from common.errors import ClusterSpecError, QuantityError
from common.resources import Resources

SIM_GPU_MEMORY_ANNOTATION = "quotient.dev/sim-gpu-memory"
QUEUE_LABEL = "kai.scheduler/queue"
DEFAULT_SCHEDULER_NAME = "quotient"
DEFAULT_NAMESPACE = "default"
DEFAULT_NODE_PREFIX = "node"
DEFAULT_POD_SLOTS = 110  # the kubelet's default maxPods
DEFAULT_MIN_CORES = 64
DEFAULT_CORES_PER_GPU = 16
DEFAULT_MIN_MEMORY_BYTES = 512 * quantities.GIB
DEFAULT_MEMORY_PER_GPU_BYTES = 128 * quantities.GIB
# Bounds that keep a typo ("20000000x8xH100") from eating the machine; far above any cluster we model.
MAX_NODES = 100_000
MAX_PODS = 1_000_000
MAX_GPUS_PER_NODE = 64
_MAX_INT = 2**63 - 1  # everything travels as int64 on the wire

# Changing this changes every fake GPU's UUID; keep it.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://quotient.dev/fake-gpu")
_UUID_NAMESPACE_BYTES = _UUID_NAMESPACE.bytes

INLINE_FORM = (
    "groups NODESxGPUS[xMODEL][:KEY=VALUE,...] joined by '+', such as 2x8xA100-80GB, 2x8xA100-80GB+4x0 or "
    "2x8xA100-80GB:cpu=96,mem=768Gi,pods=110,gpumem=80Gi,prefix=gpu-a"
)
MEMORY_SCRIPT_FORM = (
    "MEMORY@OFFSET points joined by commas, such as 2Gi@0s,30Gi@20s (without @OFFSET a point starts at 0s)"
)


_E = TypeVar("_E", bound=enum.StrEnum)


class _Invalid(Exception):
    """A problem found by a parser below the public functions, which add where it was found."""


# --- GPU models ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel:
    """A kind of GPU: the name a spec uses, the name NVML reports, and the memory NVML reports."""

    name: str
    product: str
    memory_bytes: int

    @property
    def product_label(self) -> str:
        """The value of ``nvidia.com/gpu.product`` for this model."""
        return product_label(self.product)


def _model(name: str, product: str, memory_mib: int) -> GpuModel:
    return GpuModel(name=name, product=product, memory_bytes=memory_mib * quantities.MIB)


# Memory totals as NVML (nvidia-smi, GFD's nvidia.com/gpu.memory) reports them for the SXM/PCIe boards named.
KNOWN_GPU_MODELS: Mapping[str, GpuModel] = types.MappingProxyType(
    {
        model.name: model
        for model in (
            _model("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960),
            _model("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920),
            _model("H100-80GB", "NVIDIA H100 80GB HBM3", 81559),
            _model("H200", "NVIDIA H200", 143771),
            _model("L4", "NVIDIA L4", 23034),
            _model("A10", "NVIDIA A10", 23028),
            _model("T4", "Tesla T4", 15360),
            _model("V100-16GB", "Tesla V100-SXM2-16GB", 16160),
            _model("V100-32GB", "Tesla V100-SXM2-32GB", 32510),
            _model("V100M16", "Tesla V100-SXM2-16GB", 16160),  # the Alibaba trace's names
            _model("V100M32", "Tesla V100-SXM2-32GB", 32510),
            _model("P100", "Tesla P100-PCIE-16GB", 16280),
            _model("G1", "G1", 32768),  # undisclosed in the trace: see the module docstring
            _model("G2", "G2", 32768),
            _model("G3", "G3", 32768),
        )
    }
)


def product_label(product: str) -> str:
    """GPU Feature Discovery's label form of an NVML product name: words joined by dashes, other characters dashed."""
    dashed = re.sub(r"[^A-Za-z0-9._-]", "-", "-".join(product.split()))
    return dashed[:63].strip("-._")


# Every spelling a spec may use for a known model: its name, its NVML name, and that name's label form, any case.
_MODEL_INDEX: Mapping[str, GpuModel] = {
    alias.lower(): model
    for model in tuple(KNOWN_GPU_MODELS.values())[::-1]  # the first of equal products wins
    for alias in (model.name, model.product, model.product_label)
}


def lookup_gpu_model(name: str) -> GpuModel | None:
    """The known model called ``name`` (spec name, NVML name or its label form; any case), or None."""
    return _MODEL_INDEX.get(name.strip().lower())


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of device ``index`` on ``node``: NVML's ``GPU-`` form, the same in every run.

    It is ``uuid.uuid5(_UUID_NAMESPACE, "<node>/<index>")``, computed with hashlib directly because the uuid module
    takes a second for the 40,000 devices of a 5,000-node cluster.
    """
    digest = bytearray(hashlib.sha1(_UUID_NAMESPACE_BYTES + f"{node}/{index}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _resolve_model(name: str, memory_bytes: int | None) -> GpuModel:
    known = lookup_gpu_model(name)
    if known is not None:
        return known if memory_bytes is None else dataclasses.replace(known, memory_bytes=memory_bytes)
    if memory_bytes is None:
        raise _Invalid(
            f"unknown GPU model {name!r}{_suggest(name, KNOWN_GPU_MODELS)}; give its memory, "
            f"or use one of {', '.join(KNOWN_GPU_MODELS)}"
        )
    if not product_label(name):
        raise _Invalid(f"GPU model name {name!r} needs a letter or digit")
    return GpuModel(name=name, product=name, memory_bytes=memory_bytes)


# --- Memory scripts ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryScript:
    """GPU memory over time, piecewise constant: ``points`` are (offset_ns, memory_bytes), offsets increasing."""

    points: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ClusterSpecError("a memory script needs at least one point")
        previous = -1
        for offset_ns, memory_bytes in self.points:
            if not 0 <= offset_ns <= _MAX_INT or not 0 <= memory_bytes <= _MAX_INT:
                raise ClusterSpecError(f"memory script point ({offset_ns}, {memory_bytes}) is out of range")
            if offset_ns <= previous:
                raise ClusterSpecError(f"memory script offsets must increase: {self.points}")
            previous = offset_ns

    @classmethod
    def constant(cls, memory_bytes: int) -> MemoryScript:
        """``memory_bytes`` from offset 0 on."""
        return cls(points=((0, memory_bytes),))

    @property
    def start_ns(self) -> int:
        return self.points[0][0]

    @property
    def peak_bytes(self) -> int:
        return max(memory_bytes for _, memory_bytes in self.points)

    def at(self, offset_ns: int) -> int | None:
        """The memory held at ``offset_ns`` after the start, or None before the first point (not started)."""
        position = bisect.bisect_right(self.points, offset_ns, key=lambda point: point[0])
        return None if position == 0 else self.points[position - 1][1]

    def text(self) -> str:
        """The canonical text form, which ``parse_memory_script`` reads back to an equal script."""
        return ",".join(
            f"{quantities.format_bytes_quantity(memory_bytes)}@{_format_duration(offset_ns)}"
            for offset_ns, memory_bytes in self.points
        )


def parse_memory_script(text: str) -> MemoryScript:
    """Read ``2Gi@0s,30Gi@20s`` (also the value of the ``quotient.dev/sim-gpu-memory`` annotation)."""
    try:
        return _script_from_text(text)
    except _Invalid as exc:
        raise ClusterSpecError(f"memory script {_excerpt(text)}: {exc}") from exc


def _script_from_text(text: str) -> MemoryScript:
    if not text.strip():
        raise _Invalid(f"empty; expected {MEMORY_SCRIPT_FORM}")
    points: list[tuple[int, int]] = []
    for part in text.split(","):
        memory_text, at, offset_text = part.partition("@")
        memory_bytes = _parse(quantities.parse_bytes, memory_text.strip(), "memory")
        offset_ns = _parse(quantities.parse_duration_ns, offset_text.strip(), "offset") if at else 0
        points.append((offset_ns, memory_bytes))
    return _script_from_points(points)


def _script_from_points(points: Sequence[tuple[int, int]]) -> MemoryScript:
    for (before, _), (after, _) in itertools.pairwise(points):
        if after <= before:
            raise _Invalid(
                f"offsets must increase, but {_format_duration(after)} follows {_format_duration(before)}; "
                f"expected {MEMORY_SCRIPT_FORM}"
            )
    return MemoryScript(points=tuple(points))


def _format_duration(ns: int) -> str:
    for unit, size in (("s", quantities.NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


# --- The values a spec describes ---


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Taint:
    key: str
    value: str
    effect: TaintEffect


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Toleration:
    """Kubernetes' toleration: an empty key with Exists tolerates every taint; no effect means every effect."""

    key: str
    operator: TolerationOperator
    value: str
    effect: TaintEffect | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One device: ``model`` as the spec names it, ``product`` as NVML names it, memory as NVML reports it."""

    index: int
    uuid: str
    model: str
    product: str
    memory_bytes: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UnownedProcess:
    """A process on device ``gpu_index`` that belongs to no pod, holding memory as its script says."""

    gpu_index: int
    memory: MemoryScript


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A node as the kubelet would register it, with its devices and the processes of no pod on them."""

    name: str
    milli_cpu: int
    memory_bytes: int
    pods: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    gpus: tuple[GpuSpec, ...]
    unowned_processes: tuple[UnownedProcess, ...]

    @property
    def capacity(self) -> Resources:
        """What the node offers for scheduling: its CPU, memory, whole devices and pod slots."""
        return Resources(
            milli_cpu=self.milli_cpu,
            memory_bytes=self.memory_bytes,
            milli_gpu=len(self.gpus) * quantities.MILLI_GPU_PER_GPU,
            pods=self.pods,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodSpec:
    """A scripted pod. ``gpus`` counts whole devices (``nvidia.com/gpu``); shares are in the annotations."""

    name: str
    namespace: str
    milli_cpu: int
    memory_bytes: int
    gpus: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    scheduler_name: str
    queue: str | None
    node: str | None
    gpu_memory: MemoryScript | None
    arrive_ns: int
    duration_ns: int | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Nodes in the order written (groups expanded in place), then the pods likewise."""

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]


# --- Building nodes (shared by both forms, and public for readers of other formats such as the trace) ---


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
    taints: Sequence[Taint] = (),
    unowned_processes: Sequence[UnownedProcess] = (),
) -> NodeSpec:
    """A node with its devices, UUIDs and standard labels, defaults filled in; ClusterSpecError when invalid."""
    try:
        _check_name(name, "node name")
        model = _gpu_group(gpu_count, gpu_model, gpu_memory_bytes)
        for process in unowned_processes:
            _check_unowned(process, gpu_count, model)
        for key, value in (labels or {}).items():
            _check_label(key, value)
    except _Invalid as exc:
        raise ClusterSpecError(f"node {name!r}: {exc}") from exc
    default_cpu, default_memory = default_node_resources(gpu_count)
    return _build_node(
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


def _gpu_group(count: int, model: str | None, memory_bytes: int | None) -> GpuModel | None:
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        raise _Invalid(f"{count} GPUs per node; between 0 and {MAX_GPUS_PER_NODE} are supported")
    if count == 0:
        if model is not None or memory_bytes is not None:
            raise _Invalid("a node without GPUs takes no GPU model or memory")
        return None
    if model is None:
        raise _Invalid(f"{count} GPUs need a model ({', '.join(KNOWN_GPU_MODELS)}, or any name with its memory)")
    return _resolve_model(model, memory_bytes)


def _check_unowned(process: UnownedProcess, gpu_count: int, model: GpuModel | None) -> None:
    if not 0 <= process.gpu_index < gpu_count:
        raise _Invalid(f"GPU {process.gpu_index} does not exist; the node has {gpu_count} (indices from 0)")
    if model is not None and process.memory.peak_bytes > model.memory_bytes:
        raise _Invalid(
            f"the process holds up to {quantities.format_bytes(process.memory.peak_bytes)}, more than the "
            f"device's {quantities.format_bytes(model.memory_bytes)}"
        )


def _build_node(
    name: str,
    *,
    milli_cpu: int,
    memory_bytes: int,
    pods: int,
    gpu_count: int,
    model: GpuModel | None,
    labels: Mapping[str, str],
    taints: tuple[Taint, ...],
    unowned: tuple[UnownedProcess, ...],
) -> NodeSpec:
    standard = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    gpus: tuple[GpuSpec, ...] = ()
    if model is not None:
        gpus = tuple(
            GpuSpec(
                index=index,
                uuid=gpu_uuid(name, index),
                model=model.name,
                product=model.product,
                memory_bytes=model.memory_bytes,
            )
            for index in range(gpu_count)
        )
        standard["nvidia.com/gpu.product"] = model.product_label
        standard["nvidia.com/gpu.memory"] = str(model.memory_bytes // quantities.MIB)
        standard["nvidia.com/gpu.count"] = str(gpu_count)
    return NodeSpec(
        name=name,
        milli_cpu=milli_cpu,
        memory_bytes=memory_bytes,
        pods=pods,
        labels=types.MappingProxyType(standard | dict(labels)),
        taints=taints,
        gpus=gpus,
        unowned_processes=unowned,
    )


class _Names:
    """Hands out PREFIX-0, PREFIX-1, ... numbering on per prefix, so groups that share a prefix never collide."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, prefix: str, *, scope: str = "") -> str:
        key = f"{scope}/{prefix}"
        index = self._next.get(key, 0)
        self._next[key] = index + 1
        return f"{prefix}-{index}"


# --- Names, labels and quantities ---

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _is_dns_subdomain(text: str) -> bool:
    return 0 < len(text) <= 253 and all(len(part) <= 63 and _DNS_LABEL.fullmatch(part) for part in text.split("."))


def _check_name(text: str, what: str) -> None:
    if not _is_dns_subdomain(text):
        raise _Invalid(
            f"{what} {text!r} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters)"
        )


def _check_namespace(text: str) -> None:
    if not (len(text) <= 63 and _DNS_LABEL.fullmatch(text)):
        raise _Invalid(f"namespace {text!r} is not a DNS label (lowercase letters, digits and '-', at most 63)")


def _check_key(key: str, what: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if (slash and not _is_dns_subdomain(prefix)) or not (len(name) <= 63 and _LABEL_NAME.fullmatch(name)):
        raise _Invalid(
            f"{what} key {key!r} is not a Kubernetes qualified name ([prefix/]name, such as example.com/team)"
        )


def _check_label(key: str, value: str) -> None:
    _check_key(key, "label")
    if value and not (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
        raise _Invalid(
            f"label value {value!r} of {key!r} is not valid (at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )


def _parse(parser: Callable[[str], int], text: str, what: str) -> int:
    # Exact decimal parsing turns "1e999999" into a million-digit integer, which takes a minute: refuse such
    # magnitudes before parsing. Nothing we count needs more than 19 digits.
    exponent = _EXPONENT.search(text)
    if len(text) > _MAX_QUANTITY_CHARS or (exponent is not None and len(exponent[1].lstrip("0")) > 2):
        raise _Invalid(f"{what} {_excerpt(text)} is out of range")
    try:
        value = parser(text)
    except QuantityError as exc:
        raise _Invalid(str(exc)) from exc
    except (ArithmeticError, ValueError) as exc:  # decimal overflow on absurd exponents such as 1e999999999
        raise _Invalid(f"{what} {text!r} is out of range") from exc
    if value > _MAX_INT:
        raise _Invalid(f"{what} {text!r} is too large")
    return value


_MAX_QUANTITY_CHARS = 64
_EXPONENT = re.compile(r"[eE][+-]?([0-9]+)")


def _suggest(word: str, choices: Iterable[str]) -> str:
    candidates = list(choices)
    # "gpu" means "nvidia.com/gpu" far more often than it means "cpu", which is what difflib alone would say.
    qualified = [choice for choice in candidates if choice.lower().endswith("/" + word.lower())]
    close = qualified or difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _excerpt(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def _parse_taint_text(text: str) -> Taint:
    head, colon, effect = text.rpartition(":")
    key, _, value = head.partition("=")
    if not colon or not key:
        raise _Invalid(f"taint {text!r} is not KEY[=VALUE]:EFFECT")
    return _make_taint(key, value, effect)


def _make_taint(key: str, value: str, effect: str) -> Taint:
    _check_label(key, value)
    return Taint(key=key, value=value, effect=_choice(TaintEffect, effect, "taint effect"))


def _make_toleration(key: str, operator: str | None, value: str, effect: str | None) -> Toleration:
    chosen = _choice(TolerationOperator, operator, "toleration operator") if operator else TolerationOperator.EQUAL
    if chosen is TolerationOperator.EXISTS and value:
        raise _Invalid("a toleration with operator Exists takes no value")
    if not key and chosen is not TolerationOperator.EXISTS:
        raise _Invalid("a toleration without a key must have operator Exists")
    if key:
        _check_label(key, value)
    parsed = None if effect is None else _choice(TaintEffect, effect, "taint effect")
    return Toleration(key=key, operator=chosen, value=value, effect=parsed)


def _choice(kind: type[_E], text: str, what: str) -> _E:
    try:
        return kind(text)
    except ValueError:
        accepted = [member.value for member in kind]
        raise _Invalid(f"{what} {text!r} is not one of {', '.join(accepted)}{_suggest(text, accepted)}") from None


# --- The inline form ---

_INLINE_GROUP = re.compile(r"([0-9]+)x([0-9]+)(?:x([^:]+))?(?::(.*))?", re.DOTALL)
_INLINE_KEYS = ("cpu", "mem", "pods", "gpumem", "prefix")


def parse_inline(text: str) -> ClusterSpec:
    """Read the inline form (``2x8xA100-80GB+4x0:cpu=32``); see the module docstring."""
    names = _Names()
    nodes: list[NodeSpec] = []
    for number, group in enumerate(text.split("+"), start=1):
        try:
            nodes.extend(_inline_group(group.strip(), names, len(nodes)))
        except _Invalid as exc:
            where = f"group {number} {_excerpt(group.strip())}: " if "+" in text else ""
            raise ClusterSpecError(
                f"inline cluster spec {_excerpt(text)}: {where}{exc}; expected {INLINE_FORM}"
            ) from exc
    return ClusterSpec(nodes=tuple(nodes), pods=())


def _inline_group(group: str, names: _Names, nodes_so_far: int) -> list[NodeSpec]:
    match = _INLINE_GROUP.fullmatch(group)
    if match is None:
        raise _Invalid("not NODESxGPUS[xMODEL][:KEY=VALUE,...]" if group else "empty group")
    if len(match[1]) > 9 or len(match[2]) > 9:
        raise _Invalid("too many nodes or GPUs")
    node_count, gpu_count, model, overrides = int(match[1]), int(match[2]), match[3], match[4]
    if node_count < 1 or nodes_so_far + node_count > MAX_NODES:
        raise _Invalid(f"{node_count} nodes; between 1 and {MAX_NODES} in all are supported")
    settings: dict[str, str] = {}
    for item in overrides.split(",") if overrides is not None else []:
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key or not value:
            raise _Invalid(f"override {item.strip()!r} is not KEY=VALUE")
        if key not in _INLINE_KEYS:
            raise _Invalid(
                f"unknown override {key!r}{_suggest(key, _INLINE_KEYS)}; accepted: {', '.join(_INLINE_KEYS)}"
            )
        if key in settings:
            raise _Invalid(f"override {key!r} given twice")
        settings[key] = value
    gpu_memory = _parse(quantities.parse_bytes, settings["gpumem"], "gpumem") if "gpumem" in settings else None
    gpu_model = _gpu_group(gpu_count, model.strip() if model is not None else None, gpu_memory)
    default_cpu, default_memory = default_node_resources(gpu_count)
    milli_cpu = _parse(quantities.parse_millicores, settings["cpu"], "cpu") if "cpu" in settings else default_cpu
    memory = _parse(quantities.parse_bytes, settings["mem"], "mem") if "mem" in settings else default_memory
    pods = _parse(quantities.parse_count, settings["pods"], "pods") if "pods" in settings else DEFAULT_POD_SLOTS
    prefix = settings.get("prefix", DEFAULT_NODE_PREFIX)
    nodes = []
    for _ in range(node_count):
        name = names.take(prefix)
        _check_name(name, "node name")
        nodes.append(
            _build_node(
                name,
                milli_cpu=milli_cpu,
                memory_bytes=memory,
                pods=pods,
                gpu_count=gpu_count,
                model=gpu_model,
                labels={},
                taints=(),
                unowned=(),
            )
        )
    return nodes


# --- The YAML form ---

_TAG = "tag:yaml.org,2002:"
_TEXT_TAGS = frozenset({_TAG + "str", _TAG + "int", _TAG + "float"})
_CLUSTER_KEYS = ("nodes", "pods")
_NODE_KEYS = ("name", "count", "cpu", "memory", "pods", "labels", "taints", "gpus", "unowned_processes")
_GPU_KEYS = ("count", "model", "memory")
_TAINT_KEYS = ("key", "value", "effect")
_TOLERATION_KEYS = ("key", "operator", "value", "effect")
_UNOWNED_KEYS = ("gpu", "memory")
_POD_KEYS = (
    "name",
    "namespace",
    "count",
    "requests",
    "labels",
    "annotations",
    "node_selector",
    "tolerations",
    "scheduler_name",
    "queue",
    "node",
    "gpu_memory",
    "arrive",
    "duration",
)
_REQUEST_KEYS = ("cpu", "memory", "nvidia.com/gpu")
_SCRIPT_POINT_KEYS = ("at", "memory")
_SHARE_ANNOTATIONS = ("gpu-fraction", "gpu-memory")


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == _TAG + "null":
        return "nothing"
    return f"{node.tag.removeprefix(_TAG)} {_excerpt(str(node.value))}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Reader:
    """Turns composed YAML nodes into spec values; every failure names the source, the line and the field."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self._source = source
        self._loader = loader
        self._node_names = _Names()
        self._pod_names = _Names()

    def fail(self, node: yaml.Node, path: str, message: str) -> NoReturn:
        raise ClusterSpecError(f"{self._source}:{node.start_mark.line + 1}: {path}: {message}")

    # Shapes

    def pairs(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str, yaml.Node]]:
        """A mapping's (key node, key, value node), merge keys applied, explicit duplicates refused."""
        if not isinstance(node, yaml.MappingNode) or node.tag != _TAG + "map":
            self.fail(node, path, f"expected a mapping, got {_kind(node)}")
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _TAG + "merge":
                continue
            key = self.key(key_node, path)
            if key in seen:
                self.fail(key_node, _join(path, key), f"duplicate key (first on line {seen[key].start_mark.line + 1})")
            seen[key] = key_node
        self._loader.flatten_mapping(node)
        return [(key_node, self.key(key_node, path), value) for key_node, value in node.value]

    def key(self, node: yaml.Node, path: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag == _TAG + "null":
            self.fail(node, path, f"a key must be text, got {_kind(node)}")
        return str(node.value)

    def fields(
        self, node: yaml.Node, path: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> dict[str, yaml.Node]:
        found: dict[str, yaml.Node] = {}
        for key_node, key, value in self.pairs(node, path):
            if key not in allowed:
                self.fail(
                    key_node, _join(path, key), f"unknown key{_suggest(key, allowed)}; accepted: {', '.join(allowed)}"
                )
            found[key] = value
        for key in required:
            if key not in found:
                self.fail(node, path, f"missing required key {key!r}")
        return found

    def items(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or node.tag != _TAG + "seq":
            self.fail(node, path, f"expected a list, got {_kind(node)}")
        return list(node.value)

    def text(self, node: yaml.Node, path: str, *, allow_bool: bool = False) -> str:
        """A scalar as written: names, label values ("true" stays "true") and quantities ("1.50" stays "1.50")."""
        tags = _TEXT_TAGS | {_TAG + "bool"} if allow_bool else _TEXT_TAGS
        if not isinstance(node, yaml.ScalarNode) or node.tag not in tags:
            self.fail(
                node, path, f"expected a value, got {_kind(node)}" + ("; quote it" if node.tag == _TAG + "bool" else "")
            )
        return str(node.value)

    def name(self, node: yaml.Node, path: str, check: Callable[[str], None]) -> str:
        text = self.text(node, path)
        try:
            check(text)
        except _Invalid as exc:
            self.fail(node, path, str(exc))
        return text

    def number(self, node: yaml.Node, path: str, parser: Callable[[str], int], *, minimum: int = 0) -> int:
        try:
            value = _parse(parser, self.text(node, path), path.rpartition(".")[2])
        except _Invalid as exc:
            self.fail(node, path, str(exc))
        if value < minimum:
            self.fail(node, path, f"must be at least {minimum}")
        return value

    def string_map(self, node: yaml.Node, path: str, check: Callable[[str, str], None]) -> dict[str, str]:
        result: dict[str, str] = {}
        for key_node, key, value_node in self.pairs(node, path):
            value = self.text(value_node, _join(path, key), allow_bool=True)
            try:
                check(key, value)
            except _Invalid as exc:
                self.fail(key_node, _join(path, key), str(exc))
            result[key] = value
        return result

    def script(self, node: yaml.Node, path: str) -> MemoryScript:
        try:
            if isinstance(node, yaml.SequenceNode):
                points: list[tuple[int, int]] = []
                for index, item in enumerate(self.items(node, path)):
                    here = f"{path}[{index}]"
                    fields = self.fields(item, here, _SCRIPT_POINT_KEYS, required=("memory",))
                    at = fields.get("at")
                    offset_ns = 0 if at is None else self.number(at, f"{here}.at", quantities.parse_duration_ns)
                    points.append((offset_ns, self.number(fields["memory"], f"{here}.memory", quantities.parse_bytes)))
                return _script_from_points(points)
            return _script_from_text(self.text(node, path))
        except _Invalid as exc:
            self.fail(node, path, str(exc))

    # The schema

    def cluster(self, root: yaml.Node) -> ClusterSpec:
        fields = self.fields(root, "", _CLUSTER_KEYS, required=("nodes",))
        nodes: list[NodeSpec] = []
        node_lines: dict[str, int] = {}
        for index, entry in enumerate(self.items(fields["nodes"], "nodes")):
            for node in self.node_group(entry, f"nodes[{index}]", len(nodes)):
                if node.name in node_lines:
                    self.fail(
                        entry,
                        f"nodes[{index}]",
                        f"duplicate node name {node.name!r} (also on line {node_lines[node.name]})",
                    )
                node_lines[node.name] = entry.start_mark.line + 1
                nodes.append(node)
        if not nodes:
            self.fail(fields["nodes"], "nodes", "a cluster needs at least one node")
        pods: list[PodSpec] = []
        pod_lines: dict[tuple[str, str], int] = {}
        pod_entries = self.items(fields["pods"], "pods") if "pods" in fields else []
        for index, entry in enumerate(pod_entries):
            path = f"pods[{index}]"
            for pod in self.pod_group(entry, path, len(pods)):
                if pod.node is not None and pod.node not in node_lines:
                    self.fail(entry, f"{path}.node", f"unknown node {pod.node!r}{_suggest(pod.node, node_lines)}")
                key = (pod.namespace, pod.name)
                if key in pod_lines:
                    self.fail(entry, path, f"duplicate pod {pod.namespace}/{pod.name} (also on line {pod_lines[key]})")
                pod_lines[key] = entry.start_mark.line + 1
                pods.append(pod)
        return ClusterSpec(nodes=tuple(nodes), pods=tuple(pods))

    def node_group(self, entry: yaml.Node, path: str, nodes_so_far: int) -> list[NodeSpec]:
        fields = self.fields(entry, path, _NODE_KEYS)
        gpu_count, model = 0, None
        if "gpus" in fields:
            gpu_count, model = self.gpus(fields["gpus"], f"{path}.gpus")
        default_cpu, default_memory = default_node_resources(gpu_count)
        milli_cpu = default_cpu
        if "cpu" in fields:
            milli_cpu = self.number(fields["cpu"], f"{path}.cpu", quantities.parse_millicores)
        memory = default_memory
        if "memory" in fields:
            memory = self.number(fields["memory"], f"{path}.memory", quantities.parse_bytes)
        pods = DEFAULT_POD_SLOTS
        if "pods" in fields:
            pods = self.number(fields["pods"], f"{path}.pods", quantities.parse_count)
        labels = self.string_map(fields["labels"], f"{path}.labels", _check_label) if "labels" in fields else {}
        taints = tuple(
            self.taint(item, f"{path}.taints[{index}]")
            for index, item in enumerate(self.items(fields["taints"], f"{path}.taints") if "taints" in fields else ())
        )
        unowned = tuple(
            self.unowned(item, f"{path}.unowned_processes[{index}]", gpu_count, model)
            for index, item in enumerate(
                self.items(fields["unowned_processes"], f"{path}.unowned_processes")
                if "unowned_processes" in fields
                else ()
            )
        )
        names = self.names(fields, path, self._node_names, scope="", limit=MAX_NODES - nodes_so_far)
        return [
            _build_node(
                name,
                milli_cpu=milli_cpu,
                memory_bytes=memory,
                pods=pods,
                gpu_count=gpu_count,
                model=model,
                labels=labels,
                taints=taints,
                unowned=unowned,
            )
            for name in names
        ]

    def names(
        self, fields: Mapping[str, yaml.Node], path: str, allocator: _Names, *, scope: str, limit: int
    ) -> list[str]:
        """One exact name, or ``count`` names PREFIX-i (the prefix being the name, or ``node`` for nodes)."""
        what = "pod name" if allocator is self._pod_names else "node name"
        if "count" not in fields:
            if "name" not in fields:
                return [allocator.take(DEFAULT_NODE_PREFIX, scope=scope)]
            return [self.name(fields["name"], f"{path}.name", lambda text: _check_name(text, what))]
        count = self.number(fields["count"], f"{path}.count", quantities.parse_count, minimum=1)
        if count > limit:
            self.fail(fields["count"], f"{path}.count", f"{count} is too many; at most {limit} more are supported")
        prefix = self.text(fields["name"], f"{path}.name") if "name" in fields else DEFAULT_NODE_PREFIX
        names = [allocator.take(prefix, scope=scope) for _ in range(count)]
        for name in names:
            try:
                _check_name(name, what)
            except _Invalid as exc:
                self.fail(fields.get("name", fields["count"]), f"{path}.name", str(exc))
        return names

    def gpus(self, node: yaml.Node, path: str) -> tuple[int, GpuModel | None]:
        fields = self.fields(node, path, _GPU_KEYS, required=("count",))
        count = self.number(fields["count"], f"{path}.count", quantities.parse_count)
        if count > MAX_GPUS_PER_NODE:
            self.fail(
                fields["count"], f"{path}.count", f"{count} GPUs per node; at most {MAX_GPUS_PER_NODE} are supported"
            )
        memory = self.number(fields["memory"], f"{path}.memory", quantities.parse_bytes) if "memory" in fields else None
        model = self.text(fields["model"], f"{path}.model") if "model" in fields else None
        try:
            return count, _gpu_group(count, model, memory)
        except _Invalid as exc:
            self.fail(fields.get("model", node), f"{path}.model" if "model" in fields else path, str(exc))

    def taint(self, node: yaml.Node, path: str) -> Taint:
        try:
            if isinstance(node, yaml.ScalarNode):
                return _parse_taint_text(self.text(node, path))
            fields = self.fields(node, path, _TAINT_KEYS, required=("key", "effect"))
            value = self.text(fields["value"], f"{path}.value", allow_bool=True) if "value" in fields else ""
            return _make_taint(
                self.text(fields["key"], f"{path}.key"), value, self.text(fields["effect"], f"{path}.effect")
            )
        except _Invalid as exc:
            self.fail(node, path, str(exc))

    def toleration(self, node: yaml.Node, path: str) -> Toleration:
        fields = self.fields(node, path, _TOLERATION_KEYS)
        found = {key: self.text(value, f"{path}.{key}", allow_bool=key == "value") for key, value in fields.items()}
        try:
            return _make_toleration(
                found.get("key", ""), found.get("operator"), found.get("value", ""), found.get("effect")
            )
        except _Invalid as exc:
            self.fail(node, path, str(exc))

    def unowned(self, node: yaml.Node, path: str, gpu_count: int, model: GpuModel | None) -> UnownedProcess:
        fields = self.fields(node, path, _UNOWNED_KEYS, required=("gpu", "memory"))
        process = UnownedProcess(
            gpu_index=self.number(fields["gpu"], f"{path}.gpu", quantities.parse_count),
            memory=self.script(fields["memory"], f"{path}.memory"),
        )
        try:
            _check_unowned(process, gpu_count, model)
        except _Invalid as exc:
            self.fail(node, path, str(exc))
        return process

    def pod_group(self, entry: yaml.Node, path: str, pods_so_far: int) -> list[PodSpec]:
        fields = self.fields(entry, path, _POD_KEYS, required=("name",))
        namespace = DEFAULT_NAMESPACE
        if "namespace" in fields:
            namespace = self.name(fields["namespace"], f"{path}.namespace", _check_namespace)
        requests = self.fields(fields["requests"], f"{path}.requests", _REQUEST_KEYS) if "requests" in fields else {}
        milli_cpu = (
            self.number(requests["cpu"], f"{path}.requests.cpu", quantities.parse_millicores)
            if "cpu" in requests
            else 0
        )
        memory = (
            self.number(requests["memory"], f"{path}.requests.memory", quantities.parse_bytes)
            if "memory" in requests
            else 0
        )
        gpus = 0
        if "nvidia.com/gpu" in requests:
            gpu_node = requests["nvidia.com/gpu"]
            try:
                gpus = _parse(quantities.parse_count, self.text(gpu_node, f"{path}.requests.nvidia.com/gpu"), "GPUs")
            except _Invalid as exc:
                self.fail(
                    gpu_node,
                    f"{path}.requests.nvidia.com/gpu",
                    f"{exc} (whole devices; for a share, use the gpu-fraction or gpu-memory annotation)",
                )
        labels = self.string_map(fields["labels"], f"{path}.labels", _check_label) if "labels" in fields else {}
        annotations = (
            self.string_map(fields["annotations"], f"{path}.annotations", lambda key, _: _check_key(key, "annotation"))
            if "annotations" in fields
            else {}
        )
        node_selector = {}
        if "node_selector" in fields:
            node_selector = self.string_map(fields["node_selector"], f"{path}.node_selector", _check_label)
        tolerations = tuple(
            self.toleration(item, f"{path}.tolerations[{index}]")
            for index, item in enumerate(
                self.items(fields["tolerations"], f"{path}.tolerations") if "tolerations" in fields else ()
            )
        )
        queue = labels.get(QUEUE_LABEL)
        if "queue" in fields:
            queue_node = fields["queue"]
            queue = self.name(queue_node, f"{path}.queue", lambda text: _check_label(QUEUE_LABEL, text))
            if labels.get(QUEUE_LABEL, queue) != queue:
                self.fail(queue_node, f"{path}.queue", f"contradicts the label {QUEUE_LABEL}={labels[QUEUE_LABEL]}")
            labels[QUEUE_LABEL] = queue
        script = self.pod_script(fields, annotations, path)
        if script is not None:
            annotations[SIM_GPU_MEMORY_ANNOTATION] = script.text()
            if gpus == 0 and not any(key in annotations for key in _SHARE_ANNOTATIONS):
                self.fail(
                    entry,
                    path,
                    "a GPU memory script needs a GPU: request nvidia.com/gpu or set gpu-fraction or gpu-memory",
                )
        scheduler = DEFAULT_SCHEDULER_NAME
        if "scheduler_name" in fields:
            scheduler = self.name(
                fields["scheduler_name"], f"{path}.scheduler_name", lambda text: _check_name(text, "scheduler name")
            )
        node_name = self.text(fields["node"], f"{path}.node") if "node" in fields else None
        arrive_ns = (
            self.number(fields["arrive"], f"{path}.arrive", quantities.parse_duration_ns) if "arrive" in fields else 0
        )
        duration_ns = None
        if "duration" in fields:
            duration_ns = self.number(fields["duration"], f"{path}.duration", quantities.parse_duration_ns, minimum=1)
        frozen_labels = types.MappingProxyType(labels)
        frozen_annotations = types.MappingProxyType(annotations)
        frozen_selector = types.MappingProxyType(node_selector)
        return [
            PodSpec(
                name=name,
                namespace=namespace,
                milli_cpu=milli_cpu,
                memory_bytes=memory,
                gpus=gpus,
                labels=frozen_labels,
                annotations=frozen_annotations,
                node_selector=frozen_selector,
                tolerations=tolerations,
                scheduler_name=scheduler,
                queue=queue,
                node=node_name,
                gpu_memory=script,
                arrive_ns=arrive_ns,
                duration_ns=duration_ns,
            )
            for name in self.names(fields, path, self._pod_names, scope=namespace, limit=MAX_PODS - pods_so_far)
        ]

    def pod_script(
        self, fields: Mapping[str, yaml.Node], annotations: Mapping[str, str], path: str
    ) -> MemoryScript | None:
        """The pod's memory script, from ``gpu_memory`` or, equally, from its annotation; never both."""
        written = annotations.get(SIM_GPU_MEMORY_ANNOTATION)
        if "gpu_memory" in fields:
            if written is not None:
                self.fail(
                    fields["gpu_memory"],
                    f"{path}.gpu_memory",
                    f"also given as the annotation {SIM_GPU_MEMORY_ANNOTATION}; keep one",
                )
            return self.script(fields["gpu_memory"], f"{path}.gpu_memory")
        if written is None:
            return None
        try:
            return _script_from_text(written)
        except _Invalid as exc:
            self.fail(fields["annotations"], f"{path}.annotations.{SIM_GPU_MEMORY_ANNOTATION}", str(exc))


def loads(text: str, source: str = "<string>") -> ClusterSpec:
    """Read a cluster spec from YAML text; ``source`` names it in errors (``cluster.yaml:7: nodes[1]...``)."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"{source}: not valid YAML: {exc}") from exc
    try:
        root = loader.get_single_node()
        if root is None:
            raise ClusterSpecError(f"{source}: empty cluster spec; it needs at least `nodes:`")
        return _Reader(source, loader).cluster(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        reason = ", ".join(part for part in (exc.context, exc.problem) if part)
        raise ClusterSpecError(f"{source}{line}: not valid YAML: {reason}") from exc
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"{source}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ClusterSpecError(f"{source}: nested too deeply (or a recursive alias)") from exc
    finally:
        loader.dispose()


def load(path: str | Path) -> ClusterSpec:
    """Read a cluster spec file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterSpecError(f"{path}: cannot read the cluster spec: {exc}") from exc
    return loads(text, source=str(path))


def resolve(spec_arg: str) -> ClusterSpec:
    """A command-line argument: the path of an existing file, else the inline form."""
    path = Path(spec_arg)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long for the file system is no file, and may still be the inline form
        is_file = False
    if is_file:
        return load(path)
    if path.suffix in {".yaml", ".yml", ".json"} or "/" in spec_arg:
        raise ClusterSpecError(f"{spec_arg}: no such cluster spec file (nor is it the inline form: {INLINE_FORM})")
    return parse_inline(spec_arg)

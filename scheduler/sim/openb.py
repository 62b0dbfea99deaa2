"""Loaders for the Alibaba GPU-sharing trace ("openb", cluster-trace-gpu-v2023) CSV files.

The trace is the one public, reproducible yardstick for fractional-GPU placement (Weng et al., USENIX ATC 2023), so
the simulator reads its files exactly as published: a node list (``sn,cpu_milli,memory_mib,gpu,model``) and a pod
list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, in most files, ``gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``). Values become our integer units (millicores, bytes, milli-GPU per device). A pod's
``gpu_spec`` (allowed models, ``|``-separated) becomes its GPU model constraint, which the placement engine reads as
node affinity on the node label ``nvidia.com/gpu.product`` that carries each node's ``model``.

A malformed row is refused with the file and line, never skipped: a silently shortened trace would give results
that look fine and are wrong.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from common.errors import ClusterSpecError
from common.quantities import MIB, MILLI_GPU_PER_GPU

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")

# GPU allocation at 130% arrival, mean of seeds 42..51, published with the FGD paper (Weng et al., USENIX ATC 2023)
# for its simulator (hkust-adsl/kubernetes-scheduler-simulator); the trace README in ../shared/data/openb lists them.
PUBLISHED_130: Mapping[str, Mapping[str, float]] = {
    "default": {
        "random": 87.47,
        "dotprod": 90.85,
        "clustering": 91.88,
        "packing": 92.00,
        "bestfit": 93.08,
        "fgd": 95.39,
    },
    "gpushare40": {
        "random": 86.00,
        "dotprod": 89.56,
        "clustering": 90.02,
        "packing": 90.03,
        "bestfit": 91.69,
        "fgd": 94.15,
    },
    "multigpu20": {
        "random": 88.69,
        "dotprod": 92.06,
        "clustering": 93.56,
        "packing": 93.71,
        "bestfit": 93.93,
        "fgd": 95.65,
    },
    "gpuspec20": {
        "random": 87.24,
        "dotprod": 89.97,
        "clustering": 92.25,
        "packing": 92.94,
        "bestfit": 93.30,
        "fgd": 94.84,
    },
    "gpushare60": {"bestfit": 89.36, "fgd": 91.40},
    "gpushare80": {"bestfit": 87.01, "fgd": 89.30},
    "gpushare100": {"bestfit": 85.01, "fgd": 86.90},
    "multigpu30": {"bestfit": 94.72, "fgd": 96.46},
    "multigpu40": {"bestfit": 95.23, "fgd": 96.99},
    "multigpu50": {"bestfit": 95.74, "fgd": 97.18},
    "gpuspec10": {"bestfit": 93.30, "fgd": 94.95},
    "gpuspec25": {"bestfit": 93.23, "fgd": 94.74},
    "gpuspec33": {"bestfit": 93.09, "fgd": 94.55},
    "cpu050": {"bestfit": 93.79, "fgd": 95.21},
    "cpu100": {"bestfit": 93.44, "fgd": 95.35},
    "cpu200": {"bestfit": 92.40, "fgd": 95.05},
    "cpu250": {"bestfit": 91.45, "fgd": 93.41},
}
_POD_LIST_PREFIX = "openb_pod_list_"


def trace_name(path: Path) -> str | None:
    """``default`` for ``openb_pod_list_default.csv`` and so on; None for a file not named like the trace's."""
    stem = path.stem
    return stem[len(_POD_LIST_PREFIX) :] if stem.startswith(_POD_LIST_PREFIX) else None


# The largest GPU node of any public trace has 8 devices; 64 leaves room without accepting nonsense.
_MAX_DEVICES = 64


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TraceNode:
    """One node of the trace: capacity in our units, ``gpu_count`` devices of ``gpu_model``."""

    name: str
    milli_cpu: int
    memory_bytes: int
    gpu_count: int
    gpu_model: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TracePod:
    """One pod of the trace: ``gpu_count`` devices with ``milli_gpu`` on each (1000: whole devices).

    ``gpu_models`` are the models it accepts (empty: any). The times are the trace's seconds, None where absent.
    """

    name: str
    milli_cpu: int
    memory_bytes: int
    gpu_count: int
    milli_gpu: int
    gpu_models: frozenset[str] = frozenset()
    qos: str = ""
    creation_s: int | None = None
    deletion_s: int | None = None
    scheduled_s: int | None = None

    @property
    def total_milli_gpu(self) -> int:
        return self.gpu_count * self.milli_gpu

    @property
    def kind(self) -> str:
        """``cpu_only``, ``fractional``, ``whole`` (one device) or ``multi_gpu``: how failures are counted."""
        if self.gpu_count == 0:
            return "cpu_only"
        if self.milli_gpu < MILLI_GPU_PER_GPU:
            return "fractional"
        return "whole" if self.gpu_count == 1 else "multi_gpu"


POD_KINDS = ("cpu_only", "fractional", "whole", "multi_gpu")


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, Mapping[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ClusterSpecError(f"{path}: cannot read the trace file: {exc.strerror}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise ClusterSpecError(f"{path}:1: empty file, expected a header {','.join(required)}") from None
        header = [name.strip() for name in header]
        missing = [name for name in required if name not in header]
        if missing:
            raise ClusterSpecError(f"{path}:1: header lacks column(s) {', '.join(missing)} (has {','.join(header)})")
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ClusterSpecError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
            yield line, dict(zip(header, (cell.strip() for cell in row), strict=True))


def _int(path: Path, line: int, row: Mapping[str, str], column: str, *, low: int = 0, high: int | None = None) -> int:
    text = row[column]
    try:
        value = int(text)
    except ValueError:
        raise ClusterSpecError(f"{path}:{line}: {column} is {text!r}, expected an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ClusterSpecError(f"{path}:{line}: {column} is {value}, expected {bound}")
    return value


def _optional_int(path: Path, line: int, row: Mapping[str, str], column: str) -> int | None:
    if not row.get(column):
        return None
    return _int(path, line, row, column)


def load_nodes(path: Path) -> tuple[TraceNode, ...]:
    """Every node of an openb node list, in file order. Node names must be unique."""
    nodes: list[TraceNode] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"]
        if not name:
            raise ClusterSpecError(f"{path}:{line}: sn (the node name) is empty")
        if name in seen:
            raise ClusterSpecError(f"{path}:{line}: node {name!r} already appears on line {seen[name]}")
        seen[name] = line
        gpu_count = _int(path, line, row, "gpu", high=_MAX_DEVICES)
        model = row["model"]
        if gpu_count and not model:
            raise ClusterSpecError(f"{path}:{line}: node {name!r} has {gpu_count} GPUs but no model")
        nodes.append(
            TraceNode(
                name=name,
                milli_cpu=_int(path, line, row, "cpu_milli"),
                memory_bytes=_int(path, line, row, "memory_mib") * MIB,
                gpu_count=gpu_count,
                gpu_model=model,
            )
        )
    if not nodes:
        raise ClusterSpecError(f"{path}: no nodes")
    return tuple(nodes)


def load_pods(path: Path) -> tuple[TracePod, ...]:
    """Every pod of an openb pod list, in file order. Pod names must be unique.

    ``gpu_milli`` is the share per device: a fraction (1..999) only with ``num_gpu == 1``, 1000 for whole devices,
    0 exactly when ``num_gpu`` is 0.
    """
    pods: list[TracePod] = []
    seen: dict[str, int] = {}
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"]
        if not name:
            raise ClusterSpecError(f"{path}:{line}: name is empty")
        if name in seen:
            raise ClusterSpecError(f"{path}:{line}: pod {name!r} already appears on line {seen[name]}")
        seen[name] = line
        gpu_count = _int(path, line, row, "num_gpu", high=_MAX_DEVICES)
        milli_gpu = _int(path, line, row, "gpu_milli", high=MILLI_GPU_PER_GPU)
        if gpu_count == 0 and milli_gpu != 0:
            raise ClusterSpecError(f"{path}:{line}: gpu_milli is {milli_gpu} but num_gpu is 0")
        if gpu_count > 0 and milli_gpu == 0:
            raise ClusterSpecError(f"{path}:{line}: num_gpu is {gpu_count} but gpu_milli is 0")
        if gpu_count > 1 and milli_gpu != MILLI_GPU_PER_GPU:
            raise ClusterSpecError(
                f"{path}:{line}: a share of {milli_gpu} milli-GPU on {gpu_count} devices; shares are on one device"
            )
        models = frozenset(part.strip() for part in row.get("gpu_spec", "").split("|") if part.strip())
        if models and gpu_count == 0:
            raise ClusterSpecError(f"{path}:{line}: gpu_spec {row['gpu_spec']!r} on a pod that asks for no GPU")
        pods.append(
            TracePod(
                name=name,
                milli_cpu=_int(path, line, row, "cpu_milli"),
                memory_bytes=_int(path, line, row, "memory_mib") * MIB,
                gpu_count=gpu_count,
                milli_gpu=milli_gpu,
                gpu_models=models,
                qos=row.get("qos", ""),
                creation_s=_optional_int(path, line, row, "creation_time"),
                deletion_s=_optional_int(path, line, row, "deletion_time"),
                scheduled_s=_optional_int(path, line, row, "scheduled_time"),
            )
        )
    if not pods:
        raise ClusterSpecError(f"{path}: no pods")
    return tuple(pods)

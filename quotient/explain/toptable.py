"""``kubectl quotient top``: per node and device, GPU memory allotted against measured, per pod.

The leader's ``/metrics`` gives the measured side (each device's total, used and unattributed memory, each pod's
allotted and used memory, and the alerts firing, ``GpuUnhealthy`` among them); the API gives the devices of every
GPU node and what each bound pod was allotted, so a node without telemetry, or a cluster whose metrics cannot be
read, still shows its allotments (measured columns ``-``). One row per pod on a device, the device's own columns on
its first row. Pure: inputs in, rows out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common import names, quantities
from quotient.explain import scrape, tables, units
from scheduler.objects import nodes as node_decoder
from scheduler.objects import pods as pod_decoder

HEADER = (
    "NODE",
    "GPU",
    "MODEL",
    "USED/TOTAL",
    "ALLOTTED",
    "UNATTRIBUTED",
    "HEALTH",
    "POD",
    "POD ALLOTTED",
    "POD USED",
    "ALERTS",
)
GPU_UNHEALTHY = "GpuUnhealthy"


@dataclasses.dataclass(slots=True, kw_only=True)
class PodRow:
    namespace: str
    name: str
    queue: str = ""
    allotted_bytes: int | None = None
    used_bytes: int | None = None
    alerts: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True, kw_only=True)
class Device:
    node: str
    gpu: int
    model: str = ""
    total_bytes: int | None = None
    used_bytes: int | None = None
    allotted_milli: int | None = None
    unattributed_bytes: int | None = None
    healthy: bool | None = None
    """None: unknown (no metrics)."""
    alerts: list[str] = dataclasses.field(default_factory=list)
    pods: list[PodRow] = dataclasses.field(default_factory=list)


def _int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels.get(key, ""))
    except ValueError:
        return None


def devices(
    nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], metrics: scrape.Metrics | None
) -> list[Device]:
    found: dict[tuple[str, int], Device] = {}
    node_memory: dict[str, int] = {}
    for obj in nodes:
        record = node_decoder.decode(obj)
        if record is None or record.gpu_count <= 0:
            continue
        node_memory[record.name] = record.device_memory_bytes
        for index in range(record.gpu_count):
            found[(record.name, index)] = Device(
                node=record.name,
                gpu=index,
                model=record.labels.get(names.GPU_PRODUCT_LABEL, ""),
                total_bytes=record.device_memory_bytes or None,
            )

    def device(node: str, gpu: int) -> Device:
        return found.setdefault((node, gpu), Device(node=node, gpu=gpu))

    if metrics is not None:
        _measured(metrics, device)
    else:
        _allotted_from_pods(pods, node_memory, device)
    for row in found.values():
        row.pods.sort(key=lambda pod: (pod.namespace, pod.name))
    return [found[key] for key in sorted(found)]


def _measured(metrics: scrape.Metrics, device: Callable[[str, int], Device]) -> None:
    for sample in metrics.select("quotient_device_gpu_memory_total_bytes"):
        gpu = _int(sample.labels, "gpu")
        if gpu is not None:
            row = device(sample.labels.get("node", ""), gpu)
            row.total_bytes = int(sample.value)
            row.model = sample.labels.get("model", "") or row.model
            row.healthy = True
    for name, attribute in (
        ("quotient_device_gpu_memory_used_bytes", "used_bytes"),
        ("quotient_device_gpu_allotted_milli", "allotted_milli"),
        ("quotient_device_unattributed_gpu_memory_bytes", "unattributed_bytes"),
    ):
        for sample in metrics.select(name):
            gpu = _int(sample.labels, "gpu")
            if gpu is not None:
                setattr(device(sample.labels.get("node", ""), gpu), attribute, int(sample.value))
    pods: dict[tuple[str, int, str, str], PodRow] = {}
    for name in ("quotient_pod_gpu_memory_allotted_bytes", "quotient_pod_gpu_memory_used_bytes"):
        for sample in metrics.select(name):
            gpu = _int(sample.labels, "gpu")
            if gpu is None:
                continue
            labels = sample.labels
            key = (labels.get("node", ""), gpu, labels.get("namespace", ""), labels.get("pod", ""))
            pod = pods.get(key)
            if pod is None:
                pod = pods[key] = PodRow(namespace=key[2], name=key[3], queue=labels.get("queue", ""))
                device(key[0], gpu).pods.append(pod)
            if name.endswith("allotted_bytes"):
                pod.allotted_bytes = int(sample.value)
            else:
                pod.used_bytes = int(sample.value)
    for labels in metrics.alerts():
        gpu = _int(labels, "gpu")
        node, alert = labels.get("node", ""), labels.get("alert", "")
        if gpu is None or not node:
            continue
        target = device(node, gpu)
        if alert == GPU_UNHEALTHY:
            target.healthy = False
        on = next(
            (p for p in target.pods if p.namespace == labels.get("namespace") and p.name == labels.get("pod")), None
        )
        (on.alerts if on is not None else target.alerts).append(alert)


def _allotted_from_pods(
    pods: Sequence[Mapping[str, Any]], node_memory: Mapping[str, int], device: Callable[[str, int], Device]
) -> None:
    """Without metrics: what each bound pod holds, from the devices the binder recorded on it."""
    for obj in pods:
        record = pod_decoder.decode(obj)
        if record is None or record.node is None or not record.devices or record.terminated:
            continue
        memory = node_memory.get(record.node, 0)
        for gpu in record.devices:
            share = record.share_milli or quantities.MILLI_GPU_PER_GPU
            row = device(record.node, gpu)
            row.allotted_milli = (row.allotted_milli or 0) + share
            allotted = memory * share // quantities.MILLI_GPU_PER_GPU if memory else None
            row.pods.append(PodRow(namespace=record.namespace, name=record.name, allotted_bytes=allotted))


def _mem(value: int | None) -> str:
    return "-" if value is None else units.gib(value)


def cells(rows: Sequence[Device]) -> list[list[tables.Cell]]:
    out: list[list[tables.Cell]] = []
    for row in rows:
        health = "?" if row.healthy is None else ("ok" if row.healthy else "unhealthy")
        used_total = f"{_mem(row.used_bytes)}/{_mem(row.total_bytes)}"
        device_cells = [
            tables.Cell(text=row.node),
            tables.Cell(text=str(row.gpu), right=True),
            tables.Cell(text=_short_model(row.model)),
            tables.Cell(text=used_total, right=True),
            tables.Cell(text="-" if row.allotted_milli is None else units.gpu_number(row.allotted_milli), right=True),
            tables.Cell(
                text=_mem(row.unattributed_bytes),
                right=True,
                paint=("yellow",) if row.unattributed_bytes else (),
            ),
            tables.Cell(text=health, paint=("red",) if row.healthy is False else ()),
        ]
        blank = [tables.Cell(text="", right=cell.right) for cell in device_cells]
        pods: list[PodRow | None] = [*row.pods] or [None]
        for index, pod in enumerate(pods):
            first = device_cells if index == 0 else blank
            if pod is None:
                alerts = ",".join(row.alerts) or "-"
                out.append(
                    [*first, tables.Cell(text="-"), tables.Cell(text="-"), tables.Cell(text="-"), _alert_cell(alerts)]
                )
                continue
            over = pod.used_bytes is not None and pod.allotted_bytes is not None and pod.used_bytes > pod.allotted_bytes
            alerts = ",".join(pod.alerts + (row.alerts if index == 0 else [])) or "-"
            out.append(
                [
                    *first,
                    tables.Cell(text=f"{pod.namespace}/{pod.name}"),
                    tables.Cell(text=_mem(pod.allotted_bytes), right=True),
                    tables.Cell(text=_mem(pod.used_bytes), right=True, paint=("red",) if over else ()),
                    _alert_cell(alerts),
                ]
            )
    return out


def _alert_cell(alerts: str) -> tables.Cell:
    return tables.Cell(text=alerts, paint=("red",) if alerts != "-" else ())


def items(rows: Sequence[Device]) -> list[dict[str, Any]]:
    return [
        {
            "node": row.node,
            "gpu": row.gpu,
            "model": row.model or None,
            "totalBytes": row.total_bytes,
            "usedBytes": row.used_bytes,
            "allottedMilliGpu": row.allotted_milli,
            "unattributedBytes": row.unattributed_bytes,
            "healthy": row.healthy,
            "alerts": list(row.alerts),
            "pods": [
                {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "queue": pod.queue or None,
                    "allottedBytes": pod.allotted_bytes,
                    "usedBytes": pod.used_bytes,
                    "alerts": list(pod.alerts),
                }
                for pod in row.pods
            ],
        }
        for row in rows
    ]


def _short_model(name: str) -> str:
    """A device model for a table column: NVML's ``NVIDIA A100-80GB`` as ``A100-80GB`` (one word, as
    ``nvidia.com/gpu.product`` writes it without the vendor)."""
    name = name.strip()
    if name.upper().startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return "-".join(name.split()) or "-"

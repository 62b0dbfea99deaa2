"""The live view of ``quotient demo``: where each pod landed and why the pending ones wait, what the agents publish.

A frame is plain text built from the emulator's objects (pods, their PodGroups' conditions, the scheduler's
Warning events) and from what a third-party NATS subscriber of ``quotient.v1.>`` has received, decoded with plain
msgpack (``Telemetry``): per-GPU memory with the pods' names resolved from their UIDs, node health, and the
scheduler's alerts. The demo redraws it in place on a terminal and prints it every few seconds otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgpack

from common import names, subjects
from common.quantities import GIB
from quotient.emulator.emulator import Emulator

SCHEDULER_NAMES = ("quotient", "kai-scheduler")
"""The scheduler names the demo's scheduler serves; pods naming another are "not ours"."""


@dataclasses.dataclass(slots=True)
class Telemetry:
    """What a third-party subscriber of ``quotient.v1.>`` has received, decoded with plain msgpack."""

    nodes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    health: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    undecodable: int = 0

    async def on_message(self, subject: str, data: bytes) -> None:
        kind = subject.split(".")[2] if subject.count(".") >= 3 else subject
        self.counts[kind] = self.counts.get(kind, 0) + 1
        try:
            message = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException):
            self.undecodable += 1
            return
        if kind == "alerts" and isinstance(message, dict):
            self.alerts.append(message)  # the scheduler's alerts: name, state, pod, node, device and numbers
            return
        node = subjects.node_of(subject)
        if not isinstance(message, dict) or node is None:
            return
        (self.nodes if kind == "telemetry" else self.health)[node] = message


def meta_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _gib(value: object) -> str:
    return f"{value / GIB:.1f}" if isinstance(value, int) else "?"


def render(
    emulator: Emulator,
    telemetry: Telemetry,
    *,
    elapsed_s: float,
    notes: Sequence[str],
    nats_up: bool,
    shown: Sequence[str] = (),
) -> str:
    pods = sorted(
        emulator.list("v1", "Pod"), key=lambda p: (meta_of(p).get("namespace", ""), meta_of(p).get("name", ""))
    )
    groups = {
        (meta_of(g).get("namespace"), meta_of(g).get("name")): g
        for g in emulator.list(names.POD_GROUP_API_VERSION, "PodGroup")
    }
    pod_names = {str(meta_of(p).get("uid")): f"{meta_of(p).get('namespace')}/{meta_of(p).get('name')}" for p in pods}
    lines = [
        f"Quotient demo   t={elapsed_s:5.1f}s   NATS {'up' if nats_up else 'DOWN'}   "
        f"agent messages: {', '.join(f'{k} {v}' for k, v in sorted(telemetry.counts.items())) or 'none yet'}",
        "",
        f"{'POD':<54} {'QUEUE':<13} {'STATUS':<9} {'NODE':<7} {'GPU':<16} WHY (for pending pods)",
    ]
    # The agents' own DaemonSet pods (quotient-system) are the infrastructure, not the workloads the view follows.
    system = ("kube-system", "quotient-system")
    lines += [_pod_line(emulator, pod, groups) for pod in pods if meta_of(pod).get("namespace") not in system]
    drivers = ", ".join(sorted({str(m.get("driver_version")) for m in telemetry.nodes.values()})) or "?"
    lines += ["", f"GPU telemetry as a NATS subscriber receives it (driver {drivers}; pod names from the pods' UIDs):"]
    for node in sorted(telemetry.nodes):
        message = telemetry.nodes[node]
        status = (telemetry.health.get(node) or {}).get("status", "?")
        for gpu in message.get("gpus") or []:
            procs = ", ".join(
                f"{pod_names.get(p.get('pod_uid'), '(no pod)')} {_gib(p.get('used_memory_bytes'))}Gi"
                for p in gpu.get("processes") or []
            )
            lines.append(
                f"  {node:<7} gpu {gpu.get('index')}  {_gib(gpu.get('memory_used_bytes')):>5}/"
                f"{_gib(gpu.get('memory_total_bytes'))} GiB  {procs or '-'}"
            )
        problems = "; ".join(str(p.get("message")) for p in (telemetry.health.get(node) or {}).get("problems") or [])
        lines.append(f"  {node:<7} health {status}{': ' + problems if problems else ''}")
    lines += ["", "Alerts from the scheduler (quotient.v1.alerts.<name>, newest last):"]
    lines += [f"  {alert_line(alert)}" for alert in telemetry.alerts[-6:]] or ["  none yet"]
    lines += ["", *notes[-8:]]
    if shown:  # the last command the story ran, as the user would see it
        lines += ["", *shown[:24]]
    return "\n".join(lines)


def _pod_line(emulator: Emulator, pod: dict[str, Any], groups: dict[tuple[Any, Any], dict[str, Any]]) -> str:
    """One pod: its queue, phase, node, GPUs (the share it got, or the device plugin's whole GPUs) and, while it
    waits, why (its PodGroup's last scheduling condition, else the scheduler's newest Warning about it)."""
    meta, spec = meta_of(pod), pod.get("spec") or {}
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    gpu = ""
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    plugin = emulator.devices_of(namespace, name) if spec.get("nodeName") else None
    if names.GPU_FRACTION_ANNOTATION in annotations or names.GPU_MEMORY_ANNOTATION in annotations:
        share = annotations.get(names.GPU_FRACTION_ANNOTATION) or f"{annotations.get(names.GPU_MEMORY_ANNOTATION)}MiB"
        where = annotations.get(names.GPU_DEVICES_ANNOTATION) if spec.get("nodeName") else None
        gpu = f"{share} of gpu {where}" if where else share
    elif plugin:
        # Whole GPUs: the device plugin's allocation, which is what the containers really get.
        gpu = "gpu " + ",".join(str(index) for index in plugin)
    own_group = groups.get((meta.get("namespace"), annotations.get(names.POD_GROUP_ANNOTATION)))
    queue = ((own_group or {}).get("spec") or {}).get("queue") or labels.get(names.QUEUE_LABEL) or "-"
    why = ""
    if not spec.get("nodeName"):
        conditions = ((own_group or {}).get("status") or {}).get("schedulingConditions") or []
        if spec.get("schedulerName") not in SCHEDULER_NAMES:
            why = f"not ours (schedulerName {spec.get('schedulerName', names.DEFAULT_SCHEDULER)})"
        elif conditions:
            why = f"{conditions[-1].get('reason')}: {conditions[-1].get('message')}"
        else:
            why = emulator_event(emulator, meta) or "being scheduled"
    return (
        f"{meta.get('namespace', '') + '/' + meta.get('name', ''):<54.54} {queue:<13.13} "
        f"{(pod.get('status') or {}).get('phase', ''):<9} {spec.get('nodeName') or '-':<7} {gpu:<16.16} {why}"[:220]
    )


def alert_line(alert: dict[str, Any]) -> str:
    """One alert as a line: state, name, subject and, for over-consumption, used against allotted."""
    pod = f"{alert.get('pod_namespace')}/{alert.get('pod_name')} " if alert.get("pod_name") else ""
    where = f"{pod}on {alert.get('node_name')}" + (
        f" gpu {alert.get('gpu_index')}" if alert.get("gpu_index") is not None else ""
    )
    numbers = ""
    if isinstance(alert.get("used_bytes"), int) and isinstance(alert.get("allotted_bytes"), int):
        numbers = f": uses {_gib(alert.get('used_bytes'))} GiB of {_gib(alert.get('allotted_bytes'))} GiB allotted"
    return f"{str(alert.get('state', '?')).upper():<8} {alert.get('name')} {where}{numbers}"


def emulator_event(emulator: Emulator, meta: dict[str, Any]) -> str:
    """The newest Warning event about a pod (the scheduler's reason for a pod it could not read)."""
    newest = ""
    stamp = ""
    for event in emulator.list("v1", "Event", str(meta.get("namespace") or "default")):
        involved = event.get("involvedObject") or {}
        if involved.get("name") == meta.get("name") and event.get("type") == "Warning":
            when = str(event.get("lastTimestamp") or "")
            if when >= stamp:
                stamp, newest = when, f"{event.get('reason')}: {event.get('message')}"
    return newest

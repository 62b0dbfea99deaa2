"""Every Prometheus series the scheduler and the agent export, read from their metrics objects.

The scheduler's series are metric objects on one registry (``SchedulerMetrics`` and the NATS auth callout's
``CalloutMetrics``); the agent's per-device series come from a collector that renders its newest sample at scrape
time, so it is given one synthetic sample with every optional field set, and with ``--dcgm-names`` to show the
dcgm-exporter names as well. Names, types and help texts come from the registry's own ``collect()``; label names
from the samples, and for labelled metrics that have no sample yet from the metric object (prometheus_client keeps
them in ``_labelnames``: it has no public accessor). Every label must have a line in :data:`LABELS`, so a new label
cannot reach the page unexplained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from agent.metrics import AgentMetrics
from common import wire
from common.errors import QuotientError
from quotient.docsgen import blocks
from scheduler.kube import binding
from scheduler.metrics import INTERNAL_ERROR_BOUNDARIES, SchedulerMetrics
from scheduler.natsauth.callout import CalloutMetrics
from scheduler.placement import decisions

_SUFFIXES: Mapping[str, tuple[str, ...]] = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}

LABELS: Mapping[str, str] = {
    "alert": "the alert's name (`GpuMemoryOverconsumption`, ...; [the alerts](#alerts))",
    "container_id": "the container's id as the runtime writes it in the cgroup path",
    "gpu": "the device's NVML index on its node (`0`, `1`, ...); empty where an alert concerns a whole node",
    "kind": "for `quotient_gpu_ecc_errors`: `corrected` or `uncorrected`; for the agent's messages: `telemetry` or "
    "`health`; for its sample errors: what failed",
    "mig_mode": "`enabled`, `disabled` or `unknown`",
    "model": "the device's model as NVML names it (`NVIDIA A100-SXM4-80GB`)",
    "namespace": "the pod's namespace (the pod the series is about, not the scheduler's own)",
    "node": "the Kubernetes node name",
    "outcome": "`quotient_binds_total`: "
    + ", ".join(f"`{outcome}`" for outcome in binding.Outcome)
    + "; telemetry: `accepted` or `rejected`; the NATS auth callout: `granted` or `denied`",
    "pod": "the pod's name (the pod the series is about)",
    "pod_uid": "the pod's UID, as the agent reads it from the process's cgroup (the agent knows no pod names)",
    "queue": "the queue's name",
    "reason": "`quotient_pending_groups`: the pending reason ([troubleshooting](troubleshooting.md)); "
    "`quotient_evictions_total`: "
    + ", ".join(f"`{reason}`" for reason in decisions.EvictionReason)
    + " or `ReservationLost`; `quotient_pods_rejected`: why a pod's spec cannot be read (`InvalidGpuRequest`, "
    "`InvalidPodSpec`, `InvalidPodGroup`); `quotient_telemetry_rejected_total`: why a message was refused; "
    "`quotient_nats_auth_total`: why a connection was denied (`granted` when it was not)",
    "resource": "`gpu` (in devices), `cpu` (in cores) or `memory` (in bytes)",
    "severity": "`info`, `warning` or `critical`",
    "state": "`total` or `allocated` (in devices)",
    "uuid": "the device's UUID (`GPU-...`)",
    "where": "the boundary that caught the fault: "
    + ", ".join(f"`{where}`" for where in INTERNAL_ERROR_BOUNDARIES)
    + ", `loop_<name>` for a background loop, or a task's name ([operations](operations.md))",
    "Hostname": "dcgm-exporter's name for the node",
    "UUID": "dcgm-exporter's name for the device's UUID",
    "modelName": "dcgm-exporter's name for the device's model",
}
"""What each label means, wherever it appears."""


class UndocumentedLabel(QuotientError):
    """A series carries a label :data:`LABELS` does not explain."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    only_with: str = ""
    """The flag that makes the process export it, when not always."""

    @property
    def exported(self) -> tuple[str, ...]:
        """The names Prometheus stores (a counter's ``_total``, a histogram's buckets, sum and count)."""
        return tuple(self.name + suffix for suffix in _SUFFIXES.get(self.type, ("",)))


def _label_names(objects: Iterable[object]) -> dict[str, tuple[str, ...]]:
    """Each metric object's label names, by metric name, from the attributes of ``objects``."""
    found: dict[str, tuple[str, ...]] = {}
    for holder in objects:
        for value in vars(holder).values():
            name, labels = getattr(value, "_name", None), getattr(value, "_labelnames", None)
            if isinstance(name, str) and isinstance(labels, tuple):
                found[name.removesuffix("_total")] = tuple(str(label) for label in labels)
    return found


def _collect(registry: CollectorRegistry, declared: Mapping[str, tuple[str, ...]], only_with: str = "") -> list[Series]:
    found: list[Series] = []
    for family in registry.collect():
        labels = list(declared.get(family.name, ()))
        for sample in family.samples:
            labels += [label for label in sample.labels if label not in labels and label != "le"]
        found.append(
            Series(
                name=family.name, type=family.type, labels=tuple(labels), help=family.documentation, only_with=only_with
            )
        )
    return found


def scheduler_series() -> list[Series]:
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    callout = CalloutMetrics(registry)
    return _collect(registry, _label_names([metrics, callout]))


def _sample() -> wire.NodeTelemetry:
    """One node with one device, every optional field set, one process of a pod and one of none."""
    gib = 1 << 30
    processes = (
        wire.ProcessReport(pid=100, used_memory_bytes=gib, pod_uid="pod-uid", container_id="container-id"),
        wire.ProcessReport(pid=200, used_memory_bytes=gib),
    )
    gpu = wire.GpuReport(
        index=0,
        uuid="GPU-0",
        model="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=80 * gib,
        memory_reserved_bytes=gib,
        memory_used_bytes=2 * gib,
        memory_free_bytes=77 * gib,
        gpu_util_pct=50,
        memory_util_pct=20,
        temperature_c=50,
        power_mw=200_000,
        ecc_corrected=0,
        ecc_uncorrected=0,
        mig_mode=False,
        processes=processes,
    )
    return wire.NodeTelemetry(
        v=1, node="node", boot="boot", seq=0, ts_ns=0, interval_ms=1000, driver_version="580", gpus=(gpu,)
    )


def agent_series() -> list[Series]:
    def exported(*, dcgm_names: bool) -> list[Series]:
        registry = CollectorRegistry()
        metrics = AgentMetrics(node="node", dcgm_names=dcgm_names, registry=registry)
        metrics.observe_sample(_sample(), 0.001)
        return _collect(registry, _label_names([metrics]))

    plain = exported(dcgm_names=False)
    known = {series.name for series in plain}
    extra = [
        dataclasses.replace(series, only_with="--dcgm-names")
        for series in exported(dcgm_names=True)
        if series.name not in known
    ]
    return plain + extra


def _check_labels(found: Sequence[Series]) -> None:
    unknown = sorted({label for series in found for label in series.labels if label not in LABELS})
    if unknown:
        raise UndocumentedLabel(f"labels with no meaning in quotient/docsgen/series.py LABELS: {', '.join(unknown)}")


def reference(found: Sequence[Series]) -> str:
    """A table of ``found``: the series, type, labels and meaning."""
    _check_labels(found)
    rows = []
    for series in found:
        name = ", ".join(f"`{exported}`" for exported in series.exported)
        meaning = series.help.rstrip(".")
        if series.only_with:
            meaning += f" (only with `{series.only_with}`)"
        labels = ", ".join(f"`{label}`" for label in series.labels)
        rows.append((name, series.type, labels, blocks.cell(meaning)))
    return blocks.table(("series", "type", "labels", "meaning"), rows)


def labels_reference(found: Sequence[Series]) -> str:
    """The labels the series carry, each with its meaning."""
    used = sorted({label for series in found for label in series.labels}, key=lambda label: (label.lower(), label))
    return blocks.table(("label", "meaning"), [(f"`{label}`", blocks.cell(LABELS[label])) for label in used])

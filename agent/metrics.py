"""The agent's Prometheus metrics: per device and per pod UID, rendered from the latest sample at scrape time.

A custom collector renders the newest ``NodeTelemetry`` when Prometheus scrapes, instead of setting gauges on
every sample: sampling stays cheap (the CPU budget is 2 ms per sample), and a pod's series vanish with the pod
instead of lingering until someone remembers to remove them. With ``dcgm_names`` the device series are also
exported under dcgm-exporter's names and units (``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_POWER_USAGE`` in W,
labels ``gpu``, ``UUID``, ``modelName``, ``Hostname``) so dashboards built for dcgm-exporter work unchanged.
Pod names are not known here: the scheduler exports per-pod series with names.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common import wire
from common.quantities import MIB

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _TelemetryCollector(Collector):
    def __init__(self, *, dcgm_names: bool) -> None:
        self.latest: wire.NodeTelemetry | None = None
        self._dcgm = dcgm_names

    def collect(self) -> Iterator[Metric]:
        sample = self.latest
        if sample is None:
            return
        node = sample.node
        dev_labels = ["node", "gpu", "uuid"]

        def family(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels if labels is not None else dev_labels)

        total = family("quotient_gpu_memory_total_bytes", "GPU memory of the device (NVML total)")
        used = family("quotient_gpu_memory_used_bytes", "GPU memory in use on the device")
        reserved = family("quotient_gpu_memory_reserved_bytes", "GPU memory reserved by the driver")
        free = family("quotient_gpu_memory_free_bytes", "GPU memory free on the device")
        util = family("quotient_gpu_utilization_ratio", "GPU utilisation over the last sample period (0-1)")
        mem_util = family("quotient_gpu_memory_utilization_ratio", "Memory controller utilisation (0-1)")
        temp = family("quotient_gpu_temperature_celsius", "GPU temperature")
        power = family("quotient_gpu_power_watts", "GPU power draw")
        ecc = family("quotient_gpu_ecc_errors", "Volatile ECC error count", [*dev_labels, "kind"])
        info = family("quotient_gpu_info", "Static facts about the device", [*dev_labels, "model", "mig_mode"])
        proc = family(
            "quotient_gpu_process_memory_bytes",
            "GPU memory used by the processes of one pod container on the device",
            ["node", "gpu", "pod_uid", "container_id"],
        )
        unattributed = family(
            "quotient_gpu_unattributed_memory_bytes", "GPU memory used by processes that map to no pod", dev_labels
        )
        families = [total, used, reserved, free, util, mem_util, temp, power, ecc, info, proc, unattributed]
        dcgm: list[GaugeMetricFamily] = []
        if self._dcgm:
            dcgm_labels = ["gpu", "UUID", "modelName", "Hostname"]
            fb_used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=dcgm_labels)
            fb_free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=dcgm_labels)
            gpu_util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=dcgm_labels)
            power_w = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=dcgm_labels)
            gpu_temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=dcgm_labels)
            dcgm = [fb_used, fb_free, gpu_util, power_w, gpu_temp]
        for gpu in sample.gpus:
            labels = [node, str(gpu.index), gpu.uuid]
            total.add_metric(labels, gpu.memory_total_bytes)
            used.add_metric(labels, gpu.memory_used_bytes)
            reserved.add_metric(labels, gpu.memory_reserved_bytes)
            free.add_metric(labels, gpu.memory_free_bytes)
            if gpu.gpu_util_pct is not None:
                util.add_metric(labels, gpu.gpu_util_pct / 100)
            if gpu.memory_util_pct is not None:
                mem_util.add_metric(labels, gpu.memory_util_pct / 100)
            if gpu.temperature_c is not None:
                temp.add_metric(labels, gpu.temperature_c)
            if gpu.power_mw is not None:
                power.add_metric(labels, gpu.power_mw / 1000)
            if gpu.ecc_corrected is not None:
                ecc.add_metric([*labels, "corrected"], gpu.ecc_corrected)
            if gpu.ecc_uncorrected is not None:
                ecc.add_metric([*labels, "uncorrected"], gpu.ecc_uncorrected)
            mig = "unknown" if gpu.mig_mode is None else ("enabled" if gpu.mig_mode else "disabled")
            info.add_metric([*labels, gpu.model, mig], 1)
            per_container: dict[tuple[str, str], int] = {}
            stray = 0
            for process in gpu.processes:
                amount = process.used_memory_bytes or 0
                if process.pod_uid is None:
                    stray += amount
                else:
                    key = (process.pod_uid, process.container_id or "")
                    per_container[key] = per_container.get(key, 0) + amount
            for (pod_uid, container_id), amount in sorted(per_container.items()):
                proc.add_metric([node, str(gpu.index), pod_uid, container_id], amount)
            unattributed.add_metric(labels, stray)
            if self._dcgm:
                dcgm_values = [
                    gpu.memory_used_bytes // MIB,
                    gpu.memory_free_bytes // MIB,
                    gpu.gpu_util_pct,
                    None if gpu.power_mw is None else gpu.power_mw / 1000,
                    gpu.temperature_c,
                ]
                dcgm_label_values = [str(gpu.index), gpu.uuid, gpu.model, node]
                for metric_family, value in zip(dcgm, dcgm_values, strict=True):
                    if value is not None:
                        metric_family.add_metric(dcgm_label_values, value)
        yield from families
        yield from dcgm


class AgentMetrics:
    """Every series the agent exports, on an explicit registry (tests make their own)."""

    def __init__(self, *, node: str, dcgm_names: bool = False, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._telemetry = _TelemetryCollector(dcgm_names=dcgm_names)
        self.registry.register(self._telemetry)
        self.samples = Counter("quotient_agent_samples_total", "GPU samples taken", ["node"], registry=self.registry)
        self.sample_errors = Counter(
            "quotient_agent_sample_errors_total",
            "Samples that failed, by kind",
            ["node", "kind"],
            registry=self.registry,
        )
        self.published = Counter(
            "quotient_agent_messages_published_total", "Messages published", ["node", "kind"], registry=self.registry
        )
        self.unpublished = Counter(
            "quotient_agent_messages_unpublished_total",
            "Messages not published because NATS was unavailable (only the latest is kept)",
            ["node", "kind"],
            registry=self.registry,
        )
        self.sample_seconds = Histogram(
            "quotient_agent_sample_duration_seconds",
            "Time to probe, attribute and encode one sample",
            ["node"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.nats_connected = Gauge(
            "quotient_agent_nats_connected", "1 while connected to NATS", ["node"], registry=self.registry
        )
        self.healthy = Gauge(
            "quotient_agent_gpu_healthy",
            "1 when NVML answers and no device reports a problem",
            ["node"],
            registry=self.registry,
        )
        self._node = node

    def observe_sample(self, sample: wire.NodeTelemetry, seconds: float) -> None:
        self._telemetry.latest = sample
        self.samples.labels(self._node).inc()
        self.sample_seconds.labels(self._node).observe(seconds)

    def clear_sample(self) -> None:
        """Forget the last sample (NVML is unreachable): stale device series must not look live."""
        self._telemetry.latest = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

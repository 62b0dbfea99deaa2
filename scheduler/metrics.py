"""The scheduler's Prometheus metrics (``quotient_`` prefix, base units, an explicit registry).

Per queue: fair share, quota, limit, allocated, requested (GPU in devices, CPU in cores, memory in bytes) and how
long its oldest group has been pending; pending groups by reason; cycle and binding latency; binds and evictions by
outcome. From telemetry: per pod and device the GPU memory allotted and used (with namespace and pod names, so a
dashboard and an alert name the pod), per device total, used, allotted and unattributed memory, cluster GPUs total
and allocated, each node's telemetry age, messages accepted and rejected by reason, and the alerts firing.

The names are a contract: ``deploy/monitoring/`` rules and dashboards query them. Series that name a pod, a node or
a device exist only while it does: every setter that takes a node's rows replaces that node's series and removes
the ones that are gone, so cardinality follows the cluster and never grows with its history.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from common.resources import Resources
from scheduler.telemetry import live

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_RESOURCES: tuple[tuple[str, int, Callable[[Resources], int]], ...] = (
    ("gpu", 1000, lambda amounts: amounts.milli_gpu),
    ("cpu", 1000, lambda amounts: amounts.milli_cpu),
    ("memory", 1, lambda amounts: amounts.memory_bytes),
)
"""Label, divisor and reading: milli-GPU to devices, millicores to cores, bytes stay bytes."""
UNLIMITED = Resources(milli_gpu=-1, milli_cpu=-1, memory_bytes=-1)

INTERNAL_ERROR_BOUNDARIES = ("cycle", "engine", "watch", "snapshot", "dispatch", "telemetry", "status", "sharing")
"""The ``where`` of ``quotient_internal_errors_total`` for the boundaries every scheduler has (a failed loop is
``loop_<name>``, a failed fire-and-forget task the part of its name before ``:``)."""


def _setting(amount: int, divisor: int) -> float:
    """A quota or limit in display units; -1 (unlimited) stays -1."""
    return amount if amount < 0 else amount / divisor


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "quotient_scheduling_cycle_duration_seconds",
            "Time of one scheduling cycle (snapshot and placement, without API calls)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.bind_seconds = Histogram(
            "quotient_binding_duration_seconds",
            "Time from the decision to the API's answer for one bind",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.binds = Counter("quotient_binds_total", "Binds by outcome", ["outcome"], registry=r)
        self.evictions = Counter("quotient_evictions_total", "Evictions by reason", ["reason"], registry=r)
        self.cycles = Counter("quotient_scheduling_cycles_total", "Scheduling cycles run", registry=r)
        self.pending_groups = Gauge(
            "quotient_pending_groups", "Pod groups left pending by the last cycle, by reason", ["reason"], registry=r
        )
        self.leader = Gauge("quotient_scheduler_leader", "1 while this replica leads", registry=r)
        self.internal_errors = Counter(
            "quotient_internal_errors_total",
            "Faults caught at a boundary (a cycle, a watch handler, a background loop) that the scheduler survived",
            ["where"],
            registry=r,
        )
        for where in INTERNAL_ERROR_BOUNDARIES:
            # At 0 from the start, so a first fault is a visible increase (a series born at 1 shows none).
            self.internal_errors.labels(where)
        self.quarantined_groups = Gauge(
            "quotient_quarantined_groups",
            "Pod groups left out of cycles because the cycle failed with them three times in a row (quarantined now)",
            registry=r,
        )
        self.rejected_pods = Gauge(
            "quotient_pods_rejected",
            "Pods left out of scheduling because their spec cannot be read",
            ["reason"],
            registry=r,
        )
        self.queue_fair_share = Gauge(
            "quotient_queue_fair_share", "Each queue's fair share", ["queue", "resource"], registry=r
        )
        self.queue_deserved = Gauge(
            "quotient_queue_deserved",
            "Each queue's deserved share (quota met first)",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_quota = Gauge(
            "quotient_queue_quota", "Each queue's quota (-1: unlimited)", ["queue", "resource"], registry=r
        )
        self.queue_allocated = Gauge(
            "quotient_queue_allocated", "Allocated to each queue's subtree", ["queue", "resource"], registry=r
        )
        self.queue_requested = Gauge(
            "quotient_queue_requested", "Requested by each queue's subtree", ["queue", "resource"], registry=r
        )
        self.queue_limit = Gauge(
            "quotient_queue_limit", "Each queue's limit (-1: no limit)", ["queue", "resource"], registry=r
        )
        self.queue_oldest_pending = Gauge(
            "quotient_queue_oldest_pending_seconds",
            "Age of each queue's oldest pending pod group (0: none pending)",
            ["queue"],
            registry=r,
        )
        self.pod_allotted = Gauge(
            "quotient_pod_gpu_memory_allotted_bytes",
            "GPU memory a pod was given on a device (fraction x device memory, gpu-memory, or the whole device)",
            ["namespace", "pod", "node", "gpu", "queue"],
            registry=r,
        )
        self.pod_used = Gauge(
            "quotient_pod_gpu_memory_used_bytes",
            "GPU memory a pod's processes use on a device, as measured by the node's agent",
            ["namespace", "pod", "node", "gpu", "queue"],
            registry=r,
        )
        self.device_total = Gauge(
            "quotient_device_gpu_memory_total_bytes",
            "A device's memory (NVML total)",
            ["node", "gpu", "model"],
            registry=r,
        )
        self.device_used = Gauge(
            "quotient_device_gpu_memory_used_bytes", "A device's used memory, measured", ["node", "gpu"], registry=r
        )
        self.device_allotted = Gauge(
            "quotient_device_gpu_allotted_milli",
            "Milli-GPU given out on a device (1000: whole or full)",
            ["node", "gpu"],
            registry=r,
        )
        self.device_unattributed = Gauge(
            "quotient_device_unattributed_gpu_memory_bytes",
            "GPU memory used on a device by processes of no pod the scheduler knows",
            ["node", "gpu"],
            registry=r,
        )
        self.cluster_gpus = Gauge(
            "quotient_cluster_gpus",
            "GPUs of the cluster: total devices, and allocated (in devices)",
            ["state"],
            registry=r,
        )
        self.alerts_firing = Gauge("quotient_alerts_firing", "Alerts firing, by name", ["alert"], registry=r)
        self.alert = Gauge(
            "quotient_alert",
            "1 while an alert fires (label values are empty where they do not apply)",
            ["alert", "severity", "namespace", "pod", "node", "gpu"],
            registry=r,
        )
        self.telemetry_age = Gauge(
            "quotient_node_telemetry_age_seconds", "Age of each node's newest accepted telemetry", ["node"], registry=r
        )
        self.telemetry_messages = Counter(
            "quotient_telemetry_messages", "Telemetry and health messages by outcome", ["outcome"], registry=r
        )
        self.telemetry_rejected = Counter(
            "quotient_telemetry_rejected",
            "Telemetry and health messages rejected (and claims dropped) by reason",
            ["reason"],
            registry=r,
        )
        for outcome in ("accepted", "rejected"):
            self.telemetry_messages.labels(outcome)
        self._reasons: set[str] = set()
        self._queues: set[str] = set()
        self._pod_series: dict[str, set[tuple[str, ...]]] = {}
        self._device_series: dict[str, set[tuple[str, ...]]] = {}
        self._total_series: dict[str, set[tuple[str, ...]]] = {}
        self._aged: set[str] = set()
        self._pending_queues: set[str] = set()
        self._alert_names: set[str] = set()
        self._counted: dict[tuple[str, str], int] = {}

    def set_pending(self, counts: Mapping[str, int]) -> None:
        for reason in self._reasons - set(counts):
            self.pending_groups.labels(reason).set(0)
        for reason, count in counts.items():
            self.pending_groups.labels(reason).set(count)
        self._reasons |= set(counts)

    def set_queue(
        self,
        queue: str,
        *,
        fair: Resources,
        deserved: Resources,
        quota: Resources,
        limit: Resources = UNLIMITED,
        allocated: Resources,
        requested: Resources,
    ) -> None:
        """One queue's figures, in devices, cores and bytes; a quota or limit of -1 (unlimited) stays -1."""
        self._queues.add(queue)
        for resource, divisor, amount in _RESOURCES:
            self.queue_fair_share.labels(queue, resource).set(amount(fair) / divisor)
            self.queue_deserved.labels(queue, resource).set(amount(deserved) / divisor)
            self.queue_quota.labels(queue, resource).set(_setting(amount(quota), divisor))
            self.queue_limit.labels(queue, resource).set(_setting(amount(limit), divisor))
            self.queue_allocated.labels(queue, resource).set(amount(allocated) / divisor)
            self.queue_requested.labels(queue, resource).set(amount(requested) / divisor)

    def forget_queues(self, keep: set[str]) -> None:
        for queue in self._queues - keep:
            for resource, _, _ in _RESOURCES:
                for gauge in (
                    self.queue_fair_share,
                    self.queue_deserved,
                    self.queue_quota,
                    self.queue_limit,
                    self.queue_allocated,
                    self.queue_requested,
                ):
                    with contextlib.suppress(KeyError):
                        gauge.remove(queue, resource)
        self._queues &= keep

    def set_oldest_pending(self, ages_s: Mapping[str, float]) -> None:
        """Per queue, the age of its oldest pending group; queues no longer listed lose their series."""
        for queue in self._pending_queues - set(ages_s):
            with contextlib.suppress(KeyError):
                self.queue_oldest_pending.remove(queue)
        for queue, age in ages_s.items():
            self.queue_oldest_pending.labels(queue).set(age)
        self._pending_queues = set(ages_s)

    def set_cluster_gpus(self, *, total_milli: int, allocated_milli: int) -> None:
        self.cluster_gpus.labels("total").set(total_milli / 1000)
        self.cluster_gpus.labels("allocated").set(allocated_milli / 1000)

    def set_node_rows(self, node: str, rows: live.NodeRows) -> None:
        """Replace ``node``'s per-pod and per-device series with ``rows``."""
        pods: set[tuple[str, ...]] = set()
        for pod in rows.pods:
            pod_labels = (pod.namespace, pod.name, node, str(pod.gpu_index), pod.queue)
            pods.add(pod_labels)
            self.pod_allotted.labels(*pod_labels).set(pod.allotted_bytes)
            self.pod_used.labels(*pod_labels).set(pod.used_bytes)
        devices: set[tuple[str, ...]] = set()
        totals: set[tuple[str, ...]] = set()
        for device in rows.devices:
            device_labels = (node, str(device.gpu_index))
            devices.add(device_labels)
            totals.add((*device_labels, device.model))
            self.device_total.labels(*device_labels, device.model).set(device.total_bytes)
            self.device_used.labels(*device_labels).set(device.used_bytes)
            self.device_allotted.labels(*device_labels).set(device.allotted_milli)
            self.device_unattributed.labels(*device_labels).set(device.unattributed_bytes)
        self._replace(node, pods=pods, devices=devices, totals=totals)

    def forget_node(self, node: str) -> None:
        """Remove every series of ``node`` (a node forgotten or deleted)."""
        self._replace(node, pods=set(), devices=set(), totals=set())
        if node in self._aged:
            self._aged.discard(node)
            with contextlib.suppress(KeyError):
                self.telemetry_age.remove(node)

    def _replace(
        self, node: str, *, pods: set[tuple[str, ...]], devices: set[tuple[str, ...]], totals: set[tuple[str, ...]]
    ) -> None:
        for labels in self._pod_series.get(node, set()) - pods:
            for gauge in (self.pod_allotted, self.pod_used):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        for labels in self._device_series.get(node, set()) - devices:
            for gauge in (self.device_used, self.device_allotted, self.device_unattributed):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        for labels in self._total_series.get(node, set()) - totals:
            with contextlib.suppress(KeyError):
                self.device_total.remove(*labels)
        for table, new in ((self._pod_series, pods), (self._device_series, devices), (self._total_series, totals)):
            if new:
                table[node] = new
            else:
                table.pop(node, None)

    def set_telemetry_ages(self, ages_s: Mapping[str, float]) -> None:
        for node in self._aged - set(ages_s):
            with contextlib.suppress(KeyError):
                self.telemetry_age.remove(node)
        for node, age in ages_s.items():
            self.telemetry_age.labels(node).set(age)
        self._aged = set(ages_s)

    def count_telemetry(self, *, accepted: int, rejected: Mapping[str, int]) -> None:
        """Bring the counters up to cumulative totals kept elsewhere (the consumer's); a total that went down (a
        new consumer, after a change of leader) starts over from it."""
        self._advance(self.telemetry_messages, "messages", "accepted", accepted)
        self._advance(self.telemetry_messages, "messages", "rejected", sum(rejected.values()))
        for reason, total in rejected.items():
            self._advance(self.telemetry_rejected, "rejected", reason, total)

    def internal_error(self, where: str, _exc: BaseException | None = None) -> None:
        """Count a fault the scheduler caught and survived (``where``: the boundary that caught it)."""
        self.internal_errors.labels(where).inc()

    def count_rejected(self, reason: str, amount: int) -> None:
        """Add rejections counted here and nowhere else (claims about pods of other nodes)."""
        if amount > 0:
            self.telemetry_rejected.labels(reason).inc(amount)

    def _advance(self, counter: Counter, family: str, label: str, total: int) -> None:
        key = (family, label)
        last = self._counted.get(key, 0)
        if total < last:
            last = 0
        if total > last:
            counter.labels(label).inc(total - last)
        self._counted[key] = total

    def set_alert(self, labels: Sequence[str], *, firing: bool) -> None:
        """``labels`` in the order alert, severity, namespace, pod, node, gpu: 1 while firing, removed after."""
        if firing:
            self.alert.labels(*labels).set(1)
        else:
            with contextlib.suppress(KeyError):
                self.alert.remove(*labels)

    def set_alerts_firing(self, counts: Mapping[str, int], names: Iterable[str] = ()) -> None:
        """How many alerts of each name fire; every name ever seen (and ``names``) keeps a series, at 0 when none."""
        self._alert_names |= set(counts) | set(names)
        for name in self._alert_names:
            self.alerts_firing.labels(name).set(counts.get(name, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)

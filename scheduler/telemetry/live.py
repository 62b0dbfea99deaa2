"""Live telemetry in the scheduler: each accepted sample against the cluster state, as values the loop acts on.

The consumer (``consumer.py``) keeps the newest sample of every node; the analysis (``overuse``, ``staleness``,
``headroom``) is pure and knows nothing of Kubernetes. This module sits between them and the cluster state: for each
node whose telemetry changed it takes the detector's view of the node (``views.NodeViews``: the pods bound or
assumed there, what each was allotted per device in bytes, its queue and that queue's overuse policy), runs the
detector, records the device peaks, and returns everything that follows as plain values: alert transitions,
evictions, the rows of the per-pod and per-device metrics, and the nodes whose measured headroom changed (the only
ones the snapshot builder must rebuild, so a cycle on a large cluster stays incremental).

Why here and shaped so: the telemetry loop is asyncio and I/O, the detector is pure, and the glue between them is
where mistakes hide, so it is a plain class driven by the loop and tested without NATS or an API server. It reads the
clock only through its ``now_ns`` arguments. A Queue whose overuse-policy annotation is invalid gets the cluster
default, and the problem is reported once per value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from common import names, wire
from scheduler.state.cache import ClusterState
from scheduler.telemetry import detector, headroom, health, overuse, staleness, views


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LiveSettings:
    """The detector's thresholds, the staleness floor and the headroom window (ns), and how pods name queues."""

    detector: overuse.Settings
    stale_floor_ns: int
    headroom_window_ns: int
    # A window of 30 s sampled at 4 Hz is 120 samples; 256 leaves room for faster agents without growing unbounded.
    headroom_max_samples: int = 256
    queue_label: str = names.QUEUE_LABEL


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodRow:
    """One pod on one device: what it was allotted and what it uses (``quotient_pod_gpu_memory_*_bytes``)."""

    uid: str
    namespace: str
    name: str
    node: str
    queue: str
    gpu_index: int
    allotted_bytes: int
    used_bytes: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRow:
    """One device of a node as measured and as allotted (``quotient_device_*``)."""

    node: str
    gpu_index: int
    model: str
    total_bytes: int
    used_bytes: int
    allotted_milli: int
    unattributed_bytes: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeRows:
    pods: tuple[PodRow, ...] = ()
    devices: tuple[DeviceRow, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LiveResult:
    """What one ``apply`` or ``check`` decided. ``rows`` replace the named nodes' metric rows; ``forgotten`` nodes
    lose theirs; ``headroom_changed`` nodes have new measured device views (the snapshot rebuilds them)."""

    transitions: tuple[overuse.Transition, ...] = ()
    evictions: tuple[overuse.Eviction, ...] = ()
    rows: Mapping[str, NodeRows] = dataclasses.field(default_factory=dict)
    forgotten: frozenset[str] = frozenset()
    headroom_changed: frozenset[str] = frozenset()
    foreign_claims: int = 0
    policy_problems: tuple[overuse.PolicyProblem, ...] = ()


class LiveTelemetry:
    """The detector, the staleness watch and the headroom tracker, fed from samples and the cluster state."""

    def __init__(self, settings: LiveSettings, state: ClusterState) -> None:
        self.settings = settings
        self._state = state
        self._node_views = views.NodeViews(
            state, queue_label=settings.queue_label, default_policy=settings.detector.default_policy
        )
        self.detector = detector.OveruseDetector(settings.detector)
        self.staleness = staleness.StalenessWatch(floor_ns=settings.stale_floor_ns)
        self.headroom = headroom.HeadroomTracker(
            window_ns=settings.headroom_window_ns, max_samples=settings.headroom_max_samples
        )
        self._views: dict[str, dict[int, headroom.DeviceView]] = {}
        self._changed: set[str] = set()
        self.gpu_health = health.GpuHealthWatch()

    # --- reads ------------------------------------------------------------------------------------------------------

    def device_views(self, node: str) -> Mapping[int, headroom.DeviceView] | None:
        """The measured view of each device of ``node`` (by index), or None for a node never heard from."""
        return self._views.get(node)

    def health(self, node: str) -> health.Verdict:
        """Which devices of ``node`` its agent reports broken (the snapshot takes them out of placement)."""
        return self.gpu_health.verdict_of(node)

    def take_changed(self) -> frozenset[str]:
        """Nodes whose measured views changed since the last call (the snapshot builder rebuilds them)."""
        changed, self._changed = frozenset(self._changed), set()
        return changed

    def ages_s(self, *, now_ns: int) -> dict[str, float]:
        """How old each node's telemetry is, in seconds (``quotient_node_telemetry_age_seconds``)."""
        ages: dict[str, float] = {}
        for node in self._views:
            age = self.staleness.age_ns(node, now_ns=now_ns)
            if age is not None:
                ages[node] = max(0, age) / 1e9
        return ages

    # --- updates ----------------------------------------------------------------------------------------------------

    def apply(
        self,
        samples: Iterable[overuse.NodeSample],
        *,
        now_ns: int,
        forgotten: Iterable[str] = (),
    ) -> LiveResult:
        """Evaluate each sample against the state; drop the ``forgotten`` nodes (their alerts resolve)."""
        transitions: list[overuse.Transition] = []
        evictions: list[overuse.Eviction] = []
        rows: dict[str, NodeRows] = {}
        changed: set[str] = set()
        gone: set[str] = set()
        foreign = 0
        problems: list[overuse.PolicyProblem] = []
        for node in forgotten:
            transitions += self.detector.forget_node(node, now_ns=now_ns)
            transitions += self.staleness.forget(node, now_ns=now_ns)
            self.headroom.forget(node)
            self._node_views.forget(node)
            if self._views.pop(node, None) is not None:
                changed.add(node)
            transitions += self.gpu_health.forget(node, now_ns=now_ns)
            gone.add(node)
        for sample in samples:
            telemetry = sample.telemetry
            node = telemetry.node
            gone.discard(node)
            transitions += self.staleness.record(
                node, interval_ms=telemetry.interval_ms, received_ns=sample.received_ns
            )
            on_node = self._node_views.on_node(node, telemetry, problems)
            peaks = self.headroom.peaks(node, now_ns=sample.received_ns)
            result = self.detector.observe(sample, on_node.view, now_ns=now_ns, peak_used_bytes=peaks)
            transitions += result.transitions
            evictions += result.evictions
            foreign += result.foreign_claims
            self.headroom.record(sample, unattributed_bytes=result.unattributed_bytes)
            if self._refresh_views(node, telemetry, now_ns=now_ns):
                changed.add(node)
            rows[node] = self._rows(node, telemetry, on_node, result)
        self._changed |= changed
        self._node_views.prune()
        return LiveResult(
            transitions=tuple(transitions),
            evictions=tuple(evictions),
            rows=rows,
            forgotten=frozenset(gone),
            headroom_changed=frozenset(changed),
            foreign_claims=foreign,
            policy_problems=tuple(problems),
        )

    def observe_health(self, node: str, report: wire.NodeHealth, *, cleared_ns: int, now_ns: int) -> LiveResult:
        """A node's newest health report (or a change of its operator's clearing): ``GpuUnhealthy`` alerts that fire
        or resolve, and the node rebuilt when the devices out of placement changed."""
        before = self.gpu_health.verdict_of(node)
        transitions = self.gpu_health.update(node, report, cleared_ns=cleared_ns, now_ns=now_ns)
        changed = frozenset({node}) if self.gpu_health.verdict_of(node) != before else frozenset()
        self._changed |= changed
        return LiveResult(transitions=transitions, headroom_changed=changed)

    def check(self, *, now_ns: int) -> LiveResult:
        """The periodic sweep: fire ``TelemetryStale`` for nodes gone quiet and mark their devices stale (placement
        there falls back to requests), and let device peaks age out of the window."""
        transitions = self.staleness.check(now_ns=now_ns)
        changed: set[str] = set()
        for node, known in self._views.items():
            stale = self.staleness.is_stale(node, now_ns=now_ns)
            fresh = {index: self.headroom.device_view(node, index, now_ns=now_ns, stale=stale) for index in known}
            if fresh != known:
                self._views[node] = fresh
                changed.add(node)
        self._changed |= changed
        return LiveResult(transitions=transitions, headroom_changed=frozenset(changed))

    def _refresh_views(self, node: str, telemetry: wire.NodeTelemetry, *, now_ns: int) -> bool:
        stale = self.staleness.is_stale(node, now_ns=now_ns)
        fresh = {
            gpu.index: self.headroom.device_view(node, gpu.index, now_ns=now_ns, stale=stale) for gpu in telemetry.gpus
        }
        if self._views.get(node) == fresh:
            return False
        self._views[node] = fresh
        return True

    def _rows(
        self, node: str, telemetry: wire.NodeTelemetry, on_node: views.OnNode, result: overuse.NodeResult
    ) -> NodeRows:
        pod_rows = tuple(
            PodRow(
                uid=pod.uid,
                namespace=pod.namespace,
                name=pod.name,
                node=node,
                queue=pod.queue,
                gpu_index=device.index,
                allotted_bytes=device.allotted_bytes,
                used_bytes=result.pod_used_bytes.get((pod.uid, device.index), 0),
            )
            for pod in on_node.view.pods
            for device in pod.devices
        )
        device_rows = tuple(
            DeviceRow(
                node=node,
                gpu_index=gpu.index,
                model=gpu.model,
                total_bytes=gpu.memory_total_bytes,
                used_bytes=gpu.memory_used_bytes,
                allotted_milli=on_node.allotted_milli.get(gpu.index, 0),
                unattributed_bytes=result.unattributed_bytes.get(gpu.index, 0),
            )
            for gpu in telemetry.gpus
        )
        return NodeRows(pods=pod_rows, devices=device_rows)

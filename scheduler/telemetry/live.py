"""Live telemetry in the scheduler: each accepted sample against the cluster state, as values the app acts on.

The consumer (``consumer.py``) keeps the newest sample of every node; the analysis (``overuse``, ``staleness``,
``headroom``) is pure and knows nothing of Kubernetes. This module sits between them and the cluster state: for each
node whose telemetry changed it builds the detector's ``NodeView`` from ``ClusterState`` (the pods bound or assumed
on the node, what each was allotted per device in bytes, its queue and that queue's overuse policy), runs the
detector, records the device peaks, and returns everything that follows as plain values: alert transitions,
evictions, the rows of the per-pod and per-device metrics, and the nodes whose measured headroom changed (the only
ones the snapshot builder must rebuild, so a cycle on a large cluster stays incremental).

Why here and shaped so: the app is asyncio and I/O, the detector is pure, and the glue between them (allotments in
bytes, queue policies, which pods a node may speak about) is where mistakes hide, so it is a plain class driven by
the app and tested without NATS or an API server. It reads the clock only through its ``now_ns`` arguments.

Allotments (DESIGN.md, "Telemetry in decisions"): a share is its fraction of the device memory, or its
``gpu-memory`` bytes; a whole-GPU pod is allotted the whole device. Device memory is the agent's NVML total, else
the node's ``nvidia.com/gpu.memory`` label. Reservation pods hold a device for their group's shares and run no GPU
process: they are not pods the detector looks at (they would be ghosts). A Queue whose overuse-policy annotation is
invalid gets the cluster default, and the problem is reported once per value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from common import wire
from scheduler.kube import gpurequest, grouping
from scheduler.placement import devices as placement_devices
from scheduler.placement import model
from scheduler.state import cache, objects, snapshot
from scheduler.telemetry import headroom, overuse, staleness

_PHASES = {phase.value: phase for phase in overuse.PodPhase}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LiveSettings:
    """The detector's thresholds, the staleness floor and the headroom window (ns), and how pods name queues."""

    detector: overuse.Settings
    stale_floor_ns: int
    headroom_window_ns: int
    # A window of 30 s sampled at 4 Hz is 120 samples; 256 leaves room for faster agents without growing unbounded.
    headroom_max_samples: int = 256
    queue_label: str = grouping.QUEUE_LABEL


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _OnNode:
    """The detector's view of a node plus what the metrics need that the detector does not return."""

    view: overuse.NodeView
    allotted_milli: Mapping[int, int]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _CachedNode:
    key: tuple[int, tuple[tuple[int, int], ...]]
    pods: tuple[Mapping[str, Any], ...]
    on_node: _OnNode


def _same(cached: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]) -> bool:
    return len(cached) == len(current) and all(old is new for old, new in zip(cached, current, strict=True))


class _KnownPods(Mapping[str, overuse.PodView]):
    """Every pod of the cluster state as a ``PodView``, built on first use and cached per pod object.

    The detector only looks up the uids a sample names, so building a view of every pod for every sample (20,000
    samples a second at scale) would be waste; a lookup here costs a dict access once the view is cached.
    """

    def __init__(self, live: LiveTelemetry, state: cache.ClusterState) -> None:
        self._live = live
        self._state = state

    def __getitem__(self, uid: str) -> overuse.PodView:
        pod = self._state.pods.get(uid)
        if pod is None:
            raise KeyError(uid)
        return self._live.pod_view(uid, pod, self._state)

    def __iter__(self) -> Iterator[str]:
        return iter(self._state.pods)

    def __len__(self) -> int:
        return len(self._state.pods)


class LiveTelemetry:
    """The detector, the staleness watch and the headroom tracker, fed from samples and the cluster state."""

    def __init__(self, settings: LiveSettings) -> None:
        self.settings = settings
        self.detector = overuse.OveruseDetector(settings.detector)
        self.staleness = staleness.StalenessWatch(floor_ns=settings.stale_floor_ns)
        self.headroom = headroom.HeadroomTracker(
            window_ns=settings.headroom_window_ns, max_samples=settings.headroom_max_samples
        )
        self._views: dict[str, dict[int, headroom.DeviceView]] = {}
        self._changed: set[str] = set()
        self._pod_views: dict[str, tuple[Mapping[str, Any], cache.Assumption | None, overuse.PodView]] = {}
        self._policies: dict[str, tuple[Mapping[str, Any], overuse.OverusePolicy]] = {}
        self._requests: dict[str, tuple[Mapping[str, Any], gpurequest.GpuRequest | gpurequest.AnnotationProblem]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._nodes: dict[str, _CachedNode] = {}
        """Per node, its detector view as last built, reused while nothing it reads has changed."""

    # --- reads ------------------------------------------------------------------------------------------------------

    def device_views(self, node: str) -> Mapping[int, headroom.DeviceView] | None:
        """The measured view of each device of ``node`` (by index), or None for a node never heard from."""
        return self._views.get(node)

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
        state: cache.ClusterState,
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
            self._nodes.pop(node, None)
            if self._views.pop(node, None) is not None:
                changed.add(node)
            gone.add(node)
        for sample in samples:
            telemetry = sample.telemetry
            node = telemetry.node
            gone.discard(node)
            transitions += self.staleness.record(
                node, interval_ms=telemetry.interval_ms, received_ns=sample.received_ns
            )
            on_node = self._on_node(node, telemetry, state, problems)
            result = self.detector.observe(sample, on_node.view, now_ns=now_ns)
            transitions += result.transitions
            evictions += result.evictions
            foreign += result.foreign_claims
            self.headroom.record(sample, unattributed_bytes=result.unattributed_bytes)
            if self._refresh_views(node, telemetry, now_ns=now_ns):
                changed.add(node)
            rows[node] = self._rows(node, telemetry, on_node, result)
        self._changed |= changed
        if len(self._pod_views) > 2 * len(state.pods) + 1024:  # pods deleted since they were cached
            self._pod_views = {uid: entry for uid, entry in self._pod_views.items() if uid in state.pods}
            self._requests = {uid: entry for uid, entry in self._requests.items() if uid in state.pods}
            self._policies = {queue: entry for queue, entry in self._policies.items() if queue in state.queues}
        return LiveResult(
            transitions=tuple(transitions),
            evictions=tuple(evictions),
            rows=rows,
            forgotten=frozenset(gone),
            headroom_changed=frozenset(changed),
            foreign_claims=foreign,
            policy_problems=tuple(problems),
        )

    def check(self, *, now_ns: int) -> LiveResult:
        """The periodic sweep: fire ``TelemetryStale`` for nodes gone quiet and mark their devices stale (placement
        there falls back to requests), and let device peaks age out of the window."""
        transitions = self.staleness.check(now_ns=now_ns)
        changed: set[str] = set()
        for node, views in self._views.items():
            stale = self.staleness.is_stale(node, now_ns=now_ns)
            fresh = {index: self.headroom.device_view(node, index, now_ns=now_ns, stale=stale) for index in views}
            if fresh != views:
                self._views[node] = fresh
                changed.add(node)
        self._changed |= changed
        return LiveResult(transitions=transitions, headroom_changed=frozenset(changed))

    # --- the state's side -------------------------------------------------------------------------------------------

    def pod_view(self, uid: str, pod: Mapping[str, Any], state: cache.ClusterState) -> overuse.PodView:
        """A pod as the detector sees it (without devices): cached while the pod object and assumption stay."""
        assumption = state.assumed.get(uid)
        cached = self._pod_views.get(uid)
        if cached is not None and cached[0] is pod and cached[1] is assumption:
            return cached[2]
        meta = pod.get("metadata") or {}
        node = cache.node_of(pod) or (assumption.node if assumption is not None else None)
        phase = _PHASES.get(str((pod.get("status") or {}).get("phase") or ""), overuse.PodPhase.PENDING)
        view = overuse.PodView(
            uid=uid,
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            node=node,
            queue=self._queue_of(pod, state),
            phase=phase,
        )
        self._pod_views[uid] = (pod, assumption, view)
        return view

    def _request(self, uid: str, pod: Mapping[str, Any]) -> gpurequest.GpuRequest | gpurequest.AnnotationProblem:
        """The pod's GPU request, parsed once per pod object (every sample of its node asks again)."""
        cached = self._requests.get(uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        request = gpurequest.parse(pod)
        self._requests[uid] = (pod, request)
        return request

    def _queue_of(self, pod: Mapping[str, Any], state: cache.ClusterState) -> str:
        key = state.group_of(pod) if state.is_ours(pod) else None
        podgroup = state.podgroups.get(key) if key is not None else None
        queue = ((podgroup or {}).get("spec") or {}).get("queue")
        if queue:
            return str(queue)
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return str(labels.get(self.settings.queue_label) or grouping.DEFAULT_QUEUE)

    def _policy(
        self, queue: str, state: cache.ClusterState, problems: list[overuse.PolicyProblem]
    ) -> overuse.OverusePolicy:
        default = self.settings.detector.default_policy
        obj = state.queues.get(queue)
        if obj is None:
            return default
        cached = self._policies.get(queue)
        if cached is not None and cached[0] is obj:
            return cached[1]
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        parsed = overuse.queue_policy({str(key): str(value) for key, value in annotations.items()}, default=default)
        if isinstance(parsed, overuse.PolicyProblem):
            if (queue, parsed.value) not in self._reported:
                self._reported.add((queue, parsed.value))
                problems.append(parsed)
            policy = default
        else:
            policy = parsed
        self._policies[queue] = (obj, policy)
        return policy

    def _on_node(
        self,
        node: str,
        telemetry: wire.NodeTelemetry,
        state: cache.ClusterState,
        problems: list[overuse.PolicyProblem],
    ) -> _OnNode:
        on_node = state.pods_on(node)
        memory_key = tuple((gpu.index, gpu.memory_total_bytes) for gpu in telemetry.gpus)
        key = (state.node_generation.get(node, -1), memory_key)
        cached = self._nodes.get(node)
        # The node's generation moves with the node and every pod bound or assumed there; a pod's status (its phase)
        # changes its object only, so the objects are compared too (held by the cache, so no id is reused).
        if cached is not None and cached.key == key and _same(cached.pods, on_node):
            view = cached.on_node.view
            policies = {queue: self._policy(queue, state, problems) for queue in view.policies}
            return dataclasses.replace(cached.on_node, view=dataclasses.replace(view, policies=policies))
        built = self._build_on_node(node, on_node, dict(memory_key), state, problems)
        self._nodes[node] = _CachedNode(key=key, pods=tuple(on_node), on_node=built)
        return built

    def _build_on_node(
        self,
        node: str,
        on_node: Sequence[Mapping[str, Any]],
        measured_memory: Mapping[int, int],
        state: cache.ClusterState,
        problems: list[overuse.PolicyProblem],
    ) -> _OnNode:
        node_obj = state.nodes.get(node)
        label_memory = objects.device_memory_bytes(node_obj) if node_obj is not None else 0
        pods: list[overuse.PodView] = []
        holders: dict[int, list[str]] = {}
        milli: dict[int, int] = {}
        policies: dict[str, overuse.OverusePolicy] = {}
        shared_groups = {group for pod in on_node for group in objects.pod_gpu_groups(pod)}
        for pod in on_node:
            meta = pod.get("metadata") or {}
            group = (meta.get("labels") or {}).get(snapshot.RESERVATION_GROUP_LABEL)
            if group:
                # A reservation pod holds the device for its group's shares and runs no GPU process of its own. One
                # whose group has no pod left still holds a device nobody uses: the detector sees the group as the
                # holder, gone, and raises GhostAllocation if the reservation outlives the ghost threshold.
                index_text = str((meta.get("annotations") or {}).get(RESERVATION_INDEX_ANNOTATION) or "")
                if str(group) not in shared_groups and index_text.isascii() and index_text.isdigit():
                    holders.setdefault(int(index_text), []).append(overuse.GROUP_HOLDER_PREFIX + str(group))
                continue
            uid = str(meta.get("uid") or "")
            base = self.pod_view(uid, pod, state)
            held = _allotments(pod, self._request(uid, pod), state.assumed.get(uid), measured_memory, label_memory)
            for device, share in held:
                holders.setdefault(device.index, []).append(uid)
                milli[device.index] = min(model.MILLI_GPU_PER_DEVICE, milli.get(device.index, 0) + share)
            pods.append(dataclasses.replace(base, node=node, devices=tuple(device for device, _ in held)))
            if base.queue not in policies:
                policies[base.queue] = self._policy(base.queue, state, problems)
        view = overuse.NodeView(pods=pods, holders=holders, known_pods=_KnownPods(self, state), policies=policies)
        return _OnNode(view=view, allotted_milli=milli)

    def _refresh_views(self, node: str, telemetry: wire.NodeTelemetry, *, now_ns: int) -> bool:
        stale = self.staleness.is_stale(node, now_ns=now_ns)
        fresh = {
            gpu.index: self.headroom.device_view(node, gpu.index, now_ns=now_ns, stale=stale) for gpu in telemetry.gpus
        }
        if self._views.get(node) == fresh:
            return False
        self._views[node] = fresh
        return True

    def _rows(self, node: str, telemetry: wire.NodeTelemetry, on_node: _OnNode, result: overuse.NodeResult) -> NodeRows:
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


RESERVATION_INDEX_ANNOTATION = "quotient.dev/gpu-index"
"""Written by a reservation pod (``quotient reserve``): the index of the device it holds."""
GPU_UUIDS_ANNOTATION = "quotient.dev/gpu-uuids"
"""Written by the binder on a share (``scheduler.kube.binding``): its reservation pods' device UUIDs."""


def _allotments(
    pod: Mapping[str, Any],
    request: gpurequest.GpuRequest | gpurequest.AnnotationProblem,
    assumption: cache.Assumption | None,
    measured_memory: Mapping[int, int],
    label_memory: int,
) -> Sequence[tuple[overuse.PodDevice, int]]:
    """Each device the pod holds, with its allotment in bytes, and the milli-GPU it takes there."""
    if isinstance(request, gpurequest.AnnotationProblem) or (request.whole == 0 and not request.is_share):
        return ()
    devices = assumption.devices if assumption is not None else objects.bound_devices(pod)
    # A share's devices are its reservation pods', whose UUIDs the binder recorded: that is the device it runs on,
    # whatever index the scheduler's accounting gave it.
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    uuids = [part.strip() for part in str(annotations.get(GPU_UUIDS_ANNOTATION) or "").split(",") if part.strip()]
    held: list[tuple[overuse.PodDevice, int]] = []
    for position, index in enumerate(devices):
        memory = measured_memory.get(index) or label_memory
        if request.is_share:
            share = _share_milli(pod, assumption, request, memory)
            allotted = request.memory_bytes or placement_devices.share_bytes(share, memory)
            uuid = uuids[position] if position < len(uuids) else None
            held.append((overuse.PodDevice(index=index, uuid=uuid, allotted_bytes=allotted), share))
        else:
            device = overuse.PodDevice(index=index, allotted_bytes=memory, whole=True)
            held.append((device, model.MILLI_GPU_PER_DEVICE))
    return held


def _share_milli(
    pod: Mapping[str, Any], assumption: cache.Assumption | None, request: gpurequest.GpuRequest, memory: int
) -> int:
    """The share as the binder recorded it (assumption, then annotation), else as the request says."""
    if assumption is not None and assumption.share_milli:
        return assumption.share_milli
    recorded = ((pod.get("metadata") or {}).get("annotations") or {}).get(objects.GPU_SHARE_ANNOTATION)
    if isinstance(recorded, str) and recorded.isascii() and recorded.isdigit() and int(recorded) > 0:
        return int(recorded)
    return model.share_milli_on(model.GpuShare(milli_gpu=request.milli_gpu, memory_bytes=request.memory_bytes), memory)

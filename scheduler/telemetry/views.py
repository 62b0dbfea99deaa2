"""The over-consumption detector's view of a node, built from the cluster state's records.

For each node whose telemetry arrives, the detector needs the pods accounted there (bound or assumed) with, per
device, the bytes each was allotted (and, for KAI's per-container GPU memory, its limit); the holders of each
device; every pod the scheduler knows (to tell a pod of another node from one it does not know); and the overuse
policy of each queue involved. Where a pod is and what it
holds comes from ``state.holdings``, the very reading the snapshot's accounting uses, so placement and the detector
cannot disagree about a pod: a share's devices are its reservation pods' (matched by the UUIDs the binder recorded),
a whole-GPU pod holds whole devices. Device memory is the agent's NVML total, else the node's label.

A node's view is rebuilt only when something it reads changed (the node's generation in the state, which moves with
every pod bound or assumed there, a pod's record, or a device's total memory); at 5,000 nodes x 4 Hz the detector
would otherwise rebuild every node's view four times a second. Reservation pods run no GPU process: one whose group
has no pod left is the holder ``gpu-group:<id>`` of its device, so a reservation that outlives its group shows as a
``GhostAllocation``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from common import names, wire
from scheduler.objects import gpurequest
from scheduler.objects.records import Phase, PodRecord, QueueRecord
from scheduler.placement import model
from scheduler.state import holdings
from scheduler.state.cache import Assumption, ClusterState
from scheduler.telemetry import overuse

_PHASES = {
    Phase.PENDING: overuse.PodPhase.PENDING,
    Phase.RUNNING: overuse.PodPhase.RUNNING,
    Phase.SUCCEEDED: overuse.PodPhase.SUCCEEDED,
    Phase.FAILED: overuse.PodPhase.FAILED,
    Phase.UNKNOWN: overuse.PodPhase.PENDING,
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OnNode:
    """The detector's view of a node plus what the metrics need that the detector does not return."""

    view: overuse.NodeView
    allotted_milli: Mapping[int, int]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Cached:
    key: tuple[int, tuple[tuple[int, int], ...]]
    pods: tuple[PodRecord, ...]
    on_node: OnNode


def _same(cached: Sequence[PodRecord], current: Sequence[PodRecord]) -> bool:
    return len(cached) == len(current) and all(old is new for old, new in zip(cached, current, strict=True))


class _KnownPods(Mapping[str, overuse.PodView]):
    """Every pod of the cluster state as a ``PodView``, built on first use and cached per record.

    The detector only looks up the uids a sample names, so building a view of every pod for every sample (20,000
    samples a second at scale) would be waste; a lookup here costs a dict access once the view is cached.
    """

    def __init__(self, views: NodeViews, state: ClusterState) -> None:
        self._views = views
        self._state = state

    def __getitem__(self, uid: str) -> overuse.PodView:
        pod = self._state.pods.get(uid)
        if pod is None:
            raise KeyError(uid)
        return self._views.pod_view(pod)

    def __iter__(self) -> Iterator[str]:
        return iter(self._state.pods)

    def __len__(self) -> int:
        return len(self._state.pods)


class NodeViews:
    """Builds (and keeps) the detector's view of each node from one ``ClusterState``."""

    def __init__(self, state: ClusterState, *, queue_label: str, default_policy: overuse.OverusePolicy) -> None:
        self._state = state
        self._queue_label = queue_label
        self._default_policy = default_policy
        self._known = _KnownPods(self, state)
        self._pod_views: dict[str, tuple[PodRecord, Assumption | None, overuse.PodView]] = {}
        self._policies: dict[str, tuple[QueueRecord, overuse.OverusePolicy]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._nodes: dict[str, _Cached] = {}

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def prune(self) -> None:
        """Drop what was cached for pods and queues that are gone."""
        state = self._state
        if len(self._pod_views) > 2 * len(state.pods) + 1024:
            self._pod_views = {uid: entry for uid, entry in self._pod_views.items() if uid in state.pods}
            self._policies = {queue: entry for queue, entry in self._policies.items() if queue in state.queues}

    def on_node(self, node: str, telemetry: wire.NodeTelemetry, problems: list[overuse.PolicyProblem]) -> OnNode:
        """The view of ``node`` for this sample; problems with queue policies are appended to ``problems``."""
        state = self._state
        on_node = state.pods_on(node)
        memory_key = tuple((gpu.index, gpu.memory_total_bytes) for gpu in telemetry.gpus)
        key = (state.node_generation.get(node, -1), memory_key)
        cached = self._nodes.get(node)
        # The node's generation moves with the node and every pod bound or assumed there; a pod's status (its phase)
        # changes its record only, so the records are compared too (held by the cache, so no id is reused).
        if cached is not None and cached.key == key and _same(cached.pods, on_node):
            view = cached.on_node.view
            policies = {queue: self._policy(queue, problems) for queue in view.policies}
            return dataclasses.replace(cached.on_node, view=dataclasses.replace(view, policies=policies))
        built = self._build(node, on_node, dict(memory_key), problems)
        self._nodes[node] = _Cached(key=key, pods=tuple(on_node), on_node=built)
        return built

    def pod_view(self, pod: PodRecord) -> overuse.PodView:
        """A pod as the detector sees it (without devices): cached while its record and assumption stay."""
        assumption = self._state.assumed.get(pod.uid)
        cached = self._pod_views.get(pod.uid)
        if cached is not None and cached[0] is pod and cached[1] is assumption:
            return cached[2]
        view = overuse.PodView(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            node=pod.node or (assumption.node if assumption is not None else None),
            queue=self._queue_of(pod),
            phase=_PHASES[pod.phase],
        )
        self._pod_views[pod.uid] = (pod, assumption, view)
        return view

    def _queue_of(self, pod: PodRecord) -> str:
        state = self._state
        key = state.group_of(pod) if state.is_ours(pod) else None
        podgroup = state.podgroups.get(key) if key is not None else None
        if podgroup is not None and podgroup.queue:
            return podgroup.queue
        return pod.labels.get(self._queue_label) or names.DEFAULT_QUEUE

    def _policy(self, queue: str, problems: list[overuse.PolicyProblem]) -> overuse.OverusePolicy:
        record = self._state.queues.get(queue)
        if record is None:
            return self._default_policy
        cached = self._policies.get(queue)
        if cached is not None and cached[0] is record:
            return cached[1]
        parsed = self._default_policy if record.overuse_policy is None else overuse.parse_policy(record.overuse_policy)
        if isinstance(parsed, overuse.PolicyProblem):
            if (queue, parsed.value) not in self._reported:
                self._reported.add((queue, parsed.value))
                problems.append(parsed)
            policy = self._default_policy
        else:
            policy = parsed
        self._policies[queue] = (record, policy)
        return policy

    def _build(
        self,
        node: str,
        on_node: Sequence[PodRecord],
        measured_memory: Mapping[int, int],
        problems: list[overuse.PolicyProblem],
    ) -> OnNode:
        state = self._state
        record = state.nodes.get(node)
        label_memory = record.device_memory_bytes if record is not None else 0
        pods: list[overuse.PodView] = []
        holders: dict[int, list[str]] = {}
        milli: dict[int, int] = {}
        policies: dict[str, overuse.OverusePolicy] = {}
        shared_groups = {group for pod in on_node for group in pod.gpu_groups}
        for pod in on_node:
            reservation = pod.reservation
            if pod.labels.get(names.RESERVATION_GROUP_LABEL):
                # A reservation pod holds the device for its group's shares and runs no GPU process of its own. One
                # whose group has no pod left still holds a device nobody uses: the detector sees the group as the
                # holder, gone, and raises GhostAllocation if the reservation outlives the ghost threshold.
                group = pod.labels[names.RESERVATION_GROUP_LABEL]
                index = reservation.index if reservation is not None else None
                if group not in shared_groups and index is not None:
                    holders.setdefault(index, []).append(overuse.GROUP_HOLDER_PREFIX + group)
                continue
            base = self.pod_view(pod)
            held = _allotments(pod, state.assumed.get(pod.uid), measured_memory, label_memory)
            for device, share in held:
                holders.setdefault(device.index, []).append(pod.uid)
                milli[device.index] = min(model.MILLI_GPU_PER_DEVICE, milli.get(device.index, 0) + share)
            pods.append(dataclasses.replace(base, node=node, devices=tuple(device for device, _ in held)))
            if base.queue not in policies:
                policies[base.queue] = self._policy(base.queue, problems)
        view = overuse.NodeView(pods=pods, holders=holders, known_pods=self._known, policies=policies)
        return OnNode(view=view, allotted_milli=milli)


def _allotments(
    pod: PodRecord,
    assumption: Assumption | None,
    measured_memory: Mapping[int, int],
    label_memory: int,
) -> Sequence[tuple[overuse.PodDevice, int]]:
    """Each device the pod holds, with its allotment in bytes, and the milli-GPU it takes there."""
    request = pod.gpu
    if not holdings.holds_gpus(request):
        return ()
    assert isinstance(request, gpurequest.GpuRequest)
    holding = holdings.of(pod, assumption)
    held: list[tuple[overuse.PodDevice, int]] = []
    for position, index in enumerate(holding.devices):
        memory = measured_memory.get(index) or label_memory
        if request.is_share:
            # A share's devices are its reservation pods', whose UUIDs the binder recorded: that is the device it
            # runs on, whatever index the scheduler's accounting gave it.
            share = holdings.share_milli(request, holding, memory)
            uuid = pod.gpu_uuids[position] if position < len(pod.gpu_uuids) else None
            allotted = holdings.allotted_bytes(request, share, memory)
            limit = holdings.limit_bytes(request, allotted)
            held.append((overuse.PodDevice(index=index, uuid=uuid, allotted_bytes=allotted, limit_bytes=limit), share))
        else:
            device = overuse.PodDevice(index=index, allotted_bytes=memory, whole=True)
            held.append((device, model.MILLI_GPU_PER_DEVICE))
    return held

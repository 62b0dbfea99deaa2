"""From the cluster state to the engine's ``Snapshot``, rebuilding only what changed.

A ``model.Node`` is rebuilt only when its generation moved (the node, or a pod bound or assumed on it, changed) and
a ``model.Group`` only when one of its pods or its PodGroup did; everything else is the very object of the previous
snapshot, which is what lets the engine's indexes skip it. Queues are re-read when the topology version moves.

Measured headroom (DESIGN.md, "Telemetry in decisions") comes from a ``MeasuredDevices`` source (the live telemetry):
each device gets its measured fields through ``headroom.measured``, and only the nodes the source reports changed
are re-overlaid, on top of the request-based node kept from the last rebuild, so telemetry arriving every interval
from every node does not cost a rebuild of every node per cycle.

What cannot be read becomes a reported problem, never a crash and never a silent drop: a pod whose GPU annotations
are invalid (where no webhook refused it) is left out of its group and reported with the reason; a Queue with a
malformed spec, a missing parent or a parent cycle is left out with a condition, and its groups then wait with
``QueueDoesNotExist``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from common import names
from common.resources import Resources
from scheduler.kube import gpurequest, grouping
from scheduler.placement import model
from scheduler.state import objects
from scheduler.state.cache import Assumption, ClusterState
from scheduler.telemetry import headroom

SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
RESERVATION_GROUP_LABEL = "quotient.dev/gpu-group-reservation"
"""On a reservation pod: the GPU group whose device it holds (its shares account for the device)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueIssue:
    queue: str
    condition: str
    """``Orphan`` (parent missing), ``Cycle`` or ``Invalid``."""
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodIssue:
    uid: str
    namespace: str
    name: str
    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    snapshot: model.Snapshot
    queue_issues: tuple[QueueIssue, ...]
    pod_issues: tuple[PodIssue, ...]
    podgroups: Mapping[model.GroupId, tuple[str, str]]
    """Each group's PodGroup (namespace, name), for status writing."""


class MeasuredDevices(Protocol):
    """Where measured device views come from (``telemetry.live.LiveTelemetry``)."""

    def device_views(self, node: str) -> Mapping[int, headroom.DeviceView] | None:
        """Each device's view by index; None for a node never heard from (accounted by requests alone)."""
        ...

    def take_changed(self) -> frozenset[str]:
        """The nodes whose views changed since the last call."""
        ...


def with_measured(node: model.Node, views: Mapping[int, headroom.DeviceView] | None) -> model.Node:
    """``node`` with each device's measured fields from ``views`` (absent devices: no telemetry); the same object
    when nothing changes."""
    if views is None:
        return node
    devices = tuple(headroom.measured(device, views.get(device.index, headroom.UNMEASURED)) for device in node.devices)
    if all(new is old for new, old in zip(devices, node.devices, strict=True)):
        return node
    return dataclasses.replace(node, devices=devices)


def group_id(namespace: str, name: str) -> model.GroupId:
    return model.GroupId(f"{namespace}/{name}")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _share_milli(request: gpurequest.GpuRequest, device_memory: int) -> int:
    if request.milli_gpu:
        return request.milli_gpu
    return model.share_milli_on(model.GpuShare(memory_bytes=request.memory_bytes), device_memory)


def _group_id(text: str | None) -> model.GpuGroupId | None:
    return model.GpuGroupId(text) if text else None


@dataclasses.dataclass(frozen=True, slots=True)
class PodInfo:
    """What one version of a pod asks for, parsed once and shared by its node's and its group's rebuilds."""

    requests: Resources | objects.Problem
    gpu: gpurequest.GpuRequest | gpurequest.AnnotationProblem


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    return PodInfo(requests=objects.pod_requests(pod), gpu=gpurequest.parse(pod))


def build_node(
    node: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    assumed: Mapping[str, Assumption],
    info: Callable[[Mapping[str, Any]], PodInfo] = pod_info,
) -> model.Node | objects.Problem:
    """One node with what its pods (bound and assumed) use, and its devices' allotments."""
    capacity = objects.node_capacity(node)
    if isinstance(capacity, objects.Problem):
        return capacity
    allocatable, gpu_count = capacity
    name = str(_meta(node).get("name") or "")
    labels = {str(k): str(v) for k, v in (_meta(node).get("labels") or {}).items()}
    memory = objects.device_memory_bytes(node)
    product = labels.get(names.GPU_PRODUCT_LABEL, "")
    allotted = [0] * gpu_count
    holders: list[list[str]] = [[] for _ in range(gpu_count)]
    whole = [False] * gpu_count
    groups: list[str | None] = [None] * gpu_count
    used = Resources()
    unplaced_whole: list[tuple[str, int]] = []
    reservations: list[tuple[str, str]] = []
    for pod in pods:
        meta = _meta(pod)
        uid = str(meta.get("uid") or "")
        parsed = info(pod)
        if not isinstance(parsed.requests, objects.Problem):
            used = used + parsed.requests
        request = parsed.gpu
        if isinstance(request, gpurequest.AnnotationProblem) or (request.whole == 0 and not request.is_share):
            continue
        labels_of_pod = meta.get("labels") or {}
        if labels_of_pod.get(RESERVATION_GROUP_LABEL):
            reservations.append((uid, str(labels_of_pod[RESERVATION_GROUP_LABEL])))
            continue  # the device it holds is accounted through the shares of its group
        assumption = assumed.get(uid)
        devices = assumption.devices if assumption is not None else objects.bound_devices(pod)
        devices = tuple(index for index in devices if 0 <= index < gpu_count)
        if request.is_share:
            pod_groups = assumption.gpu_groups if assumption is not None else objects.pod_gpu_groups(pod)
            recorded = (meta.get("annotations") or {}).get(objects.GPU_SHARE_ANNOTATION)
            share = (assumption.share_milli if assumption is not None else 0) or (
                int(recorded) if isinstance(recorded, str) and recorded.isascii() and recorded.isdigit() else 0
            )
            share = share or _share_milli(request, memory)
            for position, index in enumerate(devices):
                allotted[index] += share
                holders[index].append(uid)
                if position < len(pod_groups):
                    groups[index] = pod_groups[position]
        elif devices:
            for index in devices:
                allotted[index] = model.MILLI_GPU_PER_DEVICE
                holders[index].append(uid)
                whole[index] = True
        else:
            unplaced_whole.append((uid, request.whole))
    # A reservation pod whose group has no share left (draining, or its bind failed) still holds a whole device.
    held = {group for group in groups if group is not None}
    for uid, group in reservations:
        if group not in held:
            unplaced_whole.insert(0, (uid, 1))
    # Pods whose devices nobody recorded (another scheduler's, or bound before we annotated) take the lowest free ones.
    for uid, count in unplaced_whole:
        free = [i for i in range(gpu_count) if allotted[i] == 0 and groups[i] is None][:count]
        for index in free:
            allotted[index] = model.MILLI_GPU_PER_DEVICE
            holders[index].append(uid)
            whole[index] = True
    node_devices = tuple(
        model.Device(
            index=index,
            uuid=model.GpuUuid(f"{name}/gpu{index}"),
            model=product,
            memory_bytes=memory,
            allotted_milli_gpu=min(allotted[index], model.MILLI_GPU_PER_DEVICE),
            holders=tuple(model.PodUid(uid) for uid in sorted(holders[index])),
            whole=whole[index],
            gpu_group=_group_id(groups[index]),
        )
        for index in range(gpu_count)
    )
    spec = node.get("spec") or {}
    return model.Node(
        name=model.NodeName(name),
        allocatable=allocatable,
        used=dataclasses.replace(used, milli_gpu=sum(allotted)),
        labels=labels,
        taints=objects.node_taints(node),
        ready=objects.node_ready(node),
        unschedulable=bool(spec.get("unschedulable")),
        devices=node_devices,
    )


def build_queues(
    queues: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[model.QueueName, model.Queue], list[QueueIssue]]:
    """Every valid queue whose ancestors all exist and form no cycle; an issue for each one left out."""
    parsed: dict[str, model.Queue] = {}
    issues: list[QueueIssue] = []
    for name, obj in sorted(queues.items()):
        queue = objects.queue_from(obj)
        if isinstance(queue, objects.Problem):
            issues.append(QueueIssue(queue=name, condition="Invalid", message=f"{queue.field}: {queue.message}"))
        else:
            parsed[name] = queue
    kept: dict[model.QueueName, model.Queue] = {}
    for name, queue in parsed.items():
        seen = [name]
        parent = queue.parent
        problem: QueueIssue | None = None
        while parent is not None:
            if parent in seen:
                problem = QueueIssue(
                    queue=name, condition="Cycle", message=f"parent chain loops: {' -> '.join([*seen, parent])}"
                )
                break
            if parent not in parsed:
                reason = "is invalid" if parent in queues else "does not exist"
                problem = QueueIssue(queue=name, condition="Orphan", message=f"ancestor queue {parent!r} {reason}")
                break
            seen.append(parent)
            parent = parsed[parent].parent
        if problem is None:
            kept[model.QueueName(name)] = queue
        else:
            issues.append(problem)
    return kept, issues


class SnapshotBuilder:
    """Builds snapshots from one ``ClusterState``, reusing unchanged nodes and groups."""

    def __init__(
        self,
        state: ClusterState,
        *,
        config: model.Config = model.DEFAULT_CONFIG,
        measured: MeasuredDevices | None = None,
    ) -> None:
        self.state = state
        self.config = config
        self.measured = measured
        self._first = True
        self._priority_version = 0
        self._base_models: dict[model.NodeName, model.Node] = {}
        """Each node as requests account for it; ``_node_models`` holds it with its measured fields."""
        self._node_models: dict[model.NodeName, model.Node] = {}
        self._nodes_view: dict[model.NodeName, model.Node] | None = None
        self._group_models: dict[tuple[str, str], model.Group] = {}
        self._groups_view: dict[model.GroupId, model.Group] | None = None
        self._podgroup_of: dict[model.GroupId, tuple[str, str]] = {}
        self._group_issues: dict[tuple[str, str], tuple[PodIssue, ...]] = {}
        self._queues: tuple[int, dict[model.QueueName, model.Queue], list[QueueIssue]] | None = None
        self._below_min_since: dict[tuple[str, str], int] = {}
        self._pods: dict[str, tuple[int, PodInfo, model.Pod | objects.Problem | None]] = {}
        self._quarantined: dict[str, int] = {}

    def quarantine(self, node: str, *, until_ns: int) -> None:
        """Place nothing new on ``node`` until ``until_ns`` (a reservation pod there could not get its GPU)."""
        self._quarantined[node] = max(until_ns, self._quarantined.get(node, 0))
        self.state.changed_nodes.add(node)

    @property
    def quarantined(self) -> Mapping[str, int]:
        return self._quarantined

    def _info(self, pod: Mapping[str, Any]) -> PodInfo:
        uid = str(_meta(pod).get("uid") or "")
        generation = self.state.pod_generation.get(uid, -1)
        cached = self._pods.get(uid)
        if cached is not None and cached[0] == generation:
            return cached[1]
        info = pod_info(pod)
        self._pods[uid] = (generation, info, None)
        return info

    def _member(self, pod: Mapping[str, Any], info: PodInfo, subgroup: str | None) -> model.Pod | objects.Problem:
        uid = str(_meta(pod).get("uid") or "")
        generation = self.state.pod_generation.get(uid, -1)
        cached = self._pods.get(uid)
        if cached is not None and cached[0] == generation and cached[2] is not None:
            return cached[2]
        assert isinstance(info.gpu, gpurequest.GpuRequest)
        member = objects.pod_from(pod, info.gpu, subgroup=subgroup)
        self._pods[uid] = (generation, info, member)
        return member

    def build(self, now_ns: int) -> Built:
        """The snapshot of now. Only what the state marked changed is rebuilt; an unchanged mapping is handed over
        as the very same object (the engine then knows nothing in it changed), a changed one as a fresh copy (a
        snapshot is never mutated after it was handed over)."""
        state = self.state
        every = self._first or state.priority_version != self._priority_version
        self._first = False
        self._priority_version = state.priority_version
        for name, until_ns in list(self._quarantined.items()):
            if until_ns <= now_ns:
                del self._quarantined[name]
                state.changed_nodes.add(name)
        node_names = list(state.nodes) if every else list(state.changed_nodes)
        state.changed_nodes.clear()
        for name in node_names:
            node_obj = state.nodes.get(name)
            built = build_node(node_obj, state.pods_on(name), state.assumed, self._info) if node_obj else None
            if isinstance(built, model.Node):
                if name in self._quarantined:
                    built = dataclasses.replace(built, unschedulable=True)
                self._base_models[model.NodeName(name)] = built
            else:
                self._base_models.pop(model.NodeName(name), None)
                self._node_models.pop(model.NodeName(name), None)
        remeasured = self.measured.take_changed() if self.measured is not None else frozenset()
        touched = False
        for name in {*node_names, *remeasured}:
            node_name = model.NodeName(name)
            base = self._base_models.get(node_name)
            if base is None:
                continue
            views = self.measured.device_views(name) if self.measured is not None else None
            node_model = with_measured(base, views)
            if self._node_models.get(node_name) is not node_model:
                self._node_models[node_name] = node_model
                touched = True
        if node_names or touched or self._nodes_view is None:
            self._nodes_view = dict(self._node_models)
        nodes = self._nodes_view
        if self._queues is None or self._queues[0] != state.queue_version:
            kept, issues = build_queues(state.queues)
            self._queues = (state.queue_version, kept, issues)
        queues, queue_issues = self._queues[1], self._queues[2]
        group_keys = list(state.group_members) if every else list(state.changed_groups)
        state.changed_groups.clear()
        for key in group_keys:
            members = state.group_members.get(key)
            group, built_issues = self._build_group(key, members, now_ns) if members else (None, ())
            old = self._group_models.pop(key, None)
            if old is not None:
                self._podgroup_of.pop(old.id, None)
            if group is not None:
                self._group_models[key] = group
                self._podgroup_of[group.id] = key
            if built_issues:
                self._group_issues[key] = built_issues
            else:
                self._group_issues.pop(key, None)
        # Gangs below their minimum wait on the clock (stale-gang grace), so they are looked at every time.
        for key in list(self._below_min_since):
            if key not in group_keys and key in state.group_members:
                group, _ = self._build_group(key, state.group_members[key], now_ns)
                if group is not None:
                    self._group_models[key] = group
                    group_keys.append(key)
        if group_keys or self._groups_view is None:
            self._groups_view = {group.id: group for group in self._group_models.values()}
        groups = self._groups_view
        podgroups = self._podgroup_of
        pod_issues = [issue for issues in self._group_issues.values() for issue in issues]
        if len(self._pods) > 2 * len(state.pods) + 1024:
            self._pods = {uid: entry for uid, entry in self._pods.items() if uid in state.pods}
        snapshot = model.Snapshot(nodes=nodes, queues=queues, groups=groups, now_ns=now_ns, config=self.config)
        return Built(
            snapshot=snapshot, queue_issues=tuple(queue_issues), pod_issues=tuple(pod_issues), podgroups=dict(podgroups)
        )

    def _build_group(
        self, key: tuple[str, str], members: set[str], now_ns: int
    ) -> tuple[model.Group | None, tuple[PodIssue, ...]]:
        state = self.state
        podgroup = state.podgroups.get(key)
        if podgroup is None or not members:
            return None, ()
        spec = podgroup.get("spec") or {}
        min_member = spec.get("minMember")
        min_member = min_member if isinstance(min_member, int) and min_member >= 1 else 1
        queue = str(spec.get("queue") or grouping.DEFAULT_QUEUE)
        priority_class = str(spec.get("priorityClassName") or "train")
        priority = grouping.priority_value(priority_class, state.priority_classes)
        preemptibility = spec.get("preemptibility")
        preemptible = (
            preemptibility == "preemptible"
            if preemptibility in ("preemptible", "non-preemptible")
            else priority < grouping.NON_PREEMPTIBLE_FROM
        )
        subgroups = tuple(
            model.SubGroup(name=str(sub.get("name")), min_member=int(sub.get("minMember") or 1))
            for sub in spec.get("subGroups") or []
            if isinstance(sub, dict) and sub.get("name") and isinstance(sub.get("minMember", 1), int)
        )
        pods: list[model.Pod] = []
        issues: list[PodIssue] = []
        for uid in sorted(members):
            pod_obj = state.pods.get(uid)
            if pod_obj is None or (pod_obj.get("status") or {}).get("phase") == "Failed":
                continue
            meta = _meta(pod_obj)
            info = self._info(pod_obj)
            request = info.gpu
            if isinstance(request, gpurequest.AnnotationProblem):
                issues.append(
                    PodIssue(
                        uid=uid,
                        namespace=str(meta.get("namespace") or ""),
                        name=str(meta.get("name") or ""),
                        reason="InvalidGpuRequest",
                        message=request.message,
                    )
                )
                continue
            subgroup = (meta.get("labels") or {}).get(SUBGROUP_LABEL)
            pod = self._member(pod_obj, info, str(subgroup) if subgroup else None)
            if isinstance(pod, objects.Problem):
                issues.append(
                    PodIssue(
                        uid=uid,
                        namespace=str(meta.get("namespace") or ""),
                        name=str(meta.get("name") or ""),
                        reason="InvalidPodSpec",
                        message=f"{pod.field}: {pod.message}",
                    )
                )
                continue
            assumption = state.assumed.get(uid)
            if assumption is not None and pod.phase is model.PodPhase.PENDING:
                pod = dataclasses.replace(
                    pod,
                    phase=model.PodPhase.RUNNING,
                    node=model.NodeName(assumption.node),
                    devices=assumption.devices,
                    allotted_milli_gpu=assumption.share_milli,
                    gpu_groups=tuple(model.GpuGroupId(group) for group in assumption.gpu_groups),
                    started_ns=now_ns,
                )
            pods.append(pod)
        if not pods:
            return None, tuple(issues)
        satisfied = sum(1 for pod in pods if pod.phase is not model.PodPhase.PENDING)
        running = sum(1 for pod in pods if pod.phase is model.PodPhase.RUNNING)
        if running and satisfied < min_member:
            since = self._below_min_since.setdefault(key, now_ns)
        else:
            self._below_min_since.pop(key, None)
            since = None
        meta = _meta(podgroup)
        group = model.Group(
            id=group_id(*key),
            queue=model.QueueName(queue),
            min_member=min_member,
            subgroups=subgroups,
            priority=priority,
            preemptible=preemptible,
            created_ns=objects.timestamp_ns(meta.get("creationTimestamp")),
            members=tuple(pods),
            below_min_since_ns=since,
        )
        return group, tuple(issues)

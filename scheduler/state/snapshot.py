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
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol

from common import logs, names
from scheduler.objects import gpurequest
from scheduler.objects.records import NodeRecord, Phase, PodGroupRecord, PodRecord, Problem
from scheduler.placement import gangs, model
from scheduler.state import models
from scheduler.state.cache import ClusterState, GroupKey
from scheduler.state.models import QueueIssue
from scheduler.telemetry import headroom
from scheduler.telemetry import health as gpuhealth

log = logs.get("scheduler")

_DEFAULT_SUBGROUP = "default"
"""KAI's subgroup of a pod without the subgroup label (``podgroup_info.DefaultSubGroup``)."""


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
    podgroups: Mapping[model.GroupId, GroupKey]
    """Each group's PodGroup (namespace, name), for status writing."""


class MeasuredDevices(Protocol):
    """Where measured device views come from (``telemetry.live.LiveTelemetry``)."""

    def device_views(self, node: str) -> Mapping[int, headroom.DeviceView] | None:
        """Each device's view by index; None for a node never heard from (accounted by requests alone)."""
        ...

    def take_changed(self) -> frozenset[str]:
        """The nodes whose views changed since the last call."""
        ...

    def health(self, node: str) -> gpuhealth.Verdict:
        """Which devices of ``node`` its agent reports broken (``gpuhealth.HEALTHY`` when none)."""
        ...


def with_measured(
    node: model.Node,
    views: Mapping[int, headroom.DeviceView] | None,
    verdict: gpuhealth.Verdict = gpuhealth.HEALTHY,
) -> model.Node:
    """``node`` with each device's measured fields from ``views`` (absent devices: no telemetry) and the devices its
    agent reports broken out of placement; the same object when nothing changes.

    A device the device plugin already took out of the node's allocatable is not taken out twice: when the agent
    sees more devices than the node offers, that many of the broken ones count as already gone (the lowest indexes:
    which device the plugin dropped is not visible here)."""
    broken = _broken(node, views, verdict)
    if views is None and not broken:
        return node
    devices = tuple(
        _marked(
            headroom.measured(device, views.get(device.index, headroom.UNMEASURED)) if views is not None else device,
            healthy=device.index not in broken,
        )
        for device in node.devices
    )
    if all(new is old for new, old in zip(devices, node.devices, strict=True)):
        return node
    return dataclasses.replace(node, devices=devices)


def _broken(node: model.Node, views: Mapping[int, headroom.DeviceView] | None, verdict: gpuhealth.Verdict) -> set[int]:
    if not verdict.unhealthy:
        return set()
    if verdict.whole_node:
        return {device.index for device in node.devices}
    dropped = max(0, len(views) - len(node.devices)) if views else 0
    reported = sorted(index for index in verdict.unhealthy if index >= 0)
    return {index for index in reported[dropped:] if index < len(node.devices)}


def _marked(device: model.Device, *, healthy: bool) -> model.Device:
    return device if device.healthy is healthy else dataclasses.replace(device, healthy=healthy)


class SnapshotBuilder:
    """Builds snapshots from one ``ClusterState``, reusing unchanged nodes and groups."""

    def __init__(
        self,
        state: ClusterState,
        *,
        config: model.Config = model.DEFAULT_CONFIG,
        measured: MeasuredDevices | None = None,
        on_error: Callable[[str, BaseException], None] = lambda where, exc: None,
    ) -> None:
        self._on_error = on_error
        self.state = state
        self.config = config
        self.measured = measured
        self._first = True
        self._priority_version = 0
        self._base_models: dict[model.NodeName, model.Node] = {}
        """Each node as requests account for it; ``_node_models`` holds it with its measured fields."""
        self._node_models: dict[model.NodeName, model.Node] = {}
        self._nodes_view: dict[model.NodeName, model.Node] | None = None
        self._group_models: dict[GroupKey, model.Group] = {}
        self._groups_view: dict[model.GroupId, model.Group] | None = None
        self._podgroup_of: dict[model.GroupId, GroupKey] = {}
        self._group_issues: dict[GroupKey, tuple[PodIssue, ...]] = {}
        self._queues: tuple[int, dict[model.QueueName, model.Queue], list[QueueIssue]] | None = None
        self._below_min_since: dict[GroupKey, int] = {}
        self._members: dict[str, tuple[int, model.Pod | Problem]] = {}
        """Each pod of ours as a group member, kept while its generation in the state is unchanged."""
        self._quarantined: dict[str, int] = {}

    def quarantine(self, node: str, *, until_ns: int) -> None:
        """Place nothing new on ``node`` until ``until_ns`` (a reservation pod there could not get its GPU)."""
        self._quarantined[node] = max(until_ns, self._quarantined.get(node, 0))
        self.state.changed_nodes.add(node)

    @property
    def quarantined(self) -> Mapping[str, int]:
        return self._quarantined

    def _member(self, pod: PodRecord) -> model.Pod | Problem:
        generation = self.state.pod_generation.get(pod.uid, -1)
        cached = self._members.get(pod.uid)
        if cached is not None and cached[0] == generation:
            return cached[1]
        member = models.pod_from(pod)
        self._members[pod.uid] = (generation, member)
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
            record = state.nodes.get(name)
            built = self._node(name, record) if record is not None else None
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
            verdict = self.measured.health(name) if self.measured is not None else gpuhealth.HEALTHY
            node_model = with_measured(base, views, verdict)
            if self._node_models.get(node_name) is not node_model:
                self._node_models[node_name] = node_model
                touched = True
        if node_names or touched or self._nodes_view is None:
            self._nodes_view = dict(self._node_models)
        nodes = self._nodes_view
        if self._queues is None or self._queues[0] != state.queue_version:
            kept, issues = models.build_queues(state.queues)
            self._queues = (state.queue_version, kept, issues)
        queues, queue_issues = self._queues[1], self._queues[2]
        group_keys = list(state.group_members) if every else list(state.changed_groups)
        state.changed_groups.clear()
        for key in group_keys:
            members = state.group_members.get(key)
            group, built_issues = self._group(key, members, now_ns) if members else (None, ())
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
                group, _ = self._group(key, state.group_members[key], now_ns)
                if group is not None:
                    self._group_models[key] = group
                    group_keys.append(key)
        if group_keys or self._groups_view is None:
            self._groups_view = {group.id: group for group in self._group_models.values()}
        groups = self._groups_view
        pod_issues = [issue for issues in self._group_issues.values() for issue in issues]
        if len(self._members) > 2 * len(state.pods) + 1024:
            self._members = {uid: entry for uid, entry in self._members.items() if uid in state.pods}
        snapshot = model.Snapshot(nodes=nodes, queues=queues, groups=groups, now_ns=now_ns, config=self.config)
        return Built(
            snapshot=snapshot,
            queue_issues=tuple(queue_issues),
            pod_issues=tuple(pod_issues),
            podgroups=dict(self._podgroup_of),
        )

    def _node(self, name: str, record: NodeRecord) -> model.Node | Problem:
        """The node's model; a node whose pods trip the accounting is left out (and says so), never the cycle."""
        try:
            return models.build_node(record, self.state.pods_on(name), self.state.assumed)
        except Exception as exc:
            log.exception("node_model_failed", node=name)
            self._on_error("snapshot", exc)
            return Problem(field="(node)", message=f"{type(exc).__name__}: {exc}")

    def _group(self, key: GroupKey, members: set[str], now_ns: int) -> tuple[model.Group | None, tuple[PodIssue, ...]]:
        """The group's model; a group that trips the builder is left out (and says so), never the cycle."""
        try:
            return self._build_group(key, members, now_ns)
        except Exception as exc:
            log.exception("group_model_failed", podgroup=f"{key[0]}/{key[1]}")
            self._on_error("snapshot", exc)
            return None, ()

    def _build_group(
        self, key: GroupKey, members: set[str], now_ns: int
    ) -> tuple[model.Group | None, tuple[PodIssue, ...]]:
        state = self.state
        podgroup = state.podgroups.get(key)
        departed = podgroup is None
        if podgroup is None:
            podgroup = state.departed.get(key)
        if podgroup is None or not members:
            return None, ()
        queue, priority, preemptible = models.group_settings(podgroup, state.priority_classes)
        invalid = _invalid_spec(podgroup)
        tree = _tree(podgroup)
        leaves = {sub.name for sub in tree} - {sub.parent for sub in tree}
        pods: list[model.Pod] = []
        issues: list[PodIssue] = []
        for uid in sorted(members):
            record = state.pods.get(uid)
            if record is None or record.phase is Phase.FAILED:
                continue
            if departed and not record.node and uid not in state.assumed:
                continue  # its PodGroup is gone: it waits for a new one, as any pod without a group
            if invalid and record.phase is Phase.PENDING and not record.node and uid not in state.assumed:
                # A spec KAI's webhook would refuse has no meaning to place by; its running pods still count.
                issues.append(_issue(record, "InvalidPodGroup", f"PodGroup {key[0]}/{key[1]}: {invalid}"))
                continue
            if isinstance(record.gpu, gpurequest.AnnotationProblem):
                issues.append(_issue(record, "InvalidGpuRequest", record.gpu.message))
                continue
            pod = self._member(record)
            if isinstance(pod, Problem):
                issues.append(_issue(record, "InvalidPodSpec", f"{pod.field}: {pod.message}"))
                continue
            if tree and pod.subgroup not in leaves:
                pod = _in_default_subgroup(pod, leaves)
                if pod.subgroup not in leaves and pod.phase is model.PodPhase.PENDING and uid not in state.assumed:
                    # KAI leaves such a pod out (InvalidSubGroupTasks); one already running still counts.
                    issues.append(_issue(record, "InvalidPodGroup", _no_subgroup(key, record, leaves)))
                    continue
            if uid in state.evicting and pod.phase is model.PodPhase.RUNNING and not pod.leaving:
                pod = dataclasses.replace(pod, leaving=True)  # its eviction is on its way to the API
            if uid in state.nominating and pod.phase is model.PodPhase.PENDING:
                nominated = state.nominating[uid]  # its nomination is on its way to the API
                pod = dataclasses.replace(pod, nominated_node=model.NodeName(nominated) if nominated else None)
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
        delay_ns = podgroup.preemption_delay_ns
        group = model.Group(
            id=models.group_id(*key),
            queue=model.QueueName(queue),
            min_member=_min_member(podgroup),
            subgroups=tree,
            min_subgroup=podgroup.min_subgroup if tree else None,
            priority=priority,
            preemptible=preemptible,
            created_ns=podgroup.created_ns,
            members=tuple(pods),
            stale_grace_ns=podgroup.staleness_grace_ns,
            # KAI's preemptionDelay: counted from the group's creation or its last eviction, whichever is later.
            evictions_from_ns=max(podgroup.created_ns, podgroup.last_eviction_ns) + delay_ns if delay_ns else None,
        )
        # Stale when running below its minimum or a subgroup below its own (completed members count as satisfied).
        running = any(pod.phase is model.PodPhase.RUNNING for pod in pods)
        if running and gangs.below_minimum(group) is not None:
            group = dataclasses.replace(group, below_min_since_ns=self._below_min_since.setdefault(key, now_ns))
        else:
            self._below_min_since.pop(key, None)
        return group, tuple(issues)


def _min_member(podgroup: PodGroupRecord) -> int:
    """The gang size the engine holds the group to: none beside a subgroup tree (KAI reads the tree alone), none for
    ``minMember: 0`` (KAI's "no gang requirement"), else ``minMember`` (1 when unset)."""
    if podgroup.subgroup_tree or podgroup.min_member_declared == 0:
        return 0
    return podgroup.min_member


def _tree(podgroup: PodGroupRecord) -> tuple[model.SubGroup, ...]:
    """The PodGroup's subgroup tree for the engine; a leaf's unset ``minMember`` is 0, as KAI's scheduler reads it."""
    return tuple(
        model.SubGroup(
            name=spec.name, min_member=spec.min_member or 0, parent=spec.parent, min_subgroup=spec.min_subgroup
        )
        for spec in podgroup.subgroup_tree
    )


def _in_default_subgroup(pod: model.Pod, leaves: AbstractSet[str]) -> model.Pod:
    """A pod that names no subgroup is in KAI's ``default`` one, where the tree has a leaf of that name."""
    if pod.subgroup is None and _DEFAULT_SUBGROUP in leaves:
        return dataclasses.replace(pod, subgroup=_DEFAULT_SUBGROUP)
    return pod


def _no_subgroup(key: GroupKey, pod: PodRecord, leaves: AbstractSet[str]) -> str:
    named = f"subgroup {pod.subgroup!r}" if pod.subgroup else "no subgroup"
    known = ", ".join(sorted(leaves))
    return (
        f"PodGroup {key[0]}/{key[1]}: the pod names {named} ({names.SUBGROUP_LABEL}), and only its leaf "
        f"subgroups take pods: {known}"
    )


def _invalid_spec(podgroup: PodGroupRecord) -> str:
    """The PodGroup's spec problems in one line ("" when none): what KAI's PodGroup webhook would have refused
    (a subgroup tree with a cycle, both minimums on one level, ...). Its annotations' problems do not stop it."""
    return "; ".join(f"{p.field}: {p.message}" for p in podgroup.problems if p.field.startswith("spec"))


def _issue(pod: PodRecord, reason: str, message: str) -> PodIssue:
    return PodIssue(uid=pod.uid, namespace=pod.namespace, name=pod.name, reason=reason, message=message)

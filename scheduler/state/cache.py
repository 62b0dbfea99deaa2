"""The cluster state: the latest of every object the scheduler watches, kept by one writer.

Kubernetes watches (and, later, NATS telemetry) become calls on ``ClusterState``, made by one task, so nothing here
needs a lock. Each change bumps a version; each change that touches a node (the node itself, or a pod bound to it)
bumps that node's generation, which is how the snapshot builder knows which ``model.Node`` values to rebuild and
which to reuse (the engine's indexes key on their identity, so reuse is what keeps a cycle on 5,000 nodes cheap).

The binder *assumes* a placement before the API confirms it: the pod counts as bound on its node at once, so the
next cycle does not place something else in the same room. A failed bind forgets the assumption; the watch event
of a successful one replaces it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.state import objects

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Assumption:
    """A placement the binder is carrying out: the pod is treated as bound here until the API says otherwise."""

    node: str
    devices: tuple[int, ...] = ()
    share_milli: int = 0
    gpu_groups: tuple[str, ...] = ()


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


POD_GROUP_ANNOTATION = "pod-group-name"


def _pod_view(pod: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a pod the snapshot reads. The kubelet's status writes (Pending -> Running, container states) leave it
    unchanged, so they cost no rebuild; the spec's requests cannot change without this changing the annotations or
    being a new pod. The start time is read when something else changes (min-runtimes fall back to creation)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        (pod.get("spec") or {}).get("nodeName"),
        phase if phase in ("Succeeded", "Failed") else None,
        meta.get("annotations"),
        meta.get("labels"),
        meta.get("deletionTimestamp"),
        (pod.get("status") or {}).get("nominatedNodeName"),
    )


def _placement_view(node: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a node the placement reads: labels, taints, cordon, allocatable, readiness."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = [
        c.get("status") for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"
    ]
    return (meta.get("labels"), spec.get("taints"), spec.get("unschedulable"), status.get("allocatable"), ready)


def group_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (namespace, name) of the PodGroup a pod names in its ``pod-group-name`` annotation."""
    meta = pod.get("metadata") or {}
    name = (meta.get("annotations") or {}).get(POD_GROUP_ANNOTATION)
    return (str(meta.get("namespace") or "default"), str(name)) if name else None


def node_of(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


class ClusterState:
    """Every watched object, indexed for the snapshot builder. Not thread-safe: one writer."""

    def __init__(self, *, scheduler_names: Iterable[str]) -> None:
        self.scheduler_names = frozenset(scheduler_names)
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        """Our pods in every phase, and other schedulers' pods while they hold a node."""
        self.pods_by_node: dict[str, set[str]] = {}
        self.sharing_pods: set[str] = set()
        """Uids of the pods that record GPU groups (shares): the reservation keeper reads only these."""
        self.queues: dict[str, Obj] = {}
        self.podgroups: dict[tuple[str, str], Obj] = {}
        self.priority_classes: dict[str, int] = {}
        self.assumed: dict[str, Assumption] = {}
        self.decided: dict[str, str] = {}
        """Pod uid -> the PodGroup name the grouper chose, for pods whose annotation is not written yet."""
        self.group_members: dict[tuple[str, str], set[str]] = {}
        """PodGroup (namespace, name) -> uids of our pods that carry its ``pod-group-name`` annotation."""
        self.group_generation: dict[tuple[str, str], int] = {}
        self.node_generation: dict[str, int] = {}
        self.changed_nodes: set[str] = set()
        """Nodes touched since the snapshot builder last looked (it clears the set)."""
        self.changed_groups: set[tuple[str, str]] = set()
        """PodGroups (namespace, name) touched since the snapshot builder last looked (it clears the set)."""
        self.pod_generation: dict[str, int] = {}
        self.version = 0
        self.topology_version = 0
        """Bumped when nodes, queues or priority classes change: what may make a never-fitting group fit."""
        self.queue_version = 0
        self.priority_version = 0
        """Bumped when a PriorityClass changes: every group's priority may have moved."""
        self._counter = 0

    # --- bookkeeping ------------------------------------------------------------------------------------------------

    def _tick(self) -> int:
        self._counter += 1
        self.version = self._counter
        return self._counter

    def _touch_node(self, node: str | None) -> None:
        if node:
            self.node_generation[node] = self._tick()
            self.changed_nodes.add(node)

    def _touch_group(self, key: tuple[str, str] | None) -> None:
        if key is not None:
            self.group_generation[key] = self._tick()
            self.changed_groups.add(key)

    def group_of(self, pod: Mapping[str, Any]) -> tuple[str, str] | None:
        """The pod's PodGroup: its annotation, else what the grouper decided and has not written yet."""
        key = group_key(pod)
        if key is not None:
            return key
        meta = pod.get("metadata") or {}
        decided = self.decided.get(str(meta.get("uid") or ""))
        return (str(meta.get("namespace") or "default"), decided) if decided else None

    def note_group(self, uid: str, name: str) -> None:
        """The grouper made (or found) the pod's PodGroup: the pod joins it now, before its annotation is written."""
        pod = self.pods.get(uid)
        if pod is None or group_key(pod) is not None:
            return
        self.decided[uid] = name
        self.put_pod(pod, force=True)

    def is_ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") in self.scheduler_names

    # --- nodes ------------------------------------------------------------------------------------------------------

    def put_node(self, node: Obj) -> None:
        name = _name(node)
        old = self.nodes.get(name)
        self.nodes[name] = node
        if old is not None and _placement_view(old) == _placement_view(node):
            return  # a heartbeat or a status detail placement does not read
        self.topology_version = self._tick()
        self._touch_node(name)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.node_generation.pop(name, None)
        self.changed_nodes.add(name)
        self.topology_version = self._tick()

    # --- pods -------------------------------------------------------------------------------------------------------

    def put_pod(self, pod: Obj, *, force: bool = False) -> None:
        uid = _uid(pod)
        if not uid:
            return
        previous = self.pods.get(uid)
        if not force and previous is not None and uid not in self.assumed and _pod_view(previous) == _pod_view(pod):
            self.pods[uid] = pod  # keep the newest object; nothing placement reads has changed
            return
        previous_node = node_of(previous) if previous is not None else None
        node = node_of(pod)
        keep = self.is_ours(pod) or (node is not None and not objects.is_terminated(pod))
        if node is not None and uid in self.assumed:
            # The API confirmed the bind (or bound it elsewhere): the pod's own record is the truth from now on.
            assumed = self.assumed.pop(uid)
            self._touch_node(assumed.node)
        if previous_node and previous_node != node:
            self.pods_by_node.get(previous_node, set()).discard(uid)
            self._touch_node(previous_node)
        if not keep:
            self._drop_pod(uid)
            return
        old_group = self.group_of(previous) if previous is not None else None
        new_group = self.group_of(pod) if self.is_ours(pod) else None
        if old_group != new_group and old_group is not None:
            self.group_members.get(old_group, set()).discard(uid)
            self._touch_group(old_group)
        if new_group is not None:
            self.group_members.setdefault(new_group, set()).add(uid)
            self._touch_group(new_group)
        self.pods[uid] = pod
        self.pod_generation[uid] = self._tick()
        if objects.pod_gpu_groups(pod):
            self.sharing_pods.add(uid)
        else:
            self.sharing_pods.discard(uid)
        if node:
            if objects.is_terminated(pod):
                self.pods_by_node.get(node, set()).discard(uid)
            else:
                self.pods_by_node.setdefault(node, set()).add(uid)
            self._touch_node(node)

    def delete_pod(self, uid: str) -> None:
        self._drop_pod(uid)

    def _drop_pod(self, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        self.pod_generation.pop(uid, None)
        self.sharing_pods.discard(uid)
        assumed = self.assumed.pop(uid, None)
        if assumed is not None:
            self._touch_node(assumed.node)
        if pod is not None:
            node = node_of(pod)
            if node:
                self.pods_by_node.get(node, set()).discard(uid)
                self._touch_node(node)
            key = self.group_of(pod)
            self.decided.pop(uid, None)
            if key is not None and uid in self.group_members.get(key, set()):
                self.group_members[key].discard(uid)
                self._touch_group(key)
        self._tick()

    def assume(self, uid: str, assumption: Assumption) -> None:
        # The pod object is unchanged (its parsed form stays valid); its group and node see the assumption.
        self.assumed[uid] = assumption
        self._touch_node(assumption.node)
        pod = self.pods.get(uid)
        if pod is not None:
            self._touch_group(self.group_of(pod))

    def forget(self, uid: str) -> None:
        """A bind failed: the pod is pending again and its room is free."""
        assumed = self.assumed.pop(uid, None)
        if assumed is not None:
            self._touch_node(assumed.node)
            pod = self.pods.get(uid)
            if pod is not None:
                self._touch_group(self.group_of(pod))

    def pods_on(self, node: str) -> list[Obj]:
        """Pods holding room on ``node``: bound and not terminated, plus assumed ones, in uid order."""
        uids = set(self.pods_by_node.get(node, ()))
        uids.update(uid for uid, assumed in self.assumed.items() if assumed.node == node)
        return [self.pods[uid] for uid in sorted(uids) if uid in self.pods]

    # --- queues, groups, priorities ---------------------------------------------------------------------------------

    def put_queue(self, queue: Obj) -> None:
        old = self.queues.get(_name(queue))
        self.queues[_name(queue)] = queue
        if old is not None and old.get("spec") == queue.get("spec"):
            return  # a status write of ours: nothing placement reads has changed
        self.topology_version = self.queue_version = self._tick()

    def delete_queue(self, name: str) -> None:
        self.queues.pop(name, None)
        self.topology_version = self.queue_version = self._tick()

    def put_podgroup(self, podgroup: Obj) -> None:
        key = (_namespace(podgroup), _name(podgroup))
        self.podgroups[key] = podgroup
        self._touch_group(key)

    def delete_podgroup(self, namespace: str, name: str) -> None:
        self.podgroups.pop((namespace, name), None)
        self._touch_group((namespace, name))

    def put_priority_class(self, obj: Obj) -> None:
        value = obj.get("value")
        if isinstance(value, int) and not isinstance(value, bool):
            if self.priority_classes.get(_name(obj)) == value:
                return
            self.priority_classes[_name(obj)] = value
            self.topology_version = self.priority_version = self._tick()

    def delete_priority_class(self, name: str) -> None:
        if self.priority_classes.pop(name, None) is not None:
            self.topology_version = self.priority_version = self._tick()

    # --- relists ----------------------------------------------------------------------------------------------------

    def replace_all(self, kind: str, items: Iterable[Obj]) -> None:
        """After a (re)list: make the state hold exactly ``items`` of ``kind`` (deletes missed in a gap included)."""
        items = list(items)
        if kind == "nodes":
            keep = {_name(item) for item in items}
            for name in [name for name in self.nodes if name not in keep]:
                self.delete_node(name)
            for item in items:
                self.put_node(item)
        elif kind == "pods":
            keep = {_uid(item) for item in items}
            for uid in [uid for uid in self.pods if uid not in keep]:
                self.delete_pod(uid)
            for item in items:
                self.put_pod(item)
        elif kind == "queues":
            keep = {_name(item) for item in items}
            for name in [name for name in self.queues if name not in keep]:
                self.delete_queue(name)
            for item in items:
                self.put_queue(item)
        elif kind == "podgroups":
            keep_keys = {(_namespace(item), _name(item)) for item in items}
            for key in [key for key in self.podgroups if key not in keep_keys]:
                self.delete_podgroup(*key)
            for item in items:
                self.put_podgroup(item)
        elif kind == "priorityclasses":
            keep = {_name(item) for item in items}
            for name in [name for name in self.priority_classes if name not in keep]:
                self.delete_priority_class(name)
            for item in items:
                self.put_priority_class(item)
        else:
            raise ValueError(f"unknown kind {kind!r}")

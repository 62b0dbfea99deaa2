"""The cluster state: the latest record of every object the scheduler watches, kept by one writer.

The watches deliver typed records (``scheduler.objects.records``, decoded once at the reflector); their handlers
become calls on ``ClusterState``, made by one task, so nothing here needs a lock. Each change bumps a version; each
change that touches a node (the node itself, or a pod bound to it)
bumps that node's generation, which is how the snapshot builder knows which ``model.Node`` values to rebuild and
which to reuse (the engine's indexes key on their identity, so reuse is what keeps a cycle on 5,000 nodes cheap).

The binder *assumes* a placement before the API confirms it: the pod counts as bound on its node at once, so the
next cycle does not place something else in the same room. A failed bind forgets the assumption; the watch event
of a successful one replaces it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from scheduler.objects.records import NodeRecord, PodGroupRecord, PodRecord, PriorityClassRecord, QueueRecord

GroupKey = tuple[str, str]
"""A PodGroup's ``(namespace, name)``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Assumption:
    """A placement the binder is carrying out: the pod is treated as bound here until the API says otherwise."""

    node: str
    devices: tuple[int, ...] = ()
    share_milli: int = 0
    gpu_groups: tuple[str, ...] = ()


def _pod_view(pod: PodRecord) -> tuple[object, ...]:
    """What of a pod the snapshot reads. The kubelet's status writes (Pending -> Running, container states) leave it
    unchanged, so they cost no rebuild; the spec's requests cannot change without this changing the annotations or
    being a new pod. The start time is read when something else changes (min-runtimes fall back to creation)."""
    return (
        pod.node,
        pod.phase if pod.phase.terminated else None,
        pod.annotations,
        pod.labels,
        pod.deleting,
        pod.nominated_node,
    )


class ClusterState:
    """Every watched object as its record, indexed for the snapshot builder. Not thread-safe: one writer."""

    def __init__(self, *, scheduler_names: Iterable[str]) -> None:
        self.scheduler_names = frozenset(scheduler_names)
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        """Our pods in every phase, and other schedulers' pods while they hold a node."""
        self.pods_by_node: dict[str, set[str]] = {}
        self.sharing_pods: set[str] = set()
        """Uids of the pods that record GPU groups (shares): the reservation keeper reads only these."""
        self.queues: dict[str, QueueRecord] = {}
        self.podgroups: dict[GroupKey, PodGroupRecord] = {}
        self.priority_classes: dict[str, int] = {}
        self.assumed: dict[str, Assumption] = {}
        self.evicting: set[str] = set()
        """Uids of the pods whose eviction the dispatcher asked for and whose deletion the watch has not shown."""
        self.departed: dict[GroupKey, PodGroupRecord] = {}
        """PodGroups deleted while pods of theirs are on nodes, until those are gone. The garbage collector deletes a
        pod's own group after the pod, but the PodGroup watch may show it gone before the pod watch shows the pod
        gone: meanwhile the pod still holds its room, counts in its queue and, when evicted, is leaving, so the
        snapshot keeps building it with its group (its pending pods wait for a new group)."""
        self.nominating: dict[str, str | None] = {}
        """Pod uid -> the nomination the dispatcher asked for (None: cleared) that the watch has not shown yet."""
        self.decided: dict[str, str] = {}
        """Pod uid -> the PodGroup name the grouper chose, for pods whose annotation is not written yet."""
        self.group_members: dict[GroupKey, set[str]] = {}
        """PodGroup (namespace, name) -> uids of our pods that carry its ``pod-group-name`` annotation."""
        self.group_generation: dict[GroupKey, int] = {}
        self.node_generation: dict[str, int] = {}
        self.changed_nodes: set[str] = set()
        """Nodes touched since the snapshot builder last looked (it clears the set)."""
        self.changed_groups: set[GroupKey] = set()
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

    def _touch_group(self, key: GroupKey | None) -> None:
        if key is not None:
            self.group_generation[key] = self._tick()
            self.changed_groups.add(key)

    def group_of(self, pod: PodRecord) -> GroupKey | None:
        """The pod's PodGroup: its annotation, else what the grouper decided and has not written yet."""
        if pod.pod_group:
            return (pod.namespace, pod.pod_group)
        decided = self.decided.get(pod.uid)
        return (pod.namespace, decided) if decided else None

    def note_group(self, uid: str, name: str) -> None:
        """The grouper made (or found) the pod's PodGroup: the pod joins it now, before its annotation is written."""
        pod = self.pods.get(uid)
        if pod is None or pod.pod_group:
            return
        self.decided[uid] = name
        self.put_pod(pod, force=True)

    def is_ours(self, pod: PodRecord) -> bool:
        return pod.scheduler_name in self.scheduler_names

    def needs_group(self, pod: PodRecord) -> bool:
        """Does this pod of ours still need a PodGroup (none named or decided, or that PodGroup is missing)?"""
        if pod.terminated or pod.deleting:
            return False
        name = pod.pod_group or self.decided.get(pod.uid)
        return not name or (pod.namespace, name) not in self.podgroups

    def is_unannotated(self, uid: str) -> bool:
        """Does the pod still lack its ``pod-group-name`` annotation (neither bound with it nor patched)?"""
        pod = self.pods.get(uid)
        return pod is not None and not pod.pod_group

    # --- nodes ------------------------------------------------------------------------------------------------------

    def put_node(self, node: NodeRecord) -> None:
        old = self.nodes.get(node.name)
        self.nodes[node.name] = node
        if old == node:
            return  # a heartbeat or a status detail placement does not read
        self.topology_version = self._tick()
        self._touch_node(node.name)

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.node_generation.pop(name, None)
        self.changed_nodes.add(name)
        self.topology_version = self._tick()

    # --- pods -------------------------------------------------------------------------------------------------------

    def put_pod(self, pod: PodRecord, *, force: bool = False) -> None:
        uid = pod.uid
        if uid in self.nominating and self.nominating[uid] == pod.nominated_node:
            del self.nominating[uid]  # the API shows what we asked for
        previous = self.pods.get(uid)
        if not force and previous is not None and uid not in self.assumed and _pod_view(previous) == _pod_view(pod):
            self.pods[uid] = pod  # keep the newest record; nothing placement reads has changed
            return
        previous_node = previous.node if previous is not None else None
        node = pod.node
        keep = self.is_ours(pod) or pod.holds_room
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
        if pod.gpu_groups:
            self.sharing_pods.add(uid)
        else:
            self.sharing_pods.discard(uid)
        if node:
            if pod.terminated:
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
        self.evicting.discard(uid)
        self.nominating.pop(uid, None)
        if assumed is not None:
            self._touch_node(assumed.node)
        if pod is not None:
            if pod.node:
                self.pods_by_node.get(pod.node, set()).discard(uid)
                self._touch_node(pod.node)
            key = self.group_of(pod)
            self.decided.pop(uid, None)
            if key is not None and uid in self.group_members.get(key, set()):
                self.group_members[key].discard(uid)
                if key in self.departed and not self._on_a_node(key):
                    self.departed.pop(key, None)
                self._touch_group(key)
        self._tick()

    def assume(self, uid: str, assumption: Assumption) -> None:
        # The pod's record is unchanged (its parsed form stays valid); its group and node see the assumption.
        self.assumed[uid] = assumption
        self._touch_node(assumption.node)
        pod = self.pods.get(uid)
        if pod is not None:
            self._touch_group(self.group_of(pod))

    def mark_evicting(self, uid: str, evicting: bool) -> None:
        """The dispatcher asked for the pod's eviction (or it failed): until the watch shows its deletion, the pod is
        *leaving* in the snapshot, so no cycle takes it as a victim again while the request is on its way."""
        if evicting == (uid in self.evicting):
            return
        if evicting:
            self.evicting.add(uid)
        else:
            self.evicting.discard(uid)
        pod = self.pods.get(uid)
        if pod is not None:
            self._touch_group(self.group_of(pod))

    def mark_nominating(self, uid: str, node: str | None) -> None:
        """The dispatcher asked for the pod's nomination to be ``node`` (None: cleared): until the watch shows it,
        the snapshot reads it from here, so the next cycle already takes the group as nominated (room held for it,
        allocated first) instead of giving its room to whoever comes first while the status patch is on its way."""
        pod = self.pods.get(uid)
        if pod is not None and pod.nominated_node == node:
            self.nominating.pop(uid, None)
        else:
            self.nominating[uid] = node
        if pod is not None:
            self._touch_group(self.group_of(pod))

    def nomination(self, pod: PodRecord) -> str | None:
        """The pod's nomination as the scheduler knows it: the one it asked for, else the record's."""
        return self.nominating.get(pod.uid, pod.nominated_node)

    def forget(self, uid: str) -> None:
        """A bind failed: the pod is pending again and its room is free."""
        assumed = self.assumed.pop(uid, None)
        if assumed is not None:
            self._touch_node(assumed.node)
            pod = self.pods.get(uid)
            if pod is not None:
                self._touch_group(self.group_of(pod))

    def pods_on(self, node: str) -> list[PodRecord]:
        """Pods holding room on ``node``: bound and not terminated, plus assumed ones, in uid order."""
        uids = set(self.pods_by_node.get(node, ()))
        uids.update(uid for uid, assumed in self.assumed.items() if assumed.node == node)
        return [self.pods[uid] for uid in sorted(uids) if uid in self.pods]

    # --- queues, groups, priorities ---------------------------------------------------------------------------------

    def put_queue(self, queue: QueueRecord) -> None:
        old = self.queues.get(queue.name)
        self.queues[queue.name] = queue
        if old is not None and old.queue == queue.queue:
            return  # a status write of ours, or an annotation: nothing placement reads has changed
        self.topology_version = self.queue_version = self._tick()

    def delete_queue(self, name: str) -> None:
        self.queues.pop(name, None)
        self.topology_version = self.queue_version = self._tick()

    def put_podgroup(self, podgroup: PodGroupRecord) -> None:
        self.podgroups[podgroup.key] = podgroup
        self.departed.pop(podgroup.key, None)
        self._touch_group(podgroup.key)

    def delete_podgroup(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        record = self.podgroups.pop(key, None)
        if record is not None and self._on_a_node(key):
            self.departed[key] = record
        self._touch_group(key)

    def _on_a_node(self, key: GroupKey) -> bool:
        """Is a pod of the group bound or being bound?"""
        return any(
            uid in self.assumed or (uid in self.pods and self.pods[uid].node) for uid in self.group_members.get(key, ())
        )

    def put_priority_class(self, record: PriorityClassRecord) -> None:
        if record.value is None or self.priority_classes.get(record.name) == record.value:
            return
        self.priority_classes[record.name] = record.value
        self.topology_version = self.priority_version = self._tick()

    def delete_priority_class(self, name: str) -> None:
        if self.priority_classes.pop(name, None) is not None:
            self.topology_version = self.priority_version = self._tick()

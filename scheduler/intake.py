"""What the watches bring in: one table that says, for each kind the scheduler watches, how its objects are decoded
and what their arrival and departure do.

The leader watches five kinds. Each row of :data:`KINDS` names the resource, the decoder that turns its JSON into a
record (once, at the reflector) and the two handlers that apply a record to the cluster state. Pods do more than
that: a reservation pod also moves its reservation's state machine, and a pod of ours without a PodGroup is handed
to the grouper; a PodGroup that vanished sends its pods back to the grouper. Every handled event marks the state
dirty, so a cycle follows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from common import logs
from scheduler.kube import grouper, kubeapi, reservations, watches
from scheduler.objects import nodes, podgroups, pods, queues
from scheduler.objects.records import NodeRecord, PodGroupRecord, PodRecord, PriorityClassRecord, QueueRecord
from scheduler.state.cache import ClusterState

log = logs.get("scheduler")

R = TypeVar("R", bound=watches.Record)


def _name_of(record: object) -> str:
    namespace, name = getattr(record, "namespace", ""), getattr(record, "name", "")
    return f"{namespace}/{name}" if namespace else str(name)


@dataclasses.dataclass(frozen=True, slots=True)
class Kind(Generic[R]):
    """One watched kind: where it lives, how it is decoded, and what a record's arrival and departure do."""

    name: str
    resource: kubeapi.Resource
    decode: Callable[[Mapping[str, Any]], R | None]
    put: Callable[[Intake, R], None]
    delete: Callable[[Intake, R], None]


class Intake:
    """Applies the watches' records to the cluster state and tells the parts that care."""

    def __init__(
        self,
        state: ClusterState,
        *,
        grouper: grouper.Grouper,
        reservations: reservations.ReservationManager,
        on_change: Callable[[], None],
        forget_pod: Callable[[str], None],
        on_error: Callable[[str, BaseException], None] = lambda where, exc: None,
    ) -> None:
        self.state = state
        self._on_error = on_error
        self._grouper = grouper
        self._reservations = reservations
        self._on_change = on_change
        self._forget_pod = forget_pod
        self.synced: set[str] = set()
        """The kinds whose first list has been applied: the first cycle waits for all of them."""

    @property
    def all_synced(self) -> bool:
        return len(self.synced) == len(KINDS)

    def handler(self, kind: Kind[R]) -> watches.Handler[R]:
        """The reflector's callback for ``kind``."""

        async def handle(event: watches.ReflectorEvent[R]) -> None:
            try:
                if isinstance(event, watches.Synced):
                    self.synced.add(kind.name)
                elif isinstance(event, watches.Deleted):
                    kind.delete(self, event.record)
                else:
                    kind.put(self, event.record)
            except Exception as exc:
                # One object that trips a handler is logged with its name and skipped; the watch goes on.
                record = getattr(event, "record", None)
                log.exception("watch_event_failed", kind=kind.name, object=_name_of(record))
                self._on_error("watch", exc)
            self._on_change()

        return handle

    # --- pods ---

    def put_pod(self, pod: PodRecord) -> None:
        if pod.reservation is not None:
            self._reservations.observe(pod)
        self.state.put_pod(pod)
        if self.state.is_ours(pod) and self.state.needs_group(pod):
            self._grouper.submit(pod)

    def delete_pod(self, pod: PodRecord) -> None:
        if pod.reservation is not None:
            self._reservations.removed(pod)
        self.state.delete_pod(pod.uid)
        self._forget_pod(pod.uid)

    # --- the others ---

    def put_node(self, node: NodeRecord) -> None:
        self.state.put_node(node)

    def delete_node(self, node: NodeRecord) -> None:
        self.state.delete_node(node.name)

    def put_queue(self, queue: QueueRecord) -> None:
        self.state.put_queue(queue)

    def delete_queue(self, queue: QueueRecord) -> None:
        self.state.delete_queue(queue.name)

    def put_podgroup(self, podgroup: PodGroupRecord) -> None:
        self.state.put_podgroup(podgroup)

    def delete_podgroup(self, podgroup: PodGroupRecord) -> None:
        """A PodGroup vanished: its pods need one again (a user deleted it, or it was garbage collected)."""
        self.state.delete_podgroup(podgroup.namespace, podgroup.name)
        for uid in sorted(self.state.group_members.get(podgroup.key, ())):
            pod = self.state.pods.get(uid)
            if pod is not None and self.state.needs_group(pod):
                self._grouper.submit(pod)

    def put_priority_class(self, record: PriorityClassRecord) -> None:
        self.state.put_priority_class(record)

    def delete_priority_class(self, record: PriorityClassRecord) -> None:
        self.state.delete_priority_class(record.name)


KINDS: tuple[Kind[Any], ...] = (
    Kind("pods", kubeapi.PODS, pods.decode, Intake.put_pod, Intake.delete_pod),
    Kind("nodes", kubeapi.NODES, nodes.decode, Intake.put_node, Intake.delete_node),
    Kind("queues", kubeapi.QUEUES, queues.decode, Intake.put_queue, Intake.delete_queue),
    Kind("podgroups", kubeapi.POD_GROUPS, podgroups.decode, Intake.put_podgroup, Intake.delete_podgroup),
    Kind(
        "priorityclasses",
        kubeapi.PRIORITY_CLASSES,
        podgroups.decode_priority_class,
        Intake.put_priority_class,
        Intake.delete_priority_class,
    ),
)
"""Every kind the leader watches."""

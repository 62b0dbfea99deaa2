"""Telling people why: PodGroup conditions, ``Unschedulable`` events on pods, and Queue status.

After each cycle every pending group has a ``Status`` (reason code and message) and every queue its fair share.
This writer turns them into what KAI users look at: ``status.schedulingConditions`` on the PodGroup (KAI's reason
codes, our message with live numbers), an ``Unschedulable`` event on the group's pending pods, and the Queue's
``status`` (allocated, allocatedNonPreemptible, requested, childQueues, and the ``Orphan``/``OverQuota``
conditions). Writes happen only when something changed, so an idle cluster costs the API nothing; a pod that cannot
be read (invalid GPU annotations) gets its reason here too.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from common import logs, quantities
from common.resources import Resources
from scheduler.kube import client
from scheduler.kube.errors import KubeError, KubeNotFound
from scheduler.placement import model, plan, status
from scheduler.state.snapshot import PodIssue, QueueIssue

log = logs.get("scheduler.status")

EventSink = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]
"""(involved object, type, reason, message)"""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpu_text(milli: int) -> str:
    whole, rest = divmod(milli, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def resource_list(amounts: Sequence[int]) -> dict[str, str]:
    """(milli-GPU, millicores, bytes) as a Kubernetes-style resource map."""
    gpu, cpu, memory = amounts
    return {
        "gpu": _gpu_text(gpu),
        "cpu": f"{cpu}m" if cpu % 1000 else str(cpu // 1000),
        "memory": quantities.format_bytes_quantity(memory),
    }


def _triple(amounts: Resources) -> tuple[int, int, int]:
    return (amounts.milli_gpu, amounts.milli_cpu, amounts.memory_bytes)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueStatus:
    allocated: tuple[int, int, int]
    allocated_nonpreemptible: tuple[int, int, int]
    requested: tuple[int, int, int]
    children: tuple[str, ...]
    conditions: tuple[tuple[str, str, str], ...]
    """(type, reason, message) of each condition that holds."""


def queue_statuses(
    snapshot: model.Snapshot,
    shares: Mapping[model.QueueName, Any],
    issues: Sequence[QueueIssue],
    all_queues: Sequence[str],
) -> dict[str, QueueStatus]:
    """Subtree sums per queue (a running pod counts for its queue and every ancestor), children, conditions."""
    allocated: dict[str, list[int]] = {name: [0, 0, 0] for name in all_queues}
    nonpreemptible: dict[str, list[int]] = {name: [0, 0, 0] for name in all_queues}
    requested: dict[str, list[int]] = {name: [0, 0, 0] for name in all_queues}
    parents = {name: queue.parent for name, queue in snapshot.queues.items()}

    def chain(name: str) -> list[str]:
        out, seen = [], set()
        current: str | None = name
        while current is not None and current not in seen and current in allocated:
            out.append(current)
            seen.add(current)
            current = parents.get(model.QueueName(current))
        return out

    for group in snapshot.groups.values():
        for pod in group.members:
            amounts = (
                _triple(plan.pod_amounts(pod))
                if pod.is_active
                else (
                    pod.requests.milli_gpu + (pod.share.milli_gpu * pod.share.devices if pod.share else 0),
                    pod.requests.milli_cpu,
                    pod.requests.memory_bytes,
                )
            )
            if pod.phase is model.PodPhase.SUCCEEDED:
                continue
            for name in chain(group.queue):
                for i in range(3):
                    requested[name][i] += amounts[i]
                    if pod.is_active:
                        allocated[name][i] += amounts[i]
                        if not group.preemptible:
                            nonpreemptible[name][i] += amounts[i]
    children: dict[str, list[str]] = {name: [] for name in all_queues}
    for name, parent in parents.items():
        if parent is not None and parent in children:
            children[parent].append(name)
    conditions: dict[str, list[tuple[str, str, str]]] = {name: [] for name in all_queues}
    for issue in issues:
        if issue.queue in conditions:
            kind = "Orphan" if issue.condition in ("Orphan", "Cycle") else "Invalid"
            conditions[issue.queue].append((kind, issue.condition, issue.message))
    for name, queue in snapshot.queues.items():
        quotas = (queue.gpu.quota, queue.cpu.quota, queue.memory.quota)
        over = [
            label
            for label, quota, used in zip(("gpu", "cpu", "memory"), quotas, allocated.get(name, [0, 0, 0]), strict=True)
            if quota != model.UNLIMITED and used > quota
        ]
        if over:
            conditions[name].append(("OverQuota", "OverQuota", f"allocated above quota for {', '.join(over)}"))
    return {
        name: QueueStatus(
            allocated=(allocated[name][0], allocated[name][1], allocated[name][2]),
            allocated_nonpreemptible=(nonpreemptible[name][0], nonpreemptible[name][1], nonpreemptible[name][2]),
            requested=(requested[name][0], requested[name][1], requested[name][2]),
            children=tuple(sorted(children[name])),
            conditions=tuple(conditions[name]),
        )
        for name in all_queues
    }


class StatusWriter:
    """Writes statuses and events when they change. One instance per leader term."""

    def __init__(self, api: client.KubeApi, *, on_event: EventSink) -> None:
        self._api = api
        self._on_event = on_event
        self._group_written: dict[tuple[str, str], tuple[str, str] | None] = {}
        self._queue_written: dict[str, QueueStatus] = {}
        self._pod_issue_written: dict[str, str] = {}

    async def groups(
        self,
        statuses: Mapping[model.GroupId, status.Status],
        podgroups: Mapping[model.GroupId, tuple[str, str]],
        pending_pods: Mapping[model.GroupId, Sequence[Mapping[str, Any]]],
        queue_issues: Mapping[str, QueueIssue],
        group_queues: Mapping[model.GroupId, str],
    ) -> None:
        for group_id, key in podgroups.items():
            current = statuses.get(group_id)
            reason_message: tuple[str, str] | None = None
            if current is not None:
                message = current.message
                issue = queue_issues.get(group_queues.get(group_id, ""))
                if current.reason is status.Reason.QUEUE_DOES_NOT_EXIST and issue is not None:
                    message = f"queue {issue.queue!r} cannot take work: {issue.message}"
                reason_message = (current.reason.value, message)
            if key in self._group_written and self._group_written[key] == reason_message:
                continue
            if reason_message is None and key not in self._group_written:
                # Placed at its first look: there is no condition to write or clear.
                self._group_written[key] = None
                continue
            conditions = []
            if reason_message is not None:
                conditions.append(
                    {
                        "type": "UnschedulableOnNodePool",
                        "status": "True",
                        "reason": reason_message[0],
                        "message": reason_message[1],
                        "lastTransitionTime": _now(),
                        "transitionID": hashlib.sha256("\n".join(reason_message).encode()).hexdigest()[:12],
                    }
                )
            try:
                await self._api.patch(
                    client.POD_GROUPS,
                    {"status": {"schedulingConditions": conditions}},
                    name=key[1],
                    namespace=key[0],
                    subresource="status",
                )
            except KubeNotFound:
                continue
            except KubeError as exc:
                log.warning("podgroup_status_failed", podgroup=f"{key[0]}/{key[1]}", error=str(exc))
                continue
            self._group_written[key] = reason_message
            if reason_message is not None:
                for pod in pending_pods.get(group_id, ()):
                    await self._on_event(pod, "Warning", "Unschedulable", f"{reason_message[0]}: {reason_message[1]}")

    async def pod_issues(self, issues: Sequence[PodIssue], pods: Mapping[str, Mapping[str, Any]]) -> None:
        current = {issue.uid: issue for issue in issues}
        for uid, issue in current.items():
            if self._pod_issue_written.get(uid) == issue.message:
                continue
            pod = pods.get(uid)
            if pod is None:
                continue
            await self._on_event(pod, "Warning", "Unschedulable", f"{issue.reason}: {issue.message}")
            self._pod_issue_written[uid] = issue.message
        for uid in [uid for uid in self._pod_issue_written if uid not in current]:
            del self._pod_issue_written[uid]

    async def queues(self, statuses: Mapping[str, QueueStatus]) -> None:
        for name, queue_status in sorted(statuses.items()):
            if self._queue_written.get(name) == queue_status:
                continue
            body = {
                "status": {
                    "allocated": resource_list(queue_status.allocated),
                    "allocatedNonPreemptible": resource_list(queue_status.allocated_nonpreemptible),
                    "requested": resource_list(queue_status.requested),
                    "childQueues": list(queue_status.children),
                    "conditions": [
                        {
                            "type": kind,
                            "status": "True",
                            "reason": reason,
                            "message": message,
                            "lastTransitionTime": _now(),
                        }
                        for kind, reason, message in queue_status.conditions
                    ],
                }
            }
            try:
                await self._api.patch(client.QUEUES, body, name=name, subresource="status")
            except KubeNotFound:
                continue
            except KubeError as exc:
                log.warning("queue_status_failed", queue=name, error=str(exc))
                continue
            self._queue_written[name] = queue_status

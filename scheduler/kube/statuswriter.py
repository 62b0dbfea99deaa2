"""Telling people why: PodGroup conditions, ``Unschedulable`` events on pods, and Queue status.

After each cycle every pending group has a ``Status`` (reason code and message) and every queue its fair share.
This writer turns them into what KAI users look at: ``status.schedulingConditions`` on the PodGroup (KAI's reason
codes, our message with live numbers), an ``Unschedulable`` event on the group's pending pods, and the Queue's
``status`` (allocated, allocatedNonPreemptible, requested, childQueues, and the ``Orphan``/``OverQuota``
conditions). Beside KAI's fields, each gets ``status.quotient`` (``statusfields``): the structured reason, best
nodes and what would unblock a group; a queue's deserved and fair share and its pending groups. Writes happen only
when something changed, so an idle cluster costs the API nothing; a pod that cannot be read (invalid GPU
annotations) gets its reason here too.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from common import logs, names, quantities
from common.resources import ZERO, Resources
from scheduler.kube import events, kubeapi, statusfields
from scheduler.kube.errors import KubeError, KubeNotFound
from scheduler.objects.records import PodRecord
from scheduler.placement import fairshare, model, plan, status
from scheduler.state.models import QueueIssue
from scheduler.state.snapshot import PodIssue

log = logs.get("scheduler.status")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpu_text(milli: int) -> str:
    whole, rest = divmod(milli, 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def resource_list(amounts: Resources) -> dict[str, str]:
    """GPU, CPU and memory as a Kubernetes-style resource map (``{"gpu": "1.5", "cpu": "500m", ...}``)."""
    cpu = amounts.milli_cpu
    return {
        "gpu": _gpu_text(amounts.milli_gpu),
        "cpu": f"{cpu}m" if cpu % 1000 else str(cpu // 1000),
        "memory": quantities.format_bytes_quantity(amounts.memory_bytes),
    }


def quotas(queue: model.Queue) -> Resources:
    """A queue's quota per resource (``-1``: unlimited)."""
    return Resources(milli_gpu=queue.gpu.quota, milli_cpu=queue.cpu.quota, memory_bytes=queue.memory.quota)


def limits(queue: model.Queue) -> Resources:
    """A queue's limit per resource (``-1``: none)."""
    return Resources(milli_gpu=queue.gpu.limit, milli_cpu=queue.cpu.limit, memory_bytes=queue.memory.limit)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueStatus:
    allocated: Resources
    allocated_nonpreemptible: Resources
    requested: Resources
    children: tuple[str, ...]
    conditions: tuple[tuple[str, str, str], ...]
    """(type, reason, message) of each condition that holds."""
    share: fairshare.Share | None = None
    """Deserved and fair share (None: the plan gave the queue none, an orphan)."""
    pending_groups: int = 0
    """Groups of the subtree left pending by the cycle."""
    oldest_pending_ns: int | None = None
    """When the subtree's oldest pending group was created."""


def _requested(pod: model.Pod) -> Resources:
    """What a pod asks for as queues count it: its held amounts when it runs, its request when it waits."""
    if pod.is_active:
        return plan.pod_amounts(pod)
    shared = pod.share.milli_gpu * pod.share.devices if pod.share else 0
    return Resources(
        milli_gpu=pod.requests.milli_gpu + shared,
        milli_cpu=pod.requests.milli_cpu,
        memory_bytes=pod.requests.memory_bytes,
    )


def _over_quota(allocated: Resources, queue: model.Queue) -> list[str]:
    quota = quotas(queue)
    pairs = (
        ("gpu", quota.milli_gpu, allocated.milli_gpu),
        ("cpu", quota.milli_cpu, allocated.milli_cpu),
        ("memory", quota.memory_bytes, allocated.memory_bytes),
    )
    return [label for label, limit, used in pairs if limit != model.UNLIMITED and used > limit]


def queue_statuses(
    snapshot: model.Snapshot,
    issues: Sequence[QueueIssue],
    all_queues: Sequence[str],
    outcome: plan.Plan | None = None,
) -> dict[str, QueueStatus]:
    """Subtree sums per queue (a running pod counts for its queue and every ancestor), children, conditions; with
    the cycle's ``outcome``, each queue's share and its subtree's pending groups."""
    allocated: dict[str, Resources] = dict.fromkeys(all_queues, ZERO)
    nonpreemptible: dict[str, Resources] = dict.fromkeys(all_queues, ZERO)
    requested: dict[str, Resources] = dict.fromkeys(all_queues, ZERO)
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
            if pod.phase is model.PodPhase.SUCCEEDED:
                continue
            amounts = _requested(pod)
            for name in chain(group.queue):
                requested[name] += amounts
                if pod.is_active:
                    allocated[name] += amounts
                    if not group.preemptible:
                        nonpreemptible[name] += amounts
    children: dict[str, list[str]] = {name: [] for name in all_queues}
    for name, parent in parents.items():
        if parent is not None and parent in children:
            children[parent].append(name)
    conditions: dict[str, list[tuple[str, str, str]]] = {name: [] for name in all_queues}
    for issue in issues:
        if issue.queue in conditions:
            kind = names.ORPHAN_CONDITION if issue.condition in ("Orphan", "Cycle") else "Invalid"
            conditions[issue.queue].append((kind, issue.condition, issue.message))
    for name, queue in snapshot.queues.items():
        over = _over_quota(allocated.get(name, ZERO), queue)
        if over:
            message = f"allocated above quota for {', '.join(over)}"
            conditions[name].append((names.OVER_QUOTA_CONDITION, names.OVER_QUOTA_CONDITION, message))
    pending: dict[str, int] = dict.fromkeys(all_queues, 0)
    oldest: dict[str, int] = {}
    for group_id in outcome.statuses if outcome is not None else ():
        waiting = snapshot.groups.get(group_id)
        if waiting is None:
            continue
        for name in chain(waiting.queue):
            pending[name] += 1
            oldest[name] = min(oldest.get(name, waiting.created_ns), waiting.created_ns)
    shares = outcome.queues if outcome is not None else {}
    return {
        name: QueueStatus(
            allocated=allocated[name],
            allocated_nonpreemptible=nonpreemptible[name],
            requested=requested[name],
            children=tuple(sorted(children[name])),
            conditions=tuple(conditions[name]),
            share=shares.get(model.QueueName(name)),
            pending_groups=pending[name],
            oldest_pending_ns=oldest.get(name),
        )
        for name in all_queues
    }


class StatusWriter:
    """Writes statuses and events when they change. One instance per leader term."""

    def __init__(self, api: kubeapi.KubeApi, *, recorder: events.EventSink) -> None:
        self._api = api
        self._recorder = recorder
        self._group_written: dict[tuple[str, str], tuple[tuple[str, str], Mapping[str, Any]] | None] = {}
        self._condition_since: dict[tuple[str, str], str] = {}
        self._queue_written: dict[str, QueueStatus] = {}
        self._pod_issue_written: dict[str, str] = {}

    async def groups(
        self,
        statuses: Mapping[model.GroupId, status.Status],
        podgroups: Mapping[model.GroupId, tuple[str, str]],
        pending_pods: Mapping[model.GroupId, Sequence[PodRecord]],
        queue_issues: Mapping[str, QueueIssue],
        group_queues: Mapping[model.GroupId, str],
        fields: Mapping[model.GroupId, Mapping[str, Any]] | None = None,
    ) -> None:
        """``fields``: each pending group's ``status.quotient`` (``statusfields.group_fields``)."""
        for group_id, key in podgroups.items():
            current = statuses.get(group_id)
            reason_message: tuple[str, str] | None = None
            written: tuple[tuple[str, str], Mapping[str, Any]] | None = None
            if current is not None:
                message = current.message
                issue = queue_issues.get(group_queues.get(group_id, ""))
                if current.reason is status.Reason.QUEUE_DOES_NOT_EXIST and issue is not None:
                    message = f"queue {issue.queue!r} cannot take work: {issue.message}"
                reason_message = (current.reason.value, message)
                written = (reason_message, (fields or {}).get(group_id) or {})
            if key in self._group_written and self._group_written[key] == written:
                continue
            if written is None and key not in self._group_written:
                # Placed at its first look: there is no condition to write or clear.
                self._group_written[key] = None
                continue
            previous = self._group_written.get(key)
            # Only our fields changed (a best node's numbers): the condition, its time and the pods' events stay.
            same_reason = previous is not None and written is not None and previous[0] == written[0]
            conditions = []
            if reason_message is not None:
                since = self._condition_since.get(key) if same_reason else None
                since = since or _now()
                self._condition_since[key] = since
                conditions.append(
                    {
                        "type": names.UNSCHEDULABLE_CONDITION,
                        "status": "True",
                        "reason": reason_message[0],
                        "message": reason_message[1],
                        "lastTransitionTime": since,
                        "transitionID": hashlib.sha256("\n".join(reason_message).encode()).hexdigest()[:12],
                    }
                )
            # A merge patch: None removes our object once the group is placed.
            ours = dict(written[1]) if written is not None and written[1] else None
            try:
                await self._api.patch(
                    kubeapi.POD_GROUPS,
                    {"status": {"schedulingConditions": conditions, "quotient": ours}},
                    name=key[1],
                    namespace=key[0],
                    subresource="status",
                )
            except KubeNotFound:
                continue
            except KubeError as exc:
                log.warning("podgroup_status_failed", podgroup=f"{key[0]}/{key[1]}", error=str(exc))
                continue
            self._group_written[key] = written
            if reason_message is None:
                self._condition_since.pop(key, None)
            elif not same_reason:
                for pod in pending_pods.get(group_id, ()):
                    self._unschedulable(pod, f"{reason_message[0]}: {reason_message[1]}")

    def _unschedulable(self, pod: PodRecord, message: str) -> None:
        ref = events.ObjectRef.of_record(pod)
        self._recorder.record(ref, type=events.EventType.WARNING, reason="Unschedulable", message=message)

    async def pod_issues(self, issues: Sequence[PodIssue], pods: Mapping[str, PodRecord]) -> None:
        current = {issue.uid: issue for issue in issues}
        for uid, issue in current.items():
            if self._pod_issue_written.get(uid) == issue.message:
                continue
            pod = pods.get(uid)
            if pod is None:
                continue
            self._unschedulable(pod, f"{issue.reason}: {issue.message}")
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
                    "quotient": statusfields.queue_fields(
                        queue_status.share,
                        pending_groups=queue_status.pending_groups,
                        oldest_pending_ns=queue_status.oldest_pending_ns,
                    ),
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
                await self._api.patch(kubeapi.QUEUES, body, name=name, subresource="status")
            except KubeNotFound:
                continue
            except KubeError as exc:
                log.warning("queue_status_failed", queue=name, error=str(exc))
                continue
            self._queue_written[name] = queue_status

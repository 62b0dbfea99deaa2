"""Telling people why, after each cycle: PodGroup conditions, ``Unschedulable`` events, Queue status, queue metrics.

A cycle never waits for the API, so its statuses are handed over here and written by a loop of their own; when the
API is slow, a newer cycle's statuses simply replace the ones not yet written. PodGroup conditions and pod events
follow every cycle (the writer skips what did not change); Queue status sums every running pod of the subtree, so it
is written at most every ``QUEUE_STATUS_PERIOD_S``, with the per-queue fair-share metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from common import logs
from scheduler.kube import statusfields, statuswriter
from scheduler.kube.errors import KubeError
from scheduler.metrics import SchedulerMetrics
from scheduler.objects.records import PodRecord
from scheduler.placement import model, plan, status
from scheduler.state import snapshot
from scheduler.state.cache import ClusterState

log = logs.get("scheduler")

QUEUE_STATUS_PERIOD_S = 2.0
"""Queue status sums every running pod of the subtree: written at most this often, not after every cycle."""


class StatusReporter:
    """Writes the newest cycle's statuses; ``run()`` until cancelled."""

    def __init__(
        self,
        state: ClusterState,
        writer: statuswriter.StatusWriter,
        metrics: SchedulerMetrics,
        *,
        on_error: Callable[[str, BaseException], None] = lambda where, exc: None,
    ) -> None:
        self._on_error = on_error
        self._state = state
        self._writer = writer
        self._metrics = metrics
        self._due = asyncio.Event()
        self._latest: tuple[snapshot.Built, plan.Plan] | None = None
        self._queues_written_at = 0.0
        self._queues_due: asyncio.TimerHandle | None = None

    def offer(self, built: snapshot.Built, result: plan.Plan) -> None:
        """A cycle's outcome, to be written (it replaces one not yet written)."""
        self._latest = (built, result)
        self._due.set()

    def _queues_come_due(self) -> None:
        self._queues_due = None
        self._due.set()

    async def run(self) -> None:
        """Writes the newest cycle's status; a cycle never waits for the API, and a slow API skips stale statuses."""
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                try:
                    await self.write()
                except KubeError as exc:
                    log.warning("status_write_failed", error=str(exc))
                except Exception as exc:
                    log.exception("status_write_broke")
                    self._on_error("status", exc)
        finally:
            if self._queues_due is not None:
                self._queues_due.cancel()
                self._queues_due = None

    async def write(self) -> None:
        if self._latest is None:
            return
        built, outcome = self._latest
        state = self._state
        statuses = {**outcome.statuses, **orphaned(built.snapshot, outcome.statuses)}
        pending_pods: dict[model.GroupId, list[PodRecord]] = {}
        group_queues: dict[model.GroupId, str] = {}
        for group_id in statuses:
            group = built.snapshot.groups.get(group_id)
            if group is None:
                continue
            group_queues[group_id] = str(group.queue)
            pending_pods[group_id] = [
                state.pods[str(pod.uid)]
                for pod in group.members
                if pod.phase is model.PodPhase.PENDING and str(pod.uid) in state.pods
            ]
        issues = {issue.queue: issue for issue in built.queue_issues}
        made_for = statusfields.evictions_for(outcome.evictions)
        fields = {
            group_id: statusfields.group_fields(
                current,
                group=built.snapshot.groups.get(group_id),
                evictions=made_for.get(group_id, ()),
                pods=state.pods,
                now_ns=built.snapshot.now_ns,
            )
            for group_id, current in statuses.items()
        }
        await self._writer.groups(statuses, built.podgroups, pending_pods, issues, group_queues, fields)
        await self._writer.pod_issues(built.pod_issues, state.pods)
        now = time.monotonic()
        if now - self._queues_written_at < QUEUE_STATUS_PERIOD_S:
            # Come back for the queues once the period is over, without holding up the groups' statuses until then
            # (a verdict waited up to the whole period behind a sleep here).
            if self._queues_due is None:
                self._queues_due = asyncio.get_running_loop().call_later(
                    QUEUE_STATUS_PERIOD_S - (now - self._queues_written_at), self._queues_come_due
                )
            return
        self._queues_written_at = now
        queue_status = statuswriter.queue_statuses(built.snapshot, built.queue_issues, sorted(state.queues), outcome)
        await self._writer.queues(queue_status)
        for name, share in outcome.queues.items():
            current = queue_status.get(str(name))
            queue = built.snapshot.queues.get(name)
            if current is None or queue is None:
                continue
            self._metrics.set_queue(
                str(name),
                fair=share.fair,
                deserved=share.deserved,
                quota=statuswriter.quotas(queue),
                limit=statuswriter.limits(queue),
                allocated=current.allocated,
                requested=current.requested,
            )
        self._metrics.forget_queues({str(name) for name in outcome.queues})


def orphaned(
    snapshot: model.Snapshot, statuses: Mapping[model.GroupId, status.Status]
) -> dict[model.GroupId, status.Status]:
    """``QueueDoesNotExist`` for the running groups of a queue that does not exist (deleted under them): the plan
    carries statuses of pending groups only, and their owners must learn that their pods run in no queue (with no
    deserved share, so other queues may reclaim from them)."""
    return {
        group_id: status.unschedulable(
            status.Reason.QUEUE_DOES_NOT_EXIST,
            f"queue {group.queue} does not exist: the group's running pods keep running with no deserved share "
            "(other queues may reclaim from them), and its new pods wait until the queue is created",
        )
        for group_id, group in snapshot.groups.items()
        if group.queue not in snapshot.queues and group_id not in statuses
    }

"""The status reporter writes each cycle's PodGroup statuses at once; queue statuses at most every period.

A queue's status sums every running pod of its subtree, so it is written at most every ``QUEUE_STATUS_PERIOD_S``;
waiting for that period must never hold up the PodGroups' statuses (an unschedulable verdict waited up to the whole
period behind it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry

from scheduler import reporting
from scheduler.kube import statuswriter
from scheduler.metrics import SchedulerMetrics
from scheduler.placement import engine
from scheduler.state.snapshot import SnapshotBuilder
from tests import polling
from tests.unit.state.test_snapshot import NOW, pod, podgroup, seeded_state


class _Recording(statuswriter.StatusWriter):
    """Records when each kind of status was written; talks to no API."""

    def __init__(self) -> None:
        super().__init__(cast(Any, None), recorder=cast(Any, None))
        self.groups_at: list[float] = []
        self.queues_at: list[float] = []

    async def groups(self, *args: Any, **kwargs: Any) -> None:
        self.groups_at.append(time.monotonic())

    async def pod_issues(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def queues(self, statuses: Mapping[str, statuswriter.QueueStatus]) -> None:
        self.queues_at.append(time.monotonic())


async def test_a_groups_status_is_written_at_once_while_the_queues_wait_for_their_period() -> None:
    state = seeded_state()
    state.put_podgroup(podgroup("pg-a"))
    state.put_pod(pod("a", group="pg-a", gpus=1))
    built = SnapshotBuilder(state).build(NOW)
    result = engine.Engine().run(built.snapshot)
    writer = _Recording()
    reporter = reporting.StatusReporter(state, writer, SchedulerMetrics(CollectorRegistry()))
    runner = asyncio.create_task(reporter.run())
    try:
        reporter.offer(built, result)
        await polling.until(lambda: len(writer.queues_at) == 1, timeout_s=5, what="the first write, queues included")
        offered = time.monotonic()
        reporter.offer(built, result)  # the next cycle, within the queues' period
        await polling.until(lambda: len(writer.groups_at) == 2, timeout_s=5, what="the second cycle's groups")
        assert writer.groups_at[1] - offered < reporting.QUEUE_STATUS_PERIOD_S / 2
        assert len(writer.queues_at) == 1
        reporter.offer(built, result)  # and the one after: its groups at once too
        await polling.until(lambda: len(writer.groups_at) == 3, timeout_s=5, what="the third cycle's groups")
        assert writer.groups_at[2] - offered < reporting.QUEUE_STATUS_PERIOD_S / 2
        # The queues come once their period is over, without another cycle.
        await polling.until(
            lambda: len(writer.queues_at) == 2, timeout_s=reporting.QUEUE_STATUS_PERIOD_S * 3, what="the queues"
        )
        assert writer.queues_at[1] - writer.queues_at[0] >= reporting.QUEUE_STATUS_PERIOD_S * 0.9
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

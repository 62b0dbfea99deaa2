"""Background tasks with owners: a failure is logged at once, and an owner can drain or cancel what it started.

Three shapes of concurrency recur in the processes of Quotient:

- long-lived loops that run for the life of their component, inside an ``asyncio.TaskGroup``. A TaskGroup reports a
  member's failure only when the group exits, which for a service is never; :func:`guard` logs the failure the
  moment it happens (with the task's name), then re-raises, so the group still cancels the siblings and the
  process still ends with the error.
- short-lived calls a component fires and does not wait for (a bind, an event write, a grouping). Nobody awaits
  their result, so an exception would surface only as "Task exception was never retrieved" at garbage collection.
  :class:`TaskSet` keeps a strong reference to each (the event loop keeps only weak ones), logs a failure at once,
  and lets the owner ``drain`` them (tests, a graceful stop) or ``cancel`` them (losing leadership).
- long-lived loops of a service that must outlive their own bugs: :func:`supervise` runs one, and when it fails,
  logs the failure, reports it (a metric) and starts it again after a capped backoff, so one bad object or one bug in
  one loop never stops the service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from common import logs
from common.backoff import Backoff

log = logs.get("tasks")


async def guard(work: Coroutine[Any, Any, None], *, name: str) -> None:
    """Run ``work``, logging its failure at once; the failure (and cancellation) still propagates."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("task_failed", task=name)
        raise


OnFailure = Callable[[str, BaseException], None]
"""Told of every failure a helper caught: the task's name and its exception (e.g. to count it in a metric)."""

_RESTART = Backoff(base_s=0.5, cap_s=30.0)


async def supervise(
    work: Callable[[], Coroutine[Any, Any, None]],
    *,
    name: str,
    on_failure: OnFailure | None = None,
    backoff: Backoff = _RESTART,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``work()`` until it returns or the caller is cancelled; when it fails, log and report the failure and run
    it again after a backoff that grows while it keeps failing fast (a run longer than the backoff's cap resets it)."""
    failures = 0
    while True:
        started = monotonic()
        try:
            await work()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if monotonic() - started > backoff.cap_s:
                failures = 0
            delay_s = backoff.delay_s(failures)
            failures += 1
            log.exception("task_failed_restarting", task=name, restart_in_s=round(delay_s, 2))
            _tell(on_failure, name, exc)
        await sleep(delay_s)


def _tell(on_failure: OnFailure | None, name: str, exc: BaseException) -> None:
    """Report a failure; a report that fails itself is logged, never raised (it would stop what it reports on)."""
    if on_failure is None:
        return
    try:
        on_failure(name, exc)
    except Exception:
        log.exception("failure_report_failed", task=name)


class TaskSet:
    """The fire-and-forget tasks of one component. Not thread-safe: use it from its event loop only."""

    def __init__(self, owner: str, *, on_failure: OnFailure | None = None) -> None:
        self._owner = owner
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str = "") -> asyncio.Task[None]:
        """Start ``work`` now; its failure is logged (with the owner and ``name``) and ends only that task."""
        task = asyncio.ensure_future(self._run(work, name or self._owner))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A task cancelled before it first ran (a shutdown right after a cycle submitted its bindings) never awaited
        # ``work``: close it, or Python warns at exit that the coroutine was never awaited. Once the task is done,
        # ``work`` has finished or never started, so closing it does nothing else.
        task.add_done_callback(lambda _: work.close())
        return task

    async def _run(self, work: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("task_failed", owner=self._owner, task=name)
            _tell(self._on_failure, name, exc)

    async def drain(self) -> None:
        """Wait until every task has ended, including tasks spawned while waiting."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task and wait until each has ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

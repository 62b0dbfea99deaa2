"""Background tasks with owners: a failure is logged at once, and an owner can drain or cancel what it started.

Two shapes of concurrency recur in every process of Quotient:

- long-lived loops that run for the life of their component, inside an ``asyncio.TaskGroup``. A TaskGroup reports a
  member's failure only when the group exits, which for a service is never; :func:`guard` logs the failure the
  moment it happens (with the task's name), then re-raises, so the group still cancels the siblings and the
  process still ends with the error.
- short-lived calls a component fires and does not wait for (a bind, an event write, a grouping). Nobody awaits
  their result, so an exception would surface only as "Task exception was never retrieved" at garbage collection.
  :class:`TaskSet` keeps a strong reference to each (the event loop keeps only weak ones), logs a failure at once,
  and lets the owner ``drain`` them (tests, a graceful stop) or ``cancel`` them (losing leadership).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from common import logs

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


class TaskSet:
    """The fire-and-forget tasks of one component. Not thread-safe: use it from its event loop only."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str = "") -> asyncio.Task[None]:
        """Start ``work`` now; its failure is logged (with the owner and ``name``) and ends only that task."""
        task = asyncio.ensure_future(self._run(work, name or self._owner))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(self, work: Coroutine[Any, Any, None], name: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task_failed", owner=self._owner, task=name)

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

"""The task helpers: failures are logged at once, owners drain and cancel what they started."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from common import tasks
from common.backoff import Backoff


async def test_a_guarded_failure_is_logged_at_once_and_still_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await tasks.guard(broken(), name="loop")
    assert any(record.getMessage() == "task_failed" for record in caplog.records)


async def test_a_guarded_cancellation_propagates_without_a_failure_log(caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(tasks.guard(forever(), name="loop"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_drain_waits_for_tasks_spawned_while_draining() -> None:
    owned = tasks.TaskSet("test")
    done: list[str] = []

    async def second() -> None:
        done.append("second")

    async def first() -> None:
        await asyncio.sleep(0)
        owned.spawn(second(), name="second")
        done.append("first")

    owned.spawn(first(), name="first")
    await owned.drain()
    assert done == ["first", "second"]
    assert len(owned) == 0


async def test_a_failing_task_is_logged_and_leaves_the_others_running(caplog: pytest.LogCaptureFixture) -> None:
    owned = tasks.TaskSet("binder")
    gate = asyncio.Event()
    finished: list[str] = []

    async def broken() -> None:
        raise ValueError("bad")

    async def waits() -> None:
        await gate.wait()
        finished.append("waited")

    owned.spawn(broken(), name="broken")
    owned.spawn(waits(), name="waits")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(owned) == 1
    gate.set()
    await owned.drain()
    assert finished == ["waited"]
    failures = [record for record in caplog.records if record.getMessage() == "task_failed"]
    assert len(failures) == 1


async def test_cancel_ends_every_task() -> None:
    owned = tasks.TaskSet("grouper")
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    for name in ("a", "b"):
        owned.spawn(forever(name), name=name)
    await asyncio.sleep(0)
    await owned.cancel()
    assert sorted(cancelled) == ["a", "b"]
    assert len(owned) == 0


async def test_a_supervised_loop_that_fails_is_reported_and_started_again_after_a_growing_backoff() -> None:
    runs: list[int] = []
    waits: list[float] = []
    reported: list[tuple[str, str]] = []

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError(f"bug {len(runs)}")

    async def sleep(delay_s: float) -> None:
        waits.append(delay_s)

    await tasks.supervise(
        loop,
        name="cycles",
        on_failure=lambda name, exc: reported.append((name, str(exc))),
        backoff=Backoff(base_s=0.5, cap_s=30.0, min_fraction=1.0),
        sleep=sleep,
        monotonic=lambda: 0.0,
    )
    assert runs == [0, 1, 2]
    assert waits == [0.5, 1.0]
    assert reported == [("cycles", "bug 1"), ("cycles", "bug 2")]


async def test_a_failing_failure_report_never_stops_the_supervised_loop() -> None:
    runs: list[int] = []

    async def loop() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("bug")

    def broken(name: str, exc: BaseException) -> None:
        raise ValueError("the metric is broken too")

    async def sleep(delay_s: float) -> None:
        return None

    await tasks.supervise(loop, name="loop", on_failure=broken, sleep=sleep)
    assert runs == [1, 1]


async def test_a_task_set_reports_each_failure_to_its_owner() -> None:
    reported: list[str] = []
    owned = tasks.TaskSet("binder", on_failure=lambda name, exc: reported.append(f"{name}: {exc}"))

    async def broken() -> None:
        raise KeyError("gone")

    owned.spawn(broken(), name="bind")
    await owned.drain()
    assert reported == ["bind: 'gone'"]


async def test_a_task_cancelled_before_it_ran_leaves_no_never_awaited_coroutine_behind() -> None:
    owned = tasks.TaskSet("test")
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = owned.spawn(work(), name="binding")
        await owned.cancel()
        assert task.cancelled()
        del task
        for _ in range(3):
            await asyncio.sleep(0)  # the loop lets go of the task's last step
        gc.collect()
    assert ran == []
    assert not [warning for warning in caught if "never awaited" in str(warning.message)], caught

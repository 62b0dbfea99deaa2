"""The retry loop: retryable errors wait the backoff's delay, others propagate, attempts are bounded."""

from __future__ import annotations

import pytest

from common.backoff import Backoff
from common.retrying import retry

BACKOFF = Backoff(base_s=0.1, cap_s=0.4, min_fraction=1.0)


class Flaky(Exception):
    pass


async def test_a_call_that_fails_twice_then_works_returns_its_result_after_growing_waits() -> None:
    calls: list[int] = []
    waits: list[float] = []
    told: list[tuple[int, str, float]] = []

    async def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Flaky(f"try {len(calls)}")
        return "done"

    async def sleep(delay_s: float) -> None:
        waits.append(delay_s)

    result = await retry(
        call,
        backoff=BACKOFF,
        retry_on=Flaky,
        sleep=sleep,
        on_retry=lambda attempt, exc, delay: told.append((attempt, str(exc), delay)),
    )
    assert result == "done"
    assert waits == [0.1, 0.2]
    assert told == [(1, "try 1", 0.1), (2, "try 2", 0.2)]


async def test_the_last_error_is_raised_when_the_attempts_are_used_up() -> None:
    waits: list[float] = []

    async def call() -> None:
        raise Flaky("still down")

    async def sleep(delay_s: float) -> None:
        waits.append(delay_s)

    with pytest.raises(Flaky, match="still down"):
        await retry(call, backoff=BACKOFF, retry_on=Flaky, attempts=3, sleep=sleep)
    assert waits == [0.1, 0.2]


async def test_an_error_that_is_not_retryable_propagates_at_once() -> None:
    waits: list[float] = []

    async def call() -> None:
        raise KeyError("bug")

    async def sleep(delay_s: float) -> None:
        waits.append(delay_s)

    with pytest.raises(KeyError):
        await retry(call, backoff=BACKOFF, retry_on=Flaky, sleep=sleep)
    assert waits == []


async def test_fewer_than_one_attempt_is_refused() -> None:
    async def call() -> None:
        return None

    with pytest.raises(ValueError, match="at least 1"):
        await retry(call, backoff=BACKOFF, retry_on=Flaky, attempts=0)

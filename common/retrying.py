"""The one loop that applies a retry policy: call, and on a retryable error wait the backoff's delay and call again.

The policy is :class:`common.backoff.Backoff` (pure, capped, jittered); this module only applies it, so every
component that retries (connecting to NATS, binding a pod, reporting a reservation's device) retries the same way,
logs the same way and can be tested with an injected ``sleep``. Loops whose notion of progress is richer than "the
call returned" (a reflector that lists and watches, a consumer that replays) keep their own loop over the same
policy.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from common.backoff import Backoff

T = TypeVar("T")

OnRetry = Callable[[int, BaseException, float], None]
"""Told before each wait: the number of the call that failed (1 for the first), its error, the delay in seconds."""


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    attempts: int | None = None,
    on_retry: OnRetry | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    uniform: Callable[[], float] = random.random,
) -> T:
    """The first result of ``call``; a ``retry_on`` error waits and calls again, at most ``attempts`` calls in all
    (None: until it works or the caller is cancelled), after which the last error is raised. Other errors propagate
    at once."""
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    failed = 0
    while True:
        try:
            return await call()
        except retry_on as exc:
            failed += 1
            if attempts is not None and failed >= attempts:
                raise
            delay_s = backoff.delay_s(failed - 1, uniform)
            if on_retry is not None:
                on_retry(failed, exc, delay_s)
            await sleep(delay_s)

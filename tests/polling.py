"""Waiting for something to become true, the one way the tests do it.

Tests synchronise on what they can observe (a metric, a pod's phase, a message received), never on a fixed sleep:
a sleep is either too short on a loaded CI machine or too long everywhere else. ``until`` polls a condition in a
running event loop; ``until_sync`` does the same from plain test code that drives real processes. Both fail with
what was awaited and for how long, and the last value the condition saw when it returns one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
_INTERVAL_S = 0.02


@overload
async def until(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    interval_s: float = _INTERVAL_S,
) -> T: ...


@overload
async def until(
    condition: Callable[[], T],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    interval_s: float = _INTERVAL_S,
) -> T: ...


async def until(
    condition: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    interval_s: float = _INTERVAL_S,
) -> T:
    """Poll ``condition`` (plain or async) until it returns something truthy, and return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        last = result
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval_s)


def until_sync(
    condition: Callable[[], T],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    interval_s: float = 0.1,
) -> T:
    """Poll ``condition`` from synchronous test code until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {result!r})")
        time.sleep(interval_s)

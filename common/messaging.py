"""What a message bus promises: the ``MessageBus`` and ``Subscription`` Protocols, the handler types, the counters.

Components that publish or subscribe (the agent's loop, the scheduler's alerts and audit) depend on this module
only, never on the NATS adapter (``common.natsconn.NatsBus``), so loading them does not load nats-py, and tests can
hand them a fake bus. The contract is written here, on the Protocols, and every implementation keeps it:

- Nothing blocks on a down server. ``publish`` refuses at once while disconnected rather than queueing: a
  publisher that must not lose the newest value keeps it itself and publishes again when ``connected`` is back.
- The only errors are those of ``common.errors``: ``BusUnavailable`` (not connected, timed out, connection lost:
  retry later), ``BusPermissionDenied`` (the server refused this user), ``BusError`` (anything else, such as a
  message larger than the server accepts). A vendor library's exceptions never get through.
- Handlers run on the event loop, in arrival order per subscription; an exception in one is logged and ends
  neither the subscription nor the connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

Handler = Callable[[str, bytes], Awaitable[None]]
"""Receives one message as (subject, payload); awaited before the subscription's next message is handed over."""

BatchHandler = Callable[[list[tuple[str, bytes]]], None]
"""Receives the messages of one socket read as (subject, payload) pairs, in order; the list is the handler's to
keep. Runs on the event loop without awaiting, so it must not block for long."""


class Subscription(Protocol):
    async def unsubscribe(self) -> None:
        """Stop delivering. Idempotent, and never raises: a connection already gone has dropped the subscription
        with it."""
        ...


class MessageBus(Protocol):
    """Publish and subscribe on subjects.

    - ``connected``: whether the bus has a live connection now (it reconnects by itself after a loss).
    - ``publish`` never blocks on a down server: ``BusUnavailable`` at once when disconnected or when the write
      fails, ``BusError`` for a message larger than the server's limit. Not idempotent: every call is one more
      message.
    - ``subscribe``: ``BusUnavailable`` when disconnected; the subscription survives reconnects. Handlers are called
      one message at a time per subscription; an exception in a handler is logged and does not end it.
    - A server that refuses a publish or a subscription for lack of permission says so asynchronously: the message
      is dropped or the subscription gets nothing, the refusal is logged and counted (``permission_errors``), and
      nothing is raised. A refused connection is ``BusPermissionDenied``.
    - ``flush`` waits (at most ``timeout_s``) until the server has everything published so far, else raises
      ``BusUnavailable``.
    - ``close`` ends every subscription and the connection; idempotent, never raises.
    """

    @property
    def connected(self) -> bool: ...

    async def publish(self, subject: str, payload: bytes) -> None: ...

    async def subscribe(self, subject: str, handler: Handler) -> Subscription: ...

    async def flush(self, timeout_s: float = 2.0) -> None: ...

    async def close(self) -> None: ...


@dataclasses.dataclass(slots=True)
class BusCounters:
    """What happened on a bus's connections, for metrics and tests; the counts only grow.

    ``reconnects`` grows by one per connection made again after a loss, counted once its subscriptions are live
    again, so a reader that replays a stream on reconnect replays after nothing more can be missed.
    """

    disconnects: int = 0
    reconnects: int = 0
    permission_errors: int = 0
    async_errors: int = 0
    last_error: str = ""

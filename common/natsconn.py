"""The NATS adapter: the only module that imports ``nats`` (nats-py). Everything else sees ``MessageBus``.

Why it is shaped this way:
- An agent must keep sampling while NATS is down and publish its *latest* sample when NATS returns, never a
  backlog. So ``publish`` refuses at once (``BusUnavailable``) while disconnected instead of letting nats-py queue
  into its pending buffer, and the caller keeps only the newest message.
- nats-py reconnects by itself once connected, at a fixed ``reconnect_time_wait``; a fleet of agents that lost one
  server would then retry in lockstep. We pass a ``reconnect_to_server_handler`` that applies our capped, jittered
  :class:`common.backoff.Backoff`, and the first connection uses the same policy in our own loop (nats-py gives up
  on a first connect that fails).
- Authentication is by nkey: one seed file per role, mounted from a Secret.
- Permission violations arrive asynchronously through nats-py's error callback; they are logged and counted, and
  never kill the connection's user.
- A firehose (the scheduler's telemetry: 20,000 messages of ~8 KB a second, issue 7) does not go through nats-py's
  subscriptions: its pure-Python parser, one ``Msg`` object, one queue hand-off and three coroutine calls per
  message cost ~20 us of CPU a message, as much as decoding it. ``subscribe_batches`` instead opens a connection of
  its own that reads NATS's ``MSG`` frames straight out of a receive buffer (``asyncio.BufferedProtocol``: one
  payload copy, no per-message await) and hands them over as lists, one per socket read: ~4 us a message. It speaks
  only what a subscriber needs of the protocol (INFO, CONNECT, SUB, PING/PONG, MSG, -ERR; headers off, so the
  server strips any and sends plain ``MSG``), keeps the connection alive with PINGs, and after losing it
  reconnects with the bus's backoff and re-subscribes, counting the reconnect in ``counters.reconnects`` only once
  the subscription is live again, so a reader that replays a stream on reconnect replays after nothing more can be
  missed. It authenticates with the bus's nkey seed (the nonce signed by ``common.credentials``, which owns
  ``nkeys``). Connections that need credentials in the URL or TLS keep nats-py's path (batched the same way): the
  reader does not speak TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, cast
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client, Server
from nats.aio.msg import Msg

from common import credentials, logs, subjects
from common.backoff import Backoff
from common.errors import BusError, BusPermissionDenied, BusUnavailable

log = logs.get("natsconn")

# nats-py's default (DEFAULT_PING_INTERVAL): a connection that stays silent is checked every two minutes.
DEFAULT_PING_INTERVAL_S: Final = 120.0

Handler = Callable[[str, bytes], Awaitable[None]]
# Receives the messages of one socket read as (subject, payload) pairs, in order; the list is the handler's to keep.
BatchHandler = Callable[[list[tuple[str, bytes]]], None]


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


class MessageBus(Protocol):
    """Publish and subscribe on subjects.

    Contract: ``publish`` never blocks on a down server: it raises ``BusUnavailable`` at once when disconnected and
    ``BusPermissionDenied`` when the server refused this user's credentials. Handlers are called one message at a
    time per subscription; an exception in a handler is logged and does not end the subscription.
    """

    @property
    def connected(self) -> bool: ...

    async def publish(self, subject: str, payload: bytes) -> None: ...

    async def subscribe(self, subject: str, handler: Handler) -> Subscription: ...

    async def flush(self, timeout_s: float = 2.0) -> None: ...

    async def close(self) -> None: ...


@dataclasses.dataclass(slots=True)
class BusCounters:
    """What happened on the connection, for metrics and tests."""

    disconnects: int = 0
    reconnects: int = 0
    permission_errors: int = 0
    async_errors: int = 0
    last_error: str = ""


@dataclasses.dataclass(slots=True, kw_only=True)
class _NatsSubscription:
    sub: Any

    async def unsubscribe(self) -> None:
        try:
            await self.sub.unsubscribe()
        except (nats.errors.Error, ConnectionError) as exc:
            log.debug("unsubscribe_failed", error=str(exc))


@dataclasses.dataclass(slots=True, kw_only=True)
class _NatsSubscriptions:
    subs: tuple[_NatsSubscription, ...]

    async def unsubscribe(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()


class NatsBus:
    """A ``MessageBus`` over nats-py. Create with :meth:`open` (first connection waits with backoff)."""

    def __init__(
        self,
        *,
        servers: str,
        name: str,
        nkey_seed: Path | None = None,
        backoff: Backoff | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        ping_interval_s: float = DEFAULT_PING_INTERVAL_S,
        connect_timeout_s: float = 2.0,
    ) -> None:
        if ping_interval_s <= 0 or connect_timeout_s <= 0:
            raise ValueError(
                f"ping_interval_s and connect_timeout_s must be positive: {ping_interval_s}, {connect_timeout_s}"
            )
        self._servers = [url.strip() for url in servers.split(",") if url.strip()]
        self._name = name
        self._backoff = backoff or Backoff(base_s=0.1, cap_s=5.0)
        self._on_reconnect = on_reconnect
        self._client: Client | None = None
        self._closing = False
        self.counters = BusCounters()
        # Read and check the seed now: a mistyped seed is a clear ConfigError at start, not an opaque
        # "authorization violation" from the server later.
        self._seed_text = credentials.read_seed_file(nkey_seed).decode("ascii") if nkey_seed is not None else None
        self._ping_interval_s = ping_interval_s
        self._connect_timeout_s = connect_timeout_s
        self._batch_subscriptions: set[_BatchSubscription] = set()

    # -- connection ------------------------------------------------------------------------------------------------

    async def connect_once(self, *, timeout_s: float = 2.0) -> None:
        """One connection attempt; raises ``BusUnavailable`` or ``BusPermissionDenied``."""
        try:
            self._client = await nats.connect(
                servers=self._servers,
                name=self._name,
                nkeys_seed_str=self._seed_text,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                connect_timeout=timeout_s,
                # Whatever is published while reconnecting is refused by us, so the buffer only needs to hold
                # the little that is in flight at the moment of a disconnect.
                pending_size=256 * 1024,
                reconnect_to_server_handler=self._pick_server,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except nats.errors.AuthorizationError as exc:
            raise BusPermissionDenied(f"NATS refused the credentials of {self._name}: {exc}") from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            if "authorization" in str(exc).lower():
                raise BusPermissionDenied(f"NATS refused the credentials of {self._name}: {exc}") from exc
            raise BusUnavailable(f"cannot connect to {','.join(self._servers)}: {exc or type(exc).__name__}") from exc

    async def connect(self) -> None:
        """Connect, retrying with capped jittered backoff until it works (or the task is cancelled)."""
        attempt = 0
        while True:
            try:
                await self.connect_once()
            except BusUnavailable as exc:
                delay = self._backoff.delay_s(attempt)
                log.warning("nats_connect_failed", error=str(exc), retry_in_s=round(delay, 2), attempt=attempt)
                attempt += 1
                await asyncio.sleep(delay)
                continue
            log.info("nats_connected", servers=",".join(self._servers), name=self._name)
            return

    def _pick_server(self, servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        # nats-py calls this before every reconnect attempt; Server.reconnects counts failed tries of that server.
        server = min(servers, key=lambda s: s.reconnects) if servers else None
        attempts = server.reconnects if server is not None else 0
        return server, self._backoff.delay_s(attempts, random.random)

    async def _on_error(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        self.counters.last_error = text
        if "permissions violation" in text.lower() or isinstance(exc, nats.errors.AuthorizationError):
            self.counters.permission_errors += 1
            log.error("nats_permission_denied", error=text, name=self._name)
        else:
            self.counters.async_errors += 1
            log.debug("nats_error", error=text)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.counters.disconnects += 1
        log.warning("nats_disconnected", name=self._name)

    async def _on_reconnected(self) -> None:
        self.counters.reconnects += 1
        log.info("nats_reconnected", name=self._name)
        if self._on_reconnect is not None:
            try:
                await self._on_reconnect()
            except Exception:  # one bad callback must not break nats-py's reconnect loop
                log.exception("reconnect_callback_failed")

    # -- MessageBus --------------------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_connected

    def _require(self) -> Client:
        if self._client is None or not self._client.is_connected:
            raise BusUnavailable("not connected to NATS")
        return self._client

    async def publish(self, subject: str, payload: bytes) -> None:
        client = self._require()
        try:
            await client.publish(subject, payload)
        except nats.errors.MaxPayloadError as exc:
            raise BusError(f"message of {len(payload)} bytes exceeds the server's max_payload: {exc}") from exc
        except (nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"publish to {subject} failed: {exc or type(exc).__name__}") from exc

    async def subscribe(self, subject: str, handler: Handler) -> Subscription:
        client = self._require()

        async def deliver(msg: Msg) -> None:
            try:
                await handler(msg.subject, msg.data)
            except Exception:
                log.exception("subscription_handler_failed", subject=msg.subject)

        try:
            sub = await client.subscribe(subject, cb=deliver)
        except (nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"subscribe to {subject} failed: {exc}") from exc
        return _NatsSubscription(sub=sub)

    async def subscribe_batches(self, subject_filters: Sequence[str], on_batch: BatchHandler) -> Subscription:
        """Every message on ``subject_filters``, handed to ``on_batch`` as lists (one list per socket read) in
        arrival order within each filter, over a connection of this subscription's own where it can (see the module
        docstring; there the order holds across filters too).

        Raises ``BusUnavailable`` when no server takes the subscription now and ``BusPermissionDenied`` when the
        server refuses it. Once it is live it survives outages: it reconnects with the bus's backoff, re-subscribes,
        and counts one ``counters.reconnects`` when live again. ``on_batch`` runs on the event loop and must not block
        for long; an exception in it is logged and the messages of that call are lost, nothing else.
        """
        if not subject_filters:
            raise ValueError("subscribe_batches needs at least one subject filter")
        if self._closing:
            raise BusUnavailable("the bus is closed")
        if any(_needs_client(url) for url in self._servers):
            return await self._subscribe_batches_through_client(subject_filters, on_batch)
        subscription = _BatchSubscription(
            subject_filters=tuple(subject_filters),
            on_batch=on_batch,
            servers=tuple(self._servers),
            name=self._name,
            backoff=self._backoff,
            counters=self.counters,
            connect_timeout_s=self._connect_timeout_s,
            ping_interval_s=self._ping_interval_s,
            seed=self._seed_text.encode("ascii") if self._seed_text is not None else None,
        )
        await subscription.start()
        self._batch_subscriptions.add(subscription)
        subscription.on_close = self._batch_subscriptions.discard
        return subscription

    async def _subscribe_batches_through_client(
        self, subject_filters: Sequence[str], on_batch: BatchHandler
    ) -> Subscription:
        """nats-py's subscriptions, batched: the callbacks only collect, and one call per event-loop turn hands the
        collected messages over, so the handler sees the same lists as from the reader (only the transport differs)."""
        loop = asyncio.get_running_loop()
        pending: list[tuple[str, bytes]] = []

        def hand_over() -> None:
            nonlocal pending
            batch, pending = pending, []
            _deliver(on_batch, batch)

        async def collect(msg: Msg) -> None:
            if not pending:
                loop.call_soon(hand_over)
            pending.append((msg.subject, msg.data))

        client = self._require()
        subs: list[Any] = []
        try:
            for subject in subject_filters:
                subs.append(await client.subscribe(subject, cb=collect))
        except (nats.errors.Error, OSError) as exc:
            for sub in subs:
                await _NatsSubscription(sub=sub).unsubscribe()
            raise BusUnavailable(f"subscribe to {', '.join(subject_filters)} failed: {exc}") from exc
        return _NatsSubscriptions(subs=tuple(_NatsSubscription(sub=sub) for sub in subs))

    async def flush(self, timeout_s: float = 2.0) -> None:
        client = self._require()
        try:
            await client.flush(timeout=max(1, round(timeout_s)))
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"flush failed: {exc or type(exc).__name__}") from exc

    async def close(self) -> None:
        client, self._client = self._client, None
        self._closing = True
        for subscription in list(self._batch_subscriptions):
            await subscription.unsubscribe()
        if client is None or client.is_closed:
            return
        try:
            await client.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await client.close()

    # -- JetStream ---------------------------------------------------------------------------------------------------

    async def declare_telemetry_stream(self) -> None:
        """Create or update ``QUOTIENT_TELEMETRY``: memory storage, the last message of each telemetry and health
        subject, so a starting scheduler reads every node's last sample and health at once.

        Idempotent. Called by the scheduler (or an operator), never by agents, which only publish.
        """
        client = self._require()
        config = nats.js.api.StreamConfig(
            name=subjects.TELEMETRY_STREAM,
            subjects=[subjects.TELEMETRY_ALL, subjects.HEALTH_ALL],
            storage=nats.js.api.StorageType.MEMORY,
            retention=nats.js.api.RetentionPolicy.LIMITS,
            max_msgs_per_subject=1,
            discard=nats.js.api.DiscardPolicy.OLD,
            num_replicas=1,
        )
        js = client.jetstream()
        try:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError:
                await js.update_stream(config)
        except nats.js.errors.ServiceUnavailableError as exc:
            raise BusUnavailable(f"JetStream is not enabled on the server: {exc}") from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            if "permission" in str(exc).lower():
                raise BusPermissionDenied(f"cannot declare {subjects.TELEMETRY_STREAM}: {exc}") from exc
            raise BusUnavailable(f"cannot declare {subjects.TELEMETRY_STREAM}: {exc or type(exc).__name__}") from exc

    async def last_message(self, subject: str) -> bytes | None:
        """The stream's last message on ``subject`` (None when there is none)."""
        client = self._require()
        js = client.jetstream()
        try:
            msg = await js.get_last_msg(subjects.TELEMETRY_STREAM, subject)
        except nats.js.errors.NotFoundError:
            return None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"cannot read the last message of {subject}: {exc or type(exc).__name__}") from exc
        return bytes(msg.data) if msg.data is not None else b""

    async def last_per_subject(self, subject_filter: str, *, timeout_s: float = 2.0) -> Sequence[tuple[str, bytes]]:
        """Every subject's last message under ``subject_filter`` in the stream, read with an ephemeral ordered
        consumer (deliver policy last-per-subject) and returned in stream order."""
        client = self._require()
        js = client.jetstream()
        try:
            info = await js.stream_info(subjects.TELEMETRY_STREAM, subjects_filter=subject_filter)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BusUnavailable(
                f"cannot read stream {subjects.TELEMETRY_STREAM}: {exc or type(exc).__name__}"
            ) from exc
        expected = len(info.state.subjects or {})
        if expected == 0:
            return []
        out: list[tuple[str, bytes]] = []
        try:
            sub = await js.subscribe(
                subject_filter,
                ordered_consumer=True,
                deliver_policy=nats.js.api.DeliverPolicy.LAST_PER_SUBJECT,
                stream=subjects.TELEMETRY_STREAM,
            )
            try:
                while len(out) < expected:
                    msg = await sub.next_msg(timeout=timeout_s)
                    out.append((msg.subject, bytes(msg.data)))
            finally:
                await sub.unsubscribe()
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"cannot replay {subject_filter}: {exc or type(exc).__name__}") from exc
        return out


# -- batched subscriptions: a subscriber's side of the NATS protocol ---------------------------------------------------

# nats-server's MAX_CONTROL_LINE_SIZE (server/const.go): no protocol line from the server is longer.
_MAX_CONTROL_LINE: Final = 4096
# What one socket read may fill: a few dozen 8 KB telemetry messages, so the per-read costs are shared.
_READ_BUFFER_BYTES: Final = 256 * 1024
# Never offer the socket less than this much room: less would mean many small reads.
_MIN_READ_BYTES: Final = 64 * 1024
# The server's default max_payload (1 MiB), until its INFO says otherwise.
_DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024
# nats-py's DEFAULT_MAX_OUTSTANDING_PINGS: that many unanswered PINGs and the connection is considered dead.
_MAX_OUTSTANDING_PINGS: Final = 2
_CLIENT_NAME_LANG: Final = "python-quotient"


def _needs_client(url: str) -> bool:
    """Whether connecting to ``url`` takes what only nats-py does here: TLS, or credentials written in the URL."""
    parts = urlsplit(url)
    return parts.scheme == "tls" or parts.username is not None or parts.password is not None


class _Stage(enum.Enum):
    HANDSHAKE = "handshake"  # waiting for INFO, then for the PONG behind CONNECT and the SUBs
    LIVE = "live"
    CLOSED = "closed"


class _ProtocolViolation(Exception):
    """The server sent something this reader cannot parse: the connection is dropped and made again."""


def _deliver(on_batch: BatchHandler, batch: list[tuple[str, bytes]]) -> None:
    try:
        on_batch(batch)
    except Exception:  # one bad handler call must not end the subscription
        log.exception("batch_handler_failed", messages=len(batch))


class _FrameReader(asyncio.BufferedProtocol):
    """One connection of a batched subscription: the handshake's futures, then MSG frames parsed in place.

    The socket writes into ``_buffer`` at ``_end``; ``buffer_updated`` parses complete frames from ``_start`` and
    leaves a partial one for the next read, which ``get_buffer`` first moves to the front (or into a larger buffer,
    for a payload bigger than the room left).
    """

    def __init__(self, subscription: _BatchSubscription) -> None:
        loop = asyncio.get_running_loop()
        self._subscription = subscription
        self._loop = loop
        self._buffer = bytearray(_READ_BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._transport: asyncio.Transport | None = None
        self._max_payload = _DEFAULT_MAX_PAYLOAD
        self.stage = _Stage.HANDSHAKE
        self.info: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pong: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.errors: list[str] = []
        self._outstanding_pings = 0
        self._ping_timer: asyncio.TimerHandle | None = None

    # -- the transport's side --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's TCPTransport is one without subclassing asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < _MIN_READ_BYTES:
            self._make_room()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        buffer = self._buffer
        view = self._view
        find = buffer.find
        startswith = buffer.startswith
        end = self._end
        pos = self._start
        batch: list[tuple[str, bytes]] = []
        append = batch.append
        try:
            while pos < end:
                eol = find(b"\r\n", pos, end)
                if eol < 0:
                    if end - pos > _MAX_CONTROL_LINE:
                        raise _ProtocolViolation(f"a protocol line longer than {_MAX_CONTROL_LINE} bytes")
                    break
                if startswith(b"MSG ", pos, eol):
                    # MSG <subject> <sid> [reply-to] <#bytes>
                    args = buffer[pos + 4 : eol].split()
                    if not 3 <= len(args) <= 4:
                        raise _ProtocolViolation(f"malformed MSG line {bytes(buffer[pos:eol])[:200]!r}")
                    size = int(args[-1])
                    if not 0 <= size <= self._max_payload:
                        raise _ProtocolViolation(
                            f"MSG of {size} bytes, the server's max_payload is {self._max_payload}"
                        )
                    start = eol + 2
                    stop = start + size
                    if stop + 2 > end:
                        break  # the payload is still arriving
                    if buffer[stop] != 13 or buffer[stop + 1] != 10:
                        raise _ProtocolViolation("a MSG payload not followed by CRLF")
                    append((args[0].decode(), bytes(view[start:stop])))
                    pos = stop + 2
                else:
                    line = bytes(buffer[pos:eol])
                    pos = eol + 2
                    self._control(line)
        except (_ProtocolViolation, ValueError, TypeError) as exc:  # int(), decode(), json of garbage
            self._start = self._end = 0
            if batch:
                _deliver(self._subscription.on_batch, batch)
            self._subscription.protocol_violation(str(exc))
            self.abort()
            return
        self._start = pos
        if pos == end:
            self._start = self._end = 0
        if batch:
            _deliver(self._subscription.on_batch, batch)

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        previous = self.stage
        self.stage = _Stage.CLOSED
        self._transport = None
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        lost = BusUnavailable(f"connection lost: {exc or 'closed by the server'}")
        for future in (self.info, self.pong):
            if not future.done():
                future.set_exception(lost)
                future.exception()  # retrieved: nobody may be waiting any more
        if not self.closed.done():
            self.closed.set_result(None)
        if previous is _Stage.LIVE:
            self._subscription.connection_lost(self, exc)

    # -- the subscription's side --

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def go_live(self, ping_interval_s: float) -> None:
        self.stage = _Stage.LIVE
        self._ping_timer = self._loop.call_later(ping_interval_s, self._ping, ping_interval_s)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- internals --

    def _control(self, line: bytes) -> None:
        if line.startswith(b"PING"):
            self.write(b"PONG\r\n")
        elif line.startswith(b"PONG"):
            self._outstanding_pings = 0
            if not self.pong.done():
                self.pong.set_result(None)
        elif line.startswith(b"INFO "):
            info = json.loads(line[5:])
            if not isinstance(info, dict):
                raise _ProtocolViolation("INFO is not a JSON object")
            self._max_payload = int(info.get("max_payload") or _DEFAULT_MAX_PAYLOAD)
            if not self.info.done():
                self.info.set_result(info)
        elif line.startswith(b"-ERR"):
            text = line[4:].strip().strip(b"'").decode(errors="replace")
            if self.stage is _Stage.LIVE:
                self._subscription.server_error(text)
            else:
                self.errors.append(text)
        elif line.startswith(b"+OK"):
            pass
        else:
            raise _ProtocolViolation(f"unexpected protocol line {line[:200]!r}")

    def _ping(self, interval_s: float) -> None:
        if self.stage is not _Stage.LIVE:
            return
        if self._outstanding_pings >= _MAX_OUTSTANDING_PINGS:
            log.warning("nats_stale_connection", unanswered_pings=self._outstanding_pings)
            self.abort()
            return
        self._outstanding_pings += 1
        self.write(b"PING\r\n")
        self._ping_timer = self._loop.call_later(interval_s, self._ping, interval_s)

    def _make_room(self) -> None:
        """Move the unparsed tail to the front, into a larger buffer when it does not leave room for a read (a
        payload up to the server's max_payload), or back into a default-sized one once a large payload is past."""
        pending = self._end - self._start
        size = len(self._buffer)
        wanted = pending + _MIN_READ_BYTES
        if wanted > size or (size > _READ_BUFFER_BYTES and wanted <= _READ_BUFFER_BYTES):
            # Doubling keeps a large payload arriving in many reads from being copied once per read.
            fresh = bytearray(max(wanted, _READ_BUFFER_BYTES) if wanted <= size else max(wanted, 2 * size))
            fresh[:pending] = self._view[self._start : self._end]
            # The old buffer goes with the last view of it; resizing it in place could hit a view still exported.
            self._buffer = fresh
            self._view = memoryview(fresh)
        elif pending:
            # Through a copy: the two ranges may overlap, and bytearray's slice assignment copies with memcpy.
            self._buffer[:pending] = bytes(self._view[self._start : self._end])
        self._start, self._end = 0, pending


class _BatchSubscription:
    """The lifetime of a batched subscription: connect and subscribe, and after a loss, reconnect until closed."""

    def __init__(
        self,
        *,
        subject_filters: tuple[str, ...],
        on_batch: BatchHandler,
        servers: tuple[str, ...],
        name: str,
        backoff: Backoff,
        counters: BusCounters,
        connect_timeout_s: float,
        ping_interval_s: float,
        seed: bytes | None = None,
    ) -> None:
        self._seed = seed
        self._subject_filters = subject_filters
        self.on_batch = on_batch
        self._servers = servers
        self._name = name
        self._backoff = backoff
        self._counters = counters
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s
        self._next_server = 0
        self._reader: _FrameReader | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closing = False
        self.on_close: Callable[[_BatchSubscription], None] | None = None

    async def start(self) -> None:
        """Connect to the first server that takes the subscription."""
        failure: BusError | None = None
        for _ in self._servers:
            try:
                await self._connect()
            except BusPermissionDenied:
                raise
            except BusUnavailable as exc:
                failure = exc
                continue
            return
        assert failure is not None
        raise failure

    async def unsubscribe(self) -> None:
        """Close the connection (the server drops its subscriptions with it); idempotent."""
        self._closing = True
        if self.on_close is not None:
            self.on_close(self)
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader.closed), 2.0)

    # -- called by the reader --

    def connection_lost(self, reader: _FrameReader, exc: Exception | None) -> None:
        if self._closing or reader is not self._reader:
            return
        self._reader = None
        self._counters.disconnects += 1
        log.warning("nats_batch_subscription_lost", subjects=",".join(self._subject_filters), error=str(exc or ""))
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())
        self._reconnecting.add_done_callback(_log_failure)

    def server_error(self, text: str) -> None:
        counters = self._counters
        counters.last_error = text
        if "permissions violation" in text.lower():
            counters.permission_errors += 1
            log.error("nats_permission_denied", error=text, subjects=",".join(self._subject_filters))
        else:
            counters.async_errors += 1
            log.warning("nats_server_error", error=text)

    def protocol_violation(self, text: str) -> None:
        self._counters.async_errors += 1
        self._counters.last_error = text
        log.error("nats_protocol_violation", error=text)

    # -- internals --

    async def _reconnect(self) -> None:
        attempt = 0
        while not self._closing:
            await asyncio.sleep(self._backoff.delay_s(attempt, random.random))
            try:
                await self._connect()
            except BusError as exc:
                log.warning("nats_batch_reconnect_failed", error=str(exc), attempt=attempt)
                attempt += 1
                continue
            self._counters.reconnects += 1
            log.info("nats_batch_subscription_reconnected", subjects=",".join(self._subject_filters))
            return

    async def _connect(self) -> None:
        url = self._servers[self._next_server % len(self._servers)]
        self._next_server += 1
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host, port = parts.hostname or "127.0.0.1", parts.port or 4222
        loop = asyncio.get_running_loop()
        timeout_s = self._connect_timeout_s
        reader: _FrameReader | None = None
        try:
            async with asyncio.timeout(timeout_s):
                _, protocol = await loop.create_connection(lambda: _FrameReader(self), host, port)
                reader = protocol
                info = await reader.info
                if info.get("tls_required"):
                    raise BusUnavailable(f"{url} requires TLS; use a tls:// URL")
                # Whether this anonymous connection may subscribe (a server with auth_required may still have a
                # no_auth_user) is the server's to say: it answers -ERR and closes, or PONG.
                reader.write(self._handshake(info))
                await reader.pong
        except asyncio.CancelledError:
            if reader is not None:
                reader.abort()
            raise
        except (BusError, OSError, TimeoutError) as exc:
            if reader is not None:
                reader.abort()
                refusal = self._refusal(url, reader.errors)
                if refusal is not None:
                    raise refusal from exc
            if isinstance(exc, BusError):
                raise
            raise BusUnavailable(f"cannot subscribe at {url}: {exc or type(exc).__name__}") from exc
        refusal = self._refusal(url, reader.errors)
        if refusal is not None:
            reader.abort()
            raise refusal
        if self._closing:
            reader.abort()
            raise BusUnavailable("the subscription was closed while connecting")
        self._reader = reader
        reader.go_live(self._ping_interval_s)

    def _refusal(self, url: str, errors: Sequence[str]) -> BusError | None:
        """What the server's -ERR lines during the handshake mean: None when there were none."""
        if not errors:
            return None
        text = "; ".join(errors)
        if "authorization" in text.lower() or "permissions" in text.lower():
            return BusPermissionDenied(f"{url} refused {self._name}'s subscription: {text}")
        return BusUnavailable(f"{url} refused {self._name}'s subscription: {text}")

    def _handshake(self, info: Mapping[str, Any]) -> bytes:
        # verbose off (no +OK per command), headers off (the server sends plain MSG, without any headers), echo on
        # (a message this process publishes elsewhere on the subject is still one to read).
        options = {
            "verbose": False,
            "pedantic": False,
            "tls_required": False,
            "name": self._name,
            "lang": _CLIENT_NAME_LANG,
            "version": "1",
            "protocol": 1,
            "headers": False,
            "no_responders": False,
        }
        if self._seed is not None:
            # nkey authentication: the public key and the signature of the server's nonce (never the seed).
            options["nkey"] = credentials.public_key(self._seed)
            options["sig"] = credentials.sign_nonce(self._seed, str(info.get("nonce") or "").encode())
        lines = [f"CONNECT {json.dumps(options, separators=(',', ':'))}\r\n"]
        lines += [f"SUB {subject} {sid}\r\n" for sid, subject in enumerate(self._subject_filters, start=1)]
        lines.append("PING\r\n")
        return "".join(lines).encode()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("nats_batch_reconnect_crashed", error=repr(task.exception()))

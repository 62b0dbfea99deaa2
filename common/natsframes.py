"""The subscriber's side of the NATS wire protocol on one connection: MSG frames parsed in place, in batches.

This is the fast path of ``NatsBus.subscribe_batches`` (``common.natsbatches`` owns the connection's lifetime). A
firehose (the scheduler's telemetry: 20,000 messages of ~8 KB a second, issue 7) does not go through nats-py's
subscriptions: its pure-Python parser, one ``Msg`` object, one queue hand-off and three coroutine calls per message
cost ~20 us of CPU a message, as much as decoding it. :class:`FrameReader` instead reads NATS's ``MSG`` frames
straight out of a receive buffer (``asyncio.BufferedProtocol``: one payload copy, no per-message await) and hands
them over as lists, one per socket read: ~4 us a message.

It speaks only what a subscriber needs of the protocol: INFO, PING/PONG, MSG, -ERR and +OK from the server (headers
are off in the CONNECT its owner sends, so the server strips any and sends plain ``MSG``), and it keeps the
connection alive with PINGs. Over TLS (from the first byte, or upgraded after INFO: :meth:`FrameReader.start_tls`)
the event loop's TLS transport decrypts each socket read into the same receive buffer, so the parsing is the same,
one decryption per read added (the ``bench telemetry --tls`` figures are in the README). Whatever it
cannot parse drops the connection after handing over the messages before it; its :class:`Listener` hears of that,
of the server's errors and of the loss, and decides what comes next.
"""

from __future__ import annotations

import asyncio
import enum
import json
import ssl
from typing import Any, Final, Protocol, cast

from common import logs
from common.errors import BusUnavailable
from common.messaging import BatchHandler

log = logs.get("natsconn")

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


class _Stage(enum.Enum):
    HANDSHAKE = "handshake"  # waiting for INFO, then for the PONG behind CONNECT and the SUBs
    LIVE = "live"
    CLOSED = "closed"


class Listener(Protocol):
    """What a reader reports to the subscription that owns it. Every call comes from the event loop's thread."""

    def on_batch(self, batch: list[tuple[str, bytes]]) -> None:
        """The messages of one socket read, in order (called through :func:`deliver`)."""
        ...

    def server_error(self, text: str) -> None:
        """A ``-ERR`` on a live connection (the server keeps it open)."""
        ...

    def protocol_violation(self, text: str) -> None:
        """Something the reader cannot parse; it has aborted the connection."""
        ...

    def connection_lost(self, reader: FrameReader, exc: Exception | None) -> None:
        """A live connection ended (not called for one lost during its handshake)."""
        ...


class _ProtocolViolation(Exception):
    """The server sent something this reader cannot parse: the connection is dropped and made again."""


def deliver(on_batch: BatchHandler, batch: list[tuple[str, bytes]]) -> None:
    """Hand ``batch`` over; an exception in the handler is logged and loses that batch only."""
    try:
        on_batch(batch)
    except Exception:  # one bad handler call must not end the subscription
        log.exception("batch_handler_failed", messages=len(batch))


class FrameReader(asyncio.BufferedProtocol):
    """One connection of a batched subscription: the handshake's futures, then MSG frames parsed in place.

    The socket writes into ``_buffer`` at ``_end``; ``buffer_updated`` parses complete frames from ``_start`` and
    leaves a partial one for the next read, which ``get_buffer`` first moves to the front (or into a larger buffer,
    for a payload bigger than the room left).
    """

    def __init__(self, listener: Listener) -> None:
        loop = asyncio.get_running_loop()
        self._listener = listener
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
                deliver(self._listener.on_batch, batch)
            self._listener.protocol_violation(str(exc))
            self.abort()
            return
        self._start = pos
        if pos == end:
            self._start = self._end = 0
        if batch:
            deliver(self._listener.on_batch, batch)

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
            self._listener.connection_lost(self, exc)

    # -- the subscription's side --

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def start_tls(self, context: ssl.SSLContext, *, server_hostname: str, timeout_s: float) -> None:
        """Upgrade the connection to TLS (after INFO, before CONNECT); raises ``BusUnavailable`` when the handshake
        fails (a certificate that ``context`` does not trust, a wrong name, a timeout) or the connection is gone."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise BusUnavailable("the connection closed before TLS")
        if self._end != self._start:
            # The server says nothing after INFO until the client speaks: bytes here are not NATS.
            raise BusUnavailable("the server sent data before the TLS handshake")
        try:
            upgraded = await self._loop.start_tls(
                transport, self, context, server_hostname=server_hostname, ssl_handshake_timeout=timeout_s
            )
        except ssl.SSLCertVerificationError as exc:
            raise BusUnavailable(
                f"the server's certificate is not trusted ({exc.verify_message}): check --nats-ca and that the "
                f"certificate names {server_hostname}"
            ) from exc
        except (OSError, ConnectionError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise BusUnavailable(f"TLS handshake failed: {exc or type(exc).__name__}") from exc
        if upgraded is None:
            raise BusUnavailable("the connection closed during the TLS handshake")
        self._transport = upgraded

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
                self._listener.server_error(text)
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

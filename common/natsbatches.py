"""A batched subscription over a raw socket: the lifetime around ``common.natsframes.FrameReader``.

``NatsBus.subscribe_batches`` uses it where it can (see ``common.natsframes`` for why it exists at all): it opens a
connection of its own, sends CONNECT (verbose off, headers off) and the SUBs, and waits for the PONG behind them, so
a server's refusal arrives as ``BusPermissionDenied`` before the call returns. After losing a live connection it
reconnects with the bus's backoff (``common.retrying``) and re-subscribes, counting the reconnect in
``BusCounters.reconnects`` only once the subscription is live again, so a reader that replays a stream on reconnect
replays after nothing more can be missed. It authenticates with the bus's nkey seed: the server's nonce signed by
``common.credentials``, which owns ``nkeys``; the seed itself never leaves the process.

It speaks TLS as the bus's nats-py connection does (``common.natstls``): the handshake first when the bus wants TLS
(a CA to pin, a ``tls://`` URL), else an upgrade after INFO where the server requires it; the CA file is read at
every connection, so a rotated one is picked up on the next reconnect. It takes no credentials written in
the URL and no websockets: :func:`speaks` says which servers it can reach, and the bus uses nats-py's subscriptions
(batched the same way) for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from common import credentials, logs, natsframes, natstls, retrying, tasks
from common.backoff import Backoff
from common.errors import BusError, BusPermissionDenied, BusUnavailable, ConfigError
from common.messaging import BatchHandler, BusCounters

log = logs.get("natsconn")

_CLIENT_NAME_LANG: Final = "python-quotient"
# How long closing waits for the server to see the connection go.
_CLOSE_TIMEOUT_S: Final = 2.0


def speaks(url: str) -> bool:
    """Whether a batched subscription can connect to ``url`` itself: NATS's protocol (``nats://``, ``tls://``), no
    credentials written in the URL."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    return parts.scheme in ("nats", "tls") and parts.username is None and parts.password is None


class BatchSubscription:
    """The lifetime of a batched subscription: connect and subscribe, and after a loss, reconnect until closed.

    A ``messaging.Subscription``, and the ``natsframes.Listener`` of its current connection's reader.
    """

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
        tls_ca: Path | None = None,
        tls_wanted: bool = False,
    ) -> None:
        self._seed = seed
        self._tls_ca = tls_ca
        self._tls_wanted = tls_wanted or natstls.wants_tls(urls=servers, ca=tls_ca)
        self._subject_filters = subject_filters
        self.on_batch = on_batch
        self._servers = servers
        self._name = name
        self._backoff = backoff
        self._counters = counters
        self._connect_timeout_s = connect_timeout_s
        self._ping_interval_s = ping_interval_s
        self._next_server = 0
        self._reader: natsframes.FrameReader | None = None
        self._reconnecting = tasks.TaskSet("nats-batch-subscription")
        self._closing = False
        self.on_close: Callable[[BatchSubscription], None] | None = None

    async def start(self) -> None:
        """Connect to the first server that takes the subscription: ``BusPermissionDenied`` at once when one
        refuses it, else the last server's ``BusUnavailable`` when none could be reached."""
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
        await self._reconnecting.cancel()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader.closed), _CLOSE_TIMEOUT_S)

    # -- natsframes.Listener --

    def connection_lost(self, reader: natsframes.FrameReader, exc: Exception | None) -> None:
        if self._closing or reader is not self._reader:
            return
        self._reader = None
        self._counters.disconnects += 1
        log.warning("nats_batch_subscription_lost", subjects=",".join(self._subject_filters), error=str(exc or ""))
        self._reconnecting.spawn(self._reconnect(), name="nats-batch-reconnect")

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
        # The server that dropped the connection is likely restarting: wait before the first try too.
        await asyncio.sleep(self._backoff.delay_s(0, random.random))
        await retrying.retry(self._connect, backoff=self._backoff, retry_on=BusError, on_retry=self._reconnect_failed)
        self._counters.reconnects += 1
        log.info("nats_batch_subscription_reconnected", subjects=",".join(self._subject_filters))

    def _reconnect_failed(self, failed: int, exc: BaseException, _delay_s: float) -> None:
        log.warning("nats_batch_reconnect_failed", error=str(exc), attempt=failed - 1)

    async def _connect(self) -> None:
        url = self._servers[self._next_server % len(self._servers)]
        self._next_server += 1
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host, port = parts.hostname or "127.0.0.1", parts.port or 4222
        loop = asyncio.get_running_loop()
        timeout_s = self._connect_timeout_s
        reader: natsframes.FrameReader | None = None
        try:
            async with asyncio.timeout(timeout_s):
                if self._tls_wanted:  # the handshake first: nothing is read or said in clear
                    _, protocol = await loop.create_connection(
                        lambda: natsframes.FrameReader(self),
                        host,
                        port,
                        ssl=self._tls_context(),
                        server_hostname=host,
                        ssl_handshake_timeout=timeout_s,
                    )
                else:
                    _, protocol = await loop.create_connection(lambda: natsframes.FrameReader(self), host, port)
                reader = protocol
                info = await reader.info
                tls = self._tls_wanted or natstls.upgrade_needed(info, wanted=False, url=url)
                if tls and not self._tls_wanted:  # a server that requires TLS of a bus that did not ask for it
                    await reader.start_tls(natstls.client_context(None), server_hostname=host, timeout_s=timeout_s)
                # Whether this anonymous connection may subscribe (a server with auth_required may still have a
                # no_auth_user) is the server's to say: it answers -ERR and closes, or PONG.
                reader.write(self._handshake(info, tls=tls))
                await reader.pong
        except asyncio.CancelledError:
            if reader is not None:
                reader.abort()
            raise
        except ssl.SSLCertVerificationError as exc:
            if reader is not None:
                reader.abort()
            raise BusUnavailable(
                f"{url}: the server's certificate is not trusted ({exc.verify_message}): check --nats-ca and that the "
                f"certificate names {host}"
            ) from exc
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

    def _tls_context(self) -> ssl.SSLContext:
        """A fresh client context, reading the CA file now (a rotated one is picked up); an unreadable file is a
        ``BusUnavailable`` (retried: mid-rotation the file may be back in a moment)."""
        try:
            return natstls.client_context(self._tls_ca)
        except ConfigError as exc:
            raise BusUnavailable(str(exc)) from exc

    def _handshake(self, info: Mapping[str, Any], *, tls: bool) -> bytes:
        # verbose off (no +OK per command), headers off (the server sends plain MSG, without any headers), echo on
        # (a message this process publishes elsewhere on the subject is still one to read).
        options = {
            "verbose": False,
            "pedantic": False,
            "tls_required": tls,
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

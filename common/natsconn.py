"""The NATS adapter: ``NatsBus``, the ``common.messaging.MessageBus`` over nats-py, and the only module that
imports ``nats``. nats-py's exceptions are translated here into ``common.errors``; nothing else ever sees them.

Why it is shaped this way:
- An agent must keep sampling while NATS is down and publish its *latest* sample when NATS returns, never a
  backlog. So ``publish`` refuses at once (``BusUnavailable``) while disconnected instead of letting nats-py queue
  into its pending buffer, and the caller keeps only the newest message.
- nats-py reconnects by itself once connected, at a fixed ``reconnect_time_wait``; a fleet of agents that lost one
  server would then retry in lockstep. We pass a ``reconnect_to_server_handler`` that applies our capped, jittered
  :class:`common.backoff.Backoff`, and the first connection uses the same policy through ``common.retrying``
  (nats-py gives up on a first connect that fails).
- Authentication is by nkey: one seed file per role, mounted from a Secret; or, for an agent where the server runs
  the auth callout, by its pod's projected ServiceAccount token (``token_file``), read again at every (re)connect
  because the kubelet renews it.
- ``serve_requests`` answers requests in a queue group, each on a task of its own (the scheduler's auth callout:
  one slow answer must not hold the others back, and every replica serves).
- TLS is server-side, with the server's CA pinned (``tls_ca``, the commands' ``--nats-ca``), the handshake first
  (``common.natstls`` says why). The CA file is read again before every reconnect, so a rotated CA is picked up
  without a restart.
- A cluster is a list of servers (``servers``, comma-separated); the servers advertise no others (``no_advertise``
  in deploy/base/nats/nats.conf), so every server a client may dial is one it was given, by a name the certificate
  carries.
- Permission violations arrive asynchronously through nats-py's error callback; they are logged and counted, and
  never kill the connection's user.
- A firehose (the scheduler's telemetry) does not go through nats-py's subscriptions: ``subscribe_batches`` hands
  it to ``common.natsbatches``, a connection of its own that reads NATS's frames itself (``common.natsframes`` says
  why), TLS included, except for servers it cannot reach (credentials in the URL, websockets), where nats-py's
  subscriptions are batched the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import nats
import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client, Server
from nats.aio.msg import Msg

from common import credentials, logs, natsbatches, natsframes, natstls, retrying, subjects, tasks
from common.backoff import Backoff
from common.errors import BusError, BusPermissionDenied, BusUnavailable, ConfigError
from common.messaging import BatchHandler, BusCounters, Handler, MessageBus, Subscription

# MessageBus and Subscription were defined here before ``common.messaging``; kept importable from here.
__all__ = ["DEFAULT_PING_INTERVAL_S", "BusCounters", "MessageBus", "NatsBus", "Subscription"]

log = logs.get("natsconn")

# nats-py's default (DEFAULT_PING_INTERVAL): a connection that stays silent is checked every two minutes.
DEFAULT_PING_INTERVAL_S: Final = 120.0


@dataclasses.dataclass(slots=True, kw_only=True)
class _NatsSubscription:
    sub: Any

    async def unsubscribe(self) -> None:
        try:
            await self.sub.unsubscribe()
        except (nats.errors.Error, ConnectionError) as exc:
            log.debug("unsubscribe_failed", error=str(exc))


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class _ServedRequests:
    """A ``serve_requests`` registration: subscribed again on a client made afresh."""

    subject: str
    queue: str
    deliver: Callable[[Msg], Awaitable[None]]
    owner: set[_ServedRequests]
    current: _NatsSubscription | None = None

    async def subscribe(self, client: Client) -> None:
        try:
            sub = await client.subscribe(self.subject, queue=self.queue, cb=self.deliver)
        except (nats.errors.Error, OSError) as exc:
            raise BusUnavailable(f"subscribe to {self.subject} in queue {self.queue} failed: {exc}") from exc
        self.current = _NatsSubscription(sub=sub)

    async def unsubscribe(self) -> None:
        self.owner.discard(self)
        if self.current is not None:
            await self.current.unsubscribe()


@dataclasses.dataclass(slots=True, kw_only=True)
class _NatsSubscriptions:
    subs: tuple[_NatsSubscription, ...]

    async def unsubscribe(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()


class NatsBus:
    """A ``MessageBus`` over nats-py (see ``common.messaging`` for the contract). ``connect`` waits for the first
    connection with backoff, ``connect_once`` tries once; nats-py reconnects by itself after that."""

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
        tls_ca: Path | None = None,
        stream_replicas: int = 1,
        token_file: Path | None = None,
    ) -> None:
        """``tls_ca``: the CA the servers' certificates must be signed by (TLS whatever the URLs say); without it, TLS
        with the system's CAs where a URL says ``tls://`` or a server requires it. ``stream_replicas``: the
        ``QUOTIENT_TELEMETRY`` stream's replicas when this bus declares it (1 for one server, 3 for deploy's
        cluster)."""
        if not 1 <= stream_replicas <= 5:  # JetStream's limit on a stream's replicas
            raise ValueError(f"stream_replicas must be within 1..5: {stream_replicas}")
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
        self._batch_subscriptions: set[natsbatches.BatchSubscription] = set()
        self._token_file = token_file
        self._responders = tasks.TaskSet(f"nats-requests-{name}")
        self._replacing = False
        self._served: set[_ServedRequests] = set()
        self._stream_replicas = stream_replicas
        # Read and check the CA now, like the seed: a wrong path is a clear ConfigError at start.
        self._tls_ca = tls_ca
        self._tls_wanted = natstls.wants_tls(urls=self._servers, ca=tls_ca)
        self._tls_context: ssl.SSLContext | None = natstls.client_context(tls_ca) if self._tls_wanted else None

    # -- connection ------------------------------------------------------------------------------------------------

    async def connect_once(self, *, timeout_s: float = 2.0) -> None:
        """One connection attempt; raises ``BusUnavailable`` or ``BusPermissionDenied``."""
        if self._token_file is not None and not self._read_token():
            raise BusUnavailable(f"no token to connect with in {self._token_file} (yet)")
        try:
            self._client = await nats.connect(
                servers=self._servers,
                name=self._name,
                nkeys_seed_str=self._seed_text,
                # Called at every (re)connect: the kubelet renews a projected token in place.
                token=self._read_token if self._token_file is not None else None,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                connect_timeout=timeout_s,
                # Whatever is published while reconnecting is refused by us, so the buffer only needs to hold
                # the little that is in flight at the moment of a disconnect.
                pending_size=256 * 1024,
                reconnect_to_server_handler=self._pick_server,
                # None: nats-py makes a default context only for a server that requires TLS. Wanted: the handshake
                # first, so a server's INFO in clear (which anyone between could forge) decides nothing.
                tls=self._tls_context,
                tls_handshake_first=self._tls_wanted,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                closed_cb=self._on_closed,
                reconnected_cb=self._on_reconnected,
            )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            refused = isinstance(exc, nats.errors.AuthorizationError) or "authorization" in str(exc).lower()
            if refused and self._token_file is not None:
                # The auth callout refused the token: it may be down, or the token not yet renewed. Retried.
                raise BusUnavailable(f"NATS refused the token of {self._name} in {self._token_file}: {exc}") from exc
            if refused:
                raise BusPermissionDenied(f"NATS refused the credentials of {self._name}: {exc}") from exc
            raise BusUnavailable(f"cannot connect to {','.join(self._servers)}: {exc or type(exc).__name__}") from exc

    async def connect(self) -> None:
        """Connect, retrying with capped jittered backoff until it works (or the task is cancelled);
        ``BusPermissionDenied`` is not retried."""

        def failed(calls: int, exc: BaseException, delay_s: float) -> None:
            log.warning("nats_connect_failed", error=str(exc), retry_in_s=round(delay_s, 2), attempt=calls - 1)

        await retrying.retry(self.connect_once, backoff=self._backoff, retry_on=BusUnavailable, on_retry=failed)
        log.info("nats_connected", servers=",".join(self._servers), name=self._name)

    def _read_token(self) -> str:
        """The token in ``token_file`` now; "" (the server then refuses, and the bus retries) when it cannot be read."""
        assert self._token_file is not None
        try:
            return self._token_file.read_text().strip()
        except OSError as exc:
            log.warning("nats_token_unreadable", file=str(self._token_file), error=exc.strerror or str(exc))
            return ""

    def _pick_server(self, servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        # nats-py calls this before every reconnect attempt; Server.reconnects counts failed tries of that server.
        server = min(servers, key=lambda s: s.reconnects) if servers else None
        attempts = server.reconnects if server is not None else 0
        if self._tls_context is not None and self._tls_ca is not None:
            try:
                natstls.reload_ca(self._tls_context, self._tls_ca)
            except ConfigError as exc:  # mid-rotation, a missing file: the CAs already loaded still apply
                log.warning("nats_ca_unreadable", error=str(exc))
        return server, self._backoff.delay_s(attempts, random.random)

    async def _on_error(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        self.counters.last_error = text
        if "permissions violation" in text.lower() or isinstance(exc, nats.errors.AuthorizationError):
            self.counters.permission_errors += 1
            log.error("nats_permission_denied", error=text, name=self._name)
        elif isinstance(exc, ssl.SSLError):
            # A certificate not signed by --nats-ca, or without the server's name: nats-py retries, the operator
            # must hear of it.
            self.counters.async_errors += 1
            log.warning("nats_tls_failed", error=text, name=self._name, ca=str(self._tls_ca or "system"))
        else:
            self.counters.async_errors += 1
            log.debug("nats_error", error=text)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.counters.disconnects += 1
        log.warning("nats_disconnected", name=self._name)

    async def _on_closed(self) -> None:
        # nats-py gives a connection up for good on any -ERR that ends it, such as "User Authentication Expired" when
        # the auth callout's grant runs out: connect afresh (with a fresh token) unless we are the ones closing. Only
        # the current client counts, once: a failed attempt's client closes too.
        client = self._client
        if self._closing or self._replacing or client is None or not client.is_closed:
            return
        self._replacing = True
        log.warning("nats_connection_closed", name=self._name, error=self.counters.last_error)
        self._responders.spawn(self._connect_again(), name="connect-after-close")

    async def _connect_again(self) -> None:
        try:
            await self.connect()
        finally:
            self._replacing = False
        for served in list(self._served):  # the old client's subscriptions went with it
            try:
                await served.subscribe(self._require())
            except BusUnavailable as exc:
                log.error("nats_requests_not_served", subject=served.subject, error=str(exc))
        await self._on_reconnected()

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
        arrival order within each filter, over a connection of this subscription's own where it can
        (``common.natsbatches``; there the order holds across filters too).

        Raises ``BusUnavailable`` when no server takes the subscription now and ``BusPermissionDenied`` when the
        server refuses it. Once it is live it survives outages: it reconnects with the bus's backoff, re-subscribes,
        and counts one ``counters.reconnects`` when live again. ``on_batch`` runs on the event loop and must not block
        for long; an exception in it is logged and the messages of that call are lost, nothing else.
        """
        if not subject_filters:
            raise ValueError("subscribe_batches needs at least one subject filter")
        if self._closing:
            raise BusUnavailable("the bus is closed")
        if not all(natsbatches.speaks(url) for url in self._servers):
            return await self._subscribe_batches_through_client(subject_filters, on_batch)
        subscription = natsbatches.BatchSubscription(
            subject_filters=tuple(subject_filters),
            on_batch=on_batch,
            servers=tuple(self._servers),
            name=self._name,
            backoff=self._backoff,
            counters=self.counters,
            connect_timeout_s=self._connect_timeout_s,
            ping_interval_s=self._ping_interval_s,
            seed=self._seed_text.encode("ascii") if self._seed_text is not None else None,
            tls_ca=self._tls_ca,
            tls_wanted=self._tls_wanted,
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
            natsframes.deliver(on_batch, batch)

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

    async def serve_requests(
        self,
        subject: str,
        *,
        queue: str,
        handler: Callable[[bytes], Awaitable[bytes | None]],
        concurrency: int = 64,
    ) -> Subscription:
        """Answer each request on ``subject`` with what ``handler`` returns (None: no answer), as one member of the
        queue group ``queue`` (the server hands each request to one member). Requests are answered concurrently, at
        most ``concurrency`` at once; a handler that fails is logged and its request goes unanswered. The
        subscription survives reconnects (nats-py subscribes again) and a connection made afresh after nats-py
        gave one up (subscribed again here)."""
        limit = asyncio.Semaphore(concurrency)

        async def answer(msg: Msg) -> None:
            async with limit:
                reply = await handler(msg.data)
                if reply is not None and msg.reply:
                    try:
                        await msg.respond(reply)
                    except (nats.errors.Error, OSError) as exc:
                        log.warning("nats_reply_failed", subject=subject, error=str(exc) or type(exc).__name__)

        async def deliver(msg: Msg) -> None:
            self._responders.spawn(answer(msg), name=f"request:{subject}")

        served = _ServedRequests(subject=subject, queue=queue, deliver=deliver, owner=self._served)
        await served.subscribe(self._require())
        self._served.add(served)
        return served

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
        await self._responders.cancel()
        if client is None or client.is_closed:
            return
        try:
            await client.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await client.close()

    # -- JetStream ---------------------------------------------------------------------------------------------------

    async def declare_telemetry_stream(self) -> None:
        """Create or update ``QUOTIENT_TELEMETRY``: memory storage, the last message of each telemetry and health
        subject, so a starting scheduler reads every node's last sample and health at once; ``stream_replicas``
        copies on a cluster.

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
            # Replicated on a cluster (deploy: 3), so losing the server that leads the stream loses no node's last
            # sample; the scheduler's --telemetry-stream-replicas.
            num_replicas=self._stream_replicas,
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

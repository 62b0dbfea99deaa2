"""The scheduler's telemetry consumer: the newest ``NodeTelemetry`` and ``NodeHealth`` of every node, from NATS.

Why it is shaped this way:
- Budget: 20,000 node messages per second on one core (5,000 nodes of 8 GPUs at 4 Hz, issue 7). Per-message
  Python work in an asyncio callback does not reach it: the bus hands over every socket read's messages as one list
  (``subscribe_batches``, which where it can reads NATS frames itself rather than through nats-py's per-message
  machinery: ``common.natsframes`` says why), the consumer only appends that list to a buffer, and the buffer is
  decoded and applied in batches (``max_batch`` messages, or whatever arrived within ``flush_interval_s``) by
  ``scheduler.telemetry.feed.readings``, the synchronous core that keeps the newest of each node.
- Hostile or broken publishers must not hurt the scheduler: what arrives while the buffer is full is dropped and
  counted at the door, and the core drops and counts, by reason, whatever fails its checks. Memory is bounded: the
  buffer by messages and bytes, the state by a cap on nodes, and nodes not heard from for ``forget_after_s`` are
  forgotten.
- The scheduler's loop never blocks on NATS: it reads plain values (``latest()``, ``health()``) and learns what
  changed through ``take_changes()`` and the ``changed`` event. No placement waits for a message.
- Start and outages: the ``QUOTIENT_TELEMETRY`` stream keeps the last message of every subject, so the consumer
  subscribes live first (nothing is missed), then replays the stream's last values; the ``SequenceGate`` keeps the
  newest of both. The subscription survives reconnects, but what was published during the outage is only in the
  stream (and a restarted server with memory storage has lost the stream), so on every reconnect the consumer
  declares the stream again and replays it, counting the gap.
- Trust: no publisher can mute a node or make the scheduler believe a stamp far from its own clock
  (``readings``, ``conflicts``; docs/telemetry-trust.md); the telemetry loop asks ``check_conflicts`` on its sweep
  and ``why_rejected`` for the staleness alert's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Final, Protocol

from common import logs, messaging, retrying, subjects
from common.backoff import Backoff
from common.errors import BusError
from scheduler.telemetry import overuse
from scheduler.telemetry.feed import readings

log = logs.get("telemetry.consumer")

# One telemetry message of an 8-GPU node with 32 processes is about 3 kB; 512 of them decode in a few milliseconds,
# which bounds how long one batch holds the event loop.
DEFAULT_MAX_BATCH: Final = 512
# A few milliseconds: far below any sampling interval (250 ms at 4 Hz), long enough to gather a batch under load.
DEFAULT_FLUSH_INTERVAL_S: Final = 0.005
# Well above the largest clusters Quotient targets (5,000 GPU nodes), so forged node names cannot grow state forever.
DEFAULT_MAX_NODES: Final = 20_000
# A node silent for an hour is gone or renamed; the staleness alert has fired long before.
DEFAULT_FORGET_AFTER_S: Final = 3600.0
# Two seconds of the full budget (20,000 msg/s), and 64 MiB (about twenty thousand 3 kB messages): a flood beyond
# that is dropped and counted at the door instead of piling up in memory.
DEFAULT_MAX_BUFFERED_MESSAGES: Final = 40_000
DEFAULT_MAX_BUFFERED_BYTES: Final = 64 * 1024 * 1024
# NTP keeps clocks within milliseconds; 30 s tolerates a badly kept one while refusing what could matter: a stamp an
# hour off, or one far enough to outlive the staleness threshold. The scheduler's --telemetry-max-skew.
DEFAULT_MAX_SKEW_S: Final = 30.0
# A publisher counts as live (a possible rival) for max(3 x its interval, this floor) after its last message: the
# staleness rule and the default of the scheduler's --telemetry-stale-floor, which the scheduler passes here.
DEFAULT_LIVE_FLOOR_S: Final = 10.0


class ReconnectCounts(Protocol):
    @property
    def reconnects(self) -> int: ...


class TelemetryBus(Protocol):
    """What the consumer needs from the bus (``common.natsconn.NatsBus`` has it).

    Contract: every method raises ``BusError`` (``BusUnavailable`` while disconnected) and never blocks on a down
    server beyond its own timeout; ``subscribe_batches`` calls its handler with lists of ``(subject, payload)`` in
    arrival order within each subject filter (the lists are the handler's to keep; telemetry and health have
    separate sequence gates, so their relative order does not matter) and its subscription survives reconnects;
    ``counters.reconnects`` grows by one per reconnect, counted once the subscriptions are live again.
    """

    @property
    def connected(self) -> bool: ...

    @property
    def counters(self) -> ReconnectCounts: ...

    async def subscribe_batches(
        self, subject_filters: Sequence[str], on_batch: messaging.BatchHandler
    ) -> messaging.Subscription: ...

    async def declare_telemetry_stream(self) -> None: ...

    async def last_per_subject(self, subject_filter: str, *, timeout_s: float = 2.0) -> Sequence[tuple[str, bytes]]: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    max_batch: int = DEFAULT_MAX_BATCH
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    max_nodes: int = DEFAULT_MAX_NODES
    forget_after_s: float = DEFAULT_FORGET_AFTER_S
    max_buffered_messages: int = DEFAULT_MAX_BUFFERED_MESSAGES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    replay_timeout_s: float = 2.0
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    live_floor_s: float = DEFAULT_LIVE_FLOOR_S
    retry: Backoff = dataclasses.field(default_factory=lambda: Backoff(base_s=0.1, cap_s=5.0))

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_nodes < 1 or self.max_buffered_messages < 1 or self.max_buffered_bytes < 1:
            raise ValueError(f"consumer limits must be positive: {self}")
        durations = (self.flush_interval_s, self.forget_after_s, self.replay_timeout_s, self.max_skew_s)
        if min(durations) <= 0 or self.live_floor_s <= 0:
            raise ValueError(f"consumer durations must be positive: {self}")


class TelemetryConsumer:
    """Follows ``quotient.v1.telemetry.>`` and ``quotient.v1.health.>`` and keeps the newest of each per node.

    ``run()`` is the long-lived task (until cancelled). ``ingest()`` is its synchronous core, public so tests and the
    simulator can feed payloads without NATS. Reads (``latest``, ``health``, ``take_changes``) are cheap and never
    wait; ``latest()`` and ``health()`` are live read-only views, to be copied by a reader that holds them across an
    ``await`` (``latest()`` builds each ``TelemetrySample`` as it is read: hold the sample, not the view). ``ready``
    is set after the first replay attempt (``counters.replays`` or ``replay_failures`` says how it went); nothing
    needs to wait for it, since placement falls back to requests for nodes without telemetry.
    """

    def __init__(
        self,
        *,
        bus: TelemetryBus,
        config: ConsumerConfig | None = None,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._bus = bus
        self._config = config or ConsumerConfig()
        self._now_ns = now_ns
        self.counters = readings.ConsumerCounters()
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()
        self._readings = readings.NodeReadings(
            counters=self.counters,
            on_change=self.changed.set,
            now_ns=now_ns,
            max_batch=self._config.max_batch,
            max_nodes=self._config.max_nodes,
            forget_after_s=self._config.forget_after_s,
            max_skew_ns=round(self._config.max_skew_s * 1e9),
            live_floor_ns=round(self._config.live_floor_s * 1e9),
        )
        self._buffer: list[tuple[str, bytes]] = []
        self._buffered_bytes = 0
        self._last_sweep_ns = now_ns()
        self._reconnects_seen = 0
        self._replaying = False

    # -- reads -------------------------------------------------------------------------------------------------------

    def latest(self) -> Mapping[str, readings.TelemetrySample]:
        return self._readings.latest()

    def health(self) -> Mapping[str, readings.HealthSample]:
        return self._readings.health()

    def take_changes(self) -> readings.ChangeSet:
        """What changed since the last call; clears ``changed``."""
        changes = self._readings.take_changes()
        self.changed.clear()
        return changes

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def why_rejected(self, node: str) -> str | None:
        """Why ``node`` is quiet when its messages were rejected since its last accepted one (for people); else None."""
        return self._readings.why_rejected(node)

    def check_conflicts(self, *, now_ns: int, known: Container[str]) -> tuple[overuse.Transition, ...]:
        """``TelemetryConflict`` firing for the nodes of the cluster with two live publishers, resolving for those
        down to one (``conflicts``), since the last check."""
        return self._readings.check_conflicts(now_ns=now_ns, known=known)

    # -- the task ----------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Subscribe (retrying with backoff until the bus takes it), replay the stream, then apply batches until
        cancelled. After every reconnect of the bus the stream is declared and replayed again; a replay that fails
        is retried with backoff while the live feed goes on."""
        subscription = await self._subscribe()
        loop = asyncio.get_running_loop()
        self._reconnects_seen = self._bus.counters.reconnects
        # Not common.retrying: a replay is retried between flushes, never blocking the live feed, and a reconnect
        # starts its backoff over.
        replay_due, replay_attempt, next_replay_at = True, 0, 0.0
        try:
            while True:
                reconnects = self._bus.counters.reconnects
                if reconnects != self._reconnects_seen:
                    self.counters.gaps += reconnects - self._reconnects_seen
                    self._reconnects_seen = reconnects
                    log.info("telemetry_resync", reconnects=reconnects)
                    replay_due, replay_attempt, next_replay_at = True, 0, 0.0
                if replay_due and self._bus.connected and loop.time() >= next_replay_at:
                    if await self._replay():
                        replay_due = False
                    else:
                        next_replay_at = loop.time() + self._config.retry.delay_s(replay_attempt)
                        replay_attempt += 1
                    self.ready.set()
                self.flush()
                await asyncio.sleep(self._config.flush_interval_s)
        finally:
            with contextlib.suppress(BusError):
                await subscription.unsubscribe()

    async def _subscribe(self) -> messaging.Subscription:
        def failed(_calls: int, exc: BaseException, delay_s: float) -> None:
            log.warning("telemetry_subscribe_failed", error=str(exc), retry_in_s=round(delay_s, 2))

        subject_filters = (subjects.TELEMETRY_ALL, subjects.HEALTH_ALL)
        return await retrying.retry(
            lambda: self._bus.subscribe_batches(subject_filters, self._receive),
            backoff=self._config.retry,
            retry_on=BusError,
            on_retry=failed,
        )

    async def _replay(self) -> bool:
        """Declare the stream (a restarted memory-storage server has lost it) and apply its last value per subject;
        False (counted and logged) when the bus failed."""
        # Live messages that arrive meanwhile only wait in the buffer: applying them before the (older) replayed ones
        # would make the replayed ones count as out of sequence.
        self._replaying = True
        try:
            await self._bus.declare_telemetry_stream()
            replayed = [
                *await self._bus.last_per_subject(subjects.TELEMETRY_ALL, timeout_s=self._config.replay_timeout_s),
                *await self._bus.last_per_subject(subjects.HEALTH_ALL, timeout_s=self._config.replay_timeout_s),
            ]
        except BusError as exc:
            self.counters.replay_failures += 1
            log.warning("telemetry_replay_failed", error=str(exc))
            return False
        finally:
            self._replaying = False
        self.counters.replays += 1
        # Replayed messages are older than (or the same as) anything live, so the live buffer goes after them. Both
        # overlap what was applied before (and a live message that waited may be older than the stream's copy of a
        # later one): a message behind its stream is superseded there, not a second publisher.
        live, self._buffer, self._buffered_bytes = self._buffer, [], 0
        self._readings.ingest(replayed, replay=True)
        self._readings.ingest(live, replay=True)
        log.info("telemetry_replayed", messages=len(replayed), nodes=self._readings.nodes)
        return True

    def _receive(self, messages: list[tuple[str, bytes]]) -> None:
        """The subscription's handler: buffer only (the hot path); a full batch is applied at once."""
        buffer = self._buffer
        config = self._config
        size = 0
        for _, payload in messages:
            size += len(payload)
        if (
            len(buffer) + len(messages) <= config.max_buffered_messages
            and self._buffered_bytes + size <= config.max_buffered_bytes
        ):
            buffer += messages
            self._buffered_bytes += size
        else:  # near the limits: message by message, so exactly those beyond them are dropped
            for message in messages:
                size = len(message[1])
                if (
                    len(buffer) >= config.max_buffered_messages
                    or self._buffered_bytes + size > config.max_buffered_bytes
                ):
                    self.counters.dropped_buffer_full += 1
                    continue
                buffer.append(message)
                self._buffered_bytes += size
        if len(buffer) >= config.max_batch and not self._replaying:
            self.flush()

    def flush(self) -> None:
        """Apply what is buffered, then forget silent nodes when a sweep is due."""
        if self._buffer:
            batch, self._buffer, self._buffered_bytes = self._buffer, [], 0
            self._readings.ingest(batch)
        now_ns = self._now_ns()
        if now_ns - self._last_sweep_ns >= self._config.forget_after_s * 1e9 / 10:
            self._last_sweep_ns = now_ns
            self._readings.forget_silent(now_ns)

    # -- the core (scheduler.telemetry.feed.readings) ---------------------------------------------------------------

    def ingest(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Decode and apply ``(subject, payload)`` pairs, in order, in batches of at most ``max_batch``."""
        self._readings.ingest(messages)

    def forget_silent(self, now_ns: int) -> frozenset[str]:
        """Forget every node not heard from for ``forget_after_s``; returns them (also reported as ``forgotten``)."""
        return self._readings.forget_silent(now_ns)

    def forget(self, node: str) -> None:
        """Drop everything about ``node`` (a deleted node); its next message is accepted as a first one."""
        self._readings.forget(node)

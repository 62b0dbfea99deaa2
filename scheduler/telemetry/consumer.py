"""The scheduler's telemetry consumer: the newest ``NodeTelemetry`` and ``NodeHealth`` of every node, from NATS.

Why it is shaped this way:
- Budget: 20,000 node messages per second on one core (5,000 nodes of 8 GPUs at 4 Hz, issue 7). Per-message
  Python work in an asyncio callback does not reach it: the bus hands over every socket read's messages as one list
  (``subscribe_batches``, which where it can reads NATS frames itself rather than through nats-py's per-message
  machinery: ``common.natsconn`` says when), the consumer only appends that list to a buffer, and the buffer is
  decoded and applied in batches (``max_batch`` messages, or whatever arrived within ``flush_interval_s``), with
  msgspec's typed decoder doing the validation in C (``common.wire``) and the per-message Python that is left kept
  to a few dictionary operations.
- Hostile or broken publishers must not hurt the scheduler: every message that fails the strict decoder, comes out
  of sequence (``SequenceGate``), names another node than its subject, or arrives while the buffer is full is
  dropped and counted by reason, never raised. Memory is bounded: the buffer by messages and bytes, the state by a
  cap on nodes, and nodes not heard from for ``forget_after_s`` are forgotten.
- The scheduler's loop never blocks on NATS: it reads plain values (``latest()``, ``health()``) and learns what
  changed through ``take_changes()`` and the ``changed`` event. No placement waits for a message.
- Start and outages: the ``QUOTIENT_TELEMETRY`` stream keeps the last message of every subject, so the consumer
  subscribes live first (nothing is missed), then replays the stream's last values; the ``SequenceGate`` keeps the
  newest of both. nats-py re-subscribes by itself after a reconnect, but what was published during the outage is
  only in the stream (and a restarted server with memory storage has lost the stream), so on every reconnect the
  consumer declares the stream again and replays it, counting the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, Protocol

from common import logs, subjects, wire
from common.backoff import Backoff
from common.errors import BusError, WireError, WireReason

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


class ReconnectCounts(Protocol):
    @property
    def reconnects(self) -> int: ...


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


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
        self, subject_filters: Sequence[str], on_batch: Callable[[list[tuple[str, bytes]]], None]
    ) -> Subscription: ...

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
    retry: Backoff = dataclasses.field(default_factory=lambda: Backoff(base_s=0.1, cap_s=5.0))

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_nodes < 1 or self.max_buffered_messages < 1 or self.max_buffered_bytes < 1:
            raise ValueError(f"consumer limits must be positive: {self}")
        if self.flush_interval_s <= 0 or self.forget_after_s <= 0 or self.replay_timeout_s <= 0:
            raise ValueError(f"consumer durations must be positive: {self}")


def _zero_per_reason() -> dict[WireReason, int]:
    return dict.fromkeys(WireReason, 0)


@dataclasses.dataclass(slots=True)
class ConsumerCounters:
    """Plain counters for the scheduler's metrics (``quotient_telemetry_*``); they only grow."""

    received: int = 0  # messages handed over by the subscription or a replay
    accepted_telemetry: int = 0
    accepted_health: int = 0
    agent_restarts: int = 0  # accepted messages of a new boot that superseded a node's previous one
    # The very message already accepted, or a live one that waited out a replay holding a newer one: where the
    # replay and the live feed overlap. Not a rejection.
    duplicates: int = 0
    rejected: dict[WireReason, int] = dataclasses.field(default_factory=_zero_per_reason)
    dropped_buffer_full: int = 0  # refused at the door: the buffer held max_buffered_messages or _bytes
    dropped_node_limit: int = 0  # valid, but from a new node beyond max_nodes
    forgotten_nodes: int = 0
    batches: int = 0
    gaps: int = 0  # reconnects seen: live messages of the outage may be lost, the stream replay fills in
    replays: int = 0
    replay_failures: int = 0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySample:
    telemetry: wire.NodeTelemetry
    received_ns: int  # on the scheduler's wall clock, comparable with the message's ts_ns


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HealthSample:
    health: wire.NodeHealth
    received_ns: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChangeSet:
    """Nodes whose telemetry or health changed, and nodes forgotten, since the previous ``take_changes``."""

    telemetry: frozenset[str] = frozenset()
    health: frozenset[str] = frozenset()
    forgotten: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.telemetry or self.health or self.forgotten)


_TELEMETRY_PREFIX: Final = subjects.TELEMETRY_PREFIX + "."
_HEALTH_PREFIX: Final = subjects.HEALTH_PREFIX + "."


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
        self.counters = ConsumerCounters()
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()
        # The newest message of each node and when it came, kept apart rather than as TelemetrySample objects:
        # building one per message (20,000 a second) costs about a microsecond each, and most are superseded before
        # anything reads them (a scheduling cycle reads a node once, however many samples came meanwhile), so
        # ``latest()`` builds the samples on reading.
        self._telemetry: dict[str, wire.NodeTelemetry] = {}
        self._telemetry_received_ns: dict[str, int] = {}
        self._health: dict[str, HealthSample] = {}
        self._heard_ns: dict[str, int] = {}
        self._telemetry_gate = wire.SequenceGate()
        self._health_gate = wire.SequenceGate()
        self._buffer: list[tuple[str, bytes]] = []
        self._buffered_bytes = 0
        self._subject_nodes: dict[str, str] = {}  # telemetry subject -> node, so a subject is parsed once
        self._changed_telemetry: set[str] = set()
        self._changed_health: set[str] = set()
        self._forgotten: set[str] = set()
        self._last_sweep_ns = now_ns()
        self._reconnects_seen = 0
        self._replaying = False
        self._superseded_ok = False  # while applying live messages that waited for a replay

    # -- reads -------------------------------------------------------------------------------------------------------

    def latest(self) -> Mapping[str, TelemetrySample]:
        return _LatestSamples(self._telemetry, self._telemetry_received_ns)

    def health(self) -> Mapping[str, HealthSample]:
        return types.MappingProxyType(self._health)

    def take_changes(self) -> ChangeSet:
        """What changed since the last call; clears ``changed``."""
        changes = ChangeSet(
            telemetry=frozenset(self._changed_telemetry),
            health=frozenset(self._changed_health),
            forgotten=frozenset(self._forgotten),
        )
        self._changed_telemetry.clear()
        self._changed_health.clear()
        self._forgotten.clear()
        self.changed.clear()
        return changes

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # -- the task ----------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Subscribe (retrying with backoff until the bus takes it), replay the stream, then apply batches until
        cancelled. After every reconnect of the bus the stream is declared and replayed again; a replay that fails
        is retried with backoff while the live feed goes on."""
        subscriptions = await self._subscribe()
        loop = asyncio.get_running_loop()
        self._reconnects_seen = self._bus.counters.reconnects
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
            for subscription in subscriptions:
                with contextlib.suppress(BusError):
                    await subscription.unsubscribe()

    async def _subscribe(self) -> list[Subscription]:
        attempt = 0
        while True:
            try:
                subject_filters = (subjects.TELEMETRY_ALL, subjects.HEALTH_ALL)
                return [await self._bus.subscribe_batches(subject_filters, self._receive)]
            except BusError as exc:
                delay = self._config.retry.delay_s(attempt)
                log.warning("telemetry_subscribe_failed", error=str(exc), retry_in_s=round(delay, 2))
                attempt += 1
                await asyncio.sleep(delay)

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
        # Replayed messages are older than (or the same as) anything live, so the live buffer goes after them.
        live, self._buffer, self._buffered_bytes = self._buffer, [], 0
        self.ingest(replayed)
        # A live message that waited may be older than the stream's copy of a later one: superseded, not forged.
        self._superseded_ok = True
        try:
            self.ingest(live)
        finally:
            self._superseded_ok = False
        log.info("telemetry_replayed", messages=len(replayed), nodes=len(self._heard_ns))
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
            self.ingest(batch)
        now_ns = self._now_ns()
        if now_ns - self._last_sweep_ns >= self._config.forget_after_s * 1e9 / 10:
            self._last_sweep_ns = now_ns
            self.forget_silent(now_ns)

    # -- the core ----------------------------------------------------------------------------------------------------

    def ingest(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Decode and apply ``(subject, payload)`` pairs, in order, in batches of at most ``max_batch``."""
        step = self._config.max_batch
        for start in range(0, len(messages), step):
            self._ingest_batch(messages[start : start + step])

    def _ingest_batch(self, batch: Sequence[tuple[str, bytes]]) -> None:
        counters = self.counters
        counters.batches += 1
        counters.received += len(batch)
        received_ns = self._now_ns()
        # The hot loops below run 20,000 times a second: plain locals, one dictionary look-up per subject, and the
        # checks ordered so that an ordinary sample takes the shortest path.
        subject_nodes = self._subject_nodes
        payloads: list[bytes] = []
        nodes: list[str] = []
        for subject, payload in batch:
            node = subject_nodes.get(subject)
            if node is None:
                node = self._telemetry_node(subject, payload, received_ns)
                if node is None:
                    continue
            payloads.append(payload)
            nodes.append(node)
        if not payloads:
            return
        results = wire.decode_telemetry_batch(payloads, subject_nodes=nodes)
        admit = self._telemetry_gate.admit
        latest = self._telemetry
        latest_received = self._telemetry_received_ns
        heard = self._heard_ns
        changed = self._changed_telemetry
        max_nodes = self._config.max_nodes
        accepted_verdict = wire.Admission.ACCEPTED
        accepted = 0
        for result in results:
            if isinstance(result, WireError):
                counters.rejected[result.reason] += 1
                continue
            node = result.node
            if node not in heard and len(heard) >= max_nodes:
                counters.dropped_node_limit += 1
                continue
            verdict = admit(node, boot=result.boot, seq=result.seq, ts_ns=result.ts_ns)
            if verdict is accepted_verdict or verdict is wire.Admission.RESTARTED:
                if verdict is not accepted_verdict:
                    counters.agent_restarts += 1
                latest[node] = result
                latest_received[node] = received_ns
                heard[node] = received_ns
                changed.add(node)
                accepted += 1
                continue
            previous = latest.get(node)
            if self._superseded_ok or (
                previous is not None and previous.seq == result.seq and previous.boot == result.boot
            ):
                counters.duplicates += 1
            else:
                counters.rejected[WireReason.OUT_OF_SEQUENCE] += 1
        if accepted:
            counters.accepted_telemetry += accepted
            self.changed.set()

    def _telemetry_node(self, subject: str, payload: bytes, received_ns: int) -> str | None:
        """The node of a telemetry subject not seen lately (remembered for the next time); None for any other
        subject, after applying a health message or counting a subject that is not ours or names no node."""
        if subject.startswith(_TELEMETRY_PREFIX):
            node = _node_of(subject, _TELEMETRY_PREFIX)
            if node is None:
                self.counters.rejected[WireReason.SUBJECT_MISMATCH] += 1
                return None
            if len(self._subject_nodes) >= 2 * self._config.max_nodes:  # forged subjects cannot grow it forever
                self._subject_nodes.clear()
            self._subject_nodes[subject] = node
            return node
        if subject.startswith(_HEALTH_PREFIX):
            self._apply_health(subject, payload, received_ns)
        else:
            self.counters.rejected[WireReason.SUBJECT_MISMATCH] += 1
        return None

    def _apply_health(self, subject: str, payload: bytes, received_ns: int) -> None:
        # Health comes on change only (a handful per node per day), so one decode call per message is enough.
        node = _node_of(subject, _HEALTH_PREFIX)
        if node is None:
            self.counters.rejected[WireReason.SUBJECT_MISMATCH] += 1
            return
        try:
            message = wire.decode_health(payload, subject_node=node)
        except WireError as exc:
            self.counters.rejected[exc.reason] += 1
            return
        if node not in self._heard_ns and len(self._heard_ns) >= self._config.max_nodes:
            self.counters.dropped_node_limit += 1
            return
        verdict = self._health_gate.admit_message(message)
        if not verdict.accepted:
            previous = self._health.get(node)
            if self._superseded_ok or (
                previous is not None and (previous.health.boot, previous.health.seq) == (message.boot, message.seq)
            ):
                self.counters.duplicates += 1
            else:
                self.counters.rejected[WireReason.OUT_OF_SEQUENCE] += 1
            return
        if verdict is wire.Admission.RESTARTED:
            self.counters.agent_restarts += 1
        self._health[node] = HealthSample(health=message, received_ns=received_ns)
        self._heard_ns[node] = received_ns
        self._changed_health.add(node)
        self.counters.accepted_health += 1
        self.changed.set()

    def forget_silent(self, now_ns: int) -> frozenset[str]:
        """Forget every node not heard from for ``forget_after_s``; returns them (also reported as ``forgotten``)."""
        horizon_ns = now_ns - int(self._config.forget_after_s * 1e9)
        silent = frozenset(node for node, heard_ns in self._heard_ns.items() if heard_ns < horizon_ns)
        for node in silent:
            self.forget(node)
        return silent

    def forget(self, node: str) -> None:
        """Drop everything about ``node`` (a deleted node); its next message is accepted as a first one."""
        if self._heard_ns.pop(node, None) is None:
            return
        self._telemetry.pop(node, None)
        self._telemetry_received_ns.pop(node, None)
        self._health.pop(node, None)
        self._telemetry_gate.forget(node)
        self._health_gate.forget(node)
        self._changed_telemetry.discard(node)
        self._changed_health.discard(node)
        self._forgotten.add(node)
        self.counters.forgotten_nodes += 1
        self.changed.set()


def _node_of(subject: str, prefix: str) -> str | None:
    token = subject[len(prefix) :]
    if not token or "." in token:
        return None
    return subjects.node_from_token(token)


class _LatestSamples(Mapping[str, TelemetrySample]):
    """``TelemetryConsumer.latest()``: a live read-only view that builds each ``TelemetrySample`` when it is read."""

    __slots__ = ("_received_ns", "_telemetry")

    def __init__(self, telemetry: Mapping[str, wire.NodeTelemetry], received_ns: Mapping[str, int]) -> None:
        self._telemetry = telemetry
        self._received_ns = received_ns

    def __getitem__(self, node: str) -> TelemetrySample:
        return TelemetrySample(telemetry=self._telemetry[node], received_ns=self._received_ns[node])

    def __contains__(self, node: object) -> bool:
        return node in self._telemetry

    def __iter__(self) -> Iterator[str]:
        return iter(self._telemetry)

    def __len__(self) -> int:
        return len(self._telemetry)

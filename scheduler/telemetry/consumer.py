"""The scheduler's telemetry consumer: the newest ``NodeTelemetry`` and ``NodeHealth`` of every node, from NATS.

Why it is shaped this way:
- Budget: 20,000 node messages per second on one core (5,000 nodes of 8 GPUs at 4 Hz, issue 7). Per-message
  Python work in an asyncio callback does not reach it, so the subscription callback only appends ``(subject,
  payload)`` to a buffer; the buffer is decoded and applied in batches (``max_batch`` messages, or whatever arrived
  within ``flush_interval_s``), with msgspec's typed decoder doing the validation in C (``common.wire``).
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
    server beyond its own timeout; ``subscribe``'s handler is called once per message and a subscription survives
    reconnects; ``counters.reconnects`` grows by one per reconnect.
    """

    @property
    def connected(self) -> bool: ...

    @property
    def counters(self) -> ReconnectCounts: ...

    async def subscribe(self, subject: str, handler: Callable[[str, bytes], Awaitable[None]]) -> Subscription: ...

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
    ``await``. ``ready`` is set after the first replay attempt (``counters.replays`` or ``replay_failures`` says how it
    went); nothing needs to wait for it, since placement falls back to requests for nodes without telemetry.
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
        self._telemetry: dict[str, TelemetrySample] = {}
        self._health: dict[str, HealthSample] = {}
        self._heard_ns: dict[str, int] = {}
        self._telemetry_gate = wire.SequenceGate()
        self._health_gate = wire.SequenceGate()
        self._buffer: list[tuple[str, bytes]] = []
        self._buffered_bytes = 0
        self._changed_telemetry: set[str] = set()
        self._changed_health: set[str] = set()
        self._forgotten: set[str] = set()
        self._last_sweep_ns = now_ns()
        self._reconnects_seen = 0
        self._replaying = False
        self._superseded_ok = False  # while applying live messages that waited for a replay

    # -- reads -------------------------------------------------------------------------------------------------------

    def latest(self) -> Mapping[str, TelemetrySample]:
        return types.MappingProxyType(self._telemetry)

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
            subscriptions: list[Subscription] = []
            try:
                for subject_filter in (subjects.TELEMETRY_ALL, subjects.HEALTH_ALL):
                    subscriptions.append(await self._bus.subscribe(subject_filter, self._receive))
                return subscriptions
            except BusError as exc:
                for subscription in subscriptions:
                    with contextlib.suppress(BusError):
                        await subscription.unsubscribe()
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

    async def _receive(self, subject: str, payload: bytes) -> None:
        """The subscription's handler: buffer only (the hot path); a full batch is applied at once."""
        size = len(payload)
        if len(self._buffer) >= self._config.max_buffered_messages or (
            self._buffered_bytes + size > self._config.max_buffered_bytes
        ):
            self.counters.dropped_buffer_full += 1
            return
        self._buffer.append((subject, payload))
        self._buffered_bytes += size
        if len(self._buffer) >= self._config.max_batch and not self._replaying:
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
        telemetry_payloads: list[bytes] = []
        telemetry_nodes: list[str | None] = []
        for subject, payload in batch:
            if subject.startswith(_TELEMETRY_PREFIX):
                telemetry_payloads.append(payload)
                telemetry_nodes.append(_node_of(subject, _TELEMETRY_PREFIX))
            elif subject.startswith(_HEALTH_PREFIX):
                self._apply_health(subject, payload, received_ns)
            else:
                counters.rejected[WireReason.SUBJECT_MISMATCH] += 1
        if not telemetry_payloads:
            return
        results = wire.decode_telemetry_batch(telemetry_payloads, subject_nodes=telemetry_nodes)
        admit = self._telemetry_gate.admit
        latest = self._telemetry
        heard = self._heard_ns
        rejected = counters.rejected
        changed = self._changed_telemetry
        accepted = 0
        for position, result in enumerate(results):
            if isinstance(result, WireError):
                rejected[result.reason] += 1
                continue
            node = result.node
            if telemetry_nodes[position] is None:  # a subject that names no node: forged or not ours
                rejected[WireReason.SUBJECT_MISMATCH] += 1
                continue
            if node not in heard and len(heard) >= self._config.max_nodes:
                counters.dropped_node_limit += 1
                continue
            verdict = admit(node, boot=result.boot, seq=result.seq, ts_ns=result.ts_ns)
            if verdict is wire.Admission.ACCEPTED or verdict is wire.Admission.RESTARTED:
                if verdict is wire.Admission.RESTARTED:
                    counters.agent_restarts += 1
                latest[node] = TelemetrySample(telemetry=result, received_ns=received_ns)
                heard[node] = received_ns
                changed.add(node)
                accepted += 1
                continue
            previous = latest.get(node)
            if self._superseded_ok or (
                previous is not None and (previous.telemetry.boot, previous.telemetry.seq) == (result.boot, result.seq)
            ):
                counters.duplicates += 1
            else:
                rejected[WireReason.OUT_OF_SEQUENCE] += 1
        if accepted:
            counters.accepted_telemetry += accepted
            self.changed.set()

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

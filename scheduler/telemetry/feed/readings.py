"""The newest ``NodeTelemetry`` and ``NodeHealth`` of every node: the telemetry consumer's synchronous core.

``scheduler.telemetry.feed.consumer`` follows the bus and hands batches of ``(subject, payload)`` here; this module
decodes, checks and applies them, and nothing here awaits, so tests and the simulator drive it without NATS. Why it
is shaped this way:

- Budget: 20,000 node messages per second on one core (issue 7). msgspec's typed decoder does the validation in C
  (``common.wire``), a subject is parsed once and remembered, and the per-message Python left is a few dictionary
  operations, with the checks ordered so that an ordinary sample takes the shortest path.
- Hostile or broken publishers must not hurt the scheduler: every message that fails the strict decoder, comes out
  of sequence (``SequenceGate``), or names another node than its subject is dropped and counted by reason, never
  raised. State is bounded by a cap on nodes, and nodes not heard from for a while are forgotten.
- Readers never wait: ``latest()`` and ``health()`` are live read-only views and ``take_changes()`` says what
  changed since the last call.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from common import sequencing, subjects, wire
from common.errors import WireError, WireReason

_TELEMETRY_PREFIX: Final = subjects.TELEMETRY_PREFIX + "."
_HEALTH_PREFIX: Final = subjects.HEALTH_PREFIX + "."


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


class NodeReadings:
    """The newest telemetry and health of each node, and what changed since the last ``take_changes``.

    ``ingest`` decodes and applies messages in batches of at most ``max_batch``; ``on_change`` is called whenever
    something was accepted or forgotten. Not thread-safe: use it from one thread (the event loop's).
    """

    def __init__(
        self,
        *,
        counters: ConsumerCounters,
        on_change: Callable[[], None],
        now_ns: Callable[[], int],
        max_batch: int,
        max_nodes: int,
        forget_after_s: float,
    ) -> None:
        self.counters = counters
        self._on_change = on_change
        self._now_ns = now_ns
        self._max_batch = max_batch
        self._max_nodes = max_nodes
        self._forget_after_s = forget_after_s
        # The newest message of each node and when it came, kept apart rather than as TelemetrySample objects:
        # building one per message (20,000 a second) costs about a microsecond each, and most are superseded before
        # anything reads them (a scheduling cycle reads a node once, however many samples came meanwhile), so
        # ``latest()`` builds the samples on reading.
        self._telemetry: dict[str, wire.NodeTelemetry] = {}
        self._telemetry_received_ns: dict[str, int] = {}
        self._health: dict[str, HealthSample] = {}
        self._heard_ns: dict[str, int] = {}
        self._telemetry_gate = sequencing.SequenceGate()
        self._health_gate = sequencing.SequenceGate()
        self._subject_nodes: dict[str, str] = {}  # telemetry subject -> node, so a subject is parsed once
        self._changed_telemetry: set[str] = set()
        self._changed_health: set[str] = set()
        self._forgotten: set[str] = set()
        self._superseded_ok = False  # while applying live messages that waited for a replay

    # -- reads -------------------------------------------------------------------------------------------------------

    def latest(self) -> Mapping[str, TelemetrySample]:
        return _LatestSamples(self._telemetry, self._telemetry_received_ns)

    def health(self) -> Mapping[str, HealthSample]:
        return types.MappingProxyType(self._health)

    @property
    def nodes(self) -> int:
        """How many nodes were heard from and not forgotten."""
        return len(self._heard_ns)

    def take_changes(self) -> ChangeSet:
        """What changed since the last call."""
        changes = ChangeSet(
            telemetry=frozenset(self._changed_telemetry),
            health=frozenset(self._changed_health),
            forgotten=frozenset(self._forgotten),
        )
        self._changed_telemetry.clear()
        self._changed_health.clear()
        self._forgotten.clear()
        return changes

    # -- writes ------------------------------------------------------------------------------------------------------

    def ingest(self, messages: Sequence[tuple[str, bytes]], *, superseded_ok: bool = False) -> None:
        """Decode and apply ``(subject, payload)`` pairs, in order, in batches of at most ``max_batch``.

        ``superseded_ok``: the messages waited out a replay, so one older than the node's newest is a duplicate
        (superseded by the stream's copy of a later one), not a rejection."""
        self._superseded_ok = superseded_ok
        try:
            step = self._max_batch
            for start in range(0, len(messages), step):
                self._ingest_batch(messages[start : start + step])
        finally:
            self._superseded_ok = False

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
        max_nodes = self._max_nodes
        accepted_verdict = sequencing.Admission.ACCEPTED
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
            if verdict is accepted_verdict or verdict is sequencing.Admission.RESTARTED:
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
            self._on_change()

    def _telemetry_node(self, subject: str, payload: bytes, received_ns: int) -> str | None:
        """The node of a telemetry subject not seen lately (remembered for the next time); None for any other
        subject, after applying a health message or counting a subject that is not ours or names no node."""
        if subject.startswith(_TELEMETRY_PREFIX):
            node = _node_of(subject, _TELEMETRY_PREFIX)
            if node is None:
                self.counters.rejected[WireReason.SUBJECT_MISMATCH] += 1
                return None
            if len(self._subject_nodes) >= 2 * self._max_nodes:  # forged subjects cannot grow it forever
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
        if node not in self._heard_ns and len(self._heard_ns) >= self._max_nodes:
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
        if verdict is sequencing.Admission.RESTARTED:
            self.counters.agent_restarts += 1
        self._health[node] = HealthSample(health=message, received_ns=received_ns)
        self._heard_ns[node] = received_ns
        self._changed_health.add(node)
        self.counters.accepted_health += 1
        self._on_change()

    def forget_silent(self, now_ns: int) -> frozenset[str]:
        """Forget every node not heard from for ``forget_after_s``; returns them (also reported as ``forgotten``)."""
        horizon_ns = now_ns - int(self._forget_after_s * 1e9)
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
        self._on_change()


def _node_of(subject: str, prefix: str) -> str | None:
    token = subject[len(prefix) :]
    if not token or "." in token:
        return None
    return subjects.node_from_token(token)


class _LatestSamples(Mapping[str, TelemetrySample]):
    """``latest()``: a live read-only view that builds each ``TelemetrySample`` when it is read."""

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

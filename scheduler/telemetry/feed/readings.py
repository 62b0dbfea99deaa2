"""The newest ``NodeTelemetry`` and ``NodeHealth`` of every node: the telemetry consumer's synchronous core.

``scheduler.telemetry.feed.consumer`` follows the bus and hands batches of ``(subject, payload)`` here; this module
decodes, checks and applies them, and nothing here awaits, so tests and the simulator drive it without NATS. Why it
is shaped this way:

- Budget: 20,000 node messages per second on one core (issue 7). msgspec's typed decoder does the validation in C
  (``common.wire``), a subject is parsed once and remembered, and the per-message Python left is a few dictionary
  operations, with the checks ordered so that an ordinary sample takes the shortest path.
- Hostile or broken publishers must not hurt the scheduler: every message that fails the strict decoder (which
  also refuses samples that cannot be true, ``wire.implausible``), is stamped further than ``max_skew_ns`` from the
  scheduler's clock (``clock_skew``: checked before the message can move any sequence state; a replayed message may
  be old, so only a stamp ahead counts then), or names another node than its subject is dropped and counted by
  reason, never raised. State is bounded by a cap on nodes, and nodes not
  heard from for a while are forgotten.
- Nor capture a node: the ``SequenceGate`` follows each publisher's stream separately and accepts every message that
  is not a duplicate, so whatever was forged (a fresh boot, a ``seq`` of 10^15), the real agent's next message is
  accepted; the newest reading of a node is the newest accepted message, by the scheduler's receive time. Rivals
  (two live publishers of one node) raise ``TelemetryConflict`` (``conflicts``); docs/telemetry-trust.md says why.
- A node that goes quiet because its messages are rejected says why: ``why_rejected`` (the staleness alert's text).
- Readers never wait: ``latest()`` and ``health()`` are live read-only views and ``take_changes()`` says what
  changed since the last call.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Final

from common import sequencing, subjects, wire
from common.errors import WireError, WireReason
from scheduler.telemetry import overuse
from scheduler.telemetry.feed import conflicts, rejections

_TELEMETRY_PREFIX: Final = subjects.TELEMETRY_PREFIX + "."
_HEALTH_PREFIX: Final = subjects.HEALTH_PREFIX + "."
# A publisher is live for max(3 x its interval, the floor) after its last message: the staleness rule, so a publisher
# that would be stale is not a rival either.
_INTERVALS_LIVE: Final = 3
_NS_PER_MS: Final = 1_000_000
# A dead stream is kept this long (for a replay's copy of its last message to count as a duplicate), then pruned: a
# replay follows a reconnect within seconds.
_STREAM_RETAIN_NS: Final = 60 * 1_000_000_000


def _zero_per_reason() -> dict[WireReason, int]:
    return dict.fromkeys(WireReason, 0)


@dataclasses.dataclass(slots=True)
class ConsumerCounters:
    """Plain counters for the scheduler's metrics (``quotient_telemetry_*``); they only grow."""

    received: int = 0  # messages handed over by the subscription or a replay
    accepted_telemetry: int = 0
    accepted_health: int = 0
    agent_restarts: int = 0  # accepted messages that opened a stream for a boot not followed (restart, or a rival)
    forks: int = 0  # accepted messages behind every stream of their boot: a second publisher of that boot
    # The very message already accepted, or one behind its stream while a replay is applied: where the replay and
    # the live feed overlap. Not a rejection.
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
    something was accepted or forgotten. ``max_skew_ns``: how far a message's stamp may be from ``now_ns``, ahead or
    behind; ``live_floor_ns``: a publisher counts as live (a possible rival) for max(3 x its interval, this) after its
    last message. Not thread-safe: use it from one thread (the event loop's).
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
        max_skew_ns: int,
        live_floor_ns: int,
    ) -> None:
        self.counters = counters
        self._on_change = on_change
        self._now_ns = now_ns
        self._max_batch = max_batch
        self._max_nodes = max_nodes
        self._forget_after_s = forget_after_s
        self._max_skew_ns = max_skew_ns
        self._live_floor_ns = live_floor_ns
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
        self._conflicts = conflicts.ConflictWatch()
        self._rejections = rejections.RejectionNotes()  # of nodes heard from only: forged names cannot grow it
        self._subject_nodes: dict[str, str] = {}  # telemetry subject -> node, so a subject is parsed once
        self._changed_telemetry: set[str] = set()
        self._changed_health: set[str] = set()
        self._forgotten: set[str] = set()
        self._replay = False  # while applying a replay, or live messages that waited for one

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

    def why_rejected(self, node: str) -> str | None:
        """Why ``node`` has been quiet, when its messages were rejected since its last accepted one; else None."""
        return self._rejections.why(node)

    def check_conflicts(self, *, now_ns: int, known: Container[str]) -> tuple[overuse.Transition, ...]:
        """``TelemetryConflict`` transitions for the nodes of the cluster (``known``) since the last check; drops
        streams dead for long (``_STREAM_RETAIN_NS``)."""
        gate = self._telemetry_gate
        for node in gate.crowded():
            gate.prune(node, dead_before_ns=now_ns - _STREAM_RETAIN_NS)
        return self._conflicts.check(gate, now_ns=now_ns, known=known)

    # -- writes ------------------------------------------------------------------------------------------------------

    def ingest(self, messages: Sequence[tuple[str, bytes]], *, replay: bool = False) -> None:
        """Decode and apply ``(subject, payload)`` pairs, in order, in batches of at most ``max_batch``.

        ``replay``: the messages come from the stream's replay, or waited for one while it was read, so one behind
        its stream overlaps what was already applied (a duplicate), never a second publisher."""
        self._replay = replay
        try:
            step = self._max_batch
            for start in range(0, len(messages), step):
                self._ingest_batch(messages[start : start + step])
        finally:
            self._replay = False

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
        noted = self._rejections.by_node
        max_nodes = self._max_nodes
        replay = self._replay
        # A replayed message is the stream's last of its subject, as old as that: only a stamp ahead is refused then.
        earliest_ns = -1 if replay else received_ns - self._max_skew_ns
        latest_ns = received_ns + self._max_skew_ns
        live_floor_ns = self._live_floor_ns
        live_per_interval_ms = _INTERVALS_LIVE * _NS_PER_MS
        accepted_verdict = sequencing.Admission.ACCEPTED
        accepted = 0
        for subject_node, result in zip(nodes, results, strict=True):
            if isinstance(result, WireError):
                counters.rejected[result.reason] += 1
                if subject_node in heard:
                    self._rejections.note(subject_node, result.reason, result.detail)
                continue
            node = result.node
            ts_ns = result.ts_ns
            if ts_ns < earliest_ns or ts_ns > latest_ns:  # before the gate: a skewed stamp moves nothing
                counters.rejected[WireReason.CLOCK_SKEW] += 1
                if node in heard:
                    self._rejections.note(node, WireReason.CLOCK_SKEW, self._skew(ts_ns, received_ns))
                continue
            if node not in heard and len(heard) >= max_nodes:
                counters.dropped_node_limit += 1
                continue
            live_for_ns = result.interval_ms * live_per_interval_ms
            verdict = admit(
                node,
                boot=result.boot,
                seq=result.seq,
                ts_ns=ts_ns,
                received_ns=received_ns,
                live_for_ns=live_for_ns if live_for_ns > live_floor_ns else live_floor_ns,
                replay=replay,
            )
            if verdict is not accepted_verdict:
                if verdict is sequencing.Admission.RESTARTED:
                    counters.agent_restarts += 1
                elif verdict is sequencing.Admission.FORKED:
                    counters.forks += 1
                else:  # the very message already accepted, or one a replay overlaps
                    counters.duplicates += 1
                    continue
            latest[node] = result
            latest_received[node] = received_ns
            heard[node] = received_ns
            changed.add(node)
            if noted:
                noted.pop(node, None)
            accepted += 1
        if accepted:
            counters.accepted_telemetry += accepted
            self._on_change()

    def _skew(self, ts_ns: int, received_ns: int) -> str:
        return rejections.skewed(ts_ns=ts_ns, received_ns=received_ns, max_skew_ns=self._max_skew_ns)

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
            if node in self._heard_ns:
                self._rejections.note(node, exc.reason, exc.detail)
            return
        # Health is published on change, so a replay's copy may be hours old (its stamp still says when): a replayed
        # message is refused only for a stamp ahead.
        off_ns = message.ts_ns - received_ns
        if off_ns > self._max_skew_ns or (off_ns < -self._max_skew_ns and not self._replay):
            self.counters.rejected[WireReason.CLOCK_SKEW] += 1
            if node in self._heard_ns:
                self._rejections.note(node, WireReason.CLOCK_SKEW, self._skew(message.ts_ns, received_ns))
            return
        if node not in self._heard_ns and len(self._heard_ns) >= self._max_nodes:
            self.counters.dropped_node_limit += 1
            return
        # Health comes on change, so its streams are never live: rivals are told from telemetry alone.
        verdict = self._health_gate.admit_message(message, received_ns=received_ns, replay=self._replay)
        if not verdict.accepted:
            self.counters.duplicates += 1
            return
        if verdict is sequencing.Admission.RESTARTED:
            self.counters.agent_restarts += 1
        elif verdict is sequencing.Admission.FORKED:
            self.counters.forks += 1
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
        self._rejections.forget(node)
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

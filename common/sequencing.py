"""Which messages of a node to accept, and when two publishers claim one node: the ``SequenceGate``.

Out-of-order delivery (a JetStream replay, a redelivery) is not a decoding matter: ``common.wire`` says whether bytes
are a valid message, and this gate says, per node, whether a valid message is new. It reads only the envelope's four
fields (``Stamped``), so it knows nothing of msgspec or of the message kinds. Pure: no I/O, no clock (the receive time
is an argument).

Why it is shaped this way: a node's ``(boot, seq)`` is the publisher's claim, and every publisher that can publish on
the node's subject can make any claim (without the NATS auth callout, every agent can; with it, only the node's own
identity can). A gate that orders the node's messages by claims alone can be captured: one message with a fresh
``boot`` or a ``seq`` of 10^15 would make every later message of the real agent look old, muting the node for good.
So the gate never lets one message decide what comes after; it follows each publisher's *stream* separately:

- a message extends the stream of its boot whose newest ``seq`` is the closest below its own (the most recently heard
  of two such), and is accepted;
- a message of a boot the gate does not follow opens a stream for it (``RESTARTED``: a restarted agent, or another
  publisher), and is accepted; the streams it had stay followed;
- a message behind every stream of its own boot opens a second stream of that boot (``FORKED``: one boot's stream
  going back can only be a second publisher) and is accepted, except while a replay is applied, where it is what the
  replay overlaps (``SUPERSEDED``);
- only the very message a stream ends with (same boot, seq and stamp) is refused (``REPEATED_SEQ``, a duplicate).

So a real agent's message is refused only if a forger sent the same boot, seq and stamp first, and the node's newest
reading is always the newest accepted message. The price of never being captured is that a forger is not refused
either: ``rivals`` names what cannot be told apart from two live publishers, for the reader to raise
(``TelemetryConflict`` in the scheduler). A stream is *live* until ``live_for_ns`` (given with each message) after
its newest message. Two live streams are rivals when they share a boot (a fork), or when each was heard after the
other began (interleaved): an agent restart, where the old boot's last message comes before the new boot's first,
is neither.

Memory: at most ``MAX_STREAMS_PER_NODE`` streams per node (the least recently heard goes first), and ``prune`` drops
streams long dead; ``forget`` drops a node.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import Final, Protocol


class Stamped(Protocol):
    """What the gate reads of a message: its publisher, the publisher's boot, its sequence number and its stamp
    (``wire.Envelope`` has them)."""

    @property
    def node(self) -> str: ...

    @property
    def boot(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def ts_ns(self) -> int: ...


class Admission(enum.StrEnum):
    """The ``SequenceGate``'s verdict on one message: accepted (and how), or why not (a duplicate, never a
    rejection: the reader counts it as such)."""

    ACCEPTED = "accepted"  # the next message of a stream the gate follows, or the node's first
    RESTARTED = "restarted"  # accepted: the first of a boot the gate did not follow (an agent restart, or a rival)
    FORKED = "forked"  # accepted: behind every stream of its boot, so a second stream of that boot (a rival)
    REPEATED_SEQ = "repeated_seq"  # the very message a stream ends with: a duplicate
    SUPERSEDED = "superseded"  # while a replay is applied: behind the stream of its boot, which is newer

    @property
    def accepted(self) -> bool:
        return self is Admission.ACCEPTED or self is Admission.RESTARTED or self is Admission.FORKED


# A node has one stream, two while its agent restarts, a few more only under forgery; a forger opening more is
# refused nothing (its oldest streams go), so the bound only caps memory.
MAX_STREAMS_PER_NODE: Final = 4


@dataclasses.dataclass(slots=True)
class _Stream:
    boot: str
    seq: int  # of its newest message
    ts_ns: int  # of its newest message
    first_ns: int  # receive time of its first message
    heard_ns: int  # receive time of its newest message
    live_until_ns: int
    forked: bool  # opened behind another stream of its boot
    # On the stream the node's entry holds, the node's other streams (None: it has one). One object per node in the
    # common case keeps the per-message path to one look-up and one object (20,000 messages a second).
    others: list[_Stream] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Stream:
    """One stream the gate follows, as a reader reports it: its boot, newest ``seq``, and when (receive times) it
    began and was last heard; ``forked``: it opened behind another stream of its boot."""

    boot: str
    seq: int
    first_ns: int
    heard_ns: int
    forked: bool


class SequenceGate:
    """Per node, the streams of its publishers; ``admit`` says whether a message is new (see the module docstring).

    One gate per kind of message that has its own ``seq`` order for the reader (e.g. one for telemetry, one for
    health, though an agent counts both with one ``seq``). Memory is a few fields per stream; ``forget`` drops a node.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _Stream] = {}

    def admit(
        self,
        node: str,
        *,
        boot: str,
        seq: int,
        ts_ns: int,
        received_ns: int | None = None,
        live_for_ns: int = 0,
        replay: bool = False,
    ) -> Admission:
        """The verdict on one message, recorded. ``received_ns``: when the reader received it (default: its stamp);
        ``live_for_ns``: how long after it its stream counts as live; ``replay``: it comes from a replay (or waited
        for one), so a message behind its stream is what the replay overlaps, not a fork."""
        at_ns = ts_ns if received_ns is None else received_ns
        stream = self._nodes.get(node)
        if stream is None:
            self._nodes[node] = _Stream(boot, seq, ts_ns, at_ns, at_ns, at_ns + live_for_ns, False)
            return Admission.ACCEPTED
        # The common case, kept short: one publisher, its next message.
        if stream.others is None and stream.boot == boot and seq > stream.seq:
            stream.seq = seq
            stream.ts_ns = ts_ns
            stream.heard_ns = at_ns
            stream.live_until_ns = at_ns + live_for_ns
            return Admission.ACCEPTED
        return self._admit_among(
            node, _all(stream), boot=boot, seq=seq, ts_ns=ts_ns, at_ns=at_ns, live_for_ns=live_for_ns, replay=replay
        )

    def _admit_among(
        self,
        node: str,
        streams: list[_Stream],
        *,
        boot: str,
        seq: int,
        ts_ns: int,
        at_ns: int,
        live_for_ns: int,
        replay: bool,
    ) -> Admission:
        closest: _Stream | None = None
        known_boot = False
        for stream in streams:
            if stream.boot != boot:
                continue
            known_boot = True
            if stream.seq == seq and stream.ts_ns == ts_ns:
                return Admission.REPEATED_SEQ
            if stream.seq < seq and (
                closest is None
                or stream.seq > closest.seq
                or (stream.seq == closest.seq and stream.heard_ns > closest.heard_ns)
            ):
                closest = stream
        if closest is not None:
            closest.seq = seq
            closest.ts_ns = ts_ns
            closest.heard_ns = at_ns
            closest.live_until_ns = at_ns + live_for_ns
            return Admission.ACCEPTED
        if known_boot and replay:
            return Admission.SUPERSEDED
        if len(streams) >= MAX_STREAMS_PER_NODE:
            streams.remove(min(streams, key=lambda stream: stream.heard_ns))
        streams.append(_Stream(boot, seq, ts_ns, at_ns, at_ns, at_ns + live_for_ns, known_boot))
        self._store(node, streams)
        return Admission.FORKED if known_boot else Admission.RESTARTED

    def _store(self, node: str, streams: list[_Stream]) -> None:
        head = streams[0]
        for stream in streams:
            stream.others = None
        head.others = streams[1:] or None
        self._nodes[node] = head

    def admit_message(
        self, message: Stamped, *, received_ns: int | None = None, live_for_ns: int = 0, replay: bool = False
    ) -> Admission:
        """``admit`` with the envelope of a decoded message."""
        return self.admit(
            message.node,
            boot=message.boot,
            seq=message.seq,
            ts_ns=message.ts_ns,
            received_ns=received_ns,
            live_for_ns=live_for_ns,
            replay=replay,
        )

    def rivals(self, node: str, *, now_ns: int) -> tuple[Stream, ...]:
        """The live streams of ``node`` when two of them are rivals (they share a boot, or each was heard after the
        other began), most recently heard last; empty when the node has one live publisher or none."""
        head = self._nodes.get(node)
        if head is None or head.others is None:
            return ()
        live = [stream for stream in _all(head) if stream.live_until_ns >= now_ns]
        for one, other in itertools.combinations(live, 2):
            if one.boot == other.boot or (one.heard_ns > other.first_ns and other.heard_ns > one.first_ns):
                return tuple(
                    Stream(
                        boot=stream.boot,
                        seq=stream.seq,
                        first_ns=stream.first_ns,
                        heard_ns=stream.heard_ns,
                        forked=stream.forked,
                    )
                    for stream in sorted(live, key=lambda stream: stream.heard_ns)
                )
        return ()

    def crowded(self) -> list[str]:
        """The nodes followed on more than one stream (the only ones that can have rivals)."""
        return [node for node, head in self._nodes.items() if head.others is not None]

    def prune(self, node: str, *, dead_before_ns: int) -> None:
        """Drop the streams of ``node`` not live since before ``dead_before_ns``, keeping its most recently heard.

        Kept a while after they die, old streams let a replay's copy of their last message count as a duplicate;
        after that, such a message opens a stream again (and is accepted: it is the newest its subject had).
        """
        head = self._nodes.get(node)
        if head is not None and head.others is not None:
            streams = _all(head)
            newest = max(streams, key=lambda stream: stream.heard_ns)
            self._store(
                node, [stream for stream in streams if stream is newest or stream.live_until_ns >= dead_before_ns]
            )

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def __len__(self) -> int:
        return len(self._nodes)


def _all(head: _Stream) -> list[_Stream]:
    """A node's streams, the one its entry holds first."""
    return [head] if head.others is None else [head, *head.others]

"""Which messages of a publisher are newer than those already accepted: the ``SequenceGate``.

Out-of-order delivery (a JetStream replay, a redelivery, two agents briefly alive on one node during a rolling
update) is not a decoding matter: ``common.wire`` says whether bytes are a valid message, and this gate says, per
publisher, whether a valid message comes after what was already accepted. It reads only the envelope's four fields
(``Stamped``), so it knows nothing of msgspec or of the message kinds. Pure: no I/O, no clock.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
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
    """The ``SequenceGate``'s verdict on one message: accepted, or why not (all rejections count as
    ``WireReason.OUT_OF_SEQUENCE``)."""

    ACCEPTED = "accepted"
    RESTARTED = "restarted"  # accepted: a new boot of the publisher superseded the previous one
    REPEATED_SEQ = "repeated_seq"  # same boot, seq not above the last accepted: a duplicate or a late message
    RETIRED_BOOT = "retired_boot"  # from a boot that a newer one already superseded
    OLDER_BOOT = "older_boot"  # from an unknown boot, stamped no later than the last accepted message

    @property
    def accepted(self) -> bool:
        return self is Admission.ACCEPTED or self is Admission.RESTARTED


# A node's last few superseded boots are remembered, so that an old agent still publishing during a rolling update
# (old and new pod alive together for a moment) cannot flip the node back, even with a later clock. A handful is
# enough: boots pile up only as fast as the agent restarts.
_RETIRED_BOOTS_KEPT: Final = 4


@dataclasses.dataclass(slots=True)
class _Stream:
    boot: str
    seq: int
    ts_ns: int
    retired: collections.deque[str]


class SequenceGate:
    """Per publisher, admit only messages newer than the last accepted one.

    Within a boot, ``seq`` must grow. A different boot means the publisher restarted and counts from scratch, so its
    ``seq`` says nothing; it is accepted when its ``ts_ns`` is later than that of the last accepted message, and its
    predecessor is retired for good. The rule trusts the publisher's clock across a restart: a node whose clock
    stepped back at restart is rejected until the clock passes the last accepted stamp.

    One gate per stream that shares a ``seq`` counter (e.g. one for telemetry, one for health). Memory is a few
    fields per publisher; ``forget`` drops one (a deleted node).
    """

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}

    def admit(self, node: str, *, boot: str, seq: int, ts_ns: int) -> Admission:
        stream = self._streams.get(node)
        if stream is None:
            self._streams[node] = _Stream(boot, seq, ts_ns, collections.deque(maxlen=_RETIRED_BOOTS_KEPT))
            return Admission.ACCEPTED
        if boot == stream.boot:
            if seq <= stream.seq:
                return Admission.REPEATED_SEQ
            stream.seq = seq
            stream.ts_ns = ts_ns
            return Admission.ACCEPTED
        if boot in stream.retired:
            return Admission.RETIRED_BOOT
        if ts_ns <= stream.ts_ns:
            return Admission.OLDER_BOOT
        stream.retired.append(stream.boot)
        stream.boot = boot
        stream.seq = seq
        stream.ts_ns = ts_ns
        return Admission.RESTARTED

    def admit_message(self, message: Stamped) -> Admission:
        """``admit`` with the envelope of a decoded message."""
        return self.admit(message.node, boot=message.boot, seq=message.seq, ts_ns=message.ts_ns)

    def forget(self, node: str) -> None:
        self._streams.pop(node, None)

    def __len__(self) -> int:
        return len(self._streams)

"""The frame reader (``common.natsframes``), fed as a socket would: every split of the stream between reads yields
the same messages, control lines are answered or reported, a failing handler loses only its own batch, and anything
it cannot parse drops the connection after handing over what came before it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from common import natsframes


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True


class FakeSubscription:
    """What the reader reports to its subscription."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, bytes]]] = []
        self.violations: list[str] = []
        self.server_errors: list[str] = []

    def on_batch(self, batch: list[tuple[str, bytes]]) -> None:
        self.batches.append(batch)

    def protocol_violation(self, text: str) -> None:
        self.violations.append(text)

    def server_error(self, text: str) -> None:
        self.server_errors.append(text)

    def connection_lost(self, reader: object, exc: Exception | None) -> None:
        pass

    @property
    def messages(self) -> list[tuple[str, bytes]]:
        return [message for batch in self.batches for message in batch]


def feed(stream: bytes, cuts: Sequence[int], *, live: bool = True) -> tuple[FakeSubscription, FakeTransport]:
    """Run ``stream`` through a reader in reads that end at ``cuts`` (and wherever its buffer is full)."""

    async def run() -> tuple[FakeSubscription, FakeTransport]:
        subscription = FakeSubscription()
        transport = FakeTransport()
        reader = natsframes.FrameReader(subscription)
        reader.connection_made(transport)  # type: ignore[arg-type]
        if live:
            reader.go_live(ping_interval_s=3600)
        position = 0
        for end in [*sorted(set(cuts)), len(stream)]:
            while position < end and not transport.aborted:
                room = reader.get_buffer(-1)
                size = min(len(room), end - position)
                room[:size] = stream[position : position + size]
                reader.buffer_updated(size)
                position += size
        reader.connection_lost(None)
        return subscription, transport

    return asyncio.run(run())


def msg(subject: str, payload: bytes, *, sid: int = 1, reply: str | None = None) -> bytes:
    reply_part = f" {reply}" if reply else ""
    return f"MSG {subject} {sid}{reply_part} {len(payload)}\r\n".encode() + payload + b"\r\n"


subjects_strategy = st.sampled_from(["quotient.v1.telemetry.gpu-a", "quotient.v1.health.n~1", "a", "x.y.z"])
# Payloads that look like protocol lines must still be taken as payload, by their size alone.
payloads = st.one_of(
    st.binary(max_size=3000),
    st.sampled_from([b"", b"\r\n", b"MSG a 1 3\r\nabc\r\n", b"PING\r\n", b"-ERR 'x'\r\n"]),
)
frames = st.one_of(
    st.tuples(subjects_strategy, payloads, st.sampled_from([None, "_INBOX.r"])).map(lambda t: ("msg", t)),
    st.sampled_from([("ping", None), ("ok", None), ("info", None), ("err", None)]),
)
# What a live server may send between messages besides PING: cluster updates and errors it does not close for.
_INFO = b'INFO {"server_id":"s","max_payload":1048576,"connect_urls":["10.0.0.2:4222"]}\r\n'
_ERR = b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n"


@settings(max_examples=150, deadline=None)
@given(st.lists(frames, max_size=40), st.lists(st.integers(min_value=0, max_value=200_000), max_size=30))
def test_every_split_of_the_stream_between_reads_yields_the_same_messages_in_order(
    items: list[tuple[str, tuple[str, bytes, str | None] | None]], cut_points: list[int]
) -> None:
    stream = b""
    expected: list[tuple[str, bytes]] = []
    pings = errors = 0
    for kind, value in items:
        if kind == "msg":
            assert value is not None
            subject, payload, reply = value
            stream += msg(subject, payload, reply=reply)
            expected.append((subject, payload))
        elif kind == "ping":
            stream += b"PING\r\n"
            pings += 1
        elif kind == "info":
            stream += _INFO
        elif kind == "err":
            stream += _ERR
            errors += 1
        else:
            stream += b"+OK\r\n"
    subscription, transport = feed(stream, [cut % (len(stream) + 1) for cut in cut_points])
    assert subscription.messages == expected
    assert bytes(transport.written) == b"PONG\r\n" * pings
    assert subscription.server_errors == ['Permissions Violation for Subscription to "x"'] * errors
    assert not subscription.violations and not transport.aborted


def test_a_handler_that_raises_loses_only_its_own_batch() -> None:
    class Failing(FakeSubscription):
        def on_batch(self, batch: list[tuple[str, bytes]]) -> None:
            super().on_batch(batch)
            if len(self.batches) == 1:
                raise RuntimeError("a bad handler call")

    async def run() -> tuple[Failing, FakeTransport]:
        subscription, transport = Failing(), FakeTransport()
        reader = natsframes.FrameReader(subscription)
        reader.connection_made(transport)  # type: ignore[arg-type]
        reader.go_live(ping_interval_s=3600)
        for chunk in (msg("a", b"1") + msg("a", b"2"), msg("a", b"3")):
            room = reader.get_buffer(-1)
            room[: len(chunk)] = chunk
            reader.buffer_updated(len(chunk))
        reader.connection_lost(None)
        return subscription, transport

    subscription, transport = asyncio.run(run())
    assert subscription.batches == [[("a", b"1"), ("a", b"2")], [("a", b"3")]]
    assert not subscription.violations and not transport.aborted


def test_a_payload_larger_than_the_read_buffer_arrives_whole_and_later_messages_still_flow() -> None:
    big = bytes(range(256)) * 4000  # ~1 MB: the server's max_payload
    stream = msg("big", big) + msg("small", b"after") + msg("big", big[:300_000]) + msg("small", b"end")
    subscription, _ = feed(stream, list(range(0, len(stream), 3000)))
    assert subscription.messages == [("big", big), ("small", b"after"), ("big", big[:300_000]), ("small", b"end")]
    assert not subscription.violations


def test_info_sets_the_largest_payload_the_reader_accepts() -> None:
    stream = b'INFO {"server_id":"s","max_payload":10}\r\n' + msg("a", b"0123456789") + msg("a", b"0123456789X")
    subscription, transport = feed(stream, [], live=False)
    assert subscription.messages == [("a", b"0123456789")]
    assert transport.aborted and "max_payload is 10" in subscription.violations[0]


def test_what_the_reader_cannot_parse_drops_the_connection_after_the_messages_before_it() -> None:
    for garbage in (
        b"BOGUS line\r\n",
        b"MSG a 1\r\n",  # no size
        b"MSG a 1 x\r\n",  # a size that is no number
        b"MSG a 1 3\r\nabcXY",  # the payload is not followed by CRLF
        b"MSG a 1 -3\r\n",
        b"INFO [1]\r\n",
    ):
        subscription, transport = feed(msg("ok", b"first") + garbage + msg("never", b"x"), [])
        assert subscription.messages == [("ok", b"first")], garbage
        assert transport.aborted and len(subscription.violations) == 1, garbage
    # A line still without its end after more bytes than the server ever puts on one.
    for garbage in (b"MSG " + b"a" * 5000, b"\x00" * 5000):
        subscription, transport = feed(msg("ok", b"first") + garbage, [])
        assert subscription.messages == [("ok", b"first")], garbage
        assert transport.aborted and len(subscription.violations) == 1, garbage


def test_server_errors_on_a_live_connection_are_reported_and_parsing_goes_on() -> None:
    stream = msg("a", b"1") + b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n" + msg("a", b"2")
    subscription, transport = feed(stream, [5])
    assert subscription.messages == [("a", b"1"), ("a", b"2")]
    assert subscription.server_errors == ['Permissions Violation for Subscription to "x"']
    assert not transport.aborted

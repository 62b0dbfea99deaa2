"""``NatsBus.subscribe_batches`` (the frame reader's fast path, ``common.natsbatches``) against a real nats-server
(and, for the faults a real one does not make, a fake one on loopback): every message in order, headers stripped,
the server's refusals as our errors, nkey authentication, and recovery from a restarted server, a silent connection
and a garbled stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import pytest

from common import credentials
from common.errors import BusPermissionDenied, BusUnavailable
from common.natsconn import NatsBus
from common.natsserver import NatsServer
from tests.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Collector:
    def __init__(self) -> None:
        self.batches: list[list[tuple[str, bytes]]] = []

    def __call__(self, batch: list[tuple[str, bytes]]) -> None:
        self.batches.append(batch)

    @property
    def messages(self) -> list[tuple[str, bytes]]:
        return [message for batch in self.batches for message in batch]


@contextlib.asynccontextmanager
async def publisher(server: NatsServer) -> AsyncIterator[NatsBus]:
    bus = NatsBus(servers=server.url, name="publisher")
    await bus.connect_once()
    try:
        yield bus
    finally:
        await bus.close()


async def test_every_message_arrives_once_in_order_with_its_subject_from_both_filters(nats_server: NatsServer) -> None:
    reader = NatsBus(servers=nats_server.url, name="reader")
    collector = Collector()
    await reader.subscribe_batches(["quotient.v1.telemetry.>", "quotient.v1.health.>"], collector)
    sizes = [0, 1, 100, 8_000, 300_000, 1_000_000, 5, 8_000]
    published = [
        (f"quotient.v1.{'telemetry' if i % 3 else 'health'}.node-{i}", bytes([i]) * size)
        for i, size in enumerate(sizes * 25)
    ]
    async with publisher(nats_server) as bus:
        await bus.publish("quotient.v1.decisions", b"not subscribed")
        for subject, payload in published:
            await bus.publish(subject, payload)
        await bus.flush()
        await until(lambda: len(collector.messages) >= len(published))
    assert collector.messages == published
    assert len(collector.batches) < len(published)  # handed over in batches, not one call per message
    await reader.close()


async def test_headers_a_publisher_adds_are_stripped_so_the_payload_arrives_alone(nats_server: NatsServer) -> None:
    reader = NatsBus(servers=nats_server.url, name="reader")
    collector = Collector()
    await reader.subscribe_batches(["a.>"], collector)
    client = await nats.connect(nats_server.url)
    try:
        await client.publish("a.b", b"payload", headers={"Nats-Msg-Id": "1", "X-Trace": "t"})
        await client.publish("a.c", b"plain")
        await client.flush()
        await until(lambda: len(collector.messages) >= 2)
    finally:
        await client.close()
        await reader.close()
    assert collector.messages == [("a.b", b"payload"), ("a.c", b"plain")]


async def test_the_subscription_comes_back_after_the_server_restarts_and_counts_one_reconnect(
    nats_server: NatsServer,
) -> None:
    reader = NatsBus(servers=nats_server.url, name="reader")
    collector = Collector()
    await reader.subscribe_batches(["t.>"], collector)
    async with publisher(nats_server) as bus:
        await bus.publish("t.1", b"before")
        await until(lambda: collector.messages == [("t.1", b"before")])

        nats_server.stop()
        nats_server.start()  # same port
        await until(lambda: reader.counters.reconnects == 1)
        assert reader.counters.disconnects == 1

        # Live again: the publisher (reconnecting by itself) gets through to the re-made subscription.
        await until(lambda: published_and_received(bus, collector, ("t.2", b"after")), timeout_s=20)
    await reader.close()


async def published_and_received(bus: NatsBus, collector: Collector, message: tuple[str, bytes]) -> bool:
    """Publish ``message`` (while the publisher may still be reconnecting) unless the collector already has it."""
    if message in collector.messages:
        return True
    with contextlib.suppress(BusUnavailable):
        await bus.publish(*message)
    return False


async def test_an_nkey_subscription_signs_the_restarted_servers_new_nonce_and_comes_back_each_time(
    tmp_path: Path,
) -> None:
    seed = credentials.generate_user_seed()
    seed_file = tmp_path / "seed"
    seed_file.write_bytes(seed)
    config = f'authorization {{ users = [ {{ nkey: "{credentials.public_key(seed)}" }} ] }}'
    with NatsServer(extra_config=config) as server:
        reader = NatsBus(servers=server.url, name="scheduler", nkey_seed=seed_file)
        collector = Collector()
        await reader.subscribe_batches(["n.>"], collector)
        bus = NatsBus(servers=server.url, name="publisher", nkey_seed=seed_file)
        await bus.connect_once()

        async def restart_and_resume(restart: int) -> None:
            server.stop()
            server.start()  # same port, same users, a new nonce for every connection
            await until(lambda: reader.counters.reconnects == restart, what=f"reconnect {restart}")
            message = ("n.x", f"after restart {restart}".encode())
            await until(lambda: published_and_received(bus, collector, message), timeout_s=20)

        await restart_and_resume(1)
        await restart_and_resume(2)
        assert reader.counters.disconnects == 2 and reader.counters.permission_errors == 0
        await bus.close()
        await reader.close()


async def test_a_subscription_goes_to_the_next_server_when_the_first_is_down(nats_server: NatsServer) -> None:
    reader = NatsBus(servers=f"nats://127.0.0.1:1,{nats_server.url}", name="reader")
    collector = Collector()
    await reader.subscribe_batches(["d.>"], collector)
    async with publisher(nats_server) as bus:
        await bus.publish("d.1", b"to the second")
        await until(lambda: collector.messages == [("d.1", b"to the second")])
    await reader.close()


async def test_a_server_refusing_the_subscription_is_permission_denied(tmp_path: Path) -> None:
    # Anonymous connections become the user "anon", who may not subscribe to telemetry.
    config = """
authorization {
  users = [ { user: "anon", password: "unused", permissions: { subscribe: { deny: ["quotient.v1.telemetry.>"] } } } ]
}
no_auth_user: "anon"
"""
    with NatsServer(extra_config=config) as server:
        reader = NatsBus(servers=server.url, name="reader")
        with pytest.raises(BusPermissionDenied, match="Permissions Violation"):
            await reader.subscribe_batches(["quotient.v1.telemetry.>"], Collector())
        # The same user may subscribe elsewhere: the anonymous connection itself is allowed.
        collector = Collector()
        await reader.subscribe_batches(["quotient.v1.health.>"], collector)
        await reader.close()


async def test_a_server_that_wants_credentials_refuses_an_anonymous_subscription() -> None:
    with NatsServer(extra_config='authorization { user: "someone", password: "secret" }') as server:
        reader = NatsBus(servers=server.url, name="reader")
        with pytest.raises(BusPermissionDenied, match="Authorization Violation"):
            await reader.subscribe_batches(["a.>"], Collector())


async def test_credentials_written_in_the_url_are_used_for_the_subscription() -> None:
    with NatsServer(extra_config='authorization { user: "someone", password: "secret" }') as server:
        url = server.url.replace("nats://", "nats://someone:secret@")
        bus = NatsBus(servers=url, name="reader")
        await bus.connect_once()
        collector = Collector()
        await bus.subscribe_batches(["a.>"], collector)
        await bus.publish("a.b", b"hello")
        await bus.flush()
        await until(lambda: collector.messages == [("a.b", b"hello")])
        await bus.close()


async def test_no_server_listening_is_unavailable() -> None:
    reader = NatsBus(servers="nats://127.0.0.1:1", name="reader")
    with pytest.raises(BusUnavailable):
        await reader.subscribe_batches(["a.>"], Collector())


async def test_an_nkey_user_gets_every_message_in_order_over_the_signed_fast_path(tmp_path: Path) -> None:
    seed = credentials.generate_user_seed()
    seed_file = tmp_path / "seed"
    seed_file.write_bytes(seed)
    config = f'authorization {{ users = [ {{ nkey: "{credentials.public_key(seed)}" }} ] }}'
    with NatsServer(extra_config=config) as server:
        bus = NatsBus(servers=server.url, name="scheduler", nkey_seed=seed_file)
        await bus.connect_once()
        collector = Collector()
        subscription = await bus.subscribe_batches(["a.>", "b.>"], collector)
        for i in range(50):
            await bus.publish("a.x" if i % 2 else "b.y", str(i).encode())
        await bus.flush()
        await until(lambda: len(collector.messages) >= 50)
        # One connection of its own, signed with the seed: in order across both filters.
        assert collector.messages == [("a.x" if i % 2 else "b.y", str(i).encode()) for i in range(50)]
        await subscription.unsubscribe()
        await bus.close()


async def test_a_seed_the_server_does_not_know_is_refused_as_a_permission_problem(tmp_path: Path) -> None:
    known, stranger = credentials.generate_user_seed(), credentials.generate_user_seed()
    seed_file = tmp_path / "seed"
    seed_file.write_bytes(stranger)
    config = f'authorization {{ users = [ {{ nkey: "{credentials.public_key(known)}" }} ] }}'
    with NatsServer(extra_config=config) as server:
        bus = NatsBus(servers=server.url, name="scheduler", nkey_seed=seed_file)
        with pytest.raises(BusPermissionDenied):
            await bus.subscribe_batches(["a.>"], Collector())
        await bus.close()


async def test_closing_the_bus_ends_its_batched_subscriptions_for_good(nats_server: NatsServer) -> None:
    reader = NatsBus(servers=nats_server.url, name="reader")
    collector = Collector()
    subscription = await reader.subscribe_batches(["c.>"], collector)
    await reader.close()
    await subscription.unsubscribe()  # idempotent
    witness = NatsBus(servers=nats_server.url, name="witness")
    witnessed = Collector()
    await witness.subscribe_batches(["c.>"], witnessed)
    async with publisher(nats_server) as bus:
        await bus.publish("c.1", b"after close")
        await bus.flush()
    # Once a live subscriber has it, the server has routed it: a closed subscription that still had its
    # connection would have been sent it too.
    await until(lambda: witnessed.messages == [("c.1", b"after close")])
    await witness.close()
    assert collector.messages == []
    assert reader.counters.disconnects == 0 and reader.counters.reconnects == 0
    with pytest.raises(BusUnavailable):
        await reader.subscribe_batches(["c.>"], collector)


# --- faults a real server does not make, from a fake one ---------------------------------------------------------


class FakeServer:
    """Speaks just enough NATS for a subscriber; ``answer_pings`` and ``garble`` shape each connection, by number."""

    def __init__(self, *, answer_pings: Callable[[int], bool], garble: Callable[[int], bool]) -> None:
        self.answer_pings = answer_pings
        self.garble = garble
        self.connections = 0
        self.pings = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.append(writer)
        writer.write(b'INFO {"server_id":"fake","max_payload":1048576}\r\n')
        handshake_done = False
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                if not line.startswith(b"PING"):
                    continue
                if not handshake_done:
                    handshake_done = True
                    writer.write(b"PONG\r\nMSG s.1 1 5\r\nhello\r\n")
                    if self.garble(number):
                        writer.write(b"MSG s.2 1 nonsense\r\n")
                    continue
                self.pings += 1
                if self.answer_pings(number):
                    writer.write(b"PONG\r\n")


async def test_a_connection_whose_server_stops_answering_pings_is_dropped_and_made_again() -> None:
    async with FakeServer(answer_pings=lambda number: number > 1, garble=lambda _: False) as server:
        reader = NatsBus(servers=server.url, name="reader", ping_interval_s=0.05)
        collector = Collector()
        await reader.subscribe_batches(["s.>"], collector)
        await until(lambda: reader.counters.reconnects == 1)
        assert server.connections == 2 and reader.counters.disconnects == 1
        assert collector.messages == [("s.1", b"hello"), ("s.1", b"hello")]
        await reader.close()


async def test_a_garbled_stream_drops_the_connection_after_the_messages_before_it() -> None:
    async with FakeServer(answer_pings=lambda _: True, garble=lambda number: number == 1) as server:
        reader = NatsBus(servers=server.url, name="reader")
        collector = Collector()
        await reader.subscribe_batches(["s.>"], collector)
        await until(lambda: reader.counters.reconnects == 1)
        assert reader.counters.async_errors == 1 and "nonsense" in reader.counters.last_error
        assert collector.messages == [("s.1", b"hello"), ("s.1", b"hello")]
        await reader.close()

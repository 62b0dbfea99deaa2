"""TLS on NATS against a real nats-server: the server refuses plaintext, every client pins the CA, and the scheduler's
fast path (``common.natsbatches``) speaks TLS itself, with nkeys, through a CA rotation. Both the fast path and the
bus's nats-py connection start TLS first, so a forged "no TLS" line in clear gets nothing from them. ``quotient
nats-keys`` makes certificates that a real server serves and a client verifies by the names deploy dials."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import socket
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import app as agent_app
from common import credentials, natstls
from common.errors import BusUnavailable, ConfigError
from common.natsconn import NatsBus
from common.natsserver import NatsServer, free_port
from quotient import natscerts, natskeys
from tests.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SUBJECT = "quotient.v1.telemetry.node-1"


@pytest.fixture
def certs(tmp_path: Path) -> natstls.TlsFiles:
    return natscerts.for_loopback(tmp_path / "tls")


@pytest.fixture
def tls_server(certs: natstls.TlsFiles, tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tls=certs, monitor_port=free_port()) as server:
        yield server


@contextlib.asynccontextmanager
async def publisher(url: str, ca: Path) -> AsyncIterator[NatsBus]:
    bus = NatsBus(servers=url, name="publisher", tls_ca=ca)
    await asyncio.wait_for(bus.connect_once(), 10)
    try:
        yield bus
    finally:
        await bus.close()


def connections(server: NatsServer) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/connz", timeout=2) as answer:
        found: list[dict[str, Any]] = json.loads(answer.read())["connections"] or []
    return found


def test_a_tls_server_refuses_a_client_that_speaks_plaintext(tls_server: NatsServer) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=5) as sock:
        info = json.loads(sock.recv(4096)[5:])
        assert info["tls_required"] is True
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\nPUB quotient.v1.telemetry.x 2\r\nhi\r\n')
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                answer += chunk

    assert b"PONG" not in answer  # the server closed it: nothing was taken in clear


async def test_the_fast_path_reads_every_message_over_tls_with_the_ca_pinned(
    tls_server: NatsServer, certs: natstls.TlsFiles
) -> None:
    reader = NatsBus(servers=tls_server.url, name="tls-reader", tls_ca=certs.ca)
    received: list[tuple[str, bytes]] = []
    subscription = await reader.subscribe_batches(["quotient.v1.telemetry.>"], received.extend)
    payloads = [bytes([i % 251]) * size for i, size in enumerate([0, 1, 8_000, 70_000, 1_000_000, 3] * 20)]
    try:
        async with publisher(tls_server.url, certs.ca) as bus:
            for payload in payloads:
                await bus.publish(SUBJECT, payload)
            await bus.flush()
        await until(lambda: len(received) >= len(payloads), what="every message over TLS")
        fast = [c for c in connections(tls_server) if c.get("name") == "tls-reader"]
    finally:
        await subscription.unsubscribe()
        await reader.close()

    assert [payload for _, payload in received] == payloads
    # The batched subscription's own connection (not nats-py's), and encrypted.
    assert [c["lang"] for c in fast] == ["python-quotient"]
    assert fast[0]["tls_version"].startswith("1.")


async def test_the_fast_path_authenticates_by_nkey_inside_tls(certs: natstls.TlsFiles, tmp_path: Path) -> None:
    seed = credentials.generate_user_seed()
    seed_file = tmp_path / "scheduler.seed"
    seed_file.write_bytes(seed)
    auth = f'authorization {{ users = [ {{ nkey: "{credentials.public_key(seed)}" }} ] }}'
    with NatsServer(tls=certs, extra_config=auth) as server:
        reader = NatsBus(servers=server.url, name="scheduler", nkey_seed=seed_file, tls_ca=certs.ca)
        received: list[tuple[str, bytes]] = []
        subscription = await reader.subscribe_batches([SUBJECT], received.extend)
        writer = NatsBus(servers=server.url, name="writer", nkey_seed=seed_file, tls_ca=certs.ca)
        await asyncio.wait_for(writer.connect_once(), 10)
        await writer.publish(SUBJECT, b"signed, then sealed")
        await writer.flush()
        await until(lambda: received, what="the message")
        await writer.close()
        await subscription.unsubscribe()

    assert received == [(SUBJECT, b"signed, then sealed")]


async def test_a_server_whose_certificate_another_ca_signed_is_refused(tls_server: NatsServer, tmp_path: Path) -> None:
    stranger = natscerts.for_loopback(tmp_path / "stranger")
    reader = NatsBus(servers=tls_server.url, name="reader", tls_ca=stranger.ca)

    with pytest.raises(BusUnavailable, match="not trusted"):
        await reader.subscribe_batches([SUBJECT], lambda batch: None)


async def test_a_client_that_pins_a_ca_says_nothing_in_clear_to_a_server_that_claims_no_tls(
    certs: natstls.TlsFiles,
) -> None:
    """Whoever sits between a client and NATS could answer with an INFO line that says "no TLS". Neither the fast path
    nor the bus's nats-py connection listens: both start with the TLS handshake, and the forger hears no CONNECT."""
    heard: list[bytes] = []

    async def forger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'INFO {"server_id":"forged","version":"2.15.1","max_payload":1048576,"auth_required":false}\r\n')
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            while chunk := await reader.read(65536):
                heard.append(chunk)
        writer.close()

    server = await asyncio.start_server(forger, "127.0.0.1", 0)
    url = f"nats://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        reader = NatsBus(servers=url, name="agent", tls_ca=certs.ca, connect_timeout_s=1.0)
        with pytest.raises(BusUnavailable):
            await reader.subscribe_batches([SUBJECT], lambda batch: None)
        client = NatsBus(servers=url, name="agent", tls_ca=certs.ca)
        with contextlib.suppress(TimeoutError):  # nats-py retries a first connection for as long as it is let
            await asyncio.wait_for(client.connect_once(timeout_s=1.0), 3)
        await client.close()
    finally:
        server.close()
        await server.wait_closed()

    assert heard, "the clients did dial the forger"
    assert heard[0].startswith(b"\x16\x03")  # a TLS handshake record: the ClientHello
    assert b"CONNECT" not in b"".join(heard)


async def test_a_rotated_ca_is_read_again_when_the_fast_path_reconnects(tmp_path: Path) -> None:
    old = natscerts.for_loopback(tmp_path / "old")
    port = free_port()
    pinned = tmp_path / "pinned-ca.crt"
    pinned.write_bytes(old.ca.read_bytes())
    received: list[tuple[str, bytes]] = []
    server = NatsServer(port=port, tls=old).start()
    reader = NatsBus(servers=server.url, name="reader", tls_ca=pinned)
    try:
        subscription = await reader.subscribe_batches([SUBJECT], received.extend)
        # The rotation: the clients' CA bundle gains the new CA (kept beside the old), then the server restarts with
        # a certificate of the new one.
        material = natscerts.generate(
            names=natscerts.LOOPBACK_NAMES,
            now=datetime.datetime.now(datetime.UTC),
            previous_ca=old.ca.read_bytes(),
        )
        new = natscerts.write_files(tmp_path / "new", material)
        pinned.write_bytes(new.ca.read_bytes())
        server.close()
        server = NatsServer(port=port, tls=new).start()
        await until(lambda: reader.counters.reconnects >= 1, timeout_s=20, what="the reconnect under the new CA")
        async with publisher(server.url, new.ca) as bus:
            await bus.publish(SUBJECT, b"after the rotation")
            await bus.flush()
        await until(lambda: received, what="a message after the rotation")
        await subscription.unsubscribe()
    finally:
        await reader.close()
        server.close()

    assert received == [(SUBJECT, b"after the rotation")]


def test_a_ca_file_that_holds_no_certificate_is_a_config_error_at_start(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.crt"
    bogus.write_text("not a certificate\n")

    with pytest.raises(ConfigError, match="--nats-ca"):
        NatsBus(servers="nats://127.0.0.1:4222", name="agent", tls_ca=bogus)
    with pytest.raises(ConfigError, match="does not exist"):
        NatsBus(servers="nats://127.0.0.1:4222", name="agent", tls_ca=tmp_path / "missing.crt")


async def test_the_agent_with_nats_ca_publishes_over_tls(tls_server: NatsServer, certs: natstls.TlsFiles) -> None:
    values = agent_app.parse_args(["--node", "gpu-1", "--nats", tls_server.url, "--nats-ca", str(certs.ca)])

    async def reconnected() -> None:
        return None

    bus = agent_app.nats_bus(values, node="gpu-1", on_reconnect=reconnected)
    await asyncio.wait_for(bus.connect_once(), 10)
    try:
        names = {c.get("name"): c for c in connections(tls_server)}
    finally:
        await bus.close()

    assert names["quotient-agent-gpu-1"]["tls_version"].startswith("1.")


def _nats_keys(*argv: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert natskeys.main(list(argv)) == 0
    return [doc for doc in yaml.safe_load_all(out.getvalue()) if doc]


def test_nats_keys_makes_the_servers_secret_and_the_clients_ca_and_tls_only_leaves_the_nkeys_alone() -> None:
    documents = _nats_keys("--namespace", "gpu-system")
    only_tls = _nats_keys("--namespace", "gpu-system", "--tls-only")
    without = _nats_keys("--namespace", "gpu-system", "--no-tls")

    by_name = {doc["metadata"]["name"]: doc for doc in documents}
    secret, config_map = by_name[natskeys.TLS_SECRET], by_name[natskeys.CA_CONFIG_MAP]
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["stringData"]) == {natstls.CERT_FILE, natstls.KEY_FILE, natstls.CA_FILE}
    # The clients get the CA alone: no key reaches them.
    assert config_map["kind"] == "ConfigMap" and set(config_map["data"]) == {natstls.CA_FILE}
    assert config_map["data"][natstls.CA_FILE] == secret["stringData"][natstls.CA_FILE]
    assert {doc["metadata"]["name"] for doc in only_tls} == {natskeys.TLS_SECRET, natskeys.CA_CONFIG_MAP}
    assert natskeys.TLS_SECRET not in {doc["metadata"]["name"] for doc in without}
    assert natskeys.USERS_SECRET in {doc["metadata"]["name"] for doc in without}


async def test_a_server_with_the_certificate_nats_keys_made_is_verified_by_the_names_deploy_dials(
    tmp_path: Path,
) -> None:
    assert natskeys.main(["--namespace", "gpu-system", "--out-dir", str(tmp_path / "keys")]) == 0
    files = natstls.TlsFiles.in_directory(tmp_path / "keys" / natskeys.TLS_DIR)
    context = natstls.client_context(files.ca)

    with NatsServer(tls=files) as server:
        # The certificate carries the Service's names and every pod's under the headless Service: checked as a
        # client checks them, by the name (and here, loopback, which the certificate carries for port-forwards).
        for name in (
            "quotient-nats.gpu-system.svc",
            "quotient-nats-2.quotient-nats-headless.gpu-system.svc.cluster.local",
            "localhost",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert (await reader.readline()).startswith(b"INFO ")
            await writer.start_tls(context, server_hostname=name)
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await reader.readline()
        with pytest.raises(OSError, match=r"(?i)hostname|match"):
            await writer.start_tls(context, server_hostname="quotient-nats.other-namespace.svc")
        writer.close()


def test_the_previous_ca_stays_trusted_beside_the_new_one(tmp_path: Path) -> None:
    before = natscerts.for_loopback(tmp_path / "before")
    previous = tmp_path / "previous.crt"
    previous.write_bytes(before.ca.read_bytes())

    documents = _nats_keys("--tls-only", "--previous-ca", str(previous))
    bundle = next(doc for doc in documents if doc["kind"] == "ConfigMap")["data"][natstls.CA_FILE]

    assert bundle.count("BEGIN CERTIFICATE") == 2
    assert bundle.endswith(before.ca.read_text())

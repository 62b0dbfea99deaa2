"""The NATS users and permissions that deploy/ ships without the auth callout, proven against a real nats-server.

``deploy/overlays/static-nkeys/auth.conf`` (the fallback where the auth callout cannot run: every agent is the one
``agent`` user; the callout of ``deploy/base`` is proven in ``tests/e2e/test_nats_callout.py``) is loaded
unchanged: the embedded server's generated config (loopback host, free port, JetStream in a temporary directory)
ends with ``include "<relative path to auth.conf>"`` (nats-server joins an
include path, even an absolute one, to the including file's directory), and the users' public keys reach it through
the environment, as the ``quotient-nats-users`` Secret supplies them in the cluster. The full ``nats.conf`` is
checked with ``nats-server -t``, since its port and store directory are the cluster's.

A refused publish or subscription does not close the connection: the server answers ``-ERR 'Permissions
Violation ...'``, which nats-py hands to the error callback. The server answers a connection's commands in order, so
once a PING sent after them has its PONG, every violation they caused has been reported: no sleeps needed. See
``_round_trip`` for why that takes two ``flush()`` calls with nats-py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

from common import natsserver, subjects
from common.natsserver import NatsServer
from quotient import natskeys
from tests.conftest import REPO
from tests.integration import natsconf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(20)]

NATS_DIR = REPO / "deploy" / "base" / "nats"
NATS_CONF = NATS_DIR / "nats.conf"
AUTH_CONF = REPO / "deploy" / "overlays" / "static-nkeys" / "auth.conf"
RECEIVE_TIMEOUT_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Keys:
    """Fresh keys for the three users: seed files in ``directory``, public keys in ``env``."""

    directory: Path
    env: dict[str, str]

    def seed_file(self, role: str) -> Path:
        return self.directory / f"{role}.seed"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Connection:
    nc: NatsClient
    errors: list[str]

    def violations(self) -> list[str]:
        return [text for text in self.errors if "permissions violation" in text]


Connect = Callable[[str], Awaitable[Connection]]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    generated = natskeys.generate_keys()
    directory = tmp_path / "keys"
    natskeys.write_key_files(directory, generated)
    return Keys(directory=directory, env={natskeys.env_name(key.role): key.public_key for key in generated})


@pytest.fixture
def secured_server(tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsServer]:
    """The embedded server with deploy's auth.conf; it inherits the keys through this process's environment."""
    for name, value in keys.env.items():
        monkeypatch.setenv(name, value)
    workdir = tmp_path / "nats"
    workdir.mkdir()
    include = os.path.relpath(AUTH_CONF, workdir)
    with NatsServer(workdir=workdir, extra_config=f'include "{include}"\n') as server:
        yield server


@pytest.fixture
async def connect(secured_server: NatsServer, keys: Keys) -> AsyncIterator[Connect]:
    connections: list[Connection] = []

    async def _connect(role: str) -> Connection:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(
            secured_server.url,
            nkeys_seed=str(keys.seed_file(role)),
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=2,
        )
        connection = Connection(nc=nc, errors=errors)
        connections.append(connection)
        return connection

    yield _connect
    for connection in connections:
        await connection.nc.close()


async def _round_trip(connection: Connection) -> None:
    """Return once the server has answered every command this connection sent before the call.

    nats-py 2.16 writes a flush's PING straight to the socket, ahead of commands still queued for its flusher task,
    so the first PONG may come back before the server saw them. That task runs before the PONG can be read, so the
    second PING follows every earlier command.
    """
    await connection.nc.flush()
    await connection.nc.flush()


def _check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = natsserver.find_binary()
    # The pod's paths (TLS Secret, pid file, volume) pointed at files here, $POD_NAME as the pod has it.
    with tempfile.TemporaryDirectory(prefix="quotient-nats-conf-") as workdir:
        config = natsconf.stage(NATS_CONF.parent, Path(workdir))
        return subprocess.run(
            [str(binary), "-t", "-c", str(config)],
            env=env | dict(natsconf.POD_ENV),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )


def _env_without_quotient_keys() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("QUOTIENT_")}


def test_the_deploy_server_config_is_valid_when_the_user_keys_are_in_the_environment(keys: Keys) -> None:
    result = _check_config(_env_without_quotient_keys() | keys.env)

    assert result.returncode == 0, result.stderr + result.stdout


def test_the_deploy_server_refuses_to_start_when_a_user_key_is_missing(keys: Keys) -> None:
    env = _env_without_quotient_keys() | keys.env
    del env["QUOTIENT_READER_NKEY"]

    result = _check_config(env)

    assert result.returncode != 0
    assert "QUOTIENT_READER_NKEY" in result.stderr + result.stdout


def test_the_deploy_server_refuses_a_user_key_that_is_not_a_user_public_key(keys: Keys) -> None:
    env = _env_without_quotient_keys() | keys.env | {"QUOTIENT_SCHEDULER_NKEY": "not-a-key"}

    result = _check_config(env)

    assert result.returncode != 0
    assert "nkey" in (result.stderr + result.stdout).lower()


async def test_a_connection_without_credentials_is_refused(secured_server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(secured_server.url, allow_reconnect=False, connect_timeout=2)


async def test_a_connection_with_an_nkey_the_server_does_not_know_is_refused(
    secured_server: NatsServer, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"
    natskeys.write_key_files(stranger, natskeys.generate_keys())

    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(
            secured_server.url, nkeys_seed=str(stranger / "agent.seed"), allow_reconnect=False, connect_timeout=2
        )


async def test_the_agent_publishes_telemetry_and_health_that_the_scheduler_receives(connect: Connect) -> None:
    scheduler = await connect("scheduler")
    agent = await connect("agent")
    sub = await scheduler.nc.subscribe("quotient.>")
    await _round_trip(scheduler)

    published = [
        subjects.telemetry("node-1"),
        subjects.health("node-1"),
        # A node name with dots is still one subject token.
        subjects.telemetry("ip-10-0-0-1.ec2.internal"),
        subjects.health("ip-10-0-0-1.ec2.internal"),
    ]
    for subject in published:
        await agent.nc.publish(subject, b"sample")
    await _round_trip(agent)

    received = [(await sub.next_msg(timeout=RECEIVE_TIMEOUT_S)).subject for _ in published]
    assert received == published
    assert agent.errors == []


@pytest.mark.parametrize(
    "subject",
    [
        "quotient.v1.alerts.GpuMemoryOverconsumption",
        "quotient.v1.decisions",
        "quotient.v1.telemetry",
        # Not the protocol's form: the node's dots must be escaped into one token.
        "quotient.v1.telemetry.ip-10-0-0-1.ec2.internal",
        "quotient.v1.health.node-1.extra",
        "$JS.API.STREAM.CREATE.QUOTIENT_TELEMETRY",
        "_INBOX.anything",
    ],
)
async def test_the_agent_is_refused_publishing_outside_telemetry_and_health(connect: Connect, subject: str) -> None:
    scheduler = await connect("scheduler")
    agent = await connect("agent")
    sub = await scheduler.nc.subscribe("quotient.>")
    inbox_sub = await scheduler.nc.subscribe("_INBOX.>")
    await _round_trip(scheduler)

    await agent.nc.publish(subject, b"forged")
    await agent.nc.publish("quotient.v1.telemetry.node-1", b"sentinel")
    await _round_trip(agent)

    assert agent.violations() == [f'nats: permissions violation for publish to "{subject.lower()}"']
    # Messages of one connection arrive in order: the first one the scheduler sees is the sentinel.
    first = await sub.next_msg(timeout=RECEIVE_TIMEOUT_S)
    assert (first.subject, first.data) == ("quotient.v1.telemetry.node-1", b"sentinel")
    assert inbox_sub.pending_msgs == 0
    assert agent.nc.is_connected


@pytest.mark.parametrize("subject", ["quotient.>", "quotient.v1.telemetry.node-1", "_INBOX.>", ">"])
async def test_the_agent_is_refused_every_subscription(connect: Connect, subject: str) -> None:
    agent = await connect("agent")

    await agent.nc.subscribe(subject)
    await _round_trip(agent)

    assert agent.violations() == [f'nats: permissions violation for subscription to "{subject.lower()}"']


async def test_the_reader_receives_every_quotient_subject_but_publishes_nothing(connect: Connect) -> None:
    reader = await connect("reader")
    agent = await connect("agent")
    scheduler = await connect("scheduler")
    sub = await reader.nc.subscribe("quotient.>")
    await _round_trip(reader)

    await agent.nc.publish("quotient.v1.telemetry.node-1", b"t")
    await _round_trip(agent)
    await scheduler.nc.publish("quotient.v1.alerts.GpuMemoryOverconsumption", b"a")
    await scheduler.nc.publish("quotient.v1.decisions", b"d")
    await _round_trip(scheduler)
    forbidden = ["quotient.v1.telemetry.node-1", "quotient.v1.alerts.TelemetryStale", "_INBOX.x", "$JS.API.INFO"]
    for subject in forbidden:
        await reader.nc.publish(subject, b"forged")
    await _round_trip(reader)

    received = [(await sub.next_msg(timeout=RECEIVE_TIMEOUT_S)).subject for _ in range(3)]
    assert sorted(received) == [
        "quotient.v1.alerts.GpuMemoryOverconsumption",
        "quotient.v1.decisions",
        "quotient.v1.telemetry.node-1",
    ]
    assert reader.violations() == [
        f'nats: permissions violation for publish to "{subject.lower()}"' for subject in forbidden
    ]


async def test_the_scheduler_creates_the_telemetry_stream_and_reads_it_through_consumers(connect: Connect) -> None:
    scheduler = await connect("scheduler")
    agent = await connect("agent")
    js = scheduler.nc.jetstream()
    await js.add_stream(
        name="QUOTIENT_TELEMETRY",
        subjects=["quotient.v1.telemetry.>", "quotient.v1.health.>"],
        storage=StorageType.MEMORY,
        max_msgs_per_subject=1,
    )
    for node, sample in [("node-1", b"old"), ("node-1", b"new"), ("node-2", b"only")]:
        await agent.nc.publish(f"quotient.v1.telemetry.{node}", sample)
    await _round_trip(agent)

    last = await js.get_last_msg("QUOTIENT_TELEMETRY", "quotient.v1.telemetry.node-1")
    assert last.data == b"new"

    # A pull consumer with explicit acks ($JS.API for the fetch, $JS.ACK for the acks).
    pull = await js.pull_subscribe(
        "quotient.v1.telemetry.>",
        durable="scheduler",
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT),
    )
    fetched = await pull.fetch(2, timeout=RECEIVE_TIMEOUT_S)
    for msg in fetched:
        await msg.ack_sync(timeout=RECEIVE_TIMEOUT_S)
    assert sorted(msg.data for msg in fetched) == [b"new", b"only"]

    # An ordered push consumer, as a starting scheduler follows the stream (deliveries on an _INBOX subject).
    ordered = await js.subscribe(
        "quotient.v1.telemetry.>", ordered_consumer=True, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT
    )
    first = await ordered.next_msg(timeout=RECEIVE_TIMEOUT_S)
    second = await ordered.next_msg(timeout=RECEIVE_TIMEOUT_S)
    assert sorted([first.data, second.data]) == [b"new", b"only"]
    assert scheduler.errors == []


async def test_the_scheduler_publishes_alerts_and_decisions(connect: Connect) -> None:
    scheduler = await connect("scheduler")
    listener = await connect("scheduler")
    sub = await listener.nc.subscribe("quotient.v1.>")
    await _round_trip(listener)

    await scheduler.nc.publish("quotient.v1.alerts.GhostAllocation", b"alert")
    await scheduler.nc.publish("quotient.v1.decisions", b"decision")
    await _round_trip(scheduler)

    received = [(await sub.next_msg(timeout=RECEIVE_TIMEOUT_S)).subject for _ in range(2)]
    assert received == ["quotient.v1.alerts.GhostAllocation", "quotient.v1.decisions"]
    assert scheduler.errors == []

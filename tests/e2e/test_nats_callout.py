"""Proof of issue 13's first point: each agent may publish only its own node's subjects, and NATS enforces it.

From the outside: a real nats-server loads ``deploy/base/nats/auth.conf`` unchanged (the scheduler and reader nkey
users, the auth callout), with fresh keys from ``quotient nats-keys``; two real scheduler processes serve the callout
in one queue group, each under the deployed ServiceAccount and RBAC (``deploy/base`` rendered and applied to the
emulator, which enforces RBAC); the emulator's kubelets project the agent pods' ServiceAccount tokens (``audience
quotient-nats``, bound to the pod and its node) and answer the TokenReviews. Raw NATS clients then connect with those
tokens as an agent, or an attacker, would; a real ``quotient agent`` process connects with its token file.

What each test shows: node A's token may publish on A's two subjects and nothing else (B's subjects are a
permissions violation, and a forged sample for B from A's identity never reaches the scheduler: its ``/metrics``
show nothing accepted for B, while the same sample for A is accepted); a bad, expired, foreign or unbound token
cannot connect, and each refusal is counted by reason; the callout keeps answering while the leader is killed and
restarted (the other replica answers); and the real agent keeps publishing across the ends of its grants (the
callout's ``--nats-callout-max-ttl`` is short here), reconnecting each time with its token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from common import quantities, subjects, wire
from common.natsserver import NatsServer, free_port
from quotient import agentpods, natskeys
from quotient.emulator import access, authn
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Obj = dict[str, Any]
SPEC = "2x1xA100-80GB"
NODE_A, NODE_B = "node-0", "node-1"
SYSTEM = "quotient-system"
SCHEDULER = authn.service_account_user(SYSTEM, "quotient-scheduler").name
GRANT_TTL_S = 5  # --nats-callout-max-ttl: short, so the real agent's grant ends during the test
SETUP_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
GIB = quantities.GIB


@dataclasses.dataclass(slots=True, kw_only=True)
class Replica:
    process: harness.SchedulerProcess
    metrics_port: int
    identity: str

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]


@dataclasses.dataclass(slots=True, kw_only=True)
class CalloutWorld:
    world: harness.World
    nats: NatsServer
    keys: Path
    tokens: dict[str, Path]
    replicas: dict[str, Replica]
    kubeconfig: Path

    def token(self, node: str) -> str:
        return self.tokens[node].read_text()

    def start_replica(self, identity: str) -> Replica:
        metrics_port = free_port()
        process = self.world.scheduler(
            "--lease-namespace",
            SYSTEM,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(metrics_port),
            "--nats",
            self.nats.url,
            "--nats-nkey-seed",
            str(self.keys / "scheduler.seed"),
            "--nats-callout-issuer-seed",
            str(self.keys / f"{natskeys.CALLOUT}.seed"),
            "--nats-callout-max-ttl",
            f"{GRANT_TTL_S}s",
            "--telemetry-stale-floor",
            "30s",
            identity=identity,
            leader_elect=True,
            kubeconfig=self.kubeconfig,
        )
        replica = Replica(process=process, metrics_port=metrics_port, identity=identity)
        self.replicas[identity] = replica
        return replica

    def leader(self) -> Replica | None:
        holder = harness.lease_holder(self.world.emulator, SYSTEM, "quotient-scheduler")
        return self.replicas.get(holder)

    def total(self, name: str, **labels: str) -> float:
        """The sum over the running replicas of ``name``'s samples whose labels include ``labels``."""
        return sum(
            value
            for replica in self.replicas.values()
            if replica.process.process.poll() is None
            for sample, got, value in replica.samples()
            if sample == name and labels.items() <= got.items()
        )

    def leader_value(self, name: str, **labels: str) -> float | None:
        leader = self.leader()
        if leader is None:
            return None
        found = [v for s, got, v in leader.samples() if s == name and labels.items() <= got.items()]
        return found[0] if found else None


def _render_setup() -> list[Obj]:
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc and doc["kind"] in SETUP_KINDS]


@pytest.fixture(scope="module")
def callout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CalloutWorld]:
    directory = tmp_path_factory.mktemp("callout")
    keys = directory / "keys"
    generated = natskeys.generate_keys()
    natskeys.write_key_files(keys, generated)
    server_dir = directory / "nats"
    server_dir.mkdir()
    auth_conf = REPO / "deploy" / "base" / "nats" / "auth.conf"
    server = NatsServer(
        workdir=server_dir,
        extra_config=f'include "{os.path.relpath(auth_conf, server_dir)}"\n',
        env={natskeys.env_name(key.role): key.public_key for key in generated},
    ).start()
    try:
        with harness.world(SPEC, directory) as world:
            world.apply("setup", *_render_setup())
            token = world.kubectl("create", "token", "quotient-scheduler", "-n", SYSTEM, "--duration", "2h")
            kubeconfig = world.emulator.emulator.write_kubeconfig(
                directory / "scheduler.kubeconfig", token.stdout.strip()
            )
            emulator = world.emulator
            files = emulator.run(lambda: agentpods.deploy(emulator.emulator, [NODE_A, NODE_B]))
            for path in files.values():
                polling.until_sync(path.exists, timeout_s=harness.STEP_TIMEOUT_S, what=f"the projected token {path}")
            current = CalloutWorld(
                world=world, nats=server, keys=keys, tokens=files, replicas={}, kubeconfig=kubeconfig
            )
            current.start_replica("sched-a")
            current.start_replica("sched-b")
            polling.until_sync(current.leader, timeout_s=harness.STEP_TIMEOUT_S * 2, what="a leader")
            yield current
            print("--- nats-server log", server.log_tail(40), sep="\n")
    finally:
        server.close()


# --- what an agent (or an attacker) does ---


@dataclasses.dataclass(slots=True, kw_only=True)
class Session:
    client: Any
    errors: list[str]

    def violations(self) -> list[str]:
        return [error for error in self.errors if "permissions violation" in error]


async def _connect(world: CalloutWorld, token: str) -> Session:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    client = await nats.connect(
        world.nats.url, token=token, error_cb=on_error, allow_reconnect=False, connect_timeout=10
    )
    return Session(client=client, errors=errors)


async def _reader(world: CalloutWorld) -> Any:
    return await nats.connect(world.nats.url, nkeys_seed=str(world.keys / "reader.seed"), allow_reconnect=False)


async def _round_trip(session: Session) -> None:
    """Every command sent before has been answered (see tests/integration/test_nats_permissions.py)."""
    await session.client.flush()
    await session.client.flush()


def _refused(world: CalloutWorld, token: str) -> str:
    async def attempt() -> str:
        with pytest.raises(nats.errors.Error) as refused:
            await nats.connect(world.nats.url, token=token, allow_reconnect=False, connect_timeout=10)
        return str(refused.value)

    return asyncio.run(attempt())


def _sample(node: str, *, used_gib: int) -> bytes:
    """A valid telemetry sample for ``node``, stamped now: what the scheduler accepts if it arrives."""
    return wire.encode(
        wire.NodeTelemetry(
            v=1,
            node=node,
            boot="forger",
            seq=1,
            ts_ns=time.time_ns(),
            interval_ms=1000,
            gpus=(
                wire.GpuReport(
                    index=0,
                    uuid=f"GPU-{node}",
                    model="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * GIB,
                    memory_reserved_bytes=0,
                    memory_used_bytes=used_gib * GIB,
                    memory_free_bytes=(80 - used_gib) * GIB,
                    processes=(),
                ),
            ),
        )
    )


# --- the proofs ---


def test_node_as_token_publishes_on_as_subjects_and_is_refused_on_bs_and_every_subscription(
    callout: CalloutWorld,
) -> None:
    async def run() -> tuple[list[str], list[str], list[tuple[str, bytes]]]:
        reader = await _reader(callout)
        received = await reader.subscribe("quotient.>")
        await reader.flush()
        agent = await _connect(callout, callout.token(NODE_A))
        try:
            allowed = [subjects.telemetry(NODE_A), subjects.health(NODE_A)]
            refused = [subjects.telemetry(NODE_B), subjects.health(NODE_B), "quotient.v1.alerts.TelemetryStale"]
            for subject in refused + allowed:
                await agent.client.publish(subject, b"x")
            await agent.client.subscribe(subjects.TELEMETRY_ALL)
            await _round_trip(agent)
            got = [(msg.subject, msg.data) for msg in [await received.next_msg(timeout=5) for _ in allowed]]
            await reader.flush()
            assert received.pending_msgs == 0, "nothing but A's subjects arrived"
            return refused, agent.violations(), got
        finally:
            await agent.client.close()
            await reader.close()

    refused, violations, got = asyncio.run(run())

    assert got == [(subjects.telemetry(NODE_A), b"x"), (subjects.health(NODE_A), b"x")]
    assert violations == [
        *(f'nats: permissions violation for publish to "{subject.lower()}"' for subject in refused),
        f'nats: permissions violation for subscription to "{subjects.TELEMETRY_ALL}"',
    ]
    assert callout.total("quotient_nats_auth_total", outcome="granted") >= 1


def test_a_forged_sample_for_node_b_from_node_as_identity_never_reaches_the_scheduler(callout: CalloutWorld) -> None:
    async def publish(node: str, used_gib: int) -> list[str]:
        agent = await _connect(callout, callout.token(NODE_A))
        try:
            await agent.client.publish(subjects.telemetry(node), _sample(node, used_gib=used_gib))
            await _round_trip(agent)
            return agent.violations()
        finally:
            await agent.client.close()

    def used(node: str) -> float | None:
        return callout.leader_value("quotient_device_gpu_memory_used_bytes", node=node, gpu="0")

    assert asyncio.run(publish(NODE_B, 77)) == [
        f'nats: permissions violation for publish to "{subjects.telemetry(NODE_B)}"'
    ]
    # The control: the same kind of sample for A, from A's identity, is accepted and shows.
    assert asyncio.run(publish(NODE_A, 33)) == []
    polling.until_sync(lambda: used(NODE_A) == 33 * GIB, timeout_s=harness.STEP_TIMEOUT_S, what="A's sample accepted")

    assert used(NODE_B) is None
    assert callout.leader_value("quotient_node_telemetry_age_seconds", node=NODE_B) is None


def test_a_bad_expired_foreign_or_unbound_token_cannot_connect_and_each_refusal_is_counted(
    callout: CalloutWorld,
) -> None:
    kubectl = callout.world.kubectl
    emulator = callout.world.emulator
    # The agent's account, but a token for the API (not the callout's audience), and one bound to no pod.
    api_token = kubectl("create", "token", agentpods.ACCOUNT, "-n", SYSTEM).stdout.strip()
    unbound = kubectl("create", "token", agentpods.ACCOUNT, "-n", SYSTEM, "--audience", "quotient-nats").stdout.strip()
    # The scheduler's account, for the callout's audience: a valid token, of the wrong identity.
    foreign = kubectl("create", "token", "quotient-scheduler", "-n", SYSTEM, "--audience", "quotient-nats")
    # A token bound to an agent pod that is no longer there (a pod replaced, a token kept): refused by the review.
    account = emulator.call(lambda: emulator.emulator.get("v1", "ServiceAccount", agentpods.ACCOUNT, SYSTEM)) or {}
    stale = emulator.call(
        lambda: emulator.emulator.server.access.tokens.issue_for_account(
            SYSTEM,
            agentpods.ACCOUNT,
            str(account["metadata"]["uid"]),
            expiration_s=600,
            audiences=["quotient-nats"],
            pod=authn.PodBinding(namespace=SYSTEM, name=agentpods.pod_name(NODE_A), uid="gone", node=NODE_A),
        )[0]
    )
    # A token of the real agent pod that has expired (issued for a second, below TokenRequest's minimum, as a
    # test hook: the kubelet's would take ten minutes at least).
    agent_pod = emulator.call(lambda: emulator.emulator.get("v1", "Pod", agentpods.pod_name(NODE_A), SYSTEM)) or {}
    expired, expires_at_s = emulator.call(
        lambda: emulator.emulator.server.access.tokens.issue_for_account(
            SYSTEM,
            agentpods.ACCOUNT,
            str(account["metadata"]["uid"]),
            expiration_s=1,
            audiences=["quotient-nats"],
            pod=authn.PodBinding(
                namespace=SYSTEM, name=agentpods.pod_name(NODE_A), uid=str(agent_pod["metadata"]["uid"]), node=NODE_A
            ),
        )
    )
    polling.until_sync(lambda: time.time() > expires_at_s, timeout_s=3, what="the token expired")
    before = {
        reason: callout.total("quotient_nats_auth_total", outcome="denied", reason=reason)
        for reason in ("token_rejected", "not_the_agent", "no_pod", "no_token")
    }

    for token in ("not-a-token", api_token, unbound, foreign.stdout.strip(), stale, expired, ""):
        assert "authorization violation" in _refused(callout, token).lower()

    def counted() -> dict[str, float]:
        return {
            reason: callout.total("quotient_nats_auth_total", outcome="denied", reason=reason) - count
            for reason, count in before.items()
        }

    # not-a-token, the API's audience, the pod that is gone, the expired one; the scheduler's account; the unbound
    # token; none.
    expected = {"token_rejected": 4, "not_the_agent": 1, "no_pod": 1, "no_token": 1}
    polling.until_sync(lambda: counted() == expected, timeout_s=10, what=f"the refusals counted: {expected}")
    log = callout.nats.log_tail(200)
    assert "Auth callout service returned an error: not_the_agent" in log
    assert "Auth callout service returned an error: no_pod" in log
    assert "token has expired" in log


def test_the_callout_keeps_answering_while_the_leader_is_killed_and_comes_back(callout: CalloutWorld) -> None:
    async def connect_and_publish() -> None:
        agent = await _connect(callout, callout.token(NODE_B))
        try:
            await agent.client.publish(subjects.telemetry(NODE_B), b"ok")
            await _round_trip(agent)
            assert agent.violations() == []
        finally:
            await agent.client.close()

    old = polling.until_sync(callout.leader, timeout_s=harness.STEP_TIMEOUT_S, what="a leader")
    old.process.kill()
    # While the lease still names the dead leader, and while the other replica takes it over: agents connect.
    deadline = time.monotonic() + 6
    connected = 0
    while time.monotonic() < deadline:
        asyncio.run(connect_and_publish())
        connected += 1
    new = polling.until_sync(
        lambda: (leader := callout.leader()) is not None and leader is not old and leader,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the other replica leading",
    )
    assert new
    old.process.close()
    replaced = callout.start_replica(old.identity)
    polling.until_sync(
        lambda: replaced.samples() != [], timeout_s=harness.STEP_TIMEOUT_S, what="the restarted replica serving"
    )
    for _ in range(5):
        asyncio.run(connect_and_publish())
    assert connected >= 3
    assert "Traceback" not in new.process.log()


def test_the_real_agent_connects_with_its_token_file_and_keeps_publishing_across_the_ends_of_its_grants(
    callout: CalloutWorld, tmp_path: Path
) -> None:
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log_file:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quotient.cli",
                "agent",
                "--node",
                NODE_B,
                "--fake-gpus",
                SPEC,
                "--nats",
                callout.nats.url,
                "--nats-token-file",
                str(callout.tokens[NODE_B]),
                "--interval",
                "0.25s",
                "--metrics-port",
                "0",
            ],
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:

        def received() -> float:
            return callout.total("quotient_telemetry_messages_total", outcome="accepted")

        polling.until_sync(
            lambda: callout.leader_value("quotient_node_telemetry_age_seconds", node=NODE_B) is not None,
            timeout_s=harness.STEP_TIMEOUT_S,
            what="the agent's telemetry accepted",
        )
        # Two grant lifetimes: the server ends the connection at each, the agent connects again with its token.
        polling.until_sync(
            lambda: log_path.read_text().count("event=nats_connection_closed") >= 2,
            timeout_s=GRANT_TTL_S * 4,
            what="two grants ended",
        )
        count = received()
        polling.until_sync(lambda: received() > count, timeout_s=harness.STEP_TIMEOUT_S, what="telemetry after that")
        age = callout.leader_value("quotient_node_telemetry_age_seconds", node=NODE_B)
        assert age is not None and age < 3, age
        assert "Traceback" not in log_path.read_text()
        assert agent.poll() is None
    finally:
        agent.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=10)
        if agent.poll() is None:
            agent.kill()
        print("--- agent log", log_path.read_text()[-4000:], sep="\n")


def test_the_scheduler_reviewed_tokens_under_its_deployed_rights_and_was_refused_nothing_for_it(
    callout: CalloutWorld,
) -> None:
    emulator = callout.world.emulator
    record = emulator.call(lambda: emulator.emulator.requests_of(SCHEDULER))

    review = access.Asked(verb="create", api_group="authentication.k8s.io", resource="tokenreviews", namespace="")
    assert review in record.served
    assert not [asked for asked in record.refused if asked.resource == "tokenreviews"]

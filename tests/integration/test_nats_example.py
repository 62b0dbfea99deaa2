"""The Python reader on docs/nats.md works as printed, against a real nats-server secured as deploy/ secures it.

The page's code block is run as it stands (only ``__name__`` differs, so its ``main`` does not start): it connects as
the ``reader`` nkey user over TLS with the CA pinned and TLS first, to a server with deploy's users and TLS, and reads
what the scheduler user publishes: telemetry of a node whose name has dots, an alert and a decision, each as
``common.wire`` encodes it, and, in between, a message that is not msgpack and one of a future version, which it must
skip. What its own ``handle`` prints is checked too.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from common import natstls, subjects, wire
from common.natsserver import NatsServer
from quotient import natscerts, natskeys
from tests.conftest import REPO
from tests.polling import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

PAGE = REPO / "docs" / "nats.md"
AUTH_CONF = REPO / "deploy" / "overlays" / "static-nkeys" / "auth.conf"
NODE = "ip-10-0-0-1.ec2.internal"
GIB = 1 << 30


def _example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "docs/nats.md has one Python example"
    return str(blocks[0])


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    generated = natskeys.generate_keys()
    directory = tmp_path / "keys"
    natskeys.write_key_files(directory, generated)
    return directory, {natskeys.env_name(key.role): key.public_key for key in generated}


@pytest.fixture
def tls(tmp_path: Path) -> natstls.TlsFiles:
    return natscerts.for_loopback(tmp_path / "tls")


@pytest.fixture
def server(tmp_path: Path, keys: tuple[Path, dict[str, str]], tls: natstls.TlsFiles) -> Iterator[NatsServer]:
    workdir = tmp_path / "nats"
    workdir.mkdir()
    include = os.path.relpath(AUTH_CONF, workdir)
    with NatsServer(workdir=workdir, extra_config=f'include "{include}"\n', tls=tls, env=keys[1]) as running:
        yield running


def _telemetry() -> bytes:
    gpu = wire.GpuReport(
        index=0,
        uuid="GPU-0",
        model="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=80 * GIB,
        memory_reserved_bytes=GIB,
        memory_used_bytes=3 * GIB,
        memory_free_bytes=76 * GIB,
        processes=(),
    )
    return wire.encode(
        wire.NodeTelemetry(v=1, node=NODE, boot="b", seq=1, ts_ns=1, interval_ms=1000, gpus=(gpu,), driver_version="x")
    )


def _alert() -> bytes:
    return wire.encode(
        wire.Alert(
            v=1,
            node="scheduler-0",
            boot="s",
            seq=1,
            ts_ns=1,
            name="GpuUnhealthy",
            state=wire.AlertState.FIRING,
            severity=wire.Severity.CRITICAL,
            node_name=NODE,
            message="GPU 0 is out of placement: xid 79",
            labels={},
        )
    )


def _decision(pod: str) -> bytes:
    return wire.encode(
        wire.Decision(
            v=1,
            node="scheduler-0",
            boot="s",
            seq=2,
            ts_ns=2,
            action=wire.DecisionAction.BIND,
            pod_namespace="team-a",
            pod_name=pod,
            pod_uid="uid-1",
            node_name=NODE,
            gpu_indices=(0,),
            reason="Scheduled",
            message="bound",
            cycle=7,
        )
    )


async def test_the_python_reader_of_the_nats_page_reads_what_quotient_publishes(
    server: NatsServer, keys: tuple[Path, dict[str, str]], tls: natstls.TlsFiles
) -> None:
    namespace: dict[str, Any] = {"__name__": "docs_nats_example"}
    exec(compile(_example(), str(PAGE), "exec"), namespace)
    received: list[tuple[str, dict[str, Any]]] = []
    printed = io.StringIO()

    def collect(subject: str, message: dict[str, Any]) -> None:
        received.append((subject, message))
        with contextlib.redirect_stdout(printed):
            namespace["handle"](subject, message)

    reader = await namespace["follow"](
        servers=[server.url], ca_file=str(tls.ca), seed_file=str(keys[0] / "reader.seed"), on_message=collect
    )
    scheduler = await nats.connect(
        server.url, tls=natstls.client_context(tls.ca), nkeys_seed=str(keys[0] / "scheduler.seed")
    )
    try:
        await scheduler.publish(subjects.telemetry(NODE), _telemetry())
        await scheduler.publish(subjects.alert("GpuUnhealthy"), _alert())
        await scheduler.publish(subjects.DECISIONS, b"\xc1 not msgpack")
        await scheduler.publish(subjects.DECISIONS, b"\x81\xa1v\x02")  # {"v": 2}: a version this reader does not know
        await scheduler.publish(subjects.DECISIONS, _decision("train-0"))
        await scheduler.flush()
        await until(lambda: len(received) >= 3, what="the reader's three messages")
    finally:
        await scheduler.close()
        await reader.drain()

    assert [subject for subject, _ in received] == [
        "quotient.v1.telemetry.ip-10-0-0-1~ec2~internal",
        "quotient.v1.alerts.GpuUnhealthy",
        "quotient.v1.decisions",
    ]
    assert received[0][1]["gpus"][0]["memory_used_bytes"] == 3 * GIB
    assert printed.getvalue().splitlines() == [
        f"{NODE}: 1 GPUs, 3.0 GiB in use",
        "GpuUnhealthy firing (critical): GPU 0 is out of placement: xid 79",
        f"bind team-a/train-0 on {NODE}",
    ]

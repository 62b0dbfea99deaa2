"""Never down, from the outside: a fresh cluster just works, a missing namespace is said in one line and on /readyz,
a port in use is one line naming the flag, and deleting a queue under running work never stops the scheduler.

Each test runs the real scheduler process against a fresh emulated cluster and looks at it as an operator would:
kubectl, the process's exit status and output, and its HTTP endpoints.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from common.natsserver import free_port
from quotient.emulator.faults import Fault
from tests import polling
from tests.conftest import REPO
from tests.e2e import harness

pytestmark = pytest.mark.integration

LEASE_NAMESPACE = "quotient-system"


def _readyz(port: int) -> tuple[int, str]:
    """The scheduler's /readyz answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_on_a_fresh_cluster_the_scheduler_makes_its_namespaces_leads_and_places(tmp_path: Path) -> None:
    with harness.world("1x4xA100-80GB", tmp_path) as world:
        assert LEASE_NAMESPACE not in {ns["metadata"]["name"] for ns in world.kubectl.json("get", "ns")["items"]}
        scheduler = world.scheduler("--lease-namespace", LEASE_NAMESPACE, identity="fresh", leader_elect=True)
        world.apply("pod", harness.gpu_pod("first"))
        polling.until_sync(lambda: world.bound(["first"]), timeout_s=harness.STEP_TIMEOUT_S, what="the pod bound")
        namespaces = {ns["metadata"]["name"] for ns in world.kubectl.json("get", "ns")["items"]}
        assert {LEASE_NAMESPACE, "quotient-reservation"} <= namespaces
        assert harness.lease_holder(world.emulator, LEASE_NAMESPACE, "quotient-scheduler") == "fresh"
        assert "event=namespace_created" in scheduler.log()


def test_a_namespace_the_scheduler_may_not_make_is_said_in_one_line_and_on_readyz_until_it_exists(
    tmp_path: Path,
) -> None:
    with harness.world("1x4xA100-80GB", tmp_path) as world:
        refusal = harness.inject(world.emulator, Fault(verb="create", resource="namespaces", code=403))
        port = free_port()
        scheduler = world.scheduler(
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            identity="denied",
            leader_elect=True,
        )
        world.apply("pod", harness.gpu_pod("waiting"))
        polling.until_sync(
            lambda: "event=namespace_missing" in scheduler.log(), timeout_s=harness.STEP_TIMEOUT_S, what="the reason"
        )
        [line] = [line for line in scheduler.log().splitlines() if "event=namespace_missing" in line]
        assert LEASE_NAMESPACE in line and "kubectl create namespace" in line and "--lease-namespace" in line
        status, body = _readyz(port)
        assert status == 503 and LEASE_NAMESPACE in body
        assert not world.bound(["waiting"])
        # The operator creates the namespace (the scheduler's own create is still refused): all it takes.
        harness.remove_fault(world.emulator, refusal)
        world.kubectl("create", "namespace", LEASE_NAMESPACE)
        polling.until_sync(lambda: world.bound(["waiting"]), timeout_s=30, what="the pod bound once the namespace is")
        polling.until_sync(lambda: _readyz(port)[0] == 200, timeout_s=harness.STEP_TIMEOUT_S, what="ready")
        assert scheduler.process.poll() is None


def test_a_port_in_use_is_one_line_naming_the_flag_and_exit_status_2() -> None:
    with harness.cluster("1x1xA100-80GB") as emulator, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "quotient.cli",
            "scheduler",
            "--kube-server",
            emulator.url,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            "--no-webhook",
            "--no-leader-elect",
        ]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("quotient scheduler:")]
    assert len(lines) == 1 and f"--metrics-port: cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in done.stderr

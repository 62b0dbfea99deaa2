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

from common import names
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


@pytest.mark.parametrize("node", ["1x2xA100-80GB"])
def test_deleting_a_queue_under_running_work_never_stops_the_scheduler_and_its_pods_can_be_reclaimed(
    tmp_path: Path, node: str
) -> None:
    queues = [
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": {
                "resources": {
                    "gpu": {"quota": 1, "limit": -1, "overQuotaWeight": 1},
                    "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                    "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                }
            },
        }
        for name in ("team-a", "team-b")
    ]

    def in_queue(name: str, queue: str) -> dict[str, object]:
        pod = harness.gpu_pod(name)
        pod["metadata"]["labels"] = {"kai.scheduler/queue": queue}  # type: ignore[index]
        return pod

    with harness.world(node, tmp_path) as world:
        world.apply("queues", *queues)
        scheduler = world.scheduler(identity="queues")
        world.apply("running", in_queue("a-1", "team-a"), in_queue("b-1", "team-b"))
        polling.until_sync(lambda: world.bound(["a-1", "b-1"]), timeout_s=harness.STEP_TIMEOUT_S, what="both bound")
        world.kubectl("delete", "queue", "team-b")

        def podgroup_reason(pod: str) -> str:
            group = harness.pods(world.kubectl)[pod]["metadata"].get("annotations", {}).get(names.POD_GROUP_ANNOTATION)
            if group is None:
                return ""  # the grouper writes the annotation a moment after it made the group
            listed = world.kubectl.json("get", "podgroups.scheduling.run.ai", group, "-n", "default")
            conditions = (listed.get("status") or {}).get("schedulingConditions") or []
            return " ".join(f"{c.get('reason')}: {c.get('message')}" for c in conditions)

        polling.until_sync(
            lambda: "QueueDoesNotExist" in podgroup_reason("b-1"),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="QueueDoesNotExist on the running group of the deleted queue",
        )
        world.apply("orphan", in_queue("b-2", "team-b"))
        polling.until_sync(
            lambda: "QueueDoesNotExist" in podgroup_reason("b-2"),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="a new pod of the deleted queue waiting with QueueDoesNotExist",
        )
        assert not world.bound(["b-2"])
        # team-a is owed its second GPU only from team-b's pod, whose queue is gone: it must be reclaimable.
        world.apply("more", in_queue("a-2", "team-a"))
        polling.until_sync(
            lambda: world.bound(["a-2"]), timeout_s=30, what="a-2 bound after reclaiming from the deleted queue"
        )
        assert "b-1" not in harness.pods(world.kubectl) or not world.bound(["b-1"])
        assert scheduler.process.poll() is None, "the scheduler exited"
        assert "Traceback" not in scheduler.log()

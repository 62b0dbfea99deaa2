"""Proof of issue 18's operator's view: ``kubectl quotient explain|queues|top`` from the outside.

One world for the module: the emulator, emulated GPU nodes with real agents, a real nats-server and the real
scheduler process (``telemetry_harness``), leader-elected under the Lease ``quotient-system/quotient-scheduler`` as
its pod ``quotient-scheduler-0``, whose ``/metrics`` the emulator's pod proxy reaches. The plugin runs as its own
process, as installed (``.venv/bin/kubectl-quotient``), with a kubeconfig and nothing else, and once through the
real ``kubectl`` with that directory on ``PATH``. The tests run in order: a share runs and is measured, a gang hog
fills a node, a pod waits behind it and another can never fit, a higher-priority pod preempts the hog.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import quantities
from common.natsserver import free_port
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness
from tests.e2e.telemetry_harness import TelemetryWorld, share_pod, telemetry_world

pytestmark = pytest.mark.integration

GIB = quantities.GIB
LEADER = "quotient-scheduler-0"
LEASE_NAMESPACE = "quotient-system"
PLUGIN = Path(sys.executable).parent / "kubectl-quotient"

SPEC = """
nodes:
  - {name: gpu-a, gpus: {count: 2, model: A100-80GB}}
  - {name: gpu-b, gpus: {count: 1, model: A100-80GB}}
"""


def parent_queue() -> dict[str, Any]:
    """KAI's ``default-parent-queue`` with the cluster's 3 GPUs deserved: the high-priority pod is non-preemptible
    (priority 125), and non-preemptible work must fit the quota of every queue above it, as in KAI."""
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "default-parent-queue"},
        "spec": {
            "resources": {
                "gpu": {"quota": 3, "limit": -1, "overQuotaWeight": 1},
                "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
            },
        },
    }


def team_queue() -> dict[str, Any]:
    """Queue ``team``: 2 GPUs deserved, no limit."""
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "team"},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {
                "gpu": {"quota": 2, "limit": -1, "overQuotaWeight": 1},
                "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
            },
        },
    }


def whole_pod(name: str, *, gpus: int, node: str | None = None, priority: str = "train") -> dict[str, Any]:
    pod = harness.gpu_pod(name, gpus=gpus)
    pod["metadata"]["labels"] = {"kai.scheduler/queue": "team", "priorityClassName": priority}
    pod["spec"]["schedulerName"] = "quotient"
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def leader_pod() -> dict[str, Any]:
    """The object the Lease's holder names: the scheduler's pod as deploy/ makes it (port ``metrics``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": LEADER, "namespace": LEASE_NAMESPACE},
        "spec": {
            "containers": [
                {"name": "scheduler", "image": "quotient", "ports": [{"name": "metrics", "containerPort": 8080}]}
            ]
        },
    }


class Plugin:
    """``kubectl-quotient`` as a user runs it: a kubeconfig, no flags from kubectl."""

    def __init__(self, server: str, directory: Path) -> None:
        self.kubeconfig = directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server}}],
            "users": [{"name": "admin", "user": {}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "admin", "namespace": "default"}}
            ],
            "current-context": "emulator",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.cache = directory / "kubectl-cache"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "NO_COLOR": "",
            "KUBECACHEDIR": str(self.cache),
        }

    def __call__(self, *args: str, kubectl: bool = False) -> subprocess.CompletedProcess[str]:
        # kubectl takes no flags before a plugin's name: its cache directory comes from the environment.
        command = [require_tool("kubectl"), "quotient", *args] if kubectl else [str(PLUGIN), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=self.env, cwd=REPO)

    def json(self, *args: str) -> Any:
        done = self(*args, "-o", "json")
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def world() -> Iterator[TelemetryWorld]:
    if not PLUGIN.exists():
        pytest.fail(f"{PLUGIN} is not installed: pip install -e . (pyproject's [project.scripts])")
    extra = ("--leader-elect", "--identity", LEADER, "--lease-namespace", LEASE_NAMESPACE)
    with telemetry_world(SPEC, *extra) as started:
        started.apply("parent", parent_queue())
        started.apply("team", team_queue())
        started.apply("leader", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}})
        started.apply("leader-pod", leader_pod())
        address = f"127.0.0.1:{started.metrics_port}"
        started.emulator.call(lambda: started.emulator.emulator.route_pod(LEASE_NAMESPACE, LEADER, 8080, address))
        yield started


@pytest.fixture(scope="module")
def plugin(world: TelemetryWorld) -> Plugin:
    return Plugin(world.emulator.url, world.workdir)


def used(world: TelemetryWorld, pod: str) -> float | None:
    return world.value("quotient_pod_gpu_memory_used_bytes", namespace="default", pod=pod)


def test_a_running_share_is_explained_with_its_group_reservation_and_measured_memory(
    world: TelemetryWorld, plugin: Plugin
) -> None:
    world.apply("share", share_pod("share", fraction="0.5", node="gpu-b", memory="10Gi"))
    polling.until_sync(lambda: used(world, "share") == 10 * GIB, timeout_s=30, what="the share's measured memory")
    done = plugin("explain", "default/share")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "\x1b[" not in text  # piped: no escape codes
    assert "Pod default/share: Running" in text
    assert "Runs on: node gpu-b, a share of 0.5 GPU on gpu 0" in text
    assert "GPU memory (gpu-b gpu 0): 10.0 GiB used of 40.0 GiB allotted" in text
    assert "Reservation pod: quotient-reservation/gpu-reservation-gpu-b-" in text
    assert "Alerts: none firing" in text
    assert f"pod {LEASE_NAMESPACE}/{LEADER} port 8080" in text
    document = plugin.json("explain", "share")  # the context's namespace
    assert document["apiVersion"] == "quotient.dev/explain/v1"
    assert document["kind"] == "PodExplanation" and document["state"] == "Running"
    running = document["running"]
    assert running["node"] == "gpu-b" and running["shareMilliGpu"] == 500 and running["gpus"] == [0]
    assert running["memory"] == [{"node": "gpu-b", "gpu": 0, "allottedBytes": 40 * GIB, "usedBytes": 10 * GIB}]
    assert running["gpuGroups"] and running["reservationPods"][0]["namespace"] == "quotient-reservation"
    assert document["unreadable"] == []


def test_metrics_that_cannot_be_read_are_said_and_the_answer_comes_from_the_api(
    world: TelemetryWorld, plugin: Plugin
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/metrics"
    done = plugin("explain", "-n", "default", "share", "--metrics-url", closed)
    assert done.returncode == 0, done.stderr
    assert "Runs on: node gpu-b, a share of 0.5 GPU on gpu 0" in done.stdout
    assert "Could not read:" in done.stdout and f"metrics: {closed}" in done.stdout
    document = plugin.json("explain", "default/share", "--metrics-url", closed)
    assert document["running"]["measured"] is False and document["running"]["memory"] == []
    assert any(item.startswith(f"metrics: {closed}") for item in document["unreadable"])


def test_a_missing_pod_is_one_line_and_a_non_zero_exit(plugin: Plugin) -> None:
    done = plugin("explain", "default/no-such-pod")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().count("\n") == 0
    assert "pod default/no-such-pod not found" in done.stderr


def test_a_pending_pod_is_explained_with_its_queue_the_best_nodes_and_the_numbers(
    world: TelemetryWorld, plugin: Plugin
) -> None:
    world.apply("hog", whole_pod("hog", gpus=2, node="gpu-a"))
    polling.until_sync(lambda: world.running("hog"), timeout_s=harness.STEP_TIMEOUT_S, what="the hog running")
    world.apply("waiter", whole_pod("waiter", gpus=1, node="gpu-a"), whole_pod("huge", gpus=3))

    def explained(name: str) -> dict[str, Any] | None:
        document = plugin.json("explain", f"default/{name}")
        pending = document.get("pending") or {}
        return document if pending.get("reason") and pending.get("structured") else None

    waiter = polling.until_sync(lambda: explained("waiter"), timeout_s=harness.STEP_TIMEOUT_S, what="waiter's reason")
    pending = waiter["pending"]
    assert waiter["state"] == "Pending" and waiter["queue"] == "team"
    assert pending["resource"] == "gpu" and pending["requested"] == 1000
    assert pending["candidates"][0]["node"] == "gpu-a"
    assert {"resource": "gpu", "requested": 1000, "free": 0} in pending["candidates"][0]["lacking"]
    team = pending["queues"][0]
    assert team["name"] == "team" and team["resource"] == "gpu" and team["allocated"] == 2000
    assert team["deserved"] == 2000 and team["limit"] == -1 and team["requested"] >= 3000
    text = plugin("explain", "default/waiter").stdout
    assert "Pod default/waiter: Pending" in text
    assert "gpu-a: 0 GPUs free, 1 GPU asked" in text
    assert "Queue: queue team (gpu): deserved 2 GPUs, fair share " in text and "allocated 2 GPUs" in text
    assert "limit unlimited" in text
    huge = polling.until_sync(lambda: explained("huge"), timeout_s=harness.STEP_TIMEOUT_S, what="huge's reason")
    assert huge["pending"]["reason"] == "NeverFits" and huge["pending"]["code"] == "UnschedulableAtAll"
    hint = huge["pending"]["unblock"][0]
    assert (hint["remedy"], hint["current"], hint["needed"]) == ("LargerNode", 2000, 3000)
    assert "3 GPUs asked, at most 2 GPUs on any node it may use" in plugin("explain", "default/huge").stdout


def test_an_evicted_pod_says_who_took_its_place_and_why(world: TelemetryWorld, plugin: Plugin) -> None:
    world.apply("high", whole_pod("high", gpus=2, node="gpu-a", priority="inference"))
    try:
        polling.until_sync(lambda: world.pod("hog") is None, timeout_s=30, what="the hog evicted and gone")
    except AssertionError:
        print(plugin("explain", "default/high").stdout)
        raise
    polling.until_sync(lambda: world.running("high"), timeout_s=30, what="the high-priority pod running")
    done = plugin("explain", "default/hog")
    assert done.returncode == 0, done.stderr
    assert "Pod default/hog: Evicted" in done.stdout
    assert "Made room for: podgroup default/" in done.stdout and "(queue team, priority 125), by preempt" in done.stdout
    assert "default/high: runs on gpu-a (Running)" in done.stdout
    document = plugin.json("explain", "default/hog")
    evicted = document["evicted"]
    assert document["state"] == "Evicted" and evicted["action"] == "preempt"
    assert evicted["madeRoomFor"]["queue"] == "team" and evicted["madeRoomFor"]["priority"] == 125
    assert [(pod["name"], pod["node"]) for pod in evicted["madeRoomFor"]["pods"]] == [("high", "gpu-a")]


def test_the_queue_table_has_the_numbers_of_the_queue_status_plain_when_piped(
    world: TelemetryWorld, plugin: Plugin
) -> None:
    def written() -> dict[str, Any] | None:
        queue = world.kubectl.json("get", "queue", "team")
        ours = (queue.get("status") or {}).get("quotient") or {}
        return ours if ours.get("pendingGroups") == 2 and "fairShare" in ours else None

    ours = polling.until_sync(written, timeout_s=harness.STEP_TIMEOUT_S, what="team's status.quotient")
    done = plugin("queues")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "DESERVED",
        "FAIR",
        "SHARE",
        "ALLOCATED",
        "REQUESTED",
        "LIMIT",
        "PENDING",
        "OLDEST",
        "OVER",
        "QUOTA",
    ]
    team = next(line.split() for line in lines if line.strip().startswith("team"))
    fair = quantities.parse_milli_gpu(ours["fairShare"]["gpu"]) / 1000
    # Requested: high (2, running in the hog's place), waiter (1) and huge (3).
    assert team[:6] == ["team", "2", f"{fair:g}", "2", "6", "unlimited"]
    assert team[6] == "2"
    assert any(line.startswith("default-parent-queue") for line in lines)
    assert any(line.startswith(("  team", "  default-queue")) for line in lines)
    items = {item["name"]: item for item in plugin.json("queues")["items"]}
    assert items["team"]["resources"]["gpu"]["deserved"] == 2000 and items["team"]["pendingGroups"] == 2
    assert items["team"]["parent"] == "default-parent-queue" and items["team"]["depth"] == 1


def test_top_shows_allotted_against_measured_memory_per_pod_and_device(world: TelemetryWorld, plugin: Plugin) -> None:
    done = plugin("top")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0][:3] == ["NODE", "GPU", "MODEL"]
    share_row = next(row for row in rows if "default/share" in row)
    # The model as NVML names it (the agent's), without the vendor: ``NVIDIA A100-SXM4-80GB`` -> ``A100-SXM4-80GB``.
    assert share_row[:2] == ["gpu-b", "0"] and share_row[2].startswith("A100")
    assert "40.0" in share_row and "10.0" in share_row
    document = plugin.json("top")
    device = next(item for item in document["items"] if (item["node"], item["gpu"]) == ("gpu-b", 0))
    assert device["healthy"] is True and device["allottedMilliGpu"] == 500
    (pod,) = device["pods"]
    assert (pod["name"], pod["allottedBytes"], pod["usedBytes"]) == ("share", 40 * GIB, 10 * GIB)
    gpu_a = [item for item in document["items"] if item["node"] == "gpu-a"]
    assert sorted(pod["name"] for item in gpu_a for pod in item["pods"]) == ["high", "high"]


def test_kubectl_runs_the_installed_plugin_with_the_users_kubeconfig(plugin: Plugin) -> None:
    done = plugin("explain", "default/share", kubectl=True)
    assert done.returncode == 0, done.stderr
    assert "Pod default/share: Running" in done.stdout
    assert "10.0 GiB used of 40.0 GiB allotted" in done.stdout
    missing = plugin("explain", "default/gone", kubectl=True)
    assert missing.returncode != 0 and "pod default/gone not found" in missing.stderr

"""KAI v0.15-v0.18's workload surface end to end: the real scheduler process serving both admission webhooks (GPU
sharing and KAI's queue validation), the emulator calling them as an API server does and holding custom resources
to ``deploy/``'s CRD schemas, and kubectl.

An invalid Queue is refused by ``kubectl apply`` with the reason; KAI v0.17/v0.18 manifests (a pod with a
preemption delay, per-container GPU memory with a limit above the request and SM sharing, a PodGroup with the new
spec fields) are admitted, grouped with their knobs in the PodGroup's spec, and scheduled. What the knobs change in
placement (the delay holding evictions back, ...) is the engine's, tested where the engine is.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.natsserver import free_port
from quotient.emulator import status as emulator_status
from quotient.emulator.emulator import EmulatorThread
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness
from tests.e2e.harness import Kubectl, SchedulerProcess

pytestmark = pytest.mark.integration

KAI = REPO / "tests" / "integration" / "emulator" / "kai"
NAMESPACE = "kai-demo"
QUEUE_WEBHOOK = "queue-validation.quotient.dev"
Obj = dict[str, Any]


def _configurations() -> list[Obj]:
    """Both webhook configurations exactly as ``kubectl apply -k deploy/base`` would send them."""
    rendered = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    return [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] in kinds]


class World:
    def __init__(self, emulator: EmulatorThread, directory: Path) -> None:
        self.emulator = emulator
        self.directory = directory
        self.kubectl = Kubectl(emulator.url)
        self._certs = tempfile.TemporaryDirectory(prefix="quotient-webhook-")
        for configuration in _configurations():
            created = emulator.run(functools.partial(emulator.emulator.create, configuration))
            assert not isinstance(created, emulator_status.Failure), created
        port = free_port()
        emulator.call(
            lambda: emulator.emulator.route_service(
                "quotient-system", "quotient-scheduler-webhook", f"127.0.0.1:{port}"
            )
        )
        self.scheduler = SchedulerProcess(
            emulator.url,
            "--webhook",
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            self._certs.name,
            "--webhook-upkeep-interval",
            "0.2s",
            "--queue-parent-must-exist",
        )
        polling.until_sync(self._trusted, timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler's CA in both caBundles")

    def _trusted(self) -> bool:
        for kind, name in (
            ("MutatingWebhookConfiguration", "quotient-gpu-sharing"),
            ("ValidatingWebhookConfiguration", "quotient-queue-validation"),
        ):
            stored = self.emulator.call(
                functools.partial(self.emulator.emulator.get, "admissionregistration.k8s.io/v1", kind, name)
            )
            if not (stored and stored["webhooks"][0]["clientConfig"].get("caBundle")):
                return False
        return True

    def apply(self, text: str) -> subprocess.CompletedProcess[str]:
        path = self.directory / "manifest.yaml"
        path.write_text(text)
        return self.kubectl("apply", "-f", str(path), check=False)

    def close(self) -> None:
        print(self.scheduler.log()[-8000:])  # pytest shows it only when the test failed
        self.scheduler.close()
        self.kubectl.close()
        self._certs.cleanup()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with harness.cluster("1x4xA100-80GB") as emulator:
        current = World(emulator, tmp_path)
        try:
            yield current
        finally:
            current.close()


def _queue(name: str, spec: Obj) -> str:
    return yaml.safe_dump(
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    )


def test_an_invalid_queue_is_refused_by_kubectl_apply_with_the_reason(world: World) -> None:
    without_resources = world.apply(_queue("team-a", {"parentQueue": "default-parent-queue"}))
    orphan = world.apply(_queue("team-b", {"parentQueue": "nowhere", "resources": {"gpu": {"quota": 1, "limit": 2}}}))
    not_a_number = world.apply(_queue("team-c", {"resources": {"gpu": {"quota": "lots"}}}))

    assert without_resources.returncode != 0
    assert (
        f'admission webhook "{QUEUE_WEBHOOK}" denied the request: resources must be specified'
        in without_resources.stderr
    )
    assert orphan.returncode != 0 and "parent queue 'nowhere' does not exist" in orphan.stderr
    assert not_a_number.returncode != 0
    assert "spec.resources.gpu.quota in body must be of type number" in not_a_number.stderr
    listed = world.kubectl.json("get", "queues")["items"]
    assert {queue["metadata"]["name"] for queue in listed} == {"default-parent-queue", "default-queue"}


def test_a_kai_v018_manifest_with_the_new_fields_is_admitted_grouped_with_its_knobs_and_scheduled(world: World) -> None:
    manifests = ("00-queues.yaml", "01-preemption-delay.yaml", "06-nvfractions.yaml")
    for name in manifests:
        result = world.apply((KAI / name).read_text())
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert "Warning" not in result.stderr, f"{name}: {result.stderr}"
    pods = ("delayed-preemptor", "nv-fractions-request-limit", "nv-fractions-limit-only")

    def scheduled() -> bool:
        current = harness.pods(world.kubectl, NAMESPACE)
        return all(harness.bound(current.get(name, {})) for name in pods)

    polling.until_sync(scheduled, timeout_s=harness.STEP_TIMEOUT_S, what="the KAI v0.18 pods to be bound")
    current = harness.pods(world.kubectl, NAMESPACE)
    share = current["nv-fractions-request-limit"]
    env = {entry["name"]: entry for entry in share["spec"]["containers"][0].get("env", [])}
    assert "configMapKeyRef" in env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"], "wired by the GPU-sharing webhook"
    groups = {
        group["metadata"]["name"]: group for group in world.kubectl.json("get", "podgroups", "-n", NAMESPACE)["items"]
    }
    [made] = [
        group
        for name, group in groups.items()
        if name.startswith("pg-delayed-preemptor-") and group["spec"]["queue"] == "delay-queue"
    ]
    assert made["spec"]["preemptionDelay"] == "2m0s", "the pod's annotation, in its PodGroup's spec as KAI writes it"
    assert groups["delayed-group"]["spec"]["preemptionDelay"] == "5m"

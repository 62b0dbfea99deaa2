"""The seeds' workflows, each guide on a fresh emulated cluster, through the real scheduler process and kubectl."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import polling
from tests.e2e import harness
from tests.e2e.harness import Kubectl, SchedulerProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def world() -> Iterator[tuple[Kubectl, SchedulerProcess]]:
    with harness.cluster("1x4xA100-80GB") as emulator:
        kubectl = Kubectl(emulator.url)
        scheduler = SchedulerProcess(emulator.url)
        try:
            yield kubectl, scheduler
        finally:
            print(scheduler.log()[-5000:])  # pytest shows it only when the test failed
            scheduler.close()
            kubectl.close()


def test_the_kind_vcluster_talk_guide_runs_unchanged(world: tuple[Kubectl, SchedulerProcess]) -> None:
    kubectl, scheduler = world
    for path in harness.seeds("queues.yaml"):
        kubectl("apply", "-f", str(path))
    queues = {item["metadata"]["name"] for item in kubectl.json("get", "queues")["items"]}
    assert {"default", "test", "default-queue", "default-parent-queue"} <= queues
    for path in harness.seeds(
        "cpu-pod.yaml", "gpu-pod.yaml", "gpu-sharing.yaml", "inference-pod.yaml", "research-pod.yaml"
    ):
        kubectl("apply", "-f", str(path))
    ours = ("cpu-pod", "gpu-pod", "gpu-sharing", "inference-api")
    polling.until_sync(
        lambda: all(harness.bound(harness.pods(kubectl).get(name, {})) for name in ours),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the seeds' pods bound",
    )
    current = harness.pods(kubectl)
    sharing, inference = current["gpu-sharing"], current["inference-api"]
    group = sharing["metadata"]["labels"]["runai-gpu-group"]
    assert group == inference["metadata"]["labels"]["runai-gpu-group"]
    assert sharing["spec"]["nodeName"] == inference["spec"]["nodeName"]
    devices = sharing["metadata"]["annotations"]["quotient.dev/gpu-devices"]
    assert devices == inference["metadata"]["annotations"]["quotient.dev/gpu-devices"]
    assert devices != current["gpu-pod"]["metadata"]["annotations"]["quotient.dev/gpu-devices"]
    # The guide's own check of the fraction and the scheduler name.
    shown = kubectl(
        "get", "pod", "gpu-sharing", "-o", "jsonpath={.metadata.annotations.gpu-fraction} {.spec.schedulerName}"
    ).stdout
    assert shown == "0.5 kai-scheduler"
    # Pods of queue test went to their PodGroups in that queue.
    groups = {item["metadata"]["name"]: item for item in kubectl.json("get", "podgroups")["items"]}
    annotation = current["cpu-pod"]["metadata"]["annotations"]["pod-group-name"]
    assert groups[annotation]["spec"]["queue"] == "test"
    # The research team's pod keeps the default scheduler: never bound, grouped or annotated by us.
    research = current["research-pod"]
    assert not harness.bound(research)
    assert "pod-group-name" not in (research["metadata"].get("annotations") or {})
    assert "research-pod" not in scheduler.log()


def test_the_ai_ready_guide_vllm_deployments_share_one_gpu_group(world: tuple[Kubectl, SchedulerProcess]) -> None:
    kubectl, _ = world
    for path in harness.seeds("queues.yaml"):
        kubectl("apply", "-f", str(path))
    kubectl("create", "namespace", "ai-workloads")
    for path in harness.seeds("vllm-test-07.yaml", "vllm-test-02.yaml"):
        kubectl("apply", "-f", str(path))

    def both_running() -> bool:
        # The emulated kubelet starts a bound pod a moment later (``kubelet_delay``), as a real one does.
        current = harness.pods(kubectl, "ai-workloads")
        return len(current) == 2 and all(
            harness.bound(pod) and pod.get("status", {}).get("phase") == "Running" for pod in current.values()
        )

    polling.until_sync(both_running, timeout_s=harness.STEP_TIMEOUT_S, what="both vLLM pods bound and Running")
    table = kubectl(
        "-n",
        "ai-workloads",
        "get",
        "pods",
        "-o",
        "custom-columns=NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,"
        "GPU-FRACTION:.metadata.annotations.gpu-fraction,GPU-GROUP:.metadata.labels.runai-gpu-group",
    ).stdout
    rows = [line.split() for line in table.strip().splitlines()[1:]]
    assert sorted(row[3] for row in rows) == ["0.2", "0.7"]
    assert len({row[4] for row in rows}) == 1 and rows[0][4] != "<none>"
    assert all(row[1] == "Running" for row in rows)

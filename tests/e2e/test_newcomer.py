"""The local stack answers what a newcomer types, with the real scheduler running: the pod Quotient placed has its
``Scheduled`` event (the scheduler's) and the kubelet's after it, ``kubectl logs`` shows its fake GPU process,
``kubectl create deployment`` runs (the stand-in kube-scheduler places what names no scheduler), and the scheduler's
``/metrics`` answers through the API server's pod proxy, as ``kubectl quotient explain`` reaches the leader's."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import names
from common.natsserver import free_port
from quotient.emulator import status
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from tests import polling
from tests.e2e import harness

pytestmark = pytest.mark.integration


def test_a_newcomer_sees_events_logs_a_running_deployment_and_the_leaders_metrics(tmp_path: Path) -> None:
    with harness.world("1x2xA100-80GB", tmp_path) as world:
        emulator, kubectl = world.emulator, world.kubectl
        nodes = EmulatedNodes(emulator.emulator.spec, nats_url="nats://127.0.0.1:1")  # the fake GPUs; no agents
        runtime = GpuNodesRuntime(nodes)
        emulator.call(lambda: emulator.emulator.add_runtime(runtime))
        metrics_port = free_port()
        world.scheduler("--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1", identity="leader")
        try:
            world.apply(
                "train",
                harness.gpu_pod("train", annotations={names.SIM_GPU_MEMORY_ANNOTATION: "3Gi@0s"}),
            )
            polling.until_sync(
                lambda: world.bound(["train"]), timeout_s=harness.STEP_TIMEOUT_S, what="the GPU pod bound"
            )
            node = harness.pods(kubectl)["train"]["spec"]["nodeName"]

            def story() -> list[tuple[str, str]]:
                return [
                    (str(event["reason"]), str(event["source"]["component"]))
                    for event in harness.events_about(kubectl, "default", "train")
                ]

            polling.until_sync(
                lambda: {("Scheduled", "quotient-scheduler"), ("Started", "kubelet")} <= set(story()),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the scheduler's Scheduled event and the kubelet's Started",
            )
            [scheduled] = [
                event for event in harness.events_about(kubectl, "default", "train") if event["reason"] == "Scheduled"
            ]
            assert scheduled["message"] == f"Successfully assigned default/train to {node}"
            assert scheduled["type"] == "Normal"
            assert "Successfully assigned default/train" in kubectl("describe", "pod", "train").stdout

            def gpu_lines() -> list[str]:
                return [line for line in kubectl("logs", "train").stdout.splitlines() if "GPU" in line]

            polling.until_sync(
                lambda: "holds 3.0 GiB of GPU memory on GPU 0" in gpu_lines(),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the fake GPU process's lines in kubectl logs",
            )
            assert any(line.startswith("GPU process ") and line.endswith(f"of {node}") for line in gpu_lines())

            # What names no scheduler runs once kube-scheduler's stand-in is on, as the demo turns it on (--keep).
            emulator.call(emulator.emulator.start_default_scheduler)
            kubectl("create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
            polling.until_sync(
                lambda: (
                    sum(
                        1
                        for pod in harness.pods(kubectl).values()
                        if pod["metadata"]["name"].startswith("web-") and pod["status"].get("phase") == "Running"
                    )
                    == 2
                ),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the Deployment's pods running",
            )
            assert kubectl("auth", "can-i", "create", "deployments").stdout.strip() == "yes"

            # The scheduler's /metrics through the pod proxy, as from its leader pod.
            leader = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "quotient-scheduler-0", "namespace": "default"},
                "spec": {"containers": [{"name": "scheduler", "image": "quotient"}]},
            }
            created = emulator.run(lambda: emulator.emulator.create(leader))
            assert not isinstance(created, status.Failure), created
            emulator.call(
                lambda: emulator.emulator.route_pod(
                    "default", "quotient-scheduler-0", 8080, f"127.0.0.1:{metrics_port}"
                )
            )
            path = "/api/v1/namespaces/default/pods/quotient-scheduler-0:8080/proxy/metrics"
            metrics = kubectl("get", "--raw", path).stdout
            assert "quotient_scheduler_leader 1.0" in metrics
            assert world.schedulers["leader"].process.poll() is None, "the scheduler exited"
        finally:
            nodes.close()

"""Fractional GPUs end to end (issue 6): the real scheduler process serving its admission webhook, the emulator
calling it as an API server does, reservation pods holding the shared devices, kubectl to look.

Each test runs on a fresh emulated cluster. The emulator's device plugin gives every pod that requests
``nvidia.com/gpu`` (reservation pods included) a device of its own, and its reservation agent reports the device's
UUID as ``quotient reserve`` does; a recording container runtime shows what each started container was really given.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import names
from common.natsserver import free_port
from quotient.emulator import status as emulator_status
from quotient.emulator.emulator import EmulatorThread
from quotient.emulator.runtime import PodLaunch
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness
from tests.e2e.harness import Kubectl, SchedulerProcess

pytestmark = pytest.mark.integration

RESERVATION_NS = names.RESERVATION_NAMESPACE
Obj = dict[str, Any]


class Recorder:
    """A container runtime that remembers the environment each started pod's containers got."""

    def __init__(self) -> None:
        self.launches: dict[str, PodLaunch] = {}

    def start_pod(self, launch: PodLaunch) -> None:
        self.launches[f"{launch.namespace}/{launch.name}"] = launch

    def stop_pod(self, launch: PodLaunch) -> None:
        return None


class World:
    def __init__(self, emulator: EmulatorThread, *extra: str, webhook: bool = True) -> None:
        self.emulator = emulator
        self.kubectl = Kubectl(emulator.url)
        self.recorder = Recorder()
        emulator.call(lambda: emulator.emulator.add_runtime(self.recorder))
        args = ["--reservation-drain-grace", "0.5s", *extra]
        self._webhook_args: list[str] = []
        self._certs = tempfile.TemporaryDirectory(prefix="quotient-webhook-")
        if webhook:
            created = emulator.run(lambda: emulator.emulator.create(_webhook_configuration()))
            assert not isinstance(created, emulator_status.Failure), created
            port = free_port()
            self._webhook_args = [
                "--webhook",
                "--webhook-host",
                "127.0.0.1",
                "--webhook-port",
                str(port),
                "--webhook-cert-dir",
                self._certs.name,
                "--webhook-upkeep-interval",
                "0.2s",
            ]
            args += self._webhook_args
            emulator.call(
                lambda: emulator.emulator.route_service(
                    "quotient-system", "quotient-scheduler-webhook", f"127.0.0.1:{port}"
                )
            )
        self.scheduler = SchedulerProcess(emulator.url, *args)
        if webhook:
            polling.until_sync(
                self._trusted, timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler's CA in the webhook's caBundle"
            )

    def _trusted(self) -> bool:
        stored = self.emulator.call(
            lambda: self.emulator.emulator.get(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "quotient-gpu-sharing"
            )
        )
        return bool(stored and stored["webhooks"][0]["clientConfig"].get("caBundle"))

    def restart_scheduler(self) -> None:
        """SIGKILL the scheduler and start a new one with the same flags (the webhook on the same port)."""
        self.scheduler.kill()
        self.scheduler.close()
        self.scheduler = SchedulerProcess(self.emulator.url, "--reservation-drain-grace", "0.5s", *self._webhook_args)

    def reservation_pods(self) -> dict[str, Obj]:
        return harness.pods(self.kubectl, RESERVATION_NS)

    def visible_devices(self, namespace: str, name: str) -> str:
        launch = self.recorder.launches.get(f"{namespace}/{name}")
        assert launch is not None, f"{namespace}/{name} never started"
        values = {env.get("NVIDIA_VISIBLE_DEVICES") for env in launch.env.values()}
        values.discard(None)
        values.discard("void")
        assert len(values) == 1, values
        return str(values.pop())

    def pods_phase(self, name: str, namespace: str = "default") -> str:
        return str(harness.pods(self.kubectl, namespace)[name].get("status", {}).get("phase"))

    def running(self, namespace: str, *names: str) -> bool:
        current = harness.pods(self.kubectl, namespace)
        return all(current.get(name, {}).get("status", {}).get("phase") == "Running" for name in names)

    def close(self) -> None:
        print(self.scheduler.log()[-6000:])  # pytest shows it only when the test failed
        self.scheduler.close()
        self.kubectl.close()
        self._certs.cleanup()


def _webhook_configuration() -> Obj:
    """The MutatingWebhookConfiguration exactly as ``kubectl apply -k deploy/base`` would send it."""
    rendered = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    [found] = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "MutatingWebhookConfiguration"]
    configuration: Obj = found
    return configuration


@pytest.fixture
def world() -> Iterator[World]:
    with harness.cluster("1x4xA100-80GB") as emulator:
        current = World(emulator)
        try:
            yield current
        finally:
            current.close()


def _write(obj: Obj) -> Path:
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115 - kubectl reads it
    with handle:
        yaml.safe_dump(obj, handle)
    return Path(handle.name)


def share_pod(name: str, annotations: dict[str, str], *, node: str | None = None, namespace: str = "default") -> Obj:
    spec: Obj = {
        "schedulerName": "kai-scheduler",
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.08-py3"}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


def test_the_talk_guide_shares_one_device_held_by_one_reservation_pod_and_frees_it_after(world: World) -> None:
    kubectl = world.kubectl
    for path in harness.seeds("queues.yaml", "gpu-sharing.yaml", "inference-pod.yaml", "gpu-pod.yaml"):
        kubectl("apply", "-f", str(path))
    polling.until_sync(
        lambda: world.running("default", "gpu-sharing", "inference-api", "gpu-pod"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the seeds' pods running",
    )
    held = world.reservation_pods()
    assert len(held) == 1, sorted(held)
    [reservation] = held.values()
    uuid = reservation["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION]
    group = reservation["metadata"]["labels"][names.RESERVATION_GROUP_LABEL]
    current = harness.pods(kubectl)
    for name in ("gpu-sharing", "inference-api"):
        assert current[name]["metadata"]["labels"]["runai-gpu-group"] == group
        assert world.visible_devices("default", name) == uuid
    # kubectl lists it where the guide's users look for KAI's.
    listed = kubectl("get", "pods", "-n", RESERVATION_NS, "-o", "name").stdout.split()
    assert listed == [f"pod/{reservation['metadata']['name']}"]
    # The whole-GPU pod got a device of its own from the device plugin: never the shared one.
    whole = world.emulator.call(lambda: world.emulator.emulator.devices_of("default", "gpu-pod"))
    held_device = world.emulator.call(
        lambda: world.emulator.emulator.devices_of(RESERVATION_NS, reservation["metadata"]["name"])
    )
    assert whole and held_device and not set(whole) & set(held_device)
    assert world.visible_devices("default", "gpu-pod") != uuid
    # Each share's ConfigMap says what it was given.
    configmap = current["gpu-sharing"]["metadata"]["annotations"]["quotient.dev/gpu-configmap"]
    data = kubectl.json("get", "configmap", configmap)["data"]
    assert data == {"NVIDIA_VISIBLE_DEVICES": uuid, "GPU_PORTION": "0.5"}
    # The sharing pods go: the reservation pod goes, and its device is free again.
    kubectl("delete", "pod", "gpu-sharing", "inference-api", "--wait=false")
    polling.until_sync(
        lambda: not world.reservation_pods(), timeout_s=harness.STEP_TIMEOUT_S, what="the reservation pod deleted"
    )
    events = harness.events_about(kubectl, RESERVATION_NS, reservation["metadata"]["name"])
    reasons = {event["reason"] for event in events}
    assert {"ReservationCreated", "ReservationReady", "ReservationReleased"} <= reasons, reasons
    kubectl("create", "-f", str(_write(harness.gpu_pod("three", gpus=3))))
    polling.until_sync(
        lambda: world.running("default", "three"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the three GPUs left for a new pod",
    )


def test_the_vllm_deployments_at_07_and_02_share_one_group_and_one_reservation(world: World) -> None:
    kubectl = world.kubectl
    for path in harness.seeds("queues.yaml"):
        kubectl("apply", "-f", str(path))
    kubectl("create", "namespace", "ai-workloads")
    for path in harness.seeds("vllm-test-07.yaml", "vllm-test-02.yaml"):
        kubectl("apply", "-f", str(path))

    def both_running() -> bool:
        current = harness.pods(kubectl, "ai-workloads")
        return len(current) == 2 and all(pod["status"].get("phase") == "Running" for pod in current.values())

    polling.until_sync(both_running, timeout_s=harness.STEP_TIMEOUT_S, what="both vLLM pods running")
    [reservation] = world.reservation_pods().values()
    uuid = reservation["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION]
    current = harness.pods(kubectl, "ai-workloads")
    assert {pod["metadata"]["labels"]["runai-gpu-group"] for pod in current.values()} == {
        reservation["metadata"]["labels"][names.RESERVATION_GROUP_LABEL]
    }
    assert {world.visible_devices("ai-workloads", name) for name in current} == {uuid}


def test_gpu_memory_3000_gets_its_share_of_a_16_and_an_80_gib_device(tmp_path: Path) -> None:
    with harness.cluster("1x1xV100-16GB+1x1xA100-80GB") as emulator:
        world = World(emulator)
        try:
            nodes = sorted(item["metadata"]["name"] for item in world.kubectl.json("get", "nodes")["items"])
            small, large = nodes[0], nodes[1]
            for name, node in (("small", small), ("large", large)):
                harness.apply_objects(world.kubectl, tmp_path, name, share_pod(name, {"gpu-memory": "3000"}, node=node))
            polling.until_sync(
                lambda: world.running("default", "small", "large"),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="both shares running",
            )
            current = harness.pods(world.kubectl)
            # 3000 MiB of each device's memory (the node's nvidia.com/gpu.memory, MiB), in milli-GPU rounded up:
            # about 0.186 of the 16 GB V100 and 0.037 of the 80 GB A100.
            memory = {
                item["metadata"]["name"]: int(item["metadata"]["labels"]["nvidia.com/gpu.memory"])
                for item in world.kubectl.json("get", "nodes")["items"]
            }
            expected = {name: -(-3000 * 1000 // memory[node]) for name, node in (("small", small), ("large", large))}
            assert expected["small"] > 4 * expected["large"]
            for name in ("small", "large"):
                assert current[name]["metadata"]["annotations"]["quotient.dev/gpu-share"] == str(expected[name])
            portions = {
                name: world.kubectl.json(
                    "get", "configmap", current[name]["metadata"]["annotations"]["quotient.dev/gpu-configmap"]
                )["data"]["GPU_PORTION"]
                for name in ("small", "large")
            }
            assert portions == {name: f"0.{expected[name]:03d}".rstrip("0") for name in ("small", "large")}
            assert len(world.reservation_pods()) == 2
        finally:
            world.close()


def test_num_devices_2_gets_two_groups_and_sees_both_devices(world: World, tmp_path: Path) -> None:
    pod = share_pod("pair", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    harness.apply_objects(world.kubectl, tmp_path, "pair", pod)
    polling.until_sync(
        lambda: world.running("default", "pair"), timeout_s=harness.STEP_TIMEOUT_S, what="the two-device share running"
    )
    held = world.reservation_pods()
    assert len(held) == 2
    uuids = {item["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION] for item in held.values()}
    current = harness.pods(world.kubectl)["pair"]
    groups = current["metadata"]["annotations"]["quotient.dev/gpu-groups"].split(",")
    assert len(set(groups)) == 2
    assert set(world.visible_devices("default", "pair").split(",")) == uuids


BAD = [
    pytest.param({"gpu-fraction": "1.5"}, None, "main", id="1.5"),
    pytest.param({"gpu-fraction": "0"}, None, "main", id="0"),
    pytest.param({"gpu-fraction": "-0.2"}, None, "main", id="-0.2"),
    pytest.param({"gpu-fraction": "abc"}, None, "main", id="abc"),
    pytest.param({"gpu-fraction": "0.5"}, "1", "main", id="fraction-with-a-whole-gpu"),
    pytest.param({"gpu-fraction": "0.5", "gpu-memory": "3000"}, None, "main", id="fraction-and-memory"),
    pytest.param({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"}, None, "main", id="no-such-container"),
]


def _bad_pod(name: str, annotations: dict[str, str], gpus: str | None) -> Obj:
    pod = share_pod(name, annotations)
    if gpus is not None:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return pod


def test_the_webhook_in_the_scheduler_process_refuses_each_bad_annotation_with_a_clear_message(
    world: World, tmp_path: Path
) -> None:
    for index, case in enumerate(BAD):
        annotations, gpus, _ = case.values
        path = tmp_path / f"bad-{index}.yaml"
        path.write_text(yaml.safe_dump(_bad_pod(f"bad-{index}", dict(annotations), gpus)))
        result = world.kubectl("create", "-f", str(path), check=False)
        assert result.returncode != 0, case.id
        assert "denied the request" in result.stderr and "gpu-" in result.stderr, (case.id, result.stderr)
    # Nothing was stored, and a good share still runs beside them.
    assert not [name for name in harness.pods(world.kubectl) if name.startswith("bad-")]
    harness.apply_objects(world.kubectl, tmp_path, "good", share_pod("good", {"gpu-fraction": "0.5"}))
    polling.until_sync(
        lambda: world.running("default", "good"), timeout_s=harness.STEP_TIMEOUT_S, what="the good share running"
    )


def test_without_the_webhook_the_scheduler_reports_each_bad_pod_unschedulable_and_places_the_rest(
    tmp_path: Path,
) -> None:
    with harness.cluster("1x4xA100-80GB") as emulator:
        world = World(emulator, webhook=False)
        try:
            bad = [_bad_pod(f"bad-{index}", dict(case.values[0]), case.values[1]) for index, case in enumerate(BAD)]
            harness.apply_objects(world.kubectl, tmp_path, "bad", *bad, share_pod("good", {"gpu-fraction": "0.5"}))
            polling.until_sync(
                lambda: world.running("default", "good"),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the good share running",
            )

            def all_reported() -> bool:
                return all(
                    any(
                        event["reason"] == "Unschedulable" and "gpu-" in event["message"]
                        for event in harness.events_about(world.kubectl, "default", f"bad-{index}")
                    )
                    for index in range(len(BAD))
                )

            polling.until_sync(
                all_reported, timeout_s=harness.STEP_TIMEOUT_S, what="an Unschedulable event on every bad pod"
            )
            current = harness.pods(world.kubectl)
            assert not any(harness.bound(current[f"bad-{index}"]) for index in range(len(BAD)))
            assert world.scheduler.process.poll() is None
        finally:
            world.close()


def test_a_scheduler_killed_between_reserving_and_binding_leaves_one_reservation_and_a_bound_pod(
    world: World, tmp_path: Path
) -> None:
    world.emulator.call(lambda: setattr(world.emulator.emulator.reservation_agent, "delay_s", 2.0))
    harness.apply_objects(world.kubectl, tmp_path, "late", share_pod("late", {"gpu-fraction": "0.5"}))
    polling.until_sync(
        lambda: bool(world.reservation_pods()), timeout_s=harness.STEP_TIMEOUT_S, what="the reservation pod created"
    )
    assert not harness.bound(harness.pods(world.kubectl)["late"])
    world.restart_scheduler()
    polling.until_sync(lambda: world.running("default", "late"), timeout_s=30, what="the share bound after restart")
    held = world.reservation_pods()
    assert len(held) == 1
    [reservation] = held.values()
    assert (
        world.visible_devices("default", "late")
        == reservation["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION]
    )
    # The first leader's reservation drains once nothing uses it: none is left behind.
    polling.until_sync(lambda: len(world.reservation_pods()) == 1, what="no stray reservation", timeout_s=5)


def test_deleting_a_reservation_pod_under_running_shares_evicts_them_with_an_event(
    world: World, tmp_path: Path
) -> None:
    harness.apply_objects(
        world.kubectl,
        tmp_path,
        "pair",
        share_pod("left", {"gpu-fraction": "0.5"}),
        share_pod("right", {"gpu-fraction": "0.5"}),
    )
    polling.until_sync(
        lambda: world.running("default", "left", "right"), timeout_s=harness.STEP_TIMEOUT_S, what="both shares running"
    )
    [name] = world.reservation_pods()
    world.kubectl("delete", "pod", "-n", RESERVATION_NS, name, "--wait=false")

    def evicted() -> bool:
        current = harness.pods(world.kubectl)
        return "left" not in current and "right" not in current

    polling.until_sync(evicted, timeout_s=harness.STEP_TIMEOUT_S, what="the orphaned shares deleted")
    reasons = [event["reason"] for event in harness.events_about(world.kubectl, "default", "left")]
    assert "GpuReservationLost" in reasons


def test_a_reservation_whose_uuid_never_arrives_is_deleted_and_the_share_placed_on_another_node(
    tmp_path: Path,
) -> None:
    with harness.cluster("2x1xA100-80GB") as emulator:
        world = World(emulator, "--reservation-timeout", "2s")
        try:
            nodes = sorted(item["metadata"]["name"] for item in world.kubectl.json("get", "nodes")["items"])
            emulator.call(lambda: emulator.emulator.reservation_agent.broken_nodes.update(nodes[:1]))
            # Fill the second node's device first so the share goes to the broken node.
            busy = harness.gpu_pod("busy", gpus=1)
            busy["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes[1]}
            harness.apply_objects(world.kubectl, tmp_path, "busy", busy)
            polling.until_sync(
                lambda: world.running("default", "busy"),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the whole-GPU pod running",
            )
            harness.apply_objects(world.kubectl, tmp_path, "share", share_pod("share", {"gpu-fraction": "0.5"}))
            polling.until_sync(
                lambda: bool(world.reservation_pods()),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="a reservation on the broken node",
            )
            [stuck] = world.reservation_pods()
            polling.until_sync(
                lambda: any(
                    event["reason"] == "ReservationTimedOut"
                    for event in harness.events_about(world.kubectl, RESERVATION_NS, stuck)
                ),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the stuck reservation timed out",
            )
            world.kubectl("delete", "pod", "busy", "--wait=false")
            polling.until_sync(
                lambda: world.running("default", "share"), timeout_s=30, what="the share placed elsewhere"
            )
            current = harness.pods(world.kubectl)["share"]
            assert current["spec"]["nodeName"] == nodes[1]
            assert stuck not in world.reservation_pods()
            assert any(
                event["reason"] == "FailedBinding" and "UUID" in event["message"]
                for event in harness.events_about(world.kubectl, "default", "share")
            )
        finally:
            world.close()


def test_a_reservation_deleted_before_its_share_started_is_made_again_and_the_share_runs_on_it(
    tmp_path: Path,
) -> None:
    with harness.cluster("1x2xA100-80GB", kubelet_delay_s=2.0) as emulator:
        world = World(emulator)
        try:
            harness.apply_objects(world.kubectl, tmp_path, "early", share_pod("early", {"gpu-fraction": "0.5"}))
            polling.until_sync(
                lambda: harness.bound(harness.pods(world.kubectl)["early"]),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="the share bound",
            )
            [first] = world.reservation_pods().values()
            assert world.pods_phase("early") == "Pending"
            world.kubectl("delete", "pod", "-n", RESERVATION_NS, first["metadata"]["name"], "--wait=false")
            polling.until_sync(lambda: world.running("default", "early"), timeout_s=30, what="the share running")

            def reserved_again() -> bool:
                held = world.reservation_pods()
                return any(
                    pod["metadata"]["uid"] != first["metadata"]["uid"]
                    and names.RESERVATION_UUID_ANNOTATION in pod["metadata"].get("annotations", {})
                    for pod in held.values()
                )

            polling.until_sync(
                reserved_again, timeout_s=harness.STEP_TIMEOUT_S, what="a new reservation pod with its UUID"
            )
            [second] = world.reservation_pods().values()
            assert (
                world.visible_devices("default", "early")
                == second["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION]
            )
            reasons = [event["reason"] for event in harness.events_about(world.kubectl, "default", "early")]
            assert "GpuReserved" in reasons and "GpuReservationLost" not in reasons
        finally:
            world.close()

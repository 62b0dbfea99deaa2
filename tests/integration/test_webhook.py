"""The GPU-sharing webhook through the emulator's API server and the real kubectl, as in a cluster.

The base's own MutatingWebhookConfiguration (rendered with kustomize) is stored in the emulator, which calls it over
HTTPS for every pod creation, trusting only its ``caBundle``, and checks the certificate against the Service's name.
The webhook runs as the scheduler runs it (``webhook.serve``): its certificate made at start and its CA written
into that ``caBundle`` through the real ``KubeClient``. kubectl shows the refusals; the emulator's kubelet holds a
bound share until the ConfigMap its env names exists, then starts it with the values from it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import clusterspec
from quotient.emulator import status
from quotient.emulator.emulator import EmulatorThread
from quotient.emulator.runtime import PodLaunch
from scheduler.kube import webhook
from scheduler.kube.client import KubeClient
from scheduler.kube.kubeapi import BindOutcome
from scheduler.objects import gpurequest
from tests import polling
from tests.conftest import REPO, require_tool
from tests.integration.emulator.conftest import FAST, Kubectl, cluster

pytestmark = pytest.mark.integration

SERVICE_NAMESPACE = "quotient-system"
SERVICE = "quotient-scheduler-webhook"
WEBHOOK = "gpu-sharing.quotient.dev"
Obj = dict[str, Any]


class Recorder:
    """A container runtime that remembers what each started pod's containers were given (called on the emulator's
    loop; read here once the pod is Running)."""

    def __init__(self) -> None:
        self.launches: dict[str, PodLaunch] = {}

    def start_pod(self, launch: PodLaunch) -> None:
        self.launches[launch.name] = launch

    def stop_pod(self, launch: PodLaunch) -> None:
        return None


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(cluster(), config=FAST) as running:
        yield running


@pytest.fixture
def kubectl(emulator: EmulatorThread, tmp_path: Path) -> Kubectl:
    return Kubectl(binary=require_tool("kubectl"), server=emulator.url, cache_dir=tmp_path / "kube-cache")


def base_configuration() -> Obj:
    """The MutatingWebhookConfiguration exactly as ``kubectl apply -k deploy/base`` would send it."""
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [found] = [
        doc for doc in yaml.safe_load_all(result.stdout) if doc and doc["kind"] == "MutatingWebhookConfiguration"
    ]
    configuration: Obj = found
    return configuration


class Replica:
    """``webhook.serve`` as one scheduler replica runs it, on the test's loop, talking to the emulator."""

    def __init__(self, api: KubeClient, cert_dir: Path) -> None:
        self.listening: asyncio.Future[webhook.WebhookServer] = asyncio.get_running_loop().create_future()
        settings = webhook.WebhookSettings(host="127.0.0.1", port=0, cert_dir=cert_dir, upkeep_interval_s=0.2)
        self.task = asyncio.create_task(
            webhook.serve(api, settings, scheduler_names=("quotient",), on_listening=self.listening.set_result)
        )

    async def port(self) -> int:
        server = await asyncio.wait_for(asyncio.shield(self.listening), 10)
        return server.port

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Cluster:
    def __init__(self, emulator: EmulatorThread, kubectl: Kubectl, api: KubeClient, tmp_path: Path) -> None:
        self.emulator = emulator
        self.kubectl = kubectl
        self.api = api
        self.tmp_path = tmp_path
        self.replicas: list[Replica] = []
        self.recorder = Recorder()
        emulator.call(lambda: emulator.emulator.add_runtime(self.recorder))

    async def start_replica(self) -> Replica:
        replica = Replica(self.api, self.tmp_path / f"replica-{len(self.replicas)}")
        self.replicas.append(replica)
        await self.route(replica)
        return replica

    async def route(self, replica: Replica) -> None:
        address = f"127.0.0.1:{await replica.port()}"
        self.emulator.call(lambda: self.emulator.emulator.route_service(SERVICE_NAMESPACE, SERVICE, address))

    def ca_bundle(self) -> str:
        stored = self.emulator.call(
            lambda: self.emulator.emulator.get(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "quotient-gpu-sharing"
            )
        )
        assert stored is not None
        return str(stored["webhooks"][0]["clientConfig"].get("caBundle", ""))

    async def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.kubectl, *args, stdin=stdin, check=check)

    async def pod(self, name: str, namespace: str = "default") -> Obj:
        found: Obj = json.loads((await self.run("get", "pod", name, "-n", namespace, "-o", "json")).stdout)
        return found


@pytest.fixture
async def world(emulator: EmulatorThread, kubectl: Kubectl, tmp_path: Path) -> AsyncIterator[Cluster]:
    created = emulator.run(lambda: emulator.emulator.create(base_configuration()))
    assert not isinstance(created, status.Failure), created
    async with KubeClient.for_server(emulator.url, request_timeout_s=5.0) as api:
        world = Cluster(emulator, kubectl, api, tmp_path)
        try:
            await world.start_replica()
            await polling.until(lambda: asyncio.to_thread(world.ca_bundle), what="the replica's CA in the caBundle")
            yield world
        finally:
            for replica in world.replicas:
                await replica.stop()


def manifest(
    name: str,
    annotations: dict[str, str] | None = None,
    *,
    scheduler: str = "quotient",
    gpus: str | None = None,
    containers: tuple[str, ...] = ("main",),
    generate_name: bool = False,
) -> str:
    container_list: list[Obj] = [{"name": c, "image": "nvcr.io/nvidia/pytorch:24.08-py3"} for c in containers]
    if gpus is not None:
        container_list[0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    metadata: Obj = {"generateName": f"{name}-"} if generate_name else {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"schedulerName": scheduler, "containers": container_list},
    }
    return yaml.safe_dump(obj)


INVALID = [
    pytest.param({"gpu-fraction": "1.5"}, None, ("main",), id="1.5"),
    pytest.param({"gpu-fraction": "0"}, None, ("main",), id="0"),
    pytest.param({"gpu-fraction": "-0.2"}, None, ("main",), id="-0.2"),
    pytest.param({"gpu-fraction": "abc"}, None, ("main",), id="abc"),
    pytest.param({"gpu-fraction": "0.5"}, "1", ("main",), id="with-a-whole-gpu"),
    pytest.param({"gpu-fraction": "0.5", "gpu-memory": "3000"}, None, ("main",), id="fraction-and-memory"),
    pytest.param(
        {"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"}, None, ("main", "sidecar"), id="no-container"
    ),
]


@pytest.mark.parametrize(("annotations", "gpus", "containers"), INVALID)
async def test_kubectl_create_of_a_pod_with_bad_gpu_annotations_fails_with_the_webhooks_message(
    world: Cluster, annotations: dict[str, str], gpus: str | None, containers: tuple[str, ...]
) -> None:
    text = manifest("bad", annotations, gpus=gpus, containers=containers)
    problem = gpurequest.parse(yaml.safe_load(text))
    assert isinstance(problem, gpurequest.AnnotationProblem)

    result = await world.run("create", "-f", "-", stdin=text, check=False)

    assert result.returncode != 0
    assert f'admission webhook "{WEBHOOK}" denied the request: {problem.message}' in result.stderr
    assert (await world.run("get", "pod", "bad", check=False)).returncode != 0, "nothing was stored"


async def test_a_fractional_pod_is_stored_wired_to_its_configmap_and_runs_with_its_values_once_it_exists(
    world: Cluster,
) -> None:
    await world.run("create", "-f", "-", stdin=manifest("share", {"gpu-fraction": "0.5"}))
    stored = await world.pod("share")
    configmap = stored["metadata"]["annotations"]["quotient.dev/gpu-configmap"]
    [container] = stored["spec"]["containers"]
    refs = {entry["name"]: entry["valueFrom"]["configMapKeyRef"] for entry in container["env"]}

    assert stored["spec"]["runtimeClassName"] == "nvidia"
    assert refs == {
        "NVIDIA_VISIBLE_DEVICES": {"name": configmap, "key": "NVIDIA_VISIBLE_DEVICES"},
        "GPU_PORTION": {"name": configmap, "key": "GPU_PORTION"},
    }

    # What the binder will do (issue 6, later): bind, write the ConfigMap. Until it exists the kubelet waits.
    bound = await world.api.bind_pod(namespace="default", name="share", node="node-0")
    assert bound.outcome is BindOutcome.BOUND

    def waiting_reason() -> str:
        statuses = json.loads(world.kubectl("get", "pod", "share", "-o", "json").stdout)["status"]
        waiting = (statuses.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
        return f"{waiting.get('reason')}: {waiting.get('message')}" if waiting else ""

    held = await polling.until(
        lambda: asyncio.to_thread(waiting_reason), what="the kubelet to hold the pod for its ConfigMap"
    )
    assert held == f'CreateContainerConfigError: configmap "{configmap}" not found'
    assert "share" not in world.recorder.launches

    uuid = clusterspec.gpu_uuid("node-0", 0)
    await world.run(
        "create",
        "configmap",
        configmap,
        f"--from-literal=NVIDIA_VISIBLE_DEVICES={uuid}",
        "--from-literal=GPU_PORTION=0.50",
    )
    await polling.until(lambda: "share" in world.recorder.launches, what="the pod to start")

    env = world.recorder.launches["share"].env["main"]
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["GPU_PORTION"]) == (uuid, "0.50")
    assert world.recorder.launches["share"].gpu_indices == (), "a share requests no device of its own"


async def test_a_pod_made_from_generate_name_names_its_configmap_after_the_prefix(world: Cluster) -> None:
    created = await world.run(
        "create", "-f", "-", "-o", "name", stdin=manifest("vllm", {"gpu-memory": "3GiB"}, generate_name=True)
    )
    name = created.stdout.strip().removeprefix("pod/")
    stored = await world.pod(name)
    configmap = stored["metadata"]["annotations"]["quotient.dev/gpu-configmap"]

    assert name.startswith("vllm-") and configmap.startswith("vllm-gpu-")
    assert stored["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"] == configmap


async def test_whole_gpu_pods_and_pods_of_other_schedulers_are_stored_untouched(world: Cluster) -> None:
    await world.run("create", "-f", "-", stdin=manifest("whole", gpus="1"))
    await world.run("create", "-f", "-", stdin=manifest("theirs", {"gpu-fraction": "1.5"}, scheduler="kai-scheduler"))

    for name in ("whole", "theirs"):
        stored = await world.pod(name)
        assert "runtimeClassName" not in stored["spec"], name
        assert "env" not in stored["spec"]["containers"][0], name
        assert "quotient.dev/gpu-configmap" not in stored["metadata"].get("annotations", {}), name


async def test_both_replicas_are_trusted_through_one_ca_bundle_whichever_the_service_reaches(world: Cluster) -> None:
    first = world.replicas[0]
    second = await world.start_replica()

    def trusted() -> int:
        return base64.b64decode(world.ca_bundle()).count(b"-----BEGIN CERTIFICATE-----")

    await polling.until(lambda: asyncio.to_thread(lambda: trusted() == 2), what="both replicas' CAs in the caBundle")
    for replica, name in ((second, "via-second"), (first, "via-first")):
        await world.route(replica)
        await world.run("create", "-f", "-", stdin=manifest(name, {"gpu-fraction": "0.25"}))
        assert (await world.pod(name))["spec"]["runtimeClassName"] == "nvidia"


# --- KAI's queue webhook, the second path of the same server ---

QUEUE_WEBHOOK = "queue-validation.quotient.dev"


def queue_configuration() -> Obj:
    """The ValidatingWebhookConfiguration for Queues exactly as ``kubectl apply -k deploy/base`` would send it."""
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [found] = [
        doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc
        and doc["kind"] == "ValidatingWebhookConfiguration"
        and doc["metadata"]["name"] == "quotient-queue-validation"
    ]
    configuration: Obj = found
    return configuration


def queue_manifest(name: str, *, parent: str | None = None, gpu_quota: float | None = None) -> str:
    spec: Obj = {}
    if parent is not None:
        spec["parentQueue"] = parent
    if gpu_quota is not None:
        spec["resources"] = {"gpu": {"quota": gpu_quota, "limit": -1, "overQuotaWeight": 1}}
    return yaml.safe_dump(
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    )


@pytest.fixture
async def queue_world(world: Cluster) -> Cluster:
    created = world.emulator.run(lambda: world.emulator.emulator.create(queue_configuration()))
    assert not isinstance(created, status.Failure), created

    def trusted() -> bool:
        stored = world.emulator.call(
            lambda: world.emulator.emulator.get(
                "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "quotient-queue-validation"
            )
        )
        return bool(stored and stored["webhooks"][0]["clientConfig"].get("caBundle"))

    await polling.until(lambda: asyncio.to_thread(trusted), what="the replica's CA in the queue webhook's caBundle")
    return world


async def test_kubectl_apply_of_a_queue_without_resources_is_refused_with_the_reason(queue_world: Cluster) -> None:
    result = await queue_world.run("apply", "-f", "-", stdin=queue_manifest("team-a"), check=False)

    assert result.returncode != 0
    assert f'admission webhook "{QUEUE_WEBHOOK}" denied the request: resources must be specified' in result.stderr
    assert (await queue_world.run("get", "queue", "team-a", check=False)).returncode != 0, "nothing was stored"


async def test_a_queue_quota_above_its_parents_is_admitted_with_a_warning_kubectl_prints(queue_world: Cluster) -> None:
    await queue_world.run("apply", "-f", "-", stdin=queue_manifest("org", gpu_quota=2))

    result = await queue_world.run("apply", "-f", "-", stdin=queue_manifest("team-a", parent="org", gpu_quota=3))

    assert "queue.scheduling.run.ai/team-a created" in result.stdout
    assert "Warning: child queue GPU quota (3) exceeds parent queue org GPU quota (2)" in result.stderr

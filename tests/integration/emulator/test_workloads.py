"""Controllers, kubelets and the device plugin, driven through the emulator's Python API on the test's loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from quotient.emulator import status
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.emulator import Emulator
from quotient.emulator.objects import Obj
from quotient.emulator.runtime import PodLaunch
from tests.integration.emulator.conftest import FAST, cluster, pod_manifest
from tests.polling import until


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator(cluster(), config=FAST) as running:
        yield running


def pods(emulator: Emulator, namespace: str = "default") -> list[Obj]:
    return emulator.list("v1", "Pod", namespace)


def phase(emulator: Emulator, name: str, namespace: str = "default") -> str | None:
    pod = emulator.get("v1", "Pod", name, namespace)
    return None if pod is None else pod["status"].get("phase")


async def create(emulator: Emulator, obj: Obj) -> Obj:
    created = await emulator.create(obj)
    assert not isinstance(created, status.Failure), created
    return created


def bind(emulator: Emulator, name: str, node: str, namespace: str = "default") -> None:
    result = emulator.api.bind(namespace, name, {"target": {"kind": "Node", "name": node}})
    assert not isinstance(result, status.Failure), result


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "infer", "labels": {"app": "infer"}},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "infer"}},
        "template": {
            "metadata": {
                "labels": {"app": "infer", "kai.scheduler/queue": "test"},
                "annotations": {"gpu-fraction": "0.5"},
            },
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "vllm:1"}]},
        },
    },
}


async def test_a_deployment_owns_a_hashed_replicaset_which_owns_pods_that_inherit_the_template(
    emulator: Emulator,
) -> None:
    deployment = await create(emulator, DEPLOYMENT)
    sets = await until(lambda: emulator.list("apps/v1", "ReplicaSet", "default"), what="a ReplicaSet")
    replicaset = sets[0]
    pod_hash = replicaset["metadata"]["labels"]["pod-template-hash"]
    assert replicaset["metadata"]["name"] == f"infer-{pod_hash}"
    assert replicaset["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "infer",
            "uid": deployment["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    await until(lambda: len(pods(emulator)) == 3, what="three pods")
    for pod in pods(emulator):
        assert pod["metadata"]["name"].startswith(f"infer-{pod_hash}-")
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert pod["metadata"]["ownerReferences"][0]["uid"] == replicaset["metadata"]["uid"]
        assert pod["metadata"]["labels"] == {
            "app": "infer",
            "kai.scheduler/queue": "test",
            "pod-template-hash": pod_hash,
        }
        assert pod["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
    for pod, node in zip(pods(emulator), ("node-0", "node-1", "node-0"), strict=True):
        bind(emulator, pod["metadata"]["name"], node)

    def ready() -> bool:
        found = emulator.get("apps/v1", "Deployment", "infer", "default")
        return found is not None and found.get("status", {}).get("readyReplicas") == 3

    await until(ready, what="the deployment to be ready")
    victim = pods(emulator)[0]["metadata"]["name"]
    await emulator.api.delete(emulator.kind_of("v1", "Pod"), "default", victim, DeleteOptions(grace_period_s=0))
    await until(
        lambda: len(pods(emulator)) == 3 and victim not in {p["metadata"]["name"] for p in pods(emulator)},
        what="a replacement pod",
    )
    scaled = await emulator.api.patch(
        emulator.kind_of("apps/v1", "Deployment"),
        "default",
        "infer",
        "application/merge-patch+json",
        {"spec": {"replicas": 1}},
    )
    assert not isinstance(scaled, status.Failure)
    await until(
        lambda: len([p for p in pods(emulator) if "deletionTimestamp" not in p["metadata"]]) == 1,
        what="scale down to one",
    )
    await emulator.api.delete(emulator.kind_of("apps/v1", "Deployment"), "default", "infer", DeleteOptions())
    await until(lambda: not pods(emulator) and not emulator.list("apps/v1", "ReplicaSet"), what="garbage collection")


async def test_a_job_runs_pods_to_completion_with_its_parallelism(emulator: Emulator) -> None:
    await create(
        emulator,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "etl"},
            "spec": {
                "completions": 3,
                "parallelism": 2,
                "template": {
                    "metadata": {"annotations": {"quotient.dev/sim-duration": "50ms"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "schedulerName": "quotient",
                        "containers": [{"name": "main", "image": "etl:1"}],
                    },
                },
            },
        },
    )
    bound: set[str] = set()

    async def bind_new() -> None:
        for pod in pods(emulator):
            name = pod["metadata"]["name"]
            if name not in bound:
                assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "etl"
                assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
                bind(emulator, name, "node-1")
                bound.add(name)

    def complete() -> bool:
        job = emulator.get("batch/v1", "Job", "etl", "default")
        return any(c["type"] == "Complete" for c in (job or {}).get("status", {}).get("conditions", []))

    await until(lambda: len(pods(emulator)) == 2, what="two pods in parallel")

    async def bound_until_complete() -> bool:
        await bind_new()
        return complete()

    await until(bound_until_complete, what="the job to complete as its pods are bound")
    job = emulator.get("batch/v1", "Job", "etl", "default")
    assert job is not None and job["status"]["succeeded"] == 3 and len(bound) == 3


async def test_a_pytorchjob_creates_its_master_and_workers_with_the_training_operator_labels(
    emulator: Emulator,
) -> None:
    template = {
        "metadata": {"labels": {"kai.scheduler/queue": "test"}},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "pytorch", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    job = await create(
        emulator,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "llm"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": template},
                    "Worker": {"replicas": 2, "template": template},
                }
            },
        },
    )
    await until(lambda: len(pods(emulator)) == 3, what="three pods")
    by_name = {pod["metadata"]["name"]: pod for pod in pods(emulator)}
    assert set(by_name) == {"llm-master-0", "llm-worker-0", "llm-worker-1"}
    worker = by_name["llm-worker-1"]
    assert worker["metadata"]["labels"]["training.kubeflow.org/job-name"] == "llm"
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-index"] == "1"
    assert worker["metadata"]["labels"]["kai.scheduler/queue"] == "test"
    assert worker["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert worker["metadata"]["ownerReferences"][0]["controller"] is True
    env = {entry["name"]: entry["value"] for entry in worker["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "llm-master-0" and env["WORLD_SIZE"] == "3" and env["RANK"] == "2"
    for name in by_name:
        bind(emulator, name, "node-0" if name != "llm-worker-1" else "node-1")
    await until(lambda: all(phase(emulator, name) == "Running" for name in by_name), what="all running")
    await until(
        lambda: any(
            c["type"] == "Running" and c["status"] == "True"
            for c in (emulator.get("kubeflow.org/v1", "PyTorchJob", "llm", "default") or {})
            .get("status", {})
            .get("conditions", [])
        ),
        what="the job to report Running",
    )


class RecordingRuntime:
    def __init__(self) -> None:
        self.started: list[PodLaunch] = []
        self.stopped: list[PodLaunch] = []

    def start_pod(self, launch: PodLaunch) -> None:
        self.started.append(launch)

    def stop_pod(self, launch: PodLaunch) -> None:
        self.stopped.append(launch)


async def test_the_device_plugin_gives_the_lowest_free_gpus_and_the_runtime_hears_of_starts_and_stops(
    emulator: Emulator,
) -> None:
    runtime = RecordingRuntime()
    emulator.add_runtime(runtime)
    gpu = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "1"}}
    scripted = {"quotient.dev/sim-duration": "300ms"}
    await create(emulator, pod_manifest("a", resources=gpu, annotations=scripted, restartPolicy="Never"))
    await create(emulator, pod_manifest("b", resources=gpu))
    for name in ("a", "b"):
        bind(emulator, name, "node-0")
        await until(lambda name=name: phase(emulator, name) == "Running", what=f"{name} running")  # type: ignore[misc]
    assert emulator.devices_of("default", "a") == (0, 1) and emulator.devices_of("default", "b") == (2, 3)
    assert [launch.gpu_indices for launch in runtime.started] == [(0, 1), (2, 3)]
    uuids = runtime.started[1].gpu_uuids
    assert runtime.started[1].env["main"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    await until(lambda: phase(emulator, "a") == "Succeeded", what="a to finish its scripted run")
    assert [launch.name for launch in runtime.stopped] == ["a"]
    assert emulator.devices_of("default", "a") is None
    await create(emulator, pod_manifest("c", resources={"limits": {"nvidia.com/gpu": "1"}}))
    bind(emulator, "c", "node-0")
    await until(lambda: phase(emulator, "c") == "Running", what="c running")
    assert emulator.devices_of("default", "c") == (0,)
    await create(emulator, pod_manifest("d", resources={"limits": {"nvidia.com/gpu": "2"}}))
    bind(emulator, "d", "node-0")
    await until(lambda: phase(emulator, "d") == "Failed", what="d rejected")
    rejected = emulator.get("v1", "Pod", "d", "default")
    assert rejected is not None and rejected["status"]["reason"] == "UnexpectedAdmissionError"
    assert "Requested: 2, Available: 1" in rejected["status"]["message"]


async def test_the_kubelet_rejects_a_pod_that_does_not_fit_the_node(emulator: Emulator) -> None:
    await create(emulator, pod_manifest("big", resources={"requests": {"cpu": "12"}}))
    await create(emulator, pod_manifest("more", resources={"requests": {"cpu": "8"}}))
    bind(emulator, "big", "node-1")
    await until(lambda: phase(emulator, "big") == "Running", what="big running")
    bind(emulator, "more", "node-1")
    await until(lambda: phase(emulator, "more") == "Failed", what="more rejected")
    pod = emulator.get("v1", "Pod", "more", "default")
    assert pod is not None and pod["status"]["reason"] == "OutOfcpu"
    assert pod["status"]["message"].endswith("cpu, requested: 8000, used: 12000, capacity: 16000")


async def test_a_running_pod_reports_what_kubectl_and_the_scheduler_read(emulator: Emulator) -> None:
    await create(emulator, pod_manifest("web", resources={"requests": {"cpu": "1"}}))
    bind(emulator, "web", "node-1")
    await until(lambda: phase(emulator, "web") == "Running", what="web running")
    pod = emulator.get("v1", "Pod", "web", "default")
    assert pod is not None
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]} == {
        "PodScheduled": "True",
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
    }
    assert pod["status"]["podIP"].count(".") == 3 and pod["status"]["hostIP"] and pod["status"]["startTime"]
    assert pod["status"]["containerStatuses"][0]["ready"] is True


async def test_a_graceful_delete_marks_the_pod_and_the_kubelet_removes_it(emulator: Emulator) -> None:
    await create(emulator, pod_manifest("slow"))
    bind(emulator, "slow", "node-0")
    await until(lambda: phase(emulator, "slow") == "Running", what="slow running")
    marked = await emulator.api.delete(emulator.kind_of("v1", "Pod"), "default", "slow", DeleteOptions())
    assert not isinstance(marked, status.Failure) and marked["metadata"]["deletionGracePeriodSeconds"] == 30
    await until(lambda: emulator.get("v1", "Pod", "slow", "default") is None, what="the kubelet to finish")


async def test_env_from_a_configmap_waits_for_the_configmap(emulator: Emulator) -> None:
    runtime = RecordingRuntime()
    emulator.add_runtime(runtime, node="node-1")
    env = [
        {"name": "GPU_PORTION", "valueFrom": {"configMapKeyRef": {"name": "shares", "key": "portion"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    manifest = pod_manifest("shared")
    manifest["spec"]["containers"][0]["env"] = env  # type: ignore[index]
    await create(emulator, manifest)
    bind(emulator, "shared", "node-1")

    def waiting_reason() -> str | None:
        pod = emulator.get("v1", "Pod", "shared", "default") or {}
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        return statuses[0].get("state", {}).get("waiting", {}).get("reason")

    await until(lambda: waiting_reason() == "CreateContainerConfigError", what="the pod to wait for its ConfigMap")
    await create(
        emulator, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shares"}, "data": {"portion": "0.5"}}
    )
    await until(lambda: phase(emulator, "shared") == "Running", what="the pod to start")
    assert runtime.started[0].env["main"] == {"GPU_PORTION": "0.5", "POD": "shared"}


async def test_deleting_a_namespace_deletes_its_content_then_the_namespace(emulator: Emulator) -> None:
    await create(emulator, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    await create(emulator, pod_manifest("p", namespace="team"))
    await create(emulator, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team"}})
    marked = await emulator.api.delete(emulator.kind_of("v1", "Namespace"), "", "team", DeleteOptions())
    assert not isinstance(marked, status.Failure) and marked["status"]["phase"] == "Terminating"
    refused = await emulator.create(pod_manifest("late", namespace="team"))
    assert isinstance(refused, status.Failure) and refused.code == 403
    await until(lambda: emulator.get("v1", "Namespace", "team") is None, what="the namespace to go")
    assert not pods(emulator, "team")


async def test_faults_fail_matching_requests_for_a_number_of_times(emulator: Emulator) -> None:
    from quotient.emulator.faults import Fault

    emulator.inject(Fault(verb="create", resource="pods", subresource="binding", code=500), count=1)
    await create(emulator, pod_manifest("p"))
    async with aiohttp_session() as session:
        url = f"{emulator.url}/api/v1/namespaces/default/pods/p/binding"
        body = {"target": {"kind": "Node", "name": "node-0"}}
        async with session.post(url, json=body) as first:
            assert first.status == 500 and (await first.json())["reason"] == "InternalError"
        async with session.post(url, json=body) as second:
            assert second.status == 201


def aiohttp_session() -> Any:
    import aiohttp

    return aiohttp.ClientSession()

"""Workloads end to end: the vCluster guide's pods (with and without vCluster's owner reference) and a PyTorchJob gang
that waits whole until its last GPU frees, through the real scheduler process, the emulator and kubectl.

The vCluster case is the one KAI gets wrong: with ``setOwner`` on, vCluster's syncer gives every synced pod an owner
reference to the vCluster's Service on the host, KAI's grouper follows it and the pod never schedules. Quotient must
bind the pods either way, give each a group of its own (a tenant is never one gang), and say why in an event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import polling
from tests.e2e import harness
from tests.e2e.harness import World

pytestmark = pytest.mark.integration

TENANT_NAMESPACE = "vcluster-team-a"
VCLUSTER = "team-a"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with harness.world("1x4xA100-80GB", tmp_path) as current:
        current.scheduler(identity="sched-a")
        yield current


def _vcluster_service() -> dict[str, Any]:
    """The host-side Service vCluster creates for a virtual cluster (what synced pods are owned by)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": VCLUSTER, "namespace": TENANT_NAMESPACE, "labels": {"app": "vcluster"}},
        "spec": {
            "selector": {"app": "vcluster", "release": VCLUSTER},
            "ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}],
        },
    }


def _synced(seed: str, owner: tuple[str, str] | None) -> dict[str, Any]:
    """A seed pod as vCluster's syncer writes it on the host: in the tenant's namespace, with the syncer's labels and
    annotations, and (``setOwner`` on) an owner reference to the vCluster Service, given as (name, uid)."""
    pod = harness.load_seed(seed)
    meta = pod["metadata"]
    meta["namespace"] = TENANT_NAMESPACE
    meta.setdefault("labels", {})["vcluster.loft.sh/managed-by"] = VCLUSTER
    meta.setdefault("annotations", {}).update(
        {
            "vcluster.loft.sh/name": meta["name"],
            "vcluster.loft.sh/namespace": "default",
            "vcluster.loft.sh/object-name": meta["name"],
        }
    )
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": owner[0], "uid": owner[1]}]
    return pod


@pytest.mark.parametrize(
    "owner",
    ["service", "service-gone", None],
    ids=["setOwner-true", "setOwner-true-service-gone", "setOwner-false"],
)
def test_the_vcluster_guide_pods_bind_in_default_queue_each_in_a_group_of_its_own(
    world: World, owner: str | None
) -> None:
    """``service``: the pods are owned by the vCluster's Service, as vCluster syncs them by default;
    ``service-gone``: the reference names a Service that does not exist (404); None: ``setOwner: false``."""
    kubectl = world.kubectl
    kubectl("create", "namespace", TENANT_NAMESPACE)
    reference = None
    if owner == "service":
        harness.apply_objects(kubectl, world.directory, "service", _vcluster_service())
        service = kubectl.json("get", "service", VCLUSTER, "-n", TENANT_NAMESPACE)
        reference = (VCLUSTER, str(service["metadata"]["uid"]))
    elif owner == "service-gone":
        reference = (VCLUSTER, str(uuid.uuid4()))
    set_owner = reference is not None
    names = ("cpu-only-pod", "gpu-pod")
    harness.apply_objects(
        kubectl,
        world.directory,
        "tenant-pods",
        _synced("vcluster-cpu-only-pod.yaml", reference),
        _synced("vcluster-gpu-pod.yaml", reference),
    )

    def all_bound() -> bool:
        current = harness.pods(kubectl, TENANT_NAMESPACE)
        return all(harness.bound(current.get(name, {})) for name in names)

    polling.until_sync(all_bound, timeout_s=harness.STEP_TIMEOUT_S, what="the vCluster guide's pods bound")
    current = harness.pods(kubectl, TENANT_NAMESPACE)
    groups = {
        item["metadata"]["name"]: item for item in kubectl.json("get", "podgroups", "-n", TENANT_NAMESPACE)["items"]
    }
    group_names = [current[name]["metadata"]["annotations"]["pod-group-name"] for name in names]
    assert len(set(group_names)) == len(names), f"the tenant's pods were merged into one group: {group_names}"
    for name, group_name in zip(names, group_names, strict=True):
        group = groups[group_name]
        assert group["spec"]["queue"] == "default-queue"
        assert group["spec"]["minMember"] == 1
        if set_owner:
            assert current[name]["metadata"]["ownerReferences"][0]["kind"] == "Service"
    assert current["gpu-pod"]["metadata"]["annotations"]["quotient.dev/gpu-devices"]
    world.ledger.assert_each_bound_once()

    def own_group_events() -> dict[str, list[str]]:
        return {
            name: [
                event["message"]
                for event in harness.events_about(kubectl, TENANT_NAMESPACE, name)
                if event["reason"] == "OwnGroup"
            ]
            for name in names
        }

    if set_owner:
        polling.until_sync(
            lambda: all(
                any(f"Service/{VCLUSTER}" in message for message in messages)
                for messages in own_group_events().values()
            ),
            timeout_s=10,
            what="an event on each pod that says why it got a group of its own",
        )
        print(own_group_events())
    else:
        assert not any(own_group_events().values()), "an ownerless pod's own group needs no explanation"


def _pytorchjob(name: str, *, workers: int) -> dict[str, Any]:
    """A PyTorchJob with a CPU-only master and one-GPU workers: ``1 + workers`` pods in one gang, ``workers`` GPUs."""

    def replica(replicas: int, gpus: int) -> dict[str, Any]:
        resources: dict[str, dict[str, str]] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
        if gpus:
            resources["requests"]["nvidia.com/gpu"] = str(gpus)
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
                            "command": ["python", "-m", "torch.distributed.run", "train.py"],
                            "resources": resources,
                        }
                    ],
                }
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1, 0), "Worker": replica(workers, 1)}},
    }


def test_a_pytorchjob_that_needs_one_gpu_more_than_is_free_waits_whole_then_binds_whole(world: World) -> None:
    kubectl = world.kubectl
    harness.apply_objects(kubectl, world.directory, "blocker", harness.gpu_pod("blocker"))
    polling.until_sync(
        lambda: harness.bound(harness.pods(kubectl).get("blocker", {})),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the blocker bound",
    )

    harness.apply_objects(kubectl, world.directory, "job", _pytorchjob("ddp", workers=4))
    members = ("ddp-master-0", *(f"ddp-worker-{index}" for index in range(4)))

    def podgroup() -> dict[str, Any] | None:
        current = harness.pods(kubectl)
        name = ((current.get("ddp-worker-0") or {}).get("metadata", {}).get("annotations") or {}).get("pod-group-name")
        if not name:
            return None
        found: dict[str, Any] = kubectl.json("get", "podgroup", name)
        return found

    def gang_does_not_fit() -> bool:
        group = podgroup()
        conditions = ((group or {}).get("status") or {}).get("schedulingConditions") or []
        return any(condition.get("reason") == "GangDoesNotFit" for condition in conditions)

    polling.until_sync(
        gang_does_not_fit, timeout_s=harness.STEP_TIMEOUT_S, what="GangDoesNotFit on the PyTorchJob's PodGroup"
    )
    group = podgroup()
    assert group is not None and group["spec"]["minMember"] == 5
    print("waiting:", group["status"]["schedulingConditions"])
    polling.until_sync(
        lambda: any(
            event["reason"] == "Unschedulable" and "GangDoesNotFit" in event["message"]
            for event in harness.events_about(kubectl, "default", "ddp-worker-0")
        ),
        timeout_s=10,
        what="an Unschedulable event on a worker",
    )
    current = harness.pods(kubectl)
    assert set(members) <= set(current)
    # Nothing of the gang is bound, not even the master, which would fit on its own.
    assert not any(harness.bound(current[name]) for name in members)
    assert not world.ledger.bound_names() & set(members)

    kubectl("delete", "pod", "blocker", "--wait=true")

    def all_bound() -> bool:
        current = harness.pods(kubectl)
        return all(harness.bound(current.get(name, {})) for name in members)

    polling.until_sync(all_bound, timeout_s=harness.STEP_TIMEOUT_S, what="the whole gang bound once the GPU freed")
    current = harness.pods(kubectl)
    devices = sorted(
        current[f"ddp-worker-{index}"]["metadata"]["annotations"]["quotient.dev/gpu-devices"] for index in range(4)
    )
    assert devices == ["0", "1", "2", "3"]
    # Once bound, the group no longer says it does not fit.
    polling.until_sync(lambda: not gang_does_not_fit(), timeout_s=10, what="GangDoesNotFit cleared from the PodGroup")
    world.ledger.assert_each_bound_once()

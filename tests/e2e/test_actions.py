"""KAI's eviction actions end to end (issue 15), through the emulator, the real scheduler process and kubectl.

- A queue below its deserved quota reclaims one GPU from an over-quota queue whose only victims are 3-GPU jobs:
  with no eviction budget (KAI's default, now ours) one of the jobs goes, the other keeps running.
- An elastic PyTorchJob (one master, four one-GPU workers, ``minAvailable`` 2) shrinks to its minimum to make room
  for another queue's gang: three workers go, its master and one worker keep running, and the gang binds whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import polling
from tests.e2e import harness

pytestmark = pytest.mark.integration

QUEUE_LABEL = "kai.scheduler/queue"


def _queue(name: str, *, gpu_quota: int) -> dict[str, Any]:
    """A KAI Queue with a GPU quota, taking spare GPUs at weight 1, CPU and memory as much as requested."""
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "resources": {
                "gpu": {"quota": gpu_quota, "limit": -1, "overQuotaWeight": 1},
                "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
            }
        },
    }


def _in_queue(pod: dict[str, Any], queue: str) -> dict[str, Any]:
    pod["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    return pod


def _pytorchjob(name: str, *, queue: str, workers: int, min_available: int) -> dict[str, Any]:
    """A PyTorchJob with a CPU-only master and one-GPU workers; ``min_available`` of its pods must run together."""

    def replica(replicas: int, gpus: int) -> dict[str, Any]:
        resources: dict[str, dict[str, str]] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
        if gpus:
            resources["requests"]["nvidia.com/gpu"] = str(gpus)
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {
                "metadata": {"labels": {QUEUE_LABEL: queue}},
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
                },
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default", "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "runPolicy": {"schedulingPolicy": {"minAvailable": min_available}},
            "pytorchReplicaSpecs": {"Master": replica(1, 0), "Worker": replica(workers, 1)},
        },
    }


def _bound_uids(world: harness.World, names: list[str]) -> dict[str, str]:
    current = harness.pods(world.kubectl)
    return {name: current[name]["metadata"]["uid"] for name in names if harness.bound(current.get(name, {}))}


def test_a_queue_below_its_quota_reclaims_a_gpu_from_an_over_quota_queue_running_three_gpu_jobs(
    tmp_path: Path,
) -> None:
    with harness.world("1x6xA100-80GB", tmp_path) as world:
        world.apply("queues", _queue("team-a", gpu_quota=1), _queue("team-b", gpu_quota=0))
        scheduler = world.scheduler(identity="actions")
        trains = ["train-1", "train-2"]
        world.apply("trains", *(_in_queue(harness.gpu_pod(name, gpus=3), "team-b") for name in trains))
        polling.until_sync(lambda: world.bound(trains), timeout_s=harness.STEP_TIMEOUT_S, what="both 3-GPU jobs bound")

        world.apply("small", _in_queue(harness.gpu_pod("small"), "team-a"))
        polling.until_sync(
            lambda: world.bound(["small"]), timeout_s=30, what="team-a's pod bound after reclaiming from team-b"
        )
        running = _bound_uids(world, trains)
        assert len(running) == 1, f"exactly one 3-GPU job should have gone for 1 GPU, running: {sorted(running)}"
        (gone,) = set(trains) - set(running)
        reasons = [event["reason"] for event in harness.events_about(world.kubectl, "default", gone)]
        print("victim", gone, "events:", reasons)
        assert scheduler.process.poll() is None, "the scheduler exited"
        world.ledger.assert_each_bound_once()


def test_an_elastic_pytorchjob_shrinks_to_its_minimum_for_another_queues_gang(tmp_path: Path) -> None:
    with harness.world("1x4xA100-80GB", tmp_path) as world:
        world.apply("queues", _queue("team-a", gpu_quota=0), _queue("team-b", gpu_quota=3))
        scheduler = world.scheduler(identity="actions")
        world.apply("elastic", _pytorchjob("elastic", queue="team-a", workers=4, min_available=2))
        elastic = ["elastic-master-0", *(f"elastic-worker-{index}" for index in range(4))]
        polling.until_sync(
            lambda: world.bound(elastic), timeout_s=harness.STEP_TIMEOUT_S, what="the elastic job bound whole"
        )
        before = _bound_uids(world, elastic)

        world.apply("gang", _pytorchjob("gang", queue="team-b", workers=3, min_available=4))
        gang = ["gang-master-0", *(f"gang-worker-{index}" for index in range(3))]
        polling.until_sync(lambda: world.bound(gang), timeout_s=30, what="team-b's gang bound whole")

        after = _bound_uids(world, elastic)
        kept = {name for name, uid in after.items() if before.get(name) == uid}
        assert "elastic-master-0" in kept, "the elastic job's master was evicted"
        assert len(kept) == 2, f"the elastic job should keep its minimum (master and one worker), kept {sorted(kept)}"
        assert scheduler.process.poll() is None, "the scheduler exited"
        world.ledger.assert_each_bound_once()

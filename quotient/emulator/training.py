"""The PyTorchJob controller (Kubeflow training operator, ``kubeflow.org/v1``): a master and workers per job.

Pods are named ``<job>-master-0`` and ``<job>-worker-<i>`` and labelled as the training operator labels them
(``training.kubeflow.org/job-name``, ``replica-type``, ``replica-index``, ``job-role: master``), owned by the job
with ``controller: true``, and the ``pytorch`` container (or the first) gets ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE`` and ``RANK``. The job reports Created, Running when every pod runs, and Succeeded when the master
(or, without one, every worker) succeeds, or Failed when a replica fails under restart policy Never or ExitCode.
"""

from __future__ import annotations

from quotient.emulator.objects import Obj, clone, condition, is_deleting, metadata, set_condition
from quotient.emulator.workloads import Workloads, is_active, phase

PYTORCHJOBS = "pytorchjobs.kubeflow.org"
PYTORCH_DEFAULT_PORT = 23456  # the training operator's default for MASTER_PORT


async def reconcile(workloads: Workloads, namespace: str, name: str) -> None:
    """Create the missing replicas of a PyTorchJob and report its state."""
    job = workloads.store.get(PYTORCHJOBS, namespace, name)
    if job is None or is_deleting(job):
        return
    replica_specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    finished = any((condition(job, kind) or {}).get("status") == "True" for kind in ("Succeeded", "Failed"))
    has_master = "Master" in replica_specs
    world_size = sum(int((spec or {}).get("replicas", 1)) for spec in replica_specs.values())
    master_port = _master_port(replica_specs.get("Master") or {})
    by_name = {metadata(pod).get("name"): pod for pod in workloads.owned(job, "pods")}
    counts: dict[str, dict[str, int]] = {}
    failed_for_good = False
    for replica_type, replica_spec in replica_specs.items():
        replica_spec = replica_spec or {}
        replicas = int(replica_spec.get("replicas", 1))
        policy = str(replica_spec.get("restartPolicy") or "OnFailure")
        tally = counts.setdefault(replica_type, {"active": 0, "succeeded": 0, "failed": 0})
        for index in range(replicas):
            pod_name = f"{name}-{replica_type.lower()}-{index}"
            pod = by_name.get(pod_name)
            if pod is not None:
                current = phase(pod)
                if current == "Succeeded":
                    tally["succeeded"] += 1
                elif current == "Failed":
                    tally["failed"] += 1
                    failed_for_good = failed_for_good or policy in ("Never", "ExitCode")
                elif is_active(pod):
                    tally["active"] += 1
                continue
            if finished or workloads.store.get("pods", namespace, pod_name) is not None:
                continue
            rank = index if replica_type == "Master" else index + (1 if has_master else 0)
            created = await workloads.create_pod(
                namespace,
                _pytorch_pod(
                    workloads,
                    job,
                    replica_type,
                    index,
                    replica_spec,
                    pod_name,
                    rank=rank,
                    world_size=world_size,
                    master_port=master_port,
                ),
            )
            if created is not None:
                tally["active"] += 1
    new_status = clone(job.get("status") or {})
    now = workloads.api.now()
    new_status.setdefault("startTime", now)
    new_status["replicaStatuses"] = counts
    set_condition(
        new_status,
        {
            "type": "Created",
            "status": "True",
            "reason": "PyTorchJobCreated",
            "message": f"PyTorchJob {name} is created.",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        },
    )
    pods = workloads.owned(job, "pods")
    all_running = bool(pods) and len(pods) == world_size and all(phase(pod) == "Running" for pod in pods)
    done_type = "Master" if has_master else "Worker"
    done = counts.get(done_type, {})
    target = int((replica_specs.get(done_type) or {}).get("replicas", 1))
    if failed_for_good:
        final = ("Failed", "PyTorchJobFailed", f"PyTorchJob {name} has failed because a replica failed.")
    elif done and done.get("succeeded", 0) >= target:
        final = ("Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {name} is successfully completed.")
    else:
        final = None
    if final is not None:
        set_condition(
            new_status,
            {
                "type": "Running",
                "status": "False",
                "reason": final[1],
                "message": final[2],
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            },
        )
        set_condition(
            new_status,
            {
                "type": final[0],
                "status": "True",
                "reason": final[1],
                "message": final[2],
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            },
        )
        new_status.setdefault("completionTime", now)
    elif all_running:
        set_condition(
            new_status,
            {
                "type": "Running",
                "status": "True",
                "reason": "PyTorchJobRunning",
                "message": f"PyTorchJob {name} is running.",
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            },
        )
    for cond in new_status.get("conditions") or []:
        old_cond = condition(job, str(cond.get("type")))
        if old_cond is not None and old_cond.get("status") == cond.get("status"):
            cond["lastUpdateTime"] = old_cond.get("lastUpdateTime", cond.get("lastUpdateTime"))
    workloads.write_status(PYTORCHJOBS, job, new_status)


def _pytorch_pod(
    workloads: Workloads,
    job: Obj,
    replica_type: str,
    index: int,
    replica_spec: Obj,
    pod_name: str,
    *,
    rank: int,
    world_size: int,
    master_port: int,
) -> Obj:
    name = str(metadata(job).get("name"))
    pod = workloads.pod_from_template(job, replica_spec.get("template") or {}, name=pod_name)
    labels = pod["metadata"]["labels"]
    labels.update(
        {
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": replica_type.lower(),
            "training.kubeflow.org/replica-index": str(index),
        }
    )
    if replica_type == "Master":
        labels["training.kubeflow.org/job-role"] = "master"
    policy = str(replica_spec.get("restartPolicy") or "OnFailure")
    pod["spec"]["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    containers = pod["spec"].get("containers") or []
    target = next((c for c in containers if isinstance(c, dict) and c.get("name") == "pytorch"), None)
    if target is None and containers and isinstance(containers[0], dict):
        target = containers[0]
    if target is not None:
        env = target.setdefault("env", [])
        present = {entry.get("name") for entry in env if isinstance(entry, dict)}
        for key, value in (
            ("MASTER_PORT", str(master_port)),
            ("MASTER_ADDR", f"{name}-master-0"),
            ("WORLD_SIZE", str(world_size)),
            ("RANK", str(rank)),
            ("PYTHONUNBUFFERED", "1"),
        ):
            if key not in present:
                env.append({"name": key, "value": value})
    return pod


def _master_port(master: Obj) -> int:
    for container in ((master.get("template") or {}).get("spec") or {}).get("containers") or []:
        for port in (container or {}).get("ports") or []:
            if isinstance(port, dict) and port.get("name") == "pytorchjob-port" and port.get("containerPort"):
                return int(port["containerPort"])
    return PYTORCH_DEFAULT_PORT

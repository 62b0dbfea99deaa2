"""The workload controllers: Deployment -> ReplicaSet -> pods, and Job -> pods.

The scheduler's grouping follows owner references from a pod to its top owner, so these produce the chains a
cluster produces, with the same names, labels and ``ownerReferences`` (``controller: true``,
``blockOwnerDeletion: true``): a Deployment's ReplicaSet is ``<deployment>-<template hash>`` and its pods
``<replicaset>-<5 random>``; a Job's pods carry ``batch.kubernetes.io/controller-uid`` and ``job-name`` (and, for
Indexed Jobs, their completion index). Pods are created through the API layer, so they pass defaults, admission
and webhooks like any other. Rolling updates are simplified to "scale the new ReplicaSet up, the old ones to
zero". Each reconciler reads the current state and converges; ``controllers.py`` calls them.
"""

from __future__ import annotations

from common import logs
from quotient.emulator import naming, status
from quotient.emulator.api import Api
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import (
    TERMINAL_PHASES,
    Obj,
    clone,
    condition,
    controller_ref,
    is_deleting,
    labels_of,
    metadata,
    owner_reference,
    set_condition,
)

log = logs.get("emulator.workloads")

DEPLOYMENTS = "deployments.apps"
REPLICASETS = "replicasets.apps"
JOBS = "jobs.batch"


def is_active(pod: Obj) -> bool:
    return not is_deleting(pod) and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def is_ready(pod: Obj) -> bool:
    found = condition(pod, "Ready")
    return found is not None and found.get("status") == "True"


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


class Workloads:
    """Reconcilers of the built-in workload kinds, and the helpers every controller shares."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.store = api.store

    def kind(self, storage: str) -> Kind:
        found = self.api.registry.by_storage(storage)
        if found is None:
            raise LookupError(f"no kind serves {storage}")
        return found

    def owned(self, owner: Obj, storage: str) -> list[Obj]:
        uid = metadata(owner).get("uid")
        return [
            obj
            for found, obj in self.store.dependents(str(uid))
            if found == storage and (controller_ref(obj) or {}).get("uid") == uid
        ]

    async def create_pod(self, namespace: str, pod: Obj) -> Obj | None:
        created = await self.api.create(self.kind("pods"), namespace, pod)
        if isinstance(created, status.Failure):
            log.warning("pod_create_failed", namespace=namespace, message=created.message)
            return None
        return created

    async def delete_pod(self, pod: Obj, grace_s: int | None = None) -> None:
        meta = metadata(pod)
        await self.api.delete(
            self.kind("pods"), str(meta.get("namespace")), str(meta.get("name")), DeleteOptions(grace_period_s=grace_s)
        )

    def write_status(self, storage: str, obj: Obj, new_status: Obj) -> None:
        meta = metadata(obj)
        self.api.write_status(
            self.kind(storage),
            str(meta.get("namespace") or ""),
            str(meta.get("name")),
            new_status,
            uid=str(meta.get("uid")),
        )

    def pod_from_template(self, owner: Obj, template: Obj, *, name: str = "", generate: str = "") -> Obj:
        template_meta = template.get("metadata") or {}
        meta: Obj = {"labels": dict(template_meta.get("labels") or {}), "ownerReferences": [owner_reference(owner)]}
        if template_meta.get("annotations"):
            meta["annotations"] = dict(template_meta["annotations"])
        if name:
            meta["name"] = name
        else:
            meta["generateName"] = generate
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": clone(template.get("spec") or {})}

    # --- Deployment ---

    async def deployment(self, namespace: str, name: str) -> None:
        deployment = self.store.get(DEPLOYMENTS, namespace, name)
        if deployment is None or is_deleting(deployment):
            return
        spec = deployment.get("spec") or {}
        template = spec.get("template") or {}
        replicas = int(spec.get("replicas", 1))
        pod_hash = naming.template_hash(template)
        owned = self.owned(deployment, REPLICASETS)
        current = next((rs for rs in owned if labels_of(rs).get("pod-template-hash") == pod_hash), None)
        if current is None:
            rs_template = clone(template)
            rs_template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = pod_hash
            selector = clone(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})["pod-template-hash"] = pod_hash
            created = await self.api.create(
                self.kind(REPLICASETS),
                namespace,
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "metadata": {
                        "name": f"{name}-{pod_hash}",
                        "labels": dict(rs_template["metadata"]["labels"]),
                        "annotations": {
                            "deployment.kubernetes.io/revision": str(len(owned) + 1),
                            "deployment.kubernetes.io/desired-replicas": str(replicas),
                            "deployment.kubernetes.io/max-replicas": str(replicas + 1),
                        },
                        "ownerReferences": [owner_reference(deployment)],
                    },
                    "spec": {"replicas": replicas, "selector": selector, "template": rs_template},
                },
            )
            if isinstance(created, status.Failure):
                log.warning("replicaset_create_failed", namespace=namespace, message=created.message)
                return
            current = created
        elif not spec.get("paused") and int((current.get("spec") or {}).get("replicas", 0)) != replicas:
            scaled = clone(current)
            scaled["spec"]["replicas"] = replicas
            self.api.write(self.kind(REPLICASETS), scaled)
        for old in owned:
            old_replicas = int((old.get("spec") or {}).get("replicas", 0))
            if metadata(old).get("uid") != metadata(current).get("uid") and old_replicas != 0:
                scaled = clone(old)
                scaled["spec"]["replicas"] = 0
                self.api.write(self.kind(REPLICASETS), scaled)
        sets = self.owned(deployment, REPLICASETS)
        new_uid = metadata(current).get("uid")
        total = sum(int((rs.get("status") or {}).get("replicas") or 0) for rs in sets)
        ready = sum(int((rs.get("status") or {}).get("readyReplicas") or 0) for rs in sets)
        available = sum(int((rs.get("status") or {}).get("availableReplicas") or 0) for rs in sets)
        updated = sum(
            int((rs.get("status") or {}).get("replicas") or 0) for rs in sets if metadata(rs).get("uid") == new_uid
        )
        new_status = clone(deployment.get("status") or {})
        new_status.update(
            observedGeneration=metadata(deployment).get("generation", 1),
            replicas=total,
            updatedReplicas=updated,
            readyReplicas=ready,
            availableReplicas=available,
            unavailableReplicas=max(0, replicas - available),
        )
        now = self.api.now()
        minimum = "True" if available >= replicas else "False"
        set_condition(
            new_status,
            {
                "type": "Available",
                "status": minimum,
                "reason": "MinimumReplicasAvailable" if minimum == "True" else "MinimumReplicasUnavailable",
                "message": "Deployment has minimum availability."
                if minimum == "True"
                else "Deployment does not have minimum availability.",
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            },
        )
        set_condition(
            new_status,
            {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable"
                if updated == replicas and available >= replicas
                else "ReplicaSetUpdated",
                "message": f'ReplicaSet "{metadata(current).get("name")}" is progressing.',
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            },
        )
        for cond in new_status["conditions"]:
            old_cond = condition(deployment, str(cond["type"]))
            if old_cond is not None and {k: v for k, v in old_cond.items() if k != "lastUpdateTime"} == {
                k: v for k, v in cond.items() if k != "lastUpdateTime"
            }:
                cond["lastUpdateTime"] = old_cond.get("lastUpdateTime")
        self.write_status(DEPLOYMENTS, deployment, new_status)

    # --- ReplicaSet ---

    async def replicaset(self, namespace: str, name: str) -> None:
        replicaset = self.store.get(REPLICASETS, namespace, name)
        if replicaset is None or is_deleting(replicaset):
            return
        spec = replicaset.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        active = [pod for pod in self.owned(replicaset, "pods") if is_active(pod)]
        if len(active) < wanted:
            for _ in range(wanted - len(active)):
                await self.create_pod(
                    namespace, self.pod_from_template(replicaset, spec.get("template") or {}, generate=f"{name}-")
                )
        elif len(active) > wanted:
            # Scale down the pods that cost least to lose: unscheduled, then pending, then not ready, newest first.
            def cost(pod: Obj) -> tuple[int, int, int, str]:
                return (
                    1 if (pod.get("spec") or {}).get("nodeName") else 0,
                    1 if phase(pod) == "Running" else 0,
                    1 if is_ready(pod) else 0,
                    "".join(chr(0x10FFFF - ord(c)) for c in str(metadata(pod).get("creationTimestamp", ""))),
                )

            for pod in sorted(active, key=cost)[: len(active) - wanted]:
                await self.delete_pod(pod)
        current = self.store.get(REPLICASETS, namespace, name)
        if current is None:
            return
        pods = [pod for pod in self.owned(current, "pods") if is_active(pod)]
        ready = sum(1 for pod in pods if is_ready(pod))
        new_status = {
            "replicas": len(pods),
            "fullyLabeledReplicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": metadata(current).get("generation", 1),
        }
        self.write_status(REPLICASETS, current, new_status)

    # --- Job ---

    async def job(self, namespace: str, name: str) -> None:
        job = self.store.get(JOBS, namespace, name)
        if job is None or is_deleting(job):
            return
        spec = job.get("spec") or {}
        pods = self.owned(job, "pods")
        active = [pod for pod in pods if is_active(pod)]
        succeeded = [pod for pod in pods if phase(pod) == "Succeeded"]
        failed = [pod for pod in pods if phase(pod) == "Failed"]
        new_status = clone(job.get("status") or {})
        now = self.api.now()
        finished = any((condition(job, kind) or {}).get("status") == "True" for kind in ("Complete", "Failed"))
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1))
        indexed = spec.get("completionMode") == "Indexed"
        done_indexes = {_completion_index(pod) for pod in succeeded} - {None}
        if finished:
            for pod in active:
                await self.delete_pod(pod, grace_s=0)
        elif len(failed) > int(spec.get("backoffLimit", 6)):
            _job_finished(
                new_status,
                ("FailureTarget", "Failed"),
                reason="BackoffLimitExceeded",
                message="Job has reached the specified backoff limit",
                now=now,
            )
            for pod in active:
                await self.delete_pod(pod, grace_s=0)
            active = []
        elif (completions is not None and (len(done_indexes) if indexed else len(succeeded)) >= int(completions)) or (
            completions is None and succeeded and not active
        ):
            _job_finished(
                new_status,
                ("SuccessCriteriaMet", "Complete"),
                reason="CompletionsReached",
                message="Reached expected number of succeeded pods",
                now=now,
            )
            new_status["completionTime"] = now
        elif spec.get("suspend"):
            for pod in active:
                await self.delete_pod(pod, grace_s=0)
            active = []
        else:
            new_status.setdefault("startTime", now)
            remaining = parallelism if completions is None else int(completions) - len(succeeded)
            to_create = min(parallelism, remaining) - len(active)
            template = spec.get("template") or {}
            if indexed and completions is not None:
                busy = {_completion_index(pod) for pod in active} | done_indexes
                free = [index for index in range(int(completions)) if index not in busy][: max(0, to_create)]
                for index in free:
                    pod = self.pod_from_template(job, template, generate=f"{name}-{index}-")
                    key = "batch.kubernetes.io/job-completion-index"
                    pod["metadata"]["labels"][key] = str(index)
                    pod["metadata"].setdefault("annotations", {})[key] = str(index)
                    pod["spec"].setdefault("hostname", f"{name}-{index}")
                    await self.create_pod(namespace, pod)
            else:
                for _ in range(max(0, to_create)):
                    await self.create_pod(namespace, self.pod_from_template(job, template, generate=f"{name}-"))
        current = self.store.get(JOBS, namespace, name)
        if current is None:
            return
        pods = self.owned(current, "pods")
        new_status.update(
            active=sum(1 for pod in pods if is_active(pod)),
            ready=sum(1 for pod in pods if is_active(pod) and is_ready(pod)),
            succeeded=sum(1 for pod in pods if phase(pod) == "Succeeded"),
            failed=sum(1 for pod in pods if phase(pod) == "Failed"),
            uncountedTerminatedPods={},
        )
        if indexed:
            new_status["completedIndexes"] = _index_ranges(sorted(i for i in done_indexes if i is not None))
        for field in ("active", "succeeded", "failed"):
            if not new_status[field] and field not in (current.get("status") or {}):
                del new_status[field]
        self.write_status(JOBS, current, new_status)


def _job_finished(new_status: Obj, kinds: tuple[str, str], *, reason: str, message: str, now: str) -> None:
    """The two conditions a Job controller sets when it ends a Job: the target, then the final one."""
    for kind in kinds:
        set_condition(
            new_status,
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": now,
                "lastTransitionTime": now,
            },
        )


def _completion_index(pod: Obj) -> int | None:
    value = (metadata(pod).get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _index_ranges(indexes: list[int]) -> str:
    """``0-2,4``: the Job's completedIndexes form."""
    parts: list[str] = []
    start = previous = None
    for index in indexes:
        if previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(f"{start}-{previous}" if previous != start else str(start))
        start = previous = index
    if start is not None:
        parts.append(f"{start}-{previous}" if previous != start else str(start))
    return ",".join(parts)

"""What ``quotient bench kai-scale`` creates (KAI's queues, namespaces and Jobs) and what it watches (``Observations``).

The objects are KAI's scale-test objects (``test/e2e/scale/`` and ``test/e2e/modules/resources/rd/``): a parent
queue and two child queues with KAI's test defaults (quota -1, over-quota weight 1, limit -1 for GPU, CPU and
memory), a namespace per queue, and ``batch/v1`` Jobs whose pod template names the queue in its label, requests GPUs
as a limit only, tolerates ``nvidia.com/gpu`` and has no grace period. A single-GPU job is a Job of one pod (KAI's
podgrouper, and ours, give it a PodGroup of its own); a distributed job is a Job of N pods with
``kai.scheduler/batch-min-member: N`` (one gang). KAI's pods also carry a KWOK toleration and node affinity: our
emulated nodes are neither tainted nor labelled for KWOK, so those are left out.

``Observations`` is the bench's view of the cluster, fed by its watches (pure: events and the time they were seen
in, counts and times out). A pod's bound time is when a watch first showed it with a node; a PodGroup's verdict time
is when a watch first showed its ``UnschedulableOnNodePool`` condition. Counts are kept as events arrive, so waiting
on them costs nothing however many pods there are.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from common import names

SCHEDULER_NAME: Final = "quotient"
PARENT_QUEUE: Final = "kai-scale-parent"
FIRST_QUEUE: Final = "kai-scale-sanity"
"""KAI's ``sanityTestQueue``: it fills the cluster; in the reclaim scenarios it has no quota."""
SECOND_QUEUE: Final = "kai-scale-reclaim"
"""KAI's ``reclaimSingleGPUJobsQueue``: it reclaims from the first."""

Obj = dict[str, Any]


def namespace_of(queue: str) -> str:
    """KAI's tests run each queue's jobs in a namespace of its own (``QueueNamespacePrefix`` + the queue)."""
    return queue


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def queue_gpu(*, quota: float, over_quota_weight: float, limit: float) -> Obj:
    return {"quota": quota, "overQuotaWeight": over_quota_weight, "limit": limit}


def queue(name: str, *, parent: str | None) -> Obj:
    """A queue as KAI's ``queue.CreateQueueObject`` makes it: every resource -1 quota, weight 1, -1 limit."""
    unlimited = queue_gpu(quota=-1, over_quota_weight=1, limit=-1)
    spec: Obj = {"resources": {"gpu": dict(unlimited), "cpu": dict(unlimited), "memory": dict(unlimited)}}
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def job(name: str, *, queue_name: str, gpus_per_pod: int, pods: int = 1) -> Obj:
    """A single-GPU job (``pods`` 1, KAI's ``CreateBatchJobObject``) or a distributed one (KAI's
    ``CreateDistributedBatchJob``: parallelism and completions ``pods``, one gang of ``pods``)."""
    spec: Obj = {
        "template": {
            "metadata": {"labels": {names.QUEUE_LABEL: queue_name}},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"key": names.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "ubuntu-container",
                        "image": "ubuntu",
                        "args": ["sleep", "infinity"],
                        "resources": {"limits": {names.GPU_RESOURCE: str(gpus_per_pod)}},
                    }
                ],
            },
        }
    }
    metadata: Obj = {"name": name, "namespace": namespace_of(queue_name)}
    if pods > 1:
        spec["parallelism"] = pods
        spec["completions"] = pods
        metadata["annotations"] = {names.BATCH_MIN_MEMBER_ANNOTATION: str(pods)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodSeen:
    namespace: str
    name: str
    job: str | None
    group: str | None
    node: str | None
    bound_at: float | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupSeen:
    namespace: str
    name: str
    seen_at: float
    """When a watch first showed the PodGroup (KAI's clock starts at its creation)."""
    unschedulable_at: float | None
    reason: str | None
    message: str | None
    """The newest condition's reason and message (kept after the first verdict, for the report)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _job_of(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == "Job" and ref.get("controller"):
            return str(ref.get("name"))
    return None


class Observations:
    """Pods and PodGroups as the watches showed them, with the time each pod was first seen bound and each group
    first seen marked unschedulable; live and bound counts per namespace and per Job."""

    def __init__(self) -> None:
        self.pods: dict[str, PodSeen] = {}
        self.groups: dict[tuple[str, str], GroupSeen] = {}
        self.live: Counter[str] = Counter()
        self.bound: Counter[str] = Counter()
        self.live_in_job: Counter[tuple[str, str]] = Counter()
        self.bound_in_job: Counter[tuple[str, str]] = Counter()

    def _count(self, pod: PodSeen, sign: int) -> None:
        self.live[pod.namespace] += sign
        if pod.node is not None:
            self.bound[pod.namespace] += sign
        if pod.job is not None:
            self.live_in_job[pod.namespace, pod.job] += sign
            if pod.node is not None:
                self.bound_in_job[pod.namespace, pod.job] += sign

    def pod(self, event: str, obj: Mapping[str, Any], *, at: float) -> None:
        """A pod watch event (``ADDED``, ``MODIFIED``, ``DELETED``) seen at ``at``. A pod being deleted is gone."""
        meta = _meta(obj)
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        previous = self.pods.pop(uid, None)
        if previous is not None:
            self._count(previous, -1)
        if event == "DELETED" or meta.get("deletionTimestamp"):
            return
        node = (obj.get("spec") or {}).get("nodeName") or None
        bound_at = previous.bound_at if previous is not None and previous.bound_at is not None else None
        if bound_at is None and node is not None:
            bound_at = at
        seen = PodSeen(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            job=_job_of(meta),
            group=(meta.get("annotations") or {}).get(names.POD_GROUP_ANNOTATION),
            node=str(node) if node is not None else None,
            bound_at=bound_at,
        )
        self.pods[uid] = seen
        self._count(seen, +1)

    def relisted_pods(self, items: Iterable[Mapping[str, Any]], *, at: float) -> None:
        """A fresh list: pods missing from it are gone, the others seen as of ``at``."""
        listed = {str(_meta(item).get("uid") or ""): item for item in items}
        for uid in [uid for uid in self.pods if uid not in listed]:
            self._count(self.pods.pop(uid), -1)
        for item in listed.values():
            self.pod("MODIFIED", item, at=at)

    def podgroup(self, event: str, obj: Mapping[str, Any], *, at: float) -> None:
        """A PodGroup watch event seen at ``at``: the first time it shows KAI's unschedulable condition is kept."""
        meta = _meta(obj)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        previous = self.groups.pop(key, None)
        if event == "DELETED":
            return
        conditions = (obj.get("status") or {}).get("schedulingConditions") or []
        marked = [
            condition
            for condition in conditions
            if isinstance(condition, dict)
            and condition.get("type") == names.UNSCHEDULABLE_CONDITION
            and condition.get("status", "True") == "True"
        ]
        first = previous.unschedulable_at if previous is not None else None
        self.groups[key] = GroupSeen(
            namespace=key[0],
            name=key[1],
            seen_at=previous.seen_at if previous is not None else at,
            unschedulable_at=first if first is not None else (at if marked else None),
            reason=str(marked[0].get("reason")) if marked else None,
            message=str(marked[0].get("message")) if marked else None,
        )

    def relisted_groups(self, items: Iterable[Mapping[str, Any]], *, at: float) -> None:
        everything = list(items)
        listed = {(str(_meta(item).get("namespace") or ""), str(_meta(item).get("name") or "")) for item in everything}
        for key in [key for key in self.groups if key not in listed]:
            del self.groups[key]
        for item in everything:
            self.podgroup("MODIFIED", item, at=at)

    def bound_times(self, namespace: str, *, job: str | None = None) -> list[float]:
        """When each live pod of ``namespace`` (of ``job``, if given) was first seen bound."""
        return [
            pod.bound_at
            for pod in self.pods.values()
            if pod.namespace == namespace and pod.bound_at is not None and (job is None or pod.job == job)
        ]

    def group_of(self, namespace: str, job: str) -> GroupSeen | None:
        """The PodGroup of ``job``'s pods (by their ``pod-group-name``), as last seen."""
        for pod in self.pods.values():
            if pod.namespace == namespace and pod.job == job and pod.group is not None:
                seen = self.groups.get((namespace, pod.group))
                if seen is not None:
                    return seen
        return None

    def verdict(self, namespace: str, job: str) -> GroupSeen | None:
        """The PodGroup of ``job``'s pods once it is marked unschedulable."""
        seen = self.group_of(namespace, job)
        return seen if seen is not None and seen.unschedulable_at is not None else None

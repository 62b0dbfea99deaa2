"""What the scheduler asks of the Kubernetes API: the ``KubeApi`` Protocol, its values, and the resources it names.

Everything in the scheduler that talks to the API is written against :class:`KubeApi`; ``scheduler.kube.client``
implements it over the official ``kubernetes.aio`` client (the only module that imports ``kubernetes``), and the
tests' ``MemoryKube`` implements it in memory, held to the same contract by one suite run against both. Objects in
and out are plain JSON mappings: the scheduler reads a few dozen fields of thousands of objects, and decodes each once
into a record at the reflector (``scheduler.objects``). A :class:`Resource` names where a kind lives (group, version,
plural), as ``kubectl`` and the dynamic client do, so core kinds, custom resources (Queue, PodGroup) and any owner
kind the grouper follows go through one path.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

Obj = dict[str, Any]
"""A Kubernetes object as the API sends it: a JSON mapping."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """A resource type of the API: where its objects live and what they are called."""

    group: str
    """``""`` for the core group (``/api/v1``)."""
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection, or of one object (``name``) or its ``subresource``.

        A namespaced resource without a namespace names the collection across all namespaces (list and watch only).
        """
        parts = [f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"]
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are cluster-scoped: no namespace ({namespace!r} given)")
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        elif name is not None and self.namespaced:
            raise ValueError(f"{self.plural} are namespaced: {name!r} needs a namespace")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
            if subresource is not None:
                parts.append(subresource)
        return "/".join(parts)


def _core(plural: str, kind: str, *, namespaced: bool = True) -> Resource:
    return Resource(group="", version="v1", plural=plural, kind=kind, namespaced=namespaced)


def _grouped(api_version: str, plural: str, kind: str, *, namespaced: bool = True) -> Resource:
    group, _, version = api_version.partition("/")
    return Resource(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced)


PODS = _core("pods", "Pod")
NODES = _core("nodes", "Node", namespaced=False)
NAMESPACES = _core("namespaces", "Namespace", namespaced=False)
CONFIG_MAPS = _core("configmaps", "ConfigMap")
EVENTS = _core("events", "Event")
SERVICES = _core("services", "Service")
LEASES = _grouped("coordination.k8s.io/v1", "leases", "Lease")
PRIORITY_CLASSES = _grouped("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", namespaced=False)
QUEUES = _grouped("scheduling.run.ai/v2", "queues", "Queue", namespaced=False)
POD_GROUPS = _grouped("scheduling.run.ai/v2alpha2", "podgroups", "PodGroup")
DEPLOYMENTS = _grouped("apps/v1", "deployments", "Deployment")
REPLICA_SETS = _grouped("apps/v1", "replicasets", "ReplicaSet")
STATEFUL_SETS = _grouped("apps/v1", "statefulsets", "StatefulSet")
JOBS = _grouped("batch/v1", "jobs", "Job")
CRON_JOBS = _grouped("batch/v1", "cronjobs", "CronJob")
PYTORCH_JOBS = _grouped("kubeflow.org/v1", "pytorchjobs", "PyTorchJob")
TF_JOBS = _grouped("kubeflow.org/v1", "tfjobs", "TFJob")
MPI_JOBS = _grouped("kubeflow.org/v1", "mpijobs", "MPIJob")
MPI_JOBS_V2 = _grouped("kubeflow.org/v2beta1", "mpijobs", "MPIJob")
RAY_CLUSTERS = _grouped("ray.io/v1", "rayclusters", "RayCluster")
RAY_JOBS = _grouped("ray.io/v1", "rayjobs", "RayJob")
JOB_SETS = _grouped("jobset.x-k8s.io/v1alpha2", "jobsets", "JobSet")
LEADER_WORKER_SETS = _grouped("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet")

KNOWN_RESOURCES: Mapping[tuple[str, str], Resource] = {
    (resource.api_version, resource.kind): resource
    for resource in (
        PODS,
        NODES,
        NAMESPACES,
        CONFIG_MAPS,
        EVENTS,
        SERVICES,
        LEASES,
        PRIORITY_CLASSES,
        QUEUES,
        POD_GROUPS,
        DEPLOYMENTS,
        REPLICA_SETS,
        STATEFUL_SETS,
        JOBS,
        CRON_JOBS,
        PYTORCH_JOBS,
        TF_JOBS,
        MPI_JOBS,
        MPI_JOBS_V2,
        RAY_CLUSTERS,
        RAY_JOBS,
        JOB_SETS,
        LEADER_WORKER_SETS,
    )
}
"""The kinds the scheduler reads, by ``(apiVersion, kind)``; :meth:`KubeApi.resolve` asks discovery for others."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectList:
    """A list answer: the objects, and the ``resourceVersion`` to watch from so nothing after the list is missed."""

    items: list[Obj]
    resource_version: str


class WatchType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    """Carries only ``metadata.resourceVersion``: where to resume, nothing changed."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent:
    type: WatchType
    object: Obj


class PatchType(enum.StrEnum):
    """The patch formats, by content type."""

    MERGE = "application/merge-patch+json"
    """RFC 7386: maps merge, lists are replaced whole. For labels, annotations, custom resources' status."""
    STRATEGIC = "application/strategic-merge-patch+json"
    """Core types only: lists merge by key (conditions by type, containers by name)."""
    JSON = "application/json-patch+json"
    """RFC 6902: a list of operations."""


class BindOutcome(enum.StrEnum):
    BOUND = "bound"
    ALREADY_ASSIGNED = "already-assigned"
    """409: the pod has a node already (``node`` says which when the API named it), or its uid changed; re-read it."""
    POD_GONE = "pod-gone"
    """404: the pod was deleted."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BindResult:
    outcome: BindOutcome
    message: str = ""
    node: str | None = None


class EvictOutcome(enum.StrEnum):
    EVICTED = "evicted"
    """The delete was accepted; the pod terminates within its grace period."""
    POD_GONE = "pod-gone"
    """The pod (with this uid) no longer exists; nothing was deleted."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvictResult:
    outcome: EvictOutcome
    condition_written: bool
    """Whether the ``DisruptionTarget`` condition was recorded on the pod before its deletion."""


class KubeApi(Protocol):
    """What the scheduler asks of the Kubernetes API. Objects in and out are JSON dicts.

    Contract, for every implementation (``KubeClient`` and the fakes of the tests):
    - Every method is a coroutine (``watch`` an async iterator) and never blocks the event loop.
    - Faults raise :mod:`scheduler.kube.errors` classes only: ``KubeUnavailable`` when the API did not answer
      usefully (connection, timeout, 5xx, 429: retry with backoff), ``KubeForbidden``, ``KubeInvalid``,
      ``KubeConflict`` (stale ``resourceVersion`` or failed uid precondition), ``KubeAlreadyExists``,
      ``KubeNotFound``, ``KubeGone`` (410: relist). Nothing from the vendor library escapes.
    - Ordinary answers are values: ``get`` and ``delete`` return ``None`` for an object that does not exist;
      ``bind_pod`` and ``evict_pod`` return what happened.
    - Idempotency: ``get``, ``list``, ``resolve`` read only. ``patch`` with a merge or strategic patch is
      idempotent. ``delete`` and ``evict_pod`` are (a second call finds nothing: ``None``/``POD_GONE``).
      ``bind_pod`` is safe to repeat: a second bind of the same pod answers ``ALREADY_ASSIGNED``, never a second
      placement. ``create`` is not: a second create raises ``KubeAlreadyExists``. ``replace`` is optimistic: it
      sends the body's ``metadata.resourceVersion`` and raises ``KubeConflict`` when the object changed since.
    """

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """Every matching object (all namespaces when ``namespace`` is None), fetched in pages."""
        ...

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
        read_timeout_s: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes after ``resource_version``, with bookmarks, until the server ends the stream (``timeout_s``).

        Raises ``KubeGone`` when that version is compacted away (HTTP 410 or an ``ERROR`` event with code 410),
        ``KubeUnavailable`` when nothing arrives for ``read_timeout_s`` or the stream breaks. Use it with
        ``contextlib.aclosing`` so the connection is released when the consumer stops early.
        """
        ...

    async def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> Obj | None: ...

    async def resolve(self, *, api_version: str, kind: str) -> Resource | None:
        """The resource of a kind (as named in an owner reference), or None when the API does not serve it."""
        ...

    async def create(self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None) -> Obj: ...

    async def replace(
        self, resource: Resource, body: Mapping[str, Any], *, name: str, namespace: str | None = None
    ) -> Obj: ...

    async def patch(
        self,
        resource: Resource,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Obj:
        """Apply ``patch`` to the object (or its ``status`` subresource); ``KubeNotFound`` when it is gone."""
        ...

    async def delete(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        grace_period_s: int | None = None,
    ) -> Obj | None:
        """Delete the object (only if its uid is ``uid``, when given); its last state, or None when it was gone."""
        ...

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        """Bind the pod to ``node``; ``annotations`` ride on the Binding, which the API server copies onto the pod in
        the same write (``setPodHostAndAnnotations``), saving a patch."""
        ...

    async def evict_pod(
        self, *, namespace: str, name: str, uid: str, reason: str, message: str, grace_period_s: int | None = None
    ) -> EvictResult:
        """Record a ``DisruptionTarget`` condition on the pod where the API allows it, then delete the pod."""
        ...


def micro_time(now: datetime.datetime) -> str:
    """A ``MicroTime`` as the API writes it (leases' ``renewTime``, events' ``eventTime``)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(now: datetime.datetime) -> str:
    """A ``Time`` as the API writes it (conditions' ``lastTransitionTime``, events' timestamps): whole seconds."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

"""Reading what the operator's view needs from the API (and the leader's ``/metrics``), through ``KubeApi``.

The one object a command is about (the pod, the PodGroup) must be readable, or the command fails with one line that
says why; everything else (Events, Queues, reservation pods, the beneficiary of an eviction, the metrics) is read on
a best-effort basis, and what could not be read is listed in ``unread`` for the user. Nothing here decides what to
say: ``explaining``, ``queuetable`` and ``toptable`` do, from these inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from common import names
from quotient.explain import facts, scrape
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeError

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    namespace: str
    name: str
    podgroup: bool = False

    @property
    def display(self) -> str:
        return f"{self.namespace}/podgroup/{self.name}" if self.podgroup else f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSource:
    """Where the measured series come from: a URL, else the leader named by the Lease (``namespace/name``)."""

    url: str | None = None
    lease_namespace: str = "quotient-system"
    lease_name: str = "quotient-scheduler"
    enabled: bool = True


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """The command cannot answer: the object it is about, or the cluster, cannot be read."""

    message: str


@dataclasses.dataclass(slots=True, kw_only=True)
class ExplainInputs:
    target: Target
    pod: Obj | None = None
    podgroup: Obj | None = None
    members: list[Obj] = dataclasses.field(default_factory=list)
    """The pods of the PodGroup (for a PodGroup target, and to list the gang)."""
    queues: list[Obj] = dataclasses.field(default_factory=list)
    events: list[Obj] = dataclasses.field(default_factory=list)
    """Events about the pod (evictions, alerts, why it waits)."""
    reservations: list[Obj] = dataclasses.field(default_factory=list)
    node: Obj | None = None
    beneficiary: Obj | None = None
    """The PodGroup an eviction of this pod made room for."""
    beneficiary_pods: list[Obj] = dataclasses.field(default_factory=list)
    metrics: scrape.Metrics | scrape.Unread | None = None
    unread: list[str] = dataclasses.field(default_factory=list)


def _meta(obj: Obj | None) -> dict[str, Any]:
    meta = obj.get("metadata") if obj else None
    return meta if isinstance(meta, dict) else {}


def _annotation(obj: Obj | None, key: str) -> str | None:
    annotations = _meta(obj).get("annotations")
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) and value else None


def _spec(obj: Obj | None) -> dict[str, Any]:
    spec = obj.get("spec") if obj else None
    return spec if isinstance(spec, dict) else {}


class Reader:
    """Best-effort reads that note what failed."""

    def __init__(self, api: kubeapi.KubeApi, unread: list[str]) -> None:
        self.api = api
        self.unread = unread

    async def get(
        self, resource: kubeapi.Resource, what: str, *, name: str, namespace: str | None = None
    ) -> Obj | None:
        try:
            return await self.api.get(resource, name=name, namespace=namespace)
        except KubeError as exc:
            self.unread.append(f"{what}: {exc}")
            return None

    async def list(self, resource: kubeapi.Resource, what: str, **selectors: str | None) -> list[Obj]:
        try:
            return (await self.api.list(resource, **selectors)).items
        except KubeError as exc:
            self.unread.append(f"{what}: {exc}")
            return []


def group_of(pod: Obj) -> str | None:
    return _annotation(pod, names.POD_GROUP_ANNOTATION)


def _pick(members: list[Obj]) -> Obj | None:
    """The pod a PodGroup is explained through: a pending one if any (the group waits), else the first."""
    ordered = sorted(members, key=lambda pod: str(_meta(pod).get("name", "")))
    pending = [pod for pod in ordered if not _spec(pod).get("nodeName")]
    chosen = pending or ordered
    return chosen[0] if chosen else None


async def explain_inputs(
    api: kubeapi.KubeApi,
    target: Target,
    *,
    metrics: MetricsSource,
    get_text: Callable[[str], Awaitable[str]],
) -> ExplainInputs | Failure:
    """Everything ``explain`` needs about ``target``; a ``Failure`` when the target or the cluster cannot be read."""
    found = ExplainInputs(target=target)
    read = Reader(api, found.unread)
    try:
        if target.podgroup:
            found.podgroup = await api.get(kubeapi.POD_GROUPS, name=target.name, namespace=target.namespace)
            if found.podgroup is None:
                return Failure(message=f"podgroup {target.namespace}/{target.name} not found")
        else:
            found.pod = await api.get(kubeapi.PODS, name=target.name, namespace=target.namespace)
    except KubeError as exc:
        return Failure(message=f"cannot read {target.display}: {exc}")
    found.events = await read.list(
        kubeapi.EVENTS,
        f"events of {target.display}",
        namespace=target.namespace,
        field_selector=f"involvedObject.name={target.name}",
    )
    evicted = any(str(event.get("reason")) == "Evict" for event in found.events)
    if found.pod is None and not target.podgroup and not evicted:
        return Failure(message=f"pod {target.namespace}/{target.name} not found (and no eviction of it is recorded)")
    group_name = target.name if target.podgroup else (group_of(found.pod) if found.pod else None)
    if group_name is not None:
        if found.podgroup is None:
            found.podgroup = await read.get(
                kubeapi.POD_GROUPS,
                f"podgroup {target.namespace}/{group_name}",
                name=group_name,
                namespace=target.namespace,
            )
        pods = await read.list(kubeapi.PODS, f"pods in {target.namespace}", namespace=target.namespace)
        found.members = [pod for pod in pods if group_of(pod) == group_name]
    if target.podgroup:
        found.pod = _pick(found.members)
        if found.pod is not None:
            name = str(_meta(found.pod).get("name", ""))
            found.events = await read.list(
                kubeapi.EVENTS,
                f"events of {target.namespace}/{name}",
                namespace=target.namespace,
                field_selector=f"involvedObject.name={name}",
            )
    found.queues = await read.list(kubeapi.QUEUES, "queues")
    node = _spec(found.pod).get("nodeName") if found.pod else None
    if isinstance(node, str) and node:
        found.node = await read.get(kubeapi.NODES, f"node {node}", name=node)
        groups = _annotation(found.pod, names.GPU_GROUPS_ANNOTATION)
        if groups:
            wanted = set(groups.split(","))
            pods = await read.list(
                kubeapi.PODS,
                f"reservation pods in {names.RESERVATION_NAMESPACE}",
                namespace=names.RESERVATION_NAMESPACE,
                label_selector=f"{names.COMPONENT_LABEL}={names.RESERVATION_COMPONENT}",
            )
            found.reservations = [pod for pod in pods if _annotation(pod, names.RESERVATION_GROUP_ANNOTATION) in wanted]
        if metrics.enabled:
            found.metrics = await read_metrics(api, metrics, get_text)
    await _beneficiary(read, found)
    return found


async def _beneficiary(read: Reader, found: ExplainInputs) -> None:
    """For an evicted pod: the PodGroup the eviction made room for (from the ``Evict`` event), and its pods."""
    evicts = [facts.event(event) for event in found.events if str(event.get("reason")) == "Evict"]
    if not evicts:
        return
    latest = max(evicts, key=lambda event: event.at_ns or 0)
    made_for = facts.evicted_for(latest.message)
    if made_for is None:
        return
    found.beneficiary = await read.get(
        kubeapi.POD_GROUPS,
        f"podgroup {made_for.namespace}/{made_for.group}",
        name=made_for.group,
        namespace=made_for.namespace,
    )
    pods = await read.list(kubeapi.PODS, f"pods in {made_for.namespace}", namespace=made_for.namespace)
    found.beneficiary_pods = [pod for pod in pods if group_of(pod) == made_for.group]


async def read_metrics(
    api: kubeapi.KubeApi, source: MetricsSource, get_text: Callable[[str], Awaitable[str]]
) -> scrape.Metrics | scrape.Unread:
    if source.url is not None:
        return await scrape.from_url(source.url)
    return await scrape.from_leader(api, get_text, namespace=source.lease_namespace, lease=source.lease_name)


@dataclasses.dataclass(slots=True, kw_only=True)
class ClusterInputs:
    """What ``queues`` and ``top`` read: every Queue, PodGroup, node and bound pod, and the metrics."""

    queues: list[Obj] = dataclasses.field(default_factory=list)
    nodes: list[Obj] = dataclasses.field(default_factory=list)
    pods: list[Obj] = dataclasses.field(default_factory=list)
    metrics: scrape.Metrics | scrape.Unread | None = None
    unread: list[str] = dataclasses.field(default_factory=list)


async def queue_inputs(api: kubeapi.KubeApi) -> ClusterInputs | Failure:
    try:
        return ClusterInputs(queues=(await api.list(kubeapi.QUEUES)).items)
    except KubeError as exc:
        return Failure(message=f"cannot read queues: {exc}")


async def top_inputs(
    api: kubeapi.KubeApi, *, metrics: MetricsSource, get_text: Callable[[str], Awaitable[str]]
) -> ClusterInputs | Failure:
    try:
        nodes = (await api.list(kubeapi.NODES)).items
    except KubeError as exc:
        return Failure(message=f"cannot read nodes: {exc}")
    found = ClusterInputs(nodes=nodes)
    read = Reader(api, found.unread)
    found.pods = await read.list(kubeapi.PODS, "pods", field_selector="status.phase=Running")
    if metrics.enabled:
        found.metrics = await read_metrics(api, metrics, get_text)
    return found

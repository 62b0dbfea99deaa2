"""Carrying out a plan: record the devices on each pod, bind it, evict victims; idempotent, bounded, retried.

The cycle *assumes* every placement in the cluster state before the binder starts (so the next cycle sees the room
taken). For each placement the binder then binds the pod through ``pods/binding`` with what the engine chose as the
Binding's annotations (``quotient.dev/gpu-devices``, and for a share ``quotient.dev/gpu-share`` and
``quotient.dev/gpu-groups``), which the API server writes onto the pod in the same write as ``spec.nodeName``: a
scheduler restarted at any moment rebuilds the devices of every bound pod from the API, and a pod costs one API call.
A shared pod also needs the ``runai-gpu-group`` label KAI users inspect; labels cannot ride on a Binding, so it is
patched (with the annotations) just before. Outcomes:

- bound (201): done; the watch event replaces the assumption.
- already assigned (409): the pod was bound meanwhile (by a previous leader, or a retry whose answer was lost);
  re-read it: bound where we meant is success, anywhere else drops the assumption.
- gone (404): drop the assumption.
- API unavailable (5xx, timeouts): retry with capped jittered backoff, then give up and drop the assumption, so the
  pod is placed afresh by a later cycle.

At most ``concurrency`` API calls are in flight at once. Each outcome is reported to a callback (the app turns it
into state changes, events, metrics and a ``Decision`` message).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence

from common import logs
from common.backoff import Backoff
from scheduler.kube import client
from scheduler.kube.errors import KubeError, KubeNotFound, KubeUnavailable
from scheduler.placement import decisions
from scheduler.state import objects

log = logs.get("scheduler.binding")

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class Outcome(enum.StrEnum):
    BOUND = "bound"
    GONE = "gone"
    LOST = "lost"
    """Bound elsewhere meanwhile, or bound by someone else: our placement did not happen."""
    FAILED = "failed"
    """The API kept failing; the pod is pending again."""
    EVICTED = "evicted"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    pod: PodRef
    outcome: Outcome
    node: str | None
    message: str
    attempts: int = 1


ReportSink = Callable[[Report], Awaitable[None]]


def label_safe_group(group: str) -> str:
    """A GPU group id usable as the value of the ``runai-gpu-group`` label (at most 63 characters of
    ``[A-Za-z0-9._-]``, starting and ending alphanumeric): kept when it already is one, else a stable digest."""
    if len(group) <= 63 and _LABEL_VALUE.match(group):
        return group
    return "gpu-group-" + hashlib.sha256(group.encode()).hexdigest()[:24]


def placement_annotations(
    placement: decisions.Placement, gpu_groups: Sequence[str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What the binder records on the pod: its devices, its share and GPU groups, and ``extra`` (``pod-group-name``)."""
    annotations = dict(extra or {})
    if placement.devices:
        annotations[objects.GPU_DEVICES_ANNOTATION] = ",".join(str(index) for index in placement.devices)
    if placement.share_milli:
        annotations[objects.GPU_SHARE_ANNOTATION] = str(placement.share_milli[0])
        if gpu_groups:
            annotations[objects.GPU_GROUPS_ANNOTATION] = ",".join(gpu_groups)
    return annotations


def placement_labels(placement: decisions.Placement, gpu_groups: Sequence[str]) -> dict[str, str]:
    """The ``runai-gpu-group`` label of a shared pod (KAI users select and inspect it); none for other pods."""
    if placement.share_milli and gpu_groups:
        return {objects.GPU_GROUP_LABEL: gpu_groups[0]}
    return {}


class Binder:
    """Executes placements and evictions against the API with bounded concurrency."""

    def __init__(
        self,
        api: client.KubeApi,
        *,
        report: ReportSink,
        concurrency: int = 32,
        backoff: Backoff | None = None,
        max_attempts: int = 6,
    ) -> None:
        self._api = api
        self._report = report
        self._slots = asyncio.Semaphore(concurrency)
        self._backoff = backoff or Backoff(base_s=0.05, cap_s=2.0)
        self._max_attempts = max_attempts
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def submit_bind(
        self,
        pod: PodRef,
        placement: decisions.Placement,
        gpu_groups: Sequence[str],
        extra_annotations: Mapping[str, str] | None = None,
    ) -> None:
        self._spawn(self._bind(pod, placement, gpu_groups, extra_annotations))

    def submit_evict(self, pod: PodRef, eviction: decisions.Eviction) -> None:
        self._spawn(self._evict(pod, eviction))

    def submit_nomination(self, pod: PodRef, node: str | None) -> None:
        """Record where the room an eviction makes is meant to go (``status.nominatedNodeName``, as kube-scheduler
        does), so the next cycles, of this leader or the next, place that group there first."""
        self._spawn(self._nominate(pod, node))

    async def _nominate(self, pod: PodRef, node: str | None) -> None:
        try:
            async with self._slots:
                await self._api.patch(
                    client.PODS,
                    {"status": {"nominatedNodeName": node}},
                    name=pod.name,
                    namespace=pod.namespace,
                    subresource="status",
                )
        except KubeError as exc:
            log.warning("nomination_failed", pod=f"{pod.namespace}/{pod.name}", error=str(exc))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every submitted call to finish (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Report]], pod: PodRef) -> Report:
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._slots:
                    report = await call()
                return dataclasses.replace(report, attempts=attempt)
            except KubeUnavailable as exc:
                if attempt >= self._max_attempts:
                    return Report(
                        pod=pod,
                        outcome=Outcome.FAILED,
                        node=None,
                        message=f"{what} failed {attempt} times, last: {exc}",
                        attempts=attempt,
                    )
                delay = self._backoff.delay_s(attempt - 1)
                log.warning("api_retry", what=what, pod=f"{pod.namespace}/{pod.name}", attempt=attempt, error=str(exc))
                await asyncio.sleep(delay)
            except KubeError as exc:
                return Report(pod=pod, outcome=Outcome.FAILED, node=None, message=f"{what}: {exc}", attempts=attempt)

    async def _bind(
        self,
        pod: PodRef,
        placement: decisions.Placement,
        gpu_groups: Sequence[str],
        extra_annotations: Mapping[str, str] | None,
    ) -> None:
        node = str(placement.node)
        annotations = placement_annotations(placement, gpu_groups, extra_annotations)
        labels = placement_labels(placement, gpu_groups)

        async def once() -> Report:
            if labels:
                # Labels cannot ride on a Binding; the annotations go with them so the pod is complete before the bind.
                try:
                    await self._api.patch(
                        client.PODS,
                        {"metadata": {"labels": labels, "annotations": annotations}},
                        name=pod.name,
                        namespace=pod.namespace,
                    )
                except KubeNotFound:
                    return Report(pod=pod, outcome=Outcome.GONE, node=None, message="the pod was deleted")
            result = await self._api.bind_pod(
                namespace=pod.namespace, name=pod.name, node=node, uid=pod.uid, annotations=annotations
            )
            if result.outcome is client.BindOutcome.BOUND:
                return Report(pod=pod, outcome=Outcome.BOUND, node=node, message=f"bound to {node}")
            if result.outcome is client.BindOutcome.POD_GONE:
                return Report(pod=pod, outcome=Outcome.GONE, node=None, message="the pod was deleted")
            current = await self._api.get(client.PODS, name=pod.name, namespace=pod.namespace)
            bound_to = ((current or {}).get("spec") or {}).get("nodeName")
            if bound_to == node and ((current or {}).get("metadata") or {}).get("uid") == pod.uid:
                return Report(pod=pod, outcome=Outcome.BOUND, node=node, message=f"already bound to {node}")
            return Report(
                pod=pod,
                outcome=Outcome.LOST,
                node=str(bound_to) if bound_to else None,
                message=f"not bound to {node}: {result.message or 'the pod changed'}",
            )

        report = await self._retrying("bind", once, pod)
        await self._deliver(report)

    async def _evict(self, pod: PodRef, eviction: decisions.Eviction) -> None:
        async def once() -> Report:
            result = await self._api.evict_pod(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                reason=_DISRUPTION_REASONS.get(eviction.reason, "PreemptionByScheduler"),
                message=eviction.message,
            )
            if result.outcome is client.EvictOutcome.POD_GONE:
                return Report(pod=pod, outcome=Outcome.GONE, node=str(eviction.node), message="already gone")
            return Report(pod=pod, outcome=Outcome.EVICTED, node=str(eviction.node), message=eviction.message)

        report = await self._retrying("evict", once, pod)
        await self._deliver(report)

    async def _deliver(self, report: Report) -> None:
        try:
            await self._report(report)
        except Exception:  # one bad callback must not lose the other reports
            log.exception("binding_report_failed", pod=f"{report.pod.namespace}/{report.pod.name}")


# The DisruptionTarget condition's reasons Kubernetes defines (k8s.io/api/core/v1: PodReasonPreemptionByScheduler, ...).
_DISRUPTION_REASONS: dict[decisions.EvictionReason, str] = {
    decisions.EvictionReason.RECLAIM: "PreemptionByScheduler",
    decisions.EvictionReason.PREEMPT: "PreemptionByScheduler",
    decisions.EvictionReason.CONSOLIDATE: "PreemptionByScheduler",
    decisions.EvictionReason.STALE_GANG: "TerminationByScheduler",
}

"""Carrying out a plan: record the devices on each pod, bind it, evict victims; idempotent, bounded, retried.

The cycle *assumes* every placement in the cluster state before the binder starts (so the next cycle sees the room
taken). For each placement the binder then binds the pod through ``pods/binding`` with what the engine chose as the
Binding's annotations (``quotient.dev/gpu-devices``, and for a share ``quotient.dev/gpu-share`` and
``quotient.dev/gpu-groups``), which the API server writes onto the pod in the same write as ``spec.nodeName``: a
scheduler restarted at any moment rebuilds the devices of every bound pod from the API, and a pod costs one API call.
A shared pod also needs the ``runai-gpu-group`` label KAI users inspect; labels cannot ride on a Binding, so it is
patched (with the annotations) just before.

A share needs its device held first: for each of its GPU groups the binder asks the ``ReservationManager`` for the
group's reservation pod (created when this placement opens the group) and waits for the device UUID it reports.
Then it writes the pod's ConfigMap (named by the webhook in ``quotient.dev/gpu-configmap``; owned by the pod, so it
goes with it) with ``NVIDIA_VISIBLE_DEVICES`` (the UUIDs) and ``GPU_PORTION``, and records the UUIDs on the pod
(``quotient.dev/gpu-uuids``). A reservation that never reports its UUID ends the bind as ``not-reserved``: the
assumption is dropped and the pod placed afresh. Outcomes:

- bound (201): done; the watch event replaces the assumption.
- already assigned (409): the pod was bound meanwhile (by a previous leader, or a retry whose answer was lost);
  re-read it: bound where we meant is success, anywhere else drops the assumption.
- gone (404): drop the assumption.
- not reserved: the GPU group's reservation failed (no UUID in time, the pod failed, the API refused it).
- API unavailable (5xx, timeouts): retry with capped jittered backoff, then give up and drop the assumption, so the
  pod is placed afresh by a later cycle.

Evictions are a ``DisruptionTarget`` condition and a delete. The dispatcher also has the binder stamp a PodGroup
whose pods were evicted to make room with KAI's ``kai.scheduler/last-eviction-timestamp`` (a merge patch of its
annotations), which re-arms the group's preemption delay.

At most ``concurrency`` API calls are in flight at once. Each outcome is reported to a callback (the app turns it
into state changes, events, metrics and a ``Decision`` message).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from common import logs, names, retrying, tasks
from common.backoff import Backoff
from scheduler.kube import kubeapi, reservations
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeNotFound, KubeUnavailable
from scheduler.placement import decisions

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
    NOT_RESERVED = "not-reserved"
    """The device of a share could not be held (its reservation pod failed or never reported its UUID)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    namespace: str
    name: str
    uid: str


class Operation(enum.StrEnum):
    BIND = "bind"
    EVICT = "evict"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    pod: PodRef
    outcome: Outcome
    node: str | None
    message: str
    attempts: int = 1
    reason: str = ""
    """For ``not-reserved``: the reservation's reason code (``ReservationTimeout``, ...)."""
    operation: Operation = Operation.BIND


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
        annotations[names.GPU_DEVICES_ANNOTATION] = ",".join(str(index) for index in placement.devices)
    if placement.share_milli:
        annotations[names.GPU_SHARE_ANNOTATION] = str(placement.share_milli[0])
        if gpu_groups:
            annotations[names.GPU_GROUPS_ANNOTATION] = ",".join(gpu_groups)
    return annotations


def portion_text(share_milli: int) -> str:
    """A share as the decimal fraction KAI's ``GPU_PORTION`` carries: 500 -> ``0.5``, 1000 -> ``1``."""
    whole, milli = divmod(share_milli, 1000)
    return f"{whole}.{milli:03d}".rstrip("0").rstrip(".") if milli else str(whole)


def configmap_body(*, name: str, pod: PodRef, uuids: Sequence[str], share_milli: int) -> dict[str, object]:
    """The pod's GPU ConfigMap: what its container's ``NVIDIA_VISIBLE_DEVICES`` and ``GPU_PORTION`` resolve to.
    Owned by the pod, so garbage collection deletes it with the pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": pod.namespace,
            "labels": {names.MANAGED_BY_LABEL: names.PRODUCT},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "data": {names.VISIBLE_DEVICES_ENV: ",".join(uuids), names.GPU_PORTION_ENV: portion_text(share_milli)},
    }


def placement_labels(placement: decisions.Placement, gpu_groups: Sequence[str]) -> dict[str, str]:
    """The ``runai-gpu-group`` label of a shared pod (KAI users select and inspect it); none for other pods."""
    if placement.share_milli and gpu_groups:
        return {names.GPU_GROUP_LABEL: gpu_groups[0]}
    return {}


class Binder:
    """Executes placements and evictions against the API with bounded concurrency."""

    def __init__(
        self,
        api: kubeapi.KubeApi,
        *,
        report: ReportSink,
        concurrency: int = 32,
        backoff: Backoff | None = None,
        max_attempts: int = 6,
        reservations: reservations.ReservationManager | None = None,
        on_failure: tasks.OnFailure | None = None,
    ) -> None:
        self._api = api
        self._reservations = reservations
        self._report = report
        self._slots = asyncio.Semaphore(concurrency)
        self._backoff = backoff or Backoff(base_s=0.05, cap_s=2.0)
        self._max_attempts = max_attempts
        self._tasks = tasks.TaskSet("binder", on_failure=on_failure)

    def submit_bind(
        self,
        pod: PodRef,
        placement: decisions.Placement,
        gpu_groups: Sequence[str],
        extra_annotations: Mapping[str, str] | None = None,
        configmap: str | None = None,
    ) -> None:
        """Bind ``pod`` as placed; a share is first given its devices (reservation pods) and its ConfigMap
        ``configmap`` (the name the webhook chose; None when the pod was admitted without the webhook)."""
        self._spawn(self._bind(pod, placement, gpu_groups, extra_annotations, configmap))

    def submit_evict(self, pod: PodRef, *, node: str, disruption: str, message: str) -> None:
        """Evict ``pod``: a ``DisruptionTarget`` condition with reason ``disruption`` (Kubernetes' own reasons,
        ``PreemptionByScheduler`` or ``TerminationByScheduler``) and ``message``, then the delete."""
        self._spawn(self._evict(pod, node=node, disruption=disruption, message=message))

    def submit_podgroup_annotations(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Write ``annotations`` on a PodGroup (KAI's ``kai.scheduler/last-eviction-timestamp``, once pods of the
        group were evicted to make room): a PodGroup that is gone is left alone; an API that keeps failing is logged
        (the next eviction of the group writes it again)."""
        self._spawn(self._annotate_podgroup(namespace, name, dict(annotations)))

    async def _annotate_podgroup(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        async def once() -> None:
            async with self._slots:
                await self._api.patch(
                    kubeapi.POD_GROUPS, {"metadata": {"annotations": annotations}}, name=name, namespace=namespace
                )

        try:
            await retrying.retry(once, backoff=self._backoff, retry_on=KubeUnavailable, attempts=self._max_attempts)
        except KubeNotFound:
            return
        except KubeError as exc:
            log.warning("podgroup_annotation_failed", podgroup=f"{namespace}/{name}", error=str(exc))

    def submit_nomination(self, pod: PodRef, node: str | None) -> None:
        """Record where the room an eviction makes is meant to go (``status.nominatedNodeName``, as kube-scheduler
        does), so the next cycles, of this leader or the next, place that group there first."""
        self._spawn(self._nominate(pod, node))

    async def _nominate(self, pod: PodRef, node: str | None) -> None:
        try:
            async with self._slots:
                await self._api.patch(
                    kubeapi.PODS,
                    {"status": {"nominatedNodeName": node}},
                    name=pod.name,
                    namespace=pod.namespace,
                    subresource="status",
                )
        except KubeError as exc:
            log.warning("nomination_failed", pod=f"{pod.namespace}/{pod.name}", error=str(exc))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(work, name="binding")

    async def drain(self) -> None:
        """Wait for every submitted call to finish (tests, shutdown)."""
        await self._tasks.drain()

    async def cancel(self) -> None:
        await self._tasks.cancel()

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Report]], pod: PodRef) -> Report:
        """``call`` with a slot, retried while the API is unavailable; a failure that retrying cannot fix (or the
        last one) becomes a ``failed`` report."""
        attempts = 0

        async def once() -> Report:
            nonlocal attempts
            attempts += 1
            async with self._slots:
                return await call()

        def retried(attempt: int, exc: BaseException, delay_s: float) -> None:
            log.warning("api_retry", what=what, pod=f"{pod.namespace}/{pod.name}", attempt=attempt, error=str(exc))

        try:
            report = await retrying.retry(
                once,
                backoff=self._backoff,
                retry_on=KubeUnavailable,
                attempts=self._max_attempts,
                on_retry=retried,
            )
        except KubeUnavailable as exc:
            message = f"{what} failed {attempts} times, last: {exc}"
            return Report(pod=pod, outcome=Outcome.FAILED, node=None, message=message, attempts=attempts)
        except KubeError as exc:
            return Report(pod=pod, outcome=Outcome.FAILED, node=None, message=f"{what}: {exc}", attempts=attempts)
        return dataclasses.replace(report, attempts=attempts)

    async def _bind(
        self,
        pod: PodRef,
        placement: decisions.Placement,
        gpu_groups: Sequence[str],
        extra_annotations: Mapping[str, str] | None,
        configmap: str | None = None,
    ) -> None:
        shared = bool(placement.share_milli) and bool(gpu_groups) and self._reservations is not None
        if not shared:
            await self._bind_once_reserved(pod, placement, gpu_groups, extra_annotations, configmap, ())
            return
        assert self._reservations is not None
        for group in gpu_groups:
            self._reservations.hold(group)
        try:
            uuids: list[str] = []
            for group in gpu_groups:
                held = await self._reservations.reserve(group, str(placement.node))
                if isinstance(held, reservations.NotReserved):
                    await self._deliver(
                        Report(
                            pod=pod,
                            outcome=Outcome.NOT_RESERVED,
                            node=str(placement.node),
                            message=held.message,
                            reason=held.reason,
                        )
                    )
                    return
                uuids.append(held.uuid)
            await self._bind_once_reserved(pod, placement, gpu_groups, extra_annotations, configmap, tuple(uuids))
        finally:
            for group in gpu_groups:
                self._reservations.release(group)

    async def _write_configmap(self, name: str, body: Mapping[str, object], pod: PodRef) -> None:
        try:
            await self._api.create(kubeapi.CONFIG_MAPS, body, namespace=pod.namespace)
        except KubeAlreadyExists:
            await self._api.patch(kubeapi.CONFIG_MAPS, {"data": body["data"]}, name=name, namespace=pod.namespace)

    async def _bind_once_reserved(
        self,
        pod: PodRef,
        placement: decisions.Placement,
        gpu_groups: Sequence[str],
        extra_annotations: Mapping[str, str] | None,
        configmap: str | None,
        uuids: Sequence[str],
    ) -> None:
        node = str(placement.node)
        annotations = placement_annotations(placement, gpu_groups, extra_annotations)
        if uuids:
            annotations[names.GPU_UUIDS_ANNOTATION] = ",".join(uuids)
        labels = placement_labels(placement, gpu_groups)

        async def once() -> Report:
            if configmap and uuids:
                body = configmap_body(name=configmap, pod=pod, uuids=uuids, share_milli=placement.share_milli[0])
                await self._write_configmap(configmap, body, pod)
            if labels:
                # Labels cannot ride on a Binding; the annotations go with them so the pod is complete before the bind.
                try:
                    await self._api.patch(
                        kubeapi.PODS,
                        {"metadata": {"labels": labels, "annotations": annotations}},
                        name=pod.name,
                        namespace=pod.namespace,
                    )
                except KubeNotFound:
                    return Report(pod=pod, outcome=Outcome.GONE, node=None, message="the pod was deleted")
            result = await self._api.bind_pod(
                namespace=pod.namespace, name=pod.name, node=node, uid=pod.uid, annotations=annotations
            )
            if result.outcome is kubeapi.BindOutcome.BOUND:
                return Report(pod=pod, outcome=Outcome.BOUND, node=node, message=f"bound to {node}")
            if result.outcome is kubeapi.BindOutcome.POD_GONE:
                return Report(pod=pod, outcome=Outcome.GONE, node=None, message="the pod was deleted")
            current = await self._api.get(kubeapi.PODS, name=pod.name, namespace=pod.namespace)
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

    async def _evict(self, pod: PodRef, *, node: str, disruption: str, message: str) -> None:
        async def once() -> Report:
            result = await self._api.evict_pod(
                namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=disruption, message=message
            )
            if result.outcome is kubeapi.EvictOutcome.POD_GONE:
                return Report(pod=pod, outcome=Outcome.GONE, node=node, message="already gone")
            return Report(pod=pod, outcome=Outcome.EVICTED, node=node, message=message)

        report = await self._retrying("evict", once, pod)
        await self._deliver(dataclasses.replace(report, operation=Operation.EVICT))

    async def _deliver(self, report: Report) -> None:
        try:
            await self._report(report)
        except Exception:  # one bad callback must not lose the other reports
            log.exception("binding_report_failed", pod=f"{report.pod.namespace}/{report.pod.name}")

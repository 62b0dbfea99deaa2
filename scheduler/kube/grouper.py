"""Give every pod of ours a PodGroup: read its owners, decide (``grouping.decide``), create the group, annotate.

A pod (or any owner of it) with KAI's ``kai.scheduler/skip-podgrouper: "true"`` is left alone: its user made its
PodGroup and names it in ``pod-group-name``. The workload's ``kai.scheduler/preemption-delay`` and
``kai.scheduler/staleness-grace-period`` go into the spec of the PodGroup made for it, as KAI's grouper does. A
JobSet's PodGroup carries KAI's subgroup tree (``minSubGroup`` and ``subGroups``, no ``minMember``), and each of its
pods gets its leaf in the ``kai.scheduler/subgroup-name`` label together with ``pod-group-name``, in one patch at
once: a pod counts in a tree only through its leaf, so it joins the group when the watch brings it back labelled
(joined before, it would be a pending pod of no leaf). A JobSet whose PodGroup was made flat before (by an older
Quotient, as KAI's grouper before v0.16) keeps it: the PodGroup exists, and a tree-less group reads no leaf.

Runs beside the cycle: a new pod without a usable ``pod-group-name`` is queued here; once its PodGroup exists and the
annotation is written, the watch brings the pod back with the annotation and it joins its group in the next
snapshot. Owners are read through the API with a small cache (a Deployment's pods share the same owners). A 403 or
404 on an owner, an unknown kind, or a broken API call never leaves the pod pending: ``grouping.decide`` gives it a
group of its own, and an event says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from common import logs, names, tasks
from common.backoff import Backoff
from scheduler.kube import events, kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeForbidden, KubeNotFound
from scheduler.objects import durations, grouping, pods
from scheduler.objects.records import OwnerRef, PodRecord

log = logs.get("scheduler.grouper")

Obj = dict[str, Any]
GroupedSink = Callable[[str, str], None]
"""(pod uid, PodGroup name): the pod's group exists now."""
StillUnannotated = Callable[[str], bool]
"""Does the pod (uid) still lack its ``pod-group-name`` annotation (neither bound with it nor patched)?"""

# Most pods are bound within a cycle or two, and the binder writes ``pod-group-name`` onto the pod with the bind
# itself (as a Binding annotation). Only a pod still waiting after this long gets the annotation by a patch of its own,
# which saves one API write per pod in the common case.
ANNOTATE_PENDING_AFTER_S = 3.0

_MAX_OWNER_DEPTH = 8
_OWNER_CACHE_TTL_S = 30.0
_RETRY = Backoff(base_s=0.5, cap_s=30.0)
"""Between attempts to group a pod whose PodGroup or annotation the API refused."""


def _minimums(decision: grouping.Grouping) -> Obj:
    """The PodGroup's minimums as KAI's grouper writes them: ``minSubGroup`` and the tree, or ``minMember``."""
    if not decision.subgroups:
        return {"minMember": decision.min_member}
    entries: list[Obj] = []
    for sub in decision.subgroups:
        entry: Obj = {"name": sub.name}
        if sub.parent is not None:
            entry["parent"] = sub.parent
        if sub.min_subgroup is not None:
            entry["minSubGroup"] = sub.min_subgroup
        else:
            entry["minMember"] = sub.min_member or 0
        entries.append(entry)
    minimums: Obj = {"subGroups": entries}
    if decision.min_subgroup is not None:
        minimums["minSubGroup"] = decision.min_subgroup
    return minimums


def _controller(refs: Sequence[OwnerRef]) -> OwnerRef | None:
    """The controlling owner reference (the first one when none is marked controller)."""
    controllers = [ref for ref in refs if ref.controller]
    chosen = controllers or list(refs)
    return chosen[0] if chosen else None


class Grouper:
    def __init__(
        self,
        api: kubeapi.KubeApi,
        *,
        queue_label: str = names.QUEUE_LABEL,
        recorder: events.EventSink | None = None,
        on_grouped: GroupedSink | None = None,
        still_unannotated: StillUnannotated | None = None,
        still_present: Callable[[str], bool] | None = None,
        concurrency: int = 64,
        annotate_after_s: float = ANNOTATE_PENDING_AFTER_S,
        on_failure: tasks.OnFailure | None = None,
    ) -> None:
        self._api = api
        self._on_grouped = on_grouped
        self._still_unannotated = still_unannotated
        self._still_present = still_present
        self._annotate_after_s = annotate_after_s
        self._queue_label = queue_label
        self._recorder = recorder
        self._slots = asyncio.Semaphore(concurrency)
        self._owners: dict[tuple[str, str, str], tuple[float, Obj | None]] = {}
        self._in_progress: set[str] = set()
        self._tasks = tasks.TaskSet("grouper", on_failure=on_failure)

    def submit(self, pod: PodRecord) -> None:
        if pod.uid in self._in_progress:
            return
        self._in_progress.add(pod.uid)
        self._tasks.spawn(self._group(pod), name=f"group:{pod.display}")

    async def drain(self) -> None:
        await self._tasks.drain()

    async def cancel(self) -> None:
        await self._tasks.cancel()

    async def _owner(self, namespace: str, ref: OwnerRef) -> Obj | grouping.OwnerProblem | None:
        key = (ref.api_version, ref.kind, f"{namespace}/{ref.name}")
        cached = self._owners.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _OWNER_CACHE_TTL_S:
            return cached[1]
        try:
            resource = await self._api.resolve(api_version=ref.api_version, kind=ref.kind)
            if resource is None:
                # A kind the API does not serve: keep its reference, so decide() can name it in the event.
                owner: Obj | None = {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": {"name": ref.name}}
            else:
                name_space = namespace if resource.namespaced else None
                owner = await self._api.get(resource, name=ref.name, namespace=name_space)
        except KubeForbidden as exc:
            return grouping.OwnerProblem(kind=ref.kind, name=ref.name, problem="forbidden", message=str(exc))
        except KubeError as exc:
            return grouping.OwnerProblem(kind=ref.kind, name=ref.name, problem="unreadable", message=str(exc))
        if owner is None:
            return grouping.OwnerProblem(kind=ref.kind, name=ref.name, problem="missing", message="404 not found")
        self._owners[key] = (now, owner)
        return owner

    async def owners(self, pod: PodRecord) -> list[Obj] | grouping.OwnerProblem:
        """The pod's chain of controller owners, from the nearest to the top."""
        chain: list[Obj] = []
        refs: Sequence[OwnerRef] = pod.owners
        for _ in range(_MAX_OWNER_DEPTH):
            ref = _controller(refs)
            if ref is None:
                break
            owner = await self._owner(pod.namespace, ref)
            if isinstance(owner, grouping.OwnerProblem):
                return owner
            if owner is None:
                break
            chain.append(owner)
            refs = pods.owners_of(owner)
        return chain

    async def _group(self, pod: PodRecord) -> None:
        """Group the pod; an API error is retried (with a growing wait) while the pod exists, and said once on the
        pod as a ``GroupingFailed`` Event: nothing else would offer the pod again, and it would wait with no reason."""
        failures = 0
        try:
            while True:
                try:
                    async with self._slots:
                        name = await self._group_one(pod)
                    if name is not None:
                        await self._annotate(pod, name)
                    if failures:
                        log.info("grouping_recovered", pod=pod.display, failures=failures)
                    return
                except KubeError as exc:
                    failures += 1
                    delay_s = _RETRY.delay_s(failures - 1)
                    log.warning("grouping_failed", pod=pod.display, error=str(exc), retry_in_s=round(delay_s, 2))
                    if failures == 1 and self._recorder is not None:
                        self._recorder.record(
                            events.ObjectRef.of_record(pod),
                            type=events.EventType.WARNING,
                            reason="GroupingFailed",
                            message=f"the pod's PodGroup could not be made ({exc}); retrying",
                        )
                await asyncio.sleep(delay_s)
                if self._still_present is not None and not self._still_present(pod.uid):
                    return
        finally:
            self._in_progress.discard(pod.uid)

    async def _group_one(self, pod: PodRecord) -> str | None:
        """Make sure the pod's PodGroup exists; the name to annotate the pod with (None: it has the annotation, or
        it opted out of grouping)."""
        if grouping.skips_grouper(pod):  # KAI reads the pod's own annotation before it reads any owner
            self._skipped(pod, f"pod {pod.name}")
            return None
        owners = await self.owners(pod)
        skipping = [] if isinstance(owners, grouping.OwnerProblem) else [o for o in owners if grouping.skips_grouper(o)]
        if skipping:
            self._skipped(pod, f"{skipping[0].get('kind')}/{(skipping[0].get('metadata') or {}).get('name')}")
            return None
        decision = grouping.decide(pod, owners, queue_label=self._queue_label)
        name = pod.pod_group or decision.group_name
        body: Obj = {
            "apiVersion": kubeapi.POD_GROUPS.api_version,
            "kind": "PodGroup",
            "metadata": {
                "name": name,
                "namespace": pod.namespace,
                "labels": {self._queue_label: decision.queue},
            },
            "spec": {"queue": decision.queue, "priorityClassName": decision.priority_class, **_minimums(decision)},
        }
        if decision.preemptible is not None:
            body["spec"]["preemptibility"] = names.PREEMPTIBLE if decision.preemptible else names.NON_PREEMPTIBLE
        # KAI's grouper copies the workload's annotations into the spec; the scheduler reads only the spec.
        if decision.preemption_delay_ns is not None:
            body["spec"]["preemptionDelay"] = durations.format_ns(decision.preemption_delay_ns)
        if decision.staleness_grace_ns is not None:
            body["spec"]["stalenessGracePeriod"] = durations.format_ns(decision.staleness_grace_ns)
        per_pod = name == grouping.group_name(pod.name, pod.uid)
        owner = decision.owner
        if per_pod or owner is None:
            # A group of one pod lives and dies with the pod (the garbage collector deletes it after the pod).
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
            ]
        elif owner.get("uid") and owner.get("apiVersion") != "vcluster.loft.sh/tenant":
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"], "uid": owner["uid"]}
            ]
        try:
            await self._api.create(kubeapi.POD_GROUPS, body, namespace=pod.namespace)
            log.info(
                "podgroup_created",
                podgroup=f"{pod.namespace}/{name}",
                queue=decision.queue,
                min_member=decision.min_member,
                subgroups=len(decision.subgroups),
            )
        except KubeAlreadyExists:
            pass
        if decision.note and self._recorder is not None:
            self._recorder.record(
                events.ObjectRef.of_record(pod), type=events.EventType.NORMAL, reason="OwnGroup", message=decision.note
            )
        for warning in decision.warnings:
            log.warning("grouping_annotation_ignored", pod=pod.display, message=warning)
            if self._recorder is not None:
                self._recorder.record(
                    events.ObjectRef.of_record(pod),
                    type=events.EventType.WARNING,
                    reason="IgnoredAnnotation",
                    message=warning,
                )
        return await self._labelled(pod, name, decision)

    async def _labelled(self, pod: PodRecord, name: str, decision: grouping.Grouping) -> str | None:
        """For a pod of a subgroup tree: write its leaf and PodGroup on it now (see the module's docstring); None:
        nothing left to annotate."""
        leaf = decision.subgroup
        if leaf is None:
            return None if pod.pod_group else name
        if pod.labels.get(names.SUBGROUP_LABEL) == leaf and pod.pod_group:
            return None
        metadata: Obj = {"labels": {names.SUBGROUP_LABEL: leaf}}
        if not pod.pod_group:
            metadata["annotations"] = {names.POD_GROUP_ANNOTATION: name}
        try:
            await self._api.patch(kubeapi.PODS, {"metadata": metadata}, name=pod.name, namespace=pod.namespace)
        except KubeNotFound:
            return None
        log.debug("pod_subgroup_labelled", pod=pod.display, podgroup=name, subgroup=leaf)
        return None

    def _skipped(self, pod: PodRecord, where: str) -> None:
        """KAI's ``kai.scheduler/skip-podgrouper: "true"``: no PodGroup is made and the pod is not annotated; it joins
        the PodGroup its ``pod-group-name`` names once that exists. Without one it cannot be scheduled: say so."""
        if pod.pod_group:
            log.debug("grouping_skipped", pod=pod.display, podgroup=pod.pod_group, opted_out_on=where)
            return
        message = (
            f'{names.SKIP_PODGROUPER_ANNOTATION} is "true" on {where}, so no PodGroup is made for the pod, but it '
            f"names none in {names.POD_GROUP_ANNOTATION}: it waits until it does"
        )
        log.warning("grouping_skipped_without_podgroup", pod=pod.display, opted_out_on=where)
        if self._recorder is not None:
            self._recorder.record(
                events.ObjectRef.of_record(pod), type=events.EventType.WARNING, reason="NoPodGroup", message=message
            )

    async def _annotate(self, pod: PodRecord, name: str) -> None:
        """Write ``pod-group-name`` unless the binder did so first, with the bind (see ANNOTATE_PENDING_AFTER_S)."""
        if self._on_grouped is not None:
            self._on_grouped(pod.uid, name)
            await asyncio.sleep(self._annotate_after_s)
        if self._still_unannotated is not None and not self._still_unannotated(pod.uid):
            return
        async with self._slots:
            try:
                await self._api.patch(
                    kubeapi.PODS,
                    {"metadata": {"annotations": {names.POD_GROUP_ANNOTATION: name}}},
                    name=pod.name,
                    namespace=pod.namespace,
                )
            except KubeNotFound:
                return

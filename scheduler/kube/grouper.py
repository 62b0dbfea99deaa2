"""Give every pod of ours a PodGroup: read its owners, decide (``grouping.decide``), create the group, annotate.

Runs beside the cycle: a new pod without a usable ``pod-group-name`` is queued here; once its PodGroup exists and the
annotation is written, the watch brings the pod back with the annotation and it joins its group in the next
snapshot. Owners are read through the API with a small cache (a Deployment's pods share the same owners). A 403 or
404 on an owner, an unknown kind, or a broken API call never leaves the pod pending: ``grouping.decide`` gives it a
group of its own, and an event says why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from common import logs
from scheduler.kube import client, grouping
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeForbidden, KubeNotFound

log = logs.get("scheduler.grouper")

Obj = dict[str, Any]
EventSink = Callable[[Mapping[str, Any], str, str, str], Awaitable[None]]
"""(involved object, type, reason, message)"""
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


def _controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    controllers = [ref for ref in refs if isinstance(ref, dict) and ref.get("controller")]
    chosen = controllers or [ref for ref in refs if isinstance(ref, dict)]
    return chosen[0] if chosen else None


class Grouper:
    def __init__(
        self,
        api: client.KubeApi,
        *,
        queue_label: str = grouping.QUEUE_LABEL,
        on_event: EventSink | None = None,
        on_grouped: GroupedSink | None = None,
        still_unannotated: StillUnannotated | None = None,
        concurrency: int = 64,
        annotate_after_s: float = ANNOTATE_PENDING_AFTER_S,
    ) -> None:
        self._api = api
        self._on_grouped = on_grouped
        self._still_unannotated = still_unannotated
        self._annotate_after_s = annotate_after_s
        self._queue_label = queue_label
        self._on_event = on_event
        self._slots = asyncio.Semaphore(concurrency)
        self._owners: dict[tuple[str, str, str], tuple[float, Obj | None]] = {}
        self._in_progress: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def wants(
        self, pod: Mapping[str, Any], podgroups: Mapping[tuple[str, str], Obj], decided: str | None = None
    ) -> bool:
        """Does this pod of ours still need a group (none named or decided, or that PodGroup is missing)?"""
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            return False
        name = (meta.get("annotations") or {}).get(grouping.POD_GROUP_ANNOTATION) or decided
        if not name:
            return True
        return (str(meta.get("namespace") or "default"), str(name)) not in podgroups

    def submit(self, pod: Obj) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid or uid in self._in_progress:
            return
        self._in_progress.add(uid)
        task = asyncio.ensure_future(self._group(pod, uid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _owner(self, namespace: str, ref: Mapping[str, Any]) -> Obj | grouping.OwnerProblem | None:
        api_version, kind, name = (
            str(ref.get("apiVersion") or ""),
            str(ref.get("kind") or ""),
            str(ref.get("name") or ""),
        )
        key = (api_version, kind, f"{namespace}/{name}")
        cached = self._owners.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _OWNER_CACHE_TTL_S:
            return cached[1]
        try:
            resource = await self._api.resolve(api_version=api_version, kind=kind)
            if resource is None:
                # A kind the API does not serve: keep its reference, so decide() can name it in the event.
                owner: Obj | None = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
            else:
                owner = await self._api.get(resource, name=name, namespace=namespace if resource.namespaced else None)
        except KubeForbidden as exc:
            return grouping.OwnerProblem(kind=kind, name=name, problem="forbidden", message=str(exc))
        except KubeError as exc:
            return grouping.OwnerProblem(kind=kind, name=name, problem="unreadable", message=str(exc))
        if owner is None:
            return grouping.OwnerProblem(kind=kind, name=name, problem="missing", message="404 not found")
        self._owners[key] = (now, owner)
        return owner

    async def owners(self, pod: Mapping[str, Any]) -> list[Obj] | grouping.OwnerProblem:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        chain: list[Obj] = []
        current: Mapping[str, Any] = pod
        for _ in range(_MAX_OWNER_DEPTH):
            ref = _controller_ref(current)
            if ref is None:
                break
            owner = await self._owner(namespace, ref)
            if isinstance(owner, grouping.OwnerProblem):
                return owner
            if owner is None:
                break
            chain.append(owner)
            current = owner
        return chain

    async def _group(self, pod: Obj, uid: str) -> None:
        try:
            async with self._slots:
                name = await self._group_one(pod)
            if name is not None:
                await self._annotate(pod, uid, name)
        except KubeError as exc:
            log.warning("grouping_failed", pod=_pod_name(pod), error=str(exc))
        finally:
            self._in_progress.discard(uid)

    async def _group_one(self, pod: Obj) -> str | None:
        """Make sure the pod's PodGroup exists; the name to annotate the pod with (None: it has the annotation)."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        annotated = (meta.get("annotations") or {}).get(grouping.POD_GROUP_ANNOTATION)
        owners = await self.owners(pod)
        decision = grouping.decide(pod, owners, queue_label=self._queue_label)
        name = str(annotated) if annotated else decision.group_name
        body: Obj = {
            "apiVersion": client.POD_GROUPS.api_version,
            "kind": "PodGroup",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {self._queue_label: decision.queue},
            },
            "spec": {
                "minMember": decision.min_member,
                "queue": decision.queue,
                "priorityClassName": decision.priority_class,
            },
        }
        if decision.preemptible is not None:
            body["spec"]["preemptibility"] = "preemptible" if decision.preemptible else "non-preemptible"
        per_pod = name == grouping.group_name(str(meta.get("name") or ""), str(meta.get("uid") or ""))
        owner = decision.owner
        if per_pod or owner is None:
            # A group of one pod lives and dies with the pod (the garbage collector deletes it after the pod).
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}
            ]
        elif owner.get("uid") and owner.get("apiVersion") != "vcluster.loft.sh/tenant":
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["name"], "uid": owner["uid"]}
            ]
        try:
            await self._api.create(client.POD_GROUPS, body, namespace=namespace)
            log.info(
                "podgroup_created", podgroup=f"{namespace}/{name}", queue=decision.queue, min_member=decision.min_member
            )
        except KubeAlreadyExists:
            pass
        if decision.note and self._on_event is not None:
            await self._on_event(pod, "Normal", "OwnGroup", decision.note)
        return None if annotated else name

    async def _annotate(self, pod: Obj, uid: str, name: str) -> None:
        """Write ``pod-group-name`` unless the binder did so first, with the bind (see ANNOTATE_PENDING_AFTER_S)."""
        meta = pod.get("metadata") or {}
        if self._on_grouped is not None:
            self._on_grouped(uid, name)
            await asyncio.sleep(self._annotate_after_s)
        if self._still_unannotated is not None and not self._still_unannotated(uid):
            return
        async with self._slots:
            try:
                await self._api.patch(
                    client.PODS,
                    {"metadata": {"annotations": {grouping.POD_GROUP_ANNOTATION: name}}},
                    name=str(meta.get("name")),
                    namespace=str(meta.get("namespace") or "default"),
                )
            except KubeNotFound:
                return


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"

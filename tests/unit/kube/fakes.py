"""Fakes for the Kubernetes edge's tests: ``MemoryKube``, an in-memory :class:`KubeApi`, and ``VirtualClock``.

``MemoryKube`` answers every ``KubeApi`` method as the API server answers it through ``KubeClient``, and
``tests/integration/kube/test_contract.py`` holds it to that: the same tests run against it and against the real
client over the emulator. One global ``resourceVersion`` bumped by every write (none by a write that changes
nothing); create fills in the identity and drops what a client may not set; replace and patch check a sent
``resourceVersion`` and keep the status out of main-resource writes and everything but the status out of
``/status`` writes; delete honours a uid precondition and deletes a bound pod gracefully; bindings and evictions
answer with the API server's outcomes and wording; watches replay the history after a version (410 below the
compaction floor) and then follow the writes, with field selectors turning objects that leave the selection into
DELETED, as the API server's watch cache does. Errors are built by ``scheduler.kube.errors.from_status``, the
function ``KubeClient`` maps answers with, so classes, codes, reasons and messages are the ones it raises.

The API's vocabulary comes from the emulator's pure modules, so the tree keeps one copy of each: which kinds have
a ``/status`` subresource and take strategic merge patches (``kinds``), the three patch formats (``patches``), the
selector grammars (``selectors``), the API server's messages (``status``) and condition updates (``objects``).

Simplifications, on purpose: no defaulting, admission or validation beyond identity and names; a namespace must
exist only with ``require_namespaces``; no finalizers; a bound pod's graceful deletion is confirmed at once, as by
a kubelet without delay (MODIFIED with ``deletionTimestamp``, then DELETED); bookmarks come only from
:meth:`MemoryKube.bookmark`; any resource is served (unknown ones as custom resources with a status).

Test hooks: ``objects`` (the store by ``(plural, namespace, name)``; tests seed and edit it in place), ``fail``
(errors for the next calls of an operation), ``lists`` and ``watches`` (scripted answers served before the store),
``calls`` and ``watch_calls`` (what was asked), ``idle_watch`` (set when a watch has delivered everything it had),
``compact``, ``drop_watches``, ``bookmark`` and ``define`` (a kind that discovery serves). ``VirtualClock`` gives
coroutines a monotonic clock and a sleep that advance only when the test says so.

One module past the usual size for one responsibility, an in-memory API server: the store, its history and the open
watches are one state that every verb writes and every watch reads; split, each part would reach into the others.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import dataclasses
import datetime
import heapq
import itertools
import secrets
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from quotient.emulator import kinds, objects, patches, selectors, status
from scheduler.kube import errors, kubeapi
from scheduler.kube.errors import KubeConflict, KubeError, KubeNotFound, KubeUnavailable

Obj = dict[str, Any]
Key = tuple[str, str, str]
"""Where ``MemoryKube.objects`` keeps an object: ``(plural, namespace or "", name)``."""

WatchScript = Sequence[kubeapi.WatchEvent | Exception]
"""What one watch call yields: events in order; an exception raises there, and the stream ends after the last."""

_REGISTRY = kinds.default_registry()
_DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when its spec names none
_TERMINAL_PHASES = ("Succeeded", "Failed")
# apimachinery's SafeEncodeString alphabet, of which generateName's five random characters are drawn.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")
_KEPT_ON_UPDATE = (*_SYSTEM_FIELDS, "namespace", "name", "generation")
_NO_RESOURCE = status.Failure(code=404, reason="NotFound", message="the server could not find the requested resource")


def obj(name: str, *, namespace: str = "default", uid: str | None = None, rv: str = "1", **fields: Any) -> Obj:
    """A minimal pod for reflector tests."""
    metadata: Obj = {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, **fields}


def _raise(failure: status.Failure) -> KubeError:
    return errors.from_status(failure.code, failure.reason, failure.message)


def _kind(resource: kubeapi.Resource) -> kinds.Kind:
    """The emulator's record of a resource; one it does not know is served as a custom resource with a status."""
    known = _REGISTRY.lookup(resource.group, resource.version, resource.plural)
    if known is not None:
        return known
    return kinds.Kind(
        group=resource.group,
        version=resource.version,
        plural=resource.plural,
        kind=resource.kind,
        namespaced=resource.namespaced,
        subresources=frozenset({"status"}),
        builtin=False,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Change:
    rv: int
    type: kubeapi.WatchType
    plural: str
    obj: Obj
    old: Obj | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Drop:
    abort: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Bookmark:
    rv: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Selection:
    """What one list or watch asks for."""

    kind: kinds.Kind
    namespace: str | None
    labels: selectors.LabelSelector
    fields: selectors.FieldSelector

    def wants(self, found: Mapping[str, Any]) -> bool:
        meta = found.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches_object(dict(found)) and self.fields.matches(dict(found))

    def event(self, change: _Change) -> kubeapi.WatchEvent | None:
        """What a watcher of this selection sees of ``change``, if anything."""
        if change.plural != self.kind.plural:
            return None
        if change.type is kubeapi.WatchType.DELETED:
            wanted = self.wants(change.obj)
            return kubeapi.WatchEvent(type=change.type, object=copy.deepcopy(change.obj)) if wanted else None
        before = change.old is not None and self.wants(change.old)
        if self.wants(change.obj):
            kind = kubeapi.WatchType.MODIFIED if before else kubeapi.WatchType.ADDED
            return kubeapi.WatchEvent(type=kind, object=copy.deepcopy(change.obj))
        if before and change.old is not None:
            # Left the selection: the last state it matched, at the new version.
            last = copy.deepcopy(change.old)
            last.setdefault("metadata", {})["resourceVersion"] = str(change.rv)
            return kubeapi.WatchEvent(type=kubeapi.WatchType.DELETED, object=last)
        return None


class MemoryKube:
    """An in-memory :class:`scheduler.kube.client.KubeApi`."""

    def __init__(
        self, *, require_namespaces: bool = False, wall: Callable[[], datetime.datetime] | None = None
    ) -> None:
        self.objects: dict[Key, Obj] = {}
        self.lists: deque[kubeapi.ObjectList | Exception] = deque()
        """Scripted list answers, used before the store is listed."""
        self.watches: deque[WatchScript] = deque()
        """Scripted watch answers, used before the store is watched."""
        self.watch_calls: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, deque[Exception]] = {}
        """Errors to raise on the next calls of an operation (``"get"``, ``"replace"``, ``"bind"``, ...)."""
        self.idle_watch = asyncio.Event()
        """Set when a watch has delivered everything it had and waits for changes, like an idle server."""
        self.require_namespaces = require_namespaces
        """Refuse a create in a namespace that is not among ``objects`` (404), as the API server does."""
        self._wall = wall or (lambda: datetime.datetime.now(datetime.UTC))
        self._rv = 0
        self._history: deque[_Change] = deque()
        self._floor = 0
        self._watchers: set[asyncio.Queue[_Change | _Drop | _Bookmark]] = set()
        self._discoverable: dict[tuple[str, str], kubeapi.Resource] = dict(kubeapi.KNOWN_RESOURCES)

    @property
    def version(self) -> str:
        """The store's current ``resourceVersion``."""
        return str(self._rv)

    # --- test hooks ---

    def of(self, resource: kubeapi.Resource) -> builtins.list[Obj]:
        return [found for (plural, _, _), found in self.objects.items() if plural == resource.plural]

    @property
    def open_watches(self) -> int:
        """How many watches follow the store now (scripted ones are not counted)."""
        return len(self._watchers)

    def compact(self) -> int:
        """Forget the history: a watch from any version before now raises ``KubeGone``. Returns the floor."""
        self._history.clear()
        self._floor = self._rv
        return self._floor

    def drop_watches(self, *, abort: bool = False) -> None:
        """End every open watch (``abort``: as a cut connection, ``KubeUnavailable``)."""
        for watcher in self._watchers:
            watcher.put_nowait(_Drop(abort))

    def bookmark(self) -> None:
        """Send every open watch a BOOKMARK at the current version."""
        for watcher in self._watchers:
            watcher.put_nowait(_Bookmark(self._rv))

    def define(self, resource: kubeapi.Resource) -> None:
        """Serve ``resource`` through discovery (``resolve``), as a CustomResourceDefinition would."""
        self._discoverable[(resource.api_version, resource.kind)] = resource

    # --- the store ---

    def _check(self, op: str) -> None:
        queued = self.fail.get(op)
        if queued:
            raise queued.popleft()

    @staticmethod
    def _key(resource: kubeapi.Resource, name: str, namespace: str | None) -> Key:
        return (resource.plural, namespace or "", name)

    def _now(self) -> str:
        return kubeapi.rfc3339(self._wall())

    def _record(self, kind: kubeapi.WatchType, plural: str, new: Obj, old: Obj | None) -> None:
        change = _Change(self._rv, kind, plural, copy.deepcopy(new), copy.deepcopy(old))
        self._history.append(change)
        for watcher in self._watchers:
            watcher.put_nowait(change)

    def _store(self, key: Key, new: Obj) -> Obj:
        old = self.objects.get(key)
        self._rv += 1
        new.setdefault("metadata", {})["resourceVersion"] = self.version
        self.objects[key] = new
        self._record(kubeapi.WatchType.MODIFIED if old is not None else kubeapi.WatchType.ADDED, key[0], new, old)
        return copy.deepcopy(new)

    def _remove(self, key: Key) -> Obj:
        old = self.objects.pop(key)
        self._rv += 1
        last = copy.deepcopy(old)
        last.setdefault("metadata", {})["resourceVersion"] = self.version
        self._record(kubeapi.WatchType.DELETED, key[0], last, old)
        return copy.deepcopy(last)

    @staticmethod
    def _served(resource: kubeapi.Resource, found: Obj) -> Obj:
        answer = copy.deepcopy(found)
        answer.setdefault("apiVersion", resource.api_version)
        answer.setdefault("kind", resource.kind)
        return answer

    @staticmethod
    def _selection(
        resource: kubeapi.Resource, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> _Selection:
        resource.path(namespace=namespace)  # the client's argument checks
        kind = _kind(resource)
        labels = selectors.parse_labels(label_selector)
        if isinstance(labels, status.Failure):
            raise _raise(labels)
        fields = selectors.parse_fields(field_selector, kind)
        if isinstance(fields, status.Failure):
            raise _raise(fields)
        return _Selection(kind=kind, namespace=namespace, labels=labels, fields=fields)

    @staticmethod
    def _identify(kind: kinds.Kind, body: Obj, namespace: str | None) -> Obj:
        """The body's apiVersion, kind and namespace checked against the request and filled in; its metadata."""
        if body.get("apiVersion") not in (None, "", kind.api_version):
            raise _raise(
                status.bad_request(
                    f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                    f"({kind.api_version})"
                )
            )
        if body.get("kind") not in (None, "", kind.kind):
            raise _raise(
                status.bad_request(
                    f"the kind in the data ({body['kind']}) does not match the expected kind ({kind.kind})"
                )
            )
        body["apiVersion"], body["kind"] = kind.api_version, kind.kind
        meta: Obj = body.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise _raise(
                    status.bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request"
                    )
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return meta

    def _update(self, kind: kinds.Kind, key: Key, current: Obj, new: Obj, *, subresource: str) -> Obj:
        """A replace or patch of ``current`` by ``new``, as the API server's update does."""
        old_meta = current.get("metadata") or {}
        sent = (new.get("metadata") or {}).get("resourceVersion")
        if sent and str(sent) != old_meta.get("resourceVersion"):
            raise _raise(status.conflict(kind.plural, key[2], status.STALE, group=kind.group))
        if subresource == "status":
            merged = copy.deepcopy(current)
            merged.pop("status", None)
            if "status" in new:
                merged["status"] = new["status"]
        else:
            merged = new
            if kind.has_status:
                merged.pop("status", None)
                if "status" in current:
                    merged["status"] = copy.deepcopy(current["status"])
        meta = merged.setdefault("metadata", {})
        for field in _KEPT_ON_UPDATE:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        if subresource != "status" and _spec_of(kind, merged) != _spec_of(kind, current):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1
        if merged == current:
            return copy.deepcopy(current)
        return self._store(key, merged)

    # --- KubeApi ---

    async def list(
        self,
        resource: kubeapi.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> kubeapi.ObjectList:
        self.calls.append(("list", resource.plural))
        self._check("list")
        if self.lists:
            answer = self.lists.popleft()
            if isinstance(answer, Exception):
                raise answer
            return answer
        selection = self._selection(resource, namespace, label_selector, field_selector)
        items = [
            self._served(resource, found)
            for key, found in sorted(self.objects.items())
            if key[0] == resource.plural and selection.wants(found)
        ]
        return kubeapi.ObjectList(items=items, resource_version=self.version)

    async def watch(
        self,
        resource: kubeapi.Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
        read_timeout_s: float | None = None,
    ) -> AsyncGenerator[kubeapi.WatchEvent, None]:
        self.watch_calls.append(resource_version)
        self.calls.append(("watch", resource.plural))
        self._check("watch")
        if self.watches:
            for step in self.watches.popleft():
                if isinstance(step, Exception):
                    raise step
                yield step
            return
        selection = self._selection(resource, namespace, label_selector, field_selector)
        signals: asyncio.Queue[_Change | _Drop | _Bookmark] = asyncio.Queue()
        self._watchers.add(signals)  # before the backlog is read, so nothing falls between the two
        try:
            for event in self._backlog(resource, selection, resource_version):
                yield event
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            read_timeout = read_timeout_s if read_timeout_s is not None else timeout_s + 30.0
            while True:
                if signals.empty():
                    self.idle_watch.set()
                wait_s = min(deadline - loop.time(), read_timeout)
                if wait_s <= 0:
                    return
                try:
                    signal = await asyncio.wait_for(signals.get(), wait_s)
                except TimeoutError:
                    if loop.time() >= deadline:
                        return  # the server ends the stream at its timeout
                    raise KubeUnavailable(f"watch {resource.plural}: nothing arrived for {read_timeout:g} s") from None
                if isinstance(signal, _Drop):
                    if signal.abort:
                        raise KubeUnavailable(f"watch {resource.plural}: the stream broke: connection reset")
                    return
                if isinstance(signal, _Bookmark):
                    bookmark: Obj = {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(signal.rv)},
                    }
                    yield kubeapi.WatchEvent(type=kubeapi.WatchType.BOOKMARK, object=bookmark)
                    continue
                seen = selection.event(signal)
                if seen is not None:
                    yield seen
        finally:
            self._watchers.discard(signals)

    def _backlog(
        self, resource: kubeapi.Resource, selection: _Selection, resource_version: str
    ) -> builtins.list[kubeapi.WatchEvent]:
        """What a watch from ``resource_version`` sees first: every object (from "" or "0"), or the changes since."""
        if resource_version in ("", "0"):
            return [
                kubeapi.WatchEvent(type=kubeapi.WatchType.ADDED, object=self._served(resource, found))
                for key, found in sorted(self.objects.items())
                if key[0] == resource.plural and selection.wants(found)
            ]
        if not resource_version.isdigit():
            raise _raise(status.bad_request(f"invalid resource version: {resource_version}"))
        since = int(resource_version)
        if since < self._floor:
            raise _raise(status.expired(f"too old resource version: {since} ({self._floor})"))
        found = (selection.event(change) for change in self._history if change.rv > since)
        return [event for event in found if event is not None]

    async def get(self, resource: kubeapi.Resource, *, name: str, namespace: str | None = None) -> Obj | None:
        self.calls.append(("get", name))
        self._check("get")
        resource.path(namespace=namespace, name=name)
        found = self.objects.get(self._key(resource, name, namespace))
        return self._served(resource, found) if found is not None else None

    async def resolve(self, *, api_version: str, kind: str) -> kubeapi.Resource | None:
        return self._discoverable.get((api_version, kind))

    async def create(self, resource: kubeapi.Resource, body: Mapping[str, Any], *, namespace: str | None = None) -> Obj:
        self.calls.append(("create", str(body.get("metadata", {}).get("name"))))
        self._check("create")
        resource.path(namespace=namespace)
        kind = _kind(resource)
        new = copy.deepcopy(dict(body))
        meta = self._identify(kind, new, namespace)
        if kind.namespaced and self.require_namespaces and ("namespaces", "", namespace or "") not in self.objects:
            raise _raise(status.not_found("namespaces", namespace or ""))
        for field in (*_SYSTEM_FIELDS, "generation", "managedFields", "selfLink"):
            meta.pop(field, None)
        if kind.has_status and kind.plural != "nodes":  # nodes register with their status; others start empty
            new.pop("status", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
        name = str(meta.get("name") or "")
        if not name:
            causes = [status.required("metadata.name", "name or generateName is required")]
            raise _raise(status.invalid(kind.kind, name, causes, group=kind.group))
        key = self._key(resource, name, namespace)
        if key in self.objects:
            raise _raise(status.already_exists(kind.plural, name, group=kind.group))
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=self._now(), generation=1)
        return self._store(key, new)

    async def replace(
        self, resource: kubeapi.Resource, body: Mapping[str, Any], *, name: str, namespace: str | None = None
    ) -> Obj:
        self.calls.append(("replace", name))
        self._check("replace")
        resource.path(namespace=namespace, name=name)
        kind = _kind(resource)
        key = self._key(resource, name, namespace)
        current = self.objects.get(key)
        if current is None:
            raise _raise(status.not_found(kind.plural, name, group=kind.group))
        new = copy.deepcopy(dict(body))
        meta = self._identify(kind, new, namespace)
        if meta.get("name") and meta["name"] != name:
            raise _raise(
                status.bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
                )
            )
        if not kind.builtin and not meta.get("resourceVersion"):
            causes = [status.invalid_value("metadata.resourceVersion", 0, "must be specified for an update")]
            raise _raise(status.invalid(kind.kind, name, causes, group=kind.group))
        return self._update(kind, key, current, new, subresource="")

    async def patch(
        self,
        resource: kubeapi.Resource,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: kubeapi.PatchType = kubeapi.PatchType.MERGE,
    ) -> Obj:
        self.calls.append(("patch", name))
        self._check("patch")
        body: object
        if patch_type is kubeapi.PatchType.JSON:
            if isinstance(patch, Mapping):
                raise ValueError("a JSON patch is a list of operations, not a mapping")
            body = [dict(operation) for operation in patch]
        else:
            if not isinstance(patch, Mapping):
                raise ValueError(f"a {patch_type.name.lower()} patch is a mapping, not a list")
            body = dict(patch)
        resource.path(namespace=namespace, name=name, subresource=subresource)
        kind = _kind(resource)
        if subresource is not None and subresource not in kind.subresources:
            raise _raise(_NO_RESOURCE)
        key = self._key(resource, name, namespace)
        current = self.objects.get(key)
        if current is None:
            raise _raise(status.not_found(kind.plural, name, group=kind.group))
        patched = patches.apply_patch(current, patch_type.value, body, strategic_allowed=kind.strategic_merge)
        if isinstance(patched, status.Failure):
            raise _raise(patched)
        self._identify(kind, patched, namespace)
        return self._update(kind, key, current, patched, subresource=subresource or "")

    async def delete(
        self,
        resource: kubeapi.Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        grace_period_s: int | None = None,
    ) -> Obj | None:
        self.calls.append(("delete", name))
        self._check("delete")
        resource.path(namespace=namespace, name=name)
        kind = _kind(resource)
        key = self._key(resource, name, namespace)
        current = self.objects.get(key)
        if current is None:
            return None
        found_uid = (current.get("metadata") or {}).get("uid")
        if uid and uid != found_uid:
            detail = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {found_uid}"
            raise _raise(status.conflict(kind.plural, name, detail, group=kind.group))
        if kind.plural == "pods" and not resource.group:
            spec, phase = current.get("spec") or {}, (current.get("status") or {}).get("phase")
            grace_s = grace_period_s if grace_period_s is not None else spec.get("terminationGracePeriodSeconds")
            grace_s = _DEFAULT_GRACE_S if grace_s is None else int(grace_s)
            if spec.get("nodeName") and phase not in _TERMINAL_PHASES and grace_s > 0:
                # Graceful: marked for deletion; the kubelet (here: at once) confirms and the pod goes.
                marked = copy.deepcopy(current)
                deadline = self._wall() + datetime.timedelta(seconds=grace_s)
                marked["metadata"].update(
                    deletionTimestamp=kubeapi.rfc3339(deadline), deletionGracePeriodSeconds=grace_s
                )
                answer = self._store(key, marked)
                self._remove(key)
                return answer
        return self._remove(key)

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> kubeapi.BindResult:
        self.calls.append(("bind", name))
        self._check("bind")
        if not node:
            raise _raise(status.invalid("Binding", name, [status.required("target.name")]))
        key = ("pods", namespace, name)
        pod = self.objects.get(key)
        if pod is None:
            return kubeapi.BindResult(
                outcome=kubeapi.BindOutcome.POD_GONE, message=status.not_found("pods", name).message
            )
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        assigned = spec.get("nodeName")
        refusal = None
        if uid and uid != meta.get("uid"):
            refusal = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid')}"
            assigned = None
        elif meta.get("deletionTimestamp"):
            refusal = f"pod {name} is being deleted, cannot be assigned to a host"
        elif assigned:
            refusal = f'pod {name} is already assigned to node "{assigned}"'
        elif spec.get("schedulingGates"):
            refusal = f"pod {name} has non-empty .spec.schedulingGates"
        if refusal is not None:
            message = status.conflict("pods/binding", name, refusal).message
            node_named = str(assigned) if assigned and not meta.get("deletionTimestamp") else None
            return kubeapi.BindResult(outcome=kubeapi.BindOutcome.ALREADY_ASSIGNED, message=message, node=node_named)
        bound = copy.deepcopy(pod)
        bound.setdefault("spec", {})["nodeName"] = node
        if annotations:
            bound_meta = bound.setdefault("metadata", {})
            bound_meta["annotations"] = {**(bound_meta.get("annotations") or {}), **annotations}
        scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": self._now()}
        objects.set_condition(bound.setdefault("status", {}), scheduled)
        self._store(key, bound)
        return kubeapi.BindResult(outcome=kubeapi.BindOutcome.BOUND)

    async def evict_pod(
        self, *, namespace: str, name: str, uid: str, reason: str, message: str, grace_period_s: int | None = None
    ) -> kubeapi.EvictResult:
        """As ``KubeClient`` evicts: a strategic patch of the DisruptionTarget condition, then a delete on the uid."""
        self.calls.append(("evict", name))
        self._check("evict")
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": self._now(),
        }
        written = False
        try:
            await self.patch(
                kubeapi.PODS,
                {"status": {"conditions": [condition]}},
                name=name,
                namespace=namespace,
                subresource="status",
                patch_type=kubeapi.PatchType.STRATEGIC,
            )
            written = True
        except KubeNotFound:
            return kubeapi.EvictResult(outcome=kubeapi.EvictOutcome.POD_GONE, condition_written=False)
        except KubeError:
            pass  # a courtesy to the pod's owner; the eviction is the delete
        try:
            deleted = await self.delete(
                kubeapi.PODS, name=name, namespace=namespace, uid=uid, grace_period_s=grace_period_s
            )
        except KubeConflict:
            deleted = None
        outcome = kubeapi.EvictOutcome.EVICTED if deleted is not None else kubeapi.EvictOutcome.POD_GONE
        return kubeapi.EvictResult(outcome=outcome, condition_written=written)


def _spec_of(kind: kinds.Kind, found: Obj) -> Obj:
    """What ``generation`` tracks: everything but metadata (and status, where it is a subresource)."""
    skip = ("metadata", "status") if kind.has_status else ("metadata",)
    return {key: value for key, value in found.items() if key not in skip}


class VirtualClock:
    """A monotonic clock and ``sleep`` under the test's control: time moves only in :meth:`advance`."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.epoch = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> datetime.datetime:
        return self.epoch + datetime.timedelta(seconds=self.now_s)

    async def sleep(self, delay_s: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now_s + max(0.0, delay_s), next(self._order), future))
        await future

    @staticmethod
    async def settle() -> None:
        """Let every runnable task run until all wait on the clock (or on something else)."""
        for _ in range(100):
            await asyncio.sleep(0)

    async def advance(self, delta_s: float) -> None:
        """Move time forward by ``delta_s``, waking each sleeper at its own time, in order."""
        until = self.now_s + delta_s
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= until:
            at, _, future = heapq.heappop(self._sleepers)
            self.now_s = max(self.now_s, at)
            if not future.done():
                future.set_result(None)
            await self.settle()
        self.now_s = until
        await self.settle()

"""Fakes for the Kubernetes edge's unit tests: an in-memory KubeApi and a virtual clock.

``MemoryKube`` keeps objects in a dict with one global resourceVersion, answers like the API server for the
operations leases and events use (get, create with 409 AlreadyExists, replace with 409 on a stale version, merge
patch, delete), and serves lists and scripted watches for the reflector. ``VirtualClock`` gives coroutines a
monotonic clock and a sleep that only advance when the test says so, so timing logic is tested without real sleeps.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import datetime
import heapq
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from scheduler.kube import client
from scheduler.kube.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeNotFound

Obj = dict[str, Any]


def obj(name: str, *, namespace: str = "default", uid: str | None = None, rv: str = "1", **fields: Any) -> Obj:
    """A minimal object for reflector tests."""
    metadata: Obj = {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": rv}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, **fields}


def merge(target: Obj, patch: Mapping[str, Any]) -> Obj:
    """RFC 7386 merge patch."""
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


WatchScript = Sequence[client.WatchEvent | Exception]
"""What one watch call yields: events in order; an exception raises there, and the stream ends after the last."""


class MemoryKube:
    """An in-memory :class:`scheduler.kube.client.KubeApi`."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self._rv = itertools.count(1)
        self.version = "0"
        self.lists: deque[client.ObjectList | Exception] = deque()
        """Scripted list answers, used before the store is listed."""
        self.watches: deque[WatchScript] = deque()
        self.watch_calls: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, deque[Exception]] = {}
        """Errors to raise on the next calls of an operation (``"get"``, ``"replace"``, ...)."""
        self.idle_watch = asyncio.Event()
        """Set when a watch call finds no script: it then waits until cancelled, like an idle server."""

    def _check(self, op: str) -> None:
        queued = self.fail.get(op)
        if queued:
            raise queued.popleft()

    def _bump(self) -> str:
        self.version = str(next(self._rv))
        return self.version

    @staticmethod
    def _key(resource: client.Resource, name: str, namespace: str | None) -> tuple[str, str, str]:
        return (resource.plural, namespace or "", name)

    async def list(
        self,
        resource: client.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> client.ObjectList:
        self.calls.append(("list", resource.plural))
        self._check("list")
        if self.lists:
            answer = self.lists.popleft()
            if isinstance(answer, Exception):
                raise answer
            return answer
        items = [copy.deepcopy(o) for (plural, ns, _), o in self.objects.items() if plural == resource.plural]
        return client.ObjectList(items=items, resource_version=self.version)

    async def watch(
        self,
        resource: client.Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
        read_timeout_s: float | None = None,
    ) -> AsyncGenerator[client.WatchEvent, None]:
        self.watch_calls.append(resource_version)
        if not self.watches:
            self.idle_watch.set()
            await asyncio.Event().wait()
        for step in self.watches.popleft():
            if isinstance(step, Exception):
                raise step
            yield step

    async def get(self, resource: client.Resource, *, name: str, namespace: str | None = None) -> Obj | None:
        self.calls.append(("get", name))
        self._check("get")
        found = self.objects.get(self._key(resource, name, namespace))
        return copy.deepcopy(found) if found is not None else None

    async def resolve(self, *, api_version: str, kind: str) -> client.Resource | None:
        return client.KNOWN_RESOURCES.get((api_version, kind))

    async def create(self, resource: client.Resource, body: Mapping[str, Any], *, namespace: str | None = None) -> Obj:
        self.calls.append(("create", str(body.get("metadata", {}).get("name"))))
        self._check("create")
        stored = copy.deepcopy(dict(body))
        name = stored["metadata"]["name"]
        key = self._key(resource, name, namespace)
        if key in self.objects:
            raise KubeAlreadyExists(f"{resource.plural} {name!r} already exists", status=409, reason="AlreadyExists")
        stored["metadata"]["resourceVersion"] = self._bump()
        stored["metadata"].setdefault("uid", f"uid-{name}-{self.version}")
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def replace(
        self, resource: client.Resource, body: Mapping[str, Any], *, name: str, namespace: str | None = None
    ) -> Obj:
        self.calls.append(("replace", name))
        self._check("replace")
        key = self._key(resource, name, namespace)
        current = self.objects.get(key)
        if current is None:
            raise KubeNotFound(f"{resource.plural} {name!r} not found", status=404, reason="NotFound")
        sent = body.get("metadata", {}).get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise KubeConflict("the object has been modified", status=409, reason="Conflict")
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = self._bump()
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def patch(
        self,
        resource: client.Resource,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: client.PatchType = client.PatchType.MERGE,
    ) -> Obj:
        self.calls.append(("patch", name))
        self._check("patch")
        assert isinstance(patch, Mapping)
        key = self._key(resource, name, namespace)
        current = self.objects.get(key)
        if current is None:
            raise KubeNotFound(f"{resource.plural} {name!r} not found", status=404, reason="NotFound")
        stored = merge(current, patch)
        stored["metadata"]["resourceVersion"] = self._bump()
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def delete(
        self,
        resource: client.Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        grace_period_s: int | None = None,
    ) -> Obj | None:
        self.calls.append(("delete", name))
        self._check("delete")
        return self.objects.pop(self._key(resource, name, namespace), None)

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> client.BindResult:
        raise KubeError("not used by these tests")

    async def evict_pod(
        self, *, namespace: str, name: str, uid: str, reason: str, message: str, grace_period_s: int | None = None
    ) -> client.EvictResult:
        raise KubeError("not used by these tests")

    def of(self, resource: client.Resource) -> builtins.list[Obj]:
        return [o for (plural, _, _), o in self.objects.items() if plural == resource.plural]


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

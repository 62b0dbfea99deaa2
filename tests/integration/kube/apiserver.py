"""A small Kubernetes API server for the client adapter's tests: real HTTP on loopback, the real wire protocol.

It serves what the adapter's contract needs and no more, as KUBE-API-NOTES.md describes the API server: generic
objects under ``/api/v1`` and ``/apis/G/V`` (namespaced or not), one global ``resourceVersion``, lists with
``limit``/``continue`` pages, chunked watches with bookmarks, ``410 Expired`` as an ERROR event below the
compaction floor, ``Status`` bodies for every error, ``409`` on a stale ``resourceVersion``, an existing name or a
failed uid precondition, merge and strategic merge patches (conditions by type), ``pods/binding`` answering 201
with a ``Status`` (which the official client cannot parse), discovery of one extra group, and test hooks: compact
the history, drop every watch, inject error answers, and hold a watch silent.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
JSON = "application/json"


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


def reply(body: Obj, code: int = 200) -> web.Response:
    return web.Response(status=code, body=json.dumps(body).encode(), content_type=JSON)


def fail(code: int, reason: str, message: str) -> web.Response:
    return reply(status(code, reason, message), code)


def merge(target: Any, patch: Any, *, strategic: bool) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif strategic and key == "conditions" and isinstance(value, list) and isinstance(result.get(key), list):
            by_type = {c.get("type"): c for c in result[key]}
            for condition in value:
                by_type[condition.get("type")] = {**by_type.get(condition.get("type"), {}), **condition}
            result[key] = list(by_type.values())
        else:
            result[key] = merge(result.get(key), value, strategic=strategic)
    return result


@dataclasses.dataclass(frozen=True, slots=True)
class Path:
    api_version: str
    plural: str
    namespace: str
    name: str
    subresource: str


CLUSTER_SCOPED = {"nodes", "namespaces", "queues", "priorityclasses"}
KINDS = {"pods": "Pod", "nodes": "Node", "events": "Event", "leases": "Lease", "queues": "Queue"}


def parse(path: str) -> Path | None:
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        api_version, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return Path(api_version, rest[0], namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "")


class ApiServer:
    """The server and its state; ``start()`` returns its URL."""

    def __init__(self, *, bookmark_interval_s: float = 0.5) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.history: list[tuple[int, str, str, Obj]] = []
        """(resourceVersion, plural, event type, object)"""
        self.floor = 0
        self._rv = itertools.count(1)
        self.version = 0
        self._changed = asyncio.Condition()
        self.faults: dict[tuple[str, str], deque[int]] = {}
        """(method, plural or plural/subresource) -> status codes to answer next"""
        self.silent_watches = False
        self.requests: list[tuple[str, str, Mapping[str, str]]] = []
        self.bookmark_interval_s = bookmark_interval_s
        self._watchers: dict[int, web.Request] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- hooks ---

    def put(self, plural: str, obj: Obj) -> Obj:
        """Store an object as if created, with a new version and a history entry."""
        metadata = obj.setdefault("metadata", {})
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        key = (plural, metadata.get("namespace", ""), metadata["name"])
        kind = "MODIFIED" if key in self.objects else "ADDED"
        return self._commit(plural, key, obj, kind)

    def remove(self, plural: str, namespace: str, name: str) -> Obj | None:
        key = (plural, namespace, name)
        if key not in self.objects:
            return None
        return self._commit(plural, key, self.objects.pop(key), "DELETED", store=False)

    def compact(self) -> None:
        """Forget the history: a watch from any earlier version answers 410."""
        self.floor = self.version
        self.history.clear()

    def drop_watches(self) -> int:
        """Cut every watch connection, as a restarting API server or a proxy would."""
        dropped = 0
        for request in list(self._watchers.values()):
            if request.transport is not None:
                request.transport.abort()
                dropped += 1
        return dropped

    def inject(self, method: str, resource: str, *codes: int) -> None:
        self.faults.setdefault((method, resource), deque()).extend(codes)

    def _commit(self, plural: str, key: tuple[str, str, str], obj: Obj, kind: str, *, store: bool = True) -> Obj:
        self.version = next(self._rv)
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        if store:
            self.objects[key] = obj
        self.history.append((self.version, plural, kind, obj))
        asyncio.get_running_loop().create_task(self._notify())
        return copy.deepcopy(obj)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- lifecycle ---

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- HTTP ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query)))
        if request.path == "/apis/example.com/v1":
            return reply(
                {
                    "kind": "APIResourceList",
                    "groupVersion": "example.com/v1",
                    "resources": [
                        {"name": "widgets", "namespaced": True, "kind": "Widget", "verbs": ["get"]},
                        {"name": "widgets/status", "namespaced": True, "kind": "Widget", "verbs": ["get"]},
                    ],
                }
            )
        target = parse(request.path)
        if target is None:
            return fail(404, "NotFound", "the server could not find the requested resource")
        resource = target.plural + (f"/{target.subresource}" if target.subresource else "")
        queued = self.faults.get((request.method, resource)) or self.faults.get((request.method, "*"))
        if queued:
            code = queued.popleft()
            if code == 502:
                return web.Response(status=502, body=b"<html>Bad Gateway</html>", content_type="text/html")
            return fail(
                code, {403: "Forbidden", 422: "Invalid", 429: "TooManyRequests"}.get(code, "InternalError"), "injected"
            )
        body: Any = None
        if request.can_read_body:
            body = json.loads(await request.read())
        if request.method == "GET" and not target.name:
            if request.query.get("watch") == "true":
                return await self._watch(request, target)
            return self._list(request, target)
        key = (target.plural, target.namespace, target.name)
        if request.method == "GET":
            found = self.objects.get(key)
            return reply(found) if found else fail(404, "NotFound", f'{target.plural} "{target.name}" not found')
        if request.method == "POST" and target.subresource in ("binding", "bindings"):
            return self._bind(key, body)
        if request.method == "POST":
            name = body["metadata"]["name"]
            if (target.plural, target.namespace, name) in self.objects:
                return fail(409, "AlreadyExists", f'{target.plural} "{name}" already exists')
            if target.namespace:
                body["metadata"]["namespace"] = target.namespace
            return reply(self.put(target.plural, body), 201)
        current = self.objects.get(key)
        if current is None:
            return fail(404, "NotFound", f'{target.plural} "{target.name}" not found')
        if request.method == "PUT":
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                return fail(
                    409, "Conflict", "the object has been modified; please apply your changes to the latest version"
                )
            body["metadata"]["uid"] = current["metadata"]["uid"]
            return reply(self.put(target.plural, body))
        if request.method == "PATCH":
            strategic = request.content_type == "application/strategic-merge-patch+json"
            if target.subresource == "status":
                patched = {
                    **current,
                    "status": merge(current.get("status", {}), body.get("status", {}), strategic=strategic),
                }
            else:
                patched = merge(current, body, strategic=strategic)
            return reply(self.put(target.plural, patched))
        if request.method == "DELETE":
            uid = (body or {}).get("preconditions", {}).get("uid")
            current_uid = current["metadata"]["uid"]
            if uid and uid != current_uid:
                return fail(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}",
                )
            removed = self.remove(target.plural, target.namespace, target.name)
            assert removed is not None
            return reply(removed)
        return fail(405, "MethodNotAllowed", request.method)

    def _bind(self, key: tuple[str, str, str], body: Obj) -> web.Response:
        pod = self.objects.get(key)
        if pod is None:
            return fail(404, "NotFound", f'pods "{key[2]}" not found')
        uid = body.get("metadata", {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            return fail(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{key[2]}": UID mismatch')
        node = pod.get("spec", {}).get("nodeName")
        if node:
            return fail(409, "Conflict", f'pod {key[2]} is already assigned to node "{node}"')
        target = body.get("target", {})
        if target.get("kind") != "Node" or not target.get("name"):
            return fail(422, "Invalid", "target must be a Node with a name")
        bound = merge(pod, {"spec": {"nodeName": target["name"]}}, strategic=False)
        self.put("pods", bound)
        return reply({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    def _list(self, request: web.Request, target: Path) -> web.Response:
        items = [
            copy.deepcopy(obj)
            for (plural, namespace, _), obj in sorted(self.objects.items())
            if plural == target.plural and (not target.namespace or namespace == target.namespace)
        ]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(items)
        page = items[start : start + limit]
        metadata: Obj = {"resourceVersion": str(self.version)}
        if start + limit < len(items):
            metadata["continue"] = str(start + limit)
        return reply(
            {
                "kind": KINDS.get(target.plural, "Object") + "List",
                "apiVersion": target.api_version,
                "metadata": metadata,
                "items": page,
            }
        )

    async def _watch(self, request: web.Request, target: Path) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        await response.prepare(request)
        since = int(request.query.get("resourceVersion") or 0)
        if since < self.floor:
            expired = status(410, "Expired", f"too old resource version: {since} ({self.floor})")
            await response.write(json.dumps({"type": "ERROR", "object": expired}).encode() + b"\n")
            await response.write_eof()
            return response
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        timeout_s = float(request.query.get("timeoutSeconds") or 300)
        self._watchers[id(request)] = request
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while loop.time() < deadline:
                for version, plural, kind, obj in list(self.history):
                    if version > since and plural == target.plural and not self.silent_watches:
                        if target.namespace and obj["metadata"].get("namespace") != target.namespace:
                            continue
                        await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                        since = version
                try:
                    async with self._changed:
                        await asyncio.wait_for(
                            self._changed.wait(), min(self.bookmark_interval_s, deadline - loop.time())
                        )
                except TimeoutError:
                    if bookmarks and not self.silent_watches:
                        since = max(since, self.version)
                        mark = {
                            "kind": KINDS.get(target.plural, "Object"),
                            "apiVersion": target.api_version,
                            "metadata": {"resourceVersion": str(since)},
                        }
                        await response.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # dropped by the hook, or the client went away
        finally:
            self._watchers.pop(id(request), None)
        return response

"""The HTTP face of the emulator: aiohttp, one catch-all route, the Kubernetes URL scheme parsed by hand.

Kubernetes paths are regular (``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` and the same under
``/apis/GROUP/VERSION``), and the set of kinds changes when a CRD is applied, so one handler parses the path
against the registry rather than registering routes. It maps verbs to the API layer, renders objects through the
negotiated view, streams watches (chunked, one event per line, flushed per batch), serves discovery and OpenAPI,
applies injected faults, and exposes the test hooks under ``/_emulator/`` for tests that run the emulator as a
separate process. Every body is ``application/json`` exactly; every error is a ``Status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import yaml
from aiohttp import web

from common import logs
from quotient.emulator import discovery, openapi, patches, protobuf, selectors, status, testhooks, views, watching
from quotient.emulator.api import Api, DeleteOptions
from quotient.emulator.faults import Faults
from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj, encode, metadata
from quotient.emulator.views import CONTENT_TYPE, View, event_line, negotiate

log = logs.get("emulator.server")

_JSON_HEADERS = {"Content-Type": CONTENT_TYPE}
_MAX_BODY_BYTES = 16 * 1024 * 1024
_NOT_FOUND = status.Failure(code=404, reason="NotFound", message="the server could not find the requested resource")


class _Unsupported(Exception):
    """A protobuf body of a kind the emulator does not decode: 415."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    bookmark_interval_s: float = 10.0
    watch_timeout_max_s: float = 1800.0  # the API server's --min-request-timeout
    watcher_buffer_events: int = watching.DEFAULT_BUFFER_EVENTS


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A resource request's path, parsed."""

    group: str
    version: str
    plural: str
    namespace: str
    name: str
    subresource: str
    watch_path: bool


def parse_resource_path(path: str) -> Target | None:
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    return Target(
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else "",
        subresource=rest[2] if len(rest) > 2 else "",
        watch_path=watch_path,
    )


def _json(body: Obj, code: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=code, headers=_JSON_HEADERS)


def _failure(failure: status.Failure) -> web.Response:
    headers = dict(_JSON_HEADERS)
    if failure.retry_after_s is not None:
        headers["Retry-After"] = str(failure.retry_after_s)
    return web.Response(body=encode(failure.body()), status=failure.code, headers=headers)


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


class Server:
    def __init__(
        self,
        *,
        api: Api,
        hub: watching.WatchHub,
        faults: Faults,
        hooks: testhooks.Hooks,
        config: ServerConfig = ServerConfig(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.hub = hub
        self.faults = faults
        self.hooks = hooks
        self.config = config
        self.clock = clock
        self.registry: Registry = api.registry
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0

    # --- Lifecycle ---

    def application(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(self.application(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        address = self._runner.addresses[0]
        self.host, self.port = str(address[0]), int(address[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            self.hub.close_all()
            await self._runner.cleanup()
            self._runner = None

    # --- Dispatch ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request_failed", method=request.method, path=request.path)
            return _failure(status.internal("the emulator failed on this request; see its log"))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path.startswith(("/api/", "/apis/")) or path in ("/api", "/apis"):
            document = self._discovery(request, path)
            if isinstance(document, status.Failure):
                return _failure(document)
            if document is not None:
                return _json(document)
            target = parse_resource_path(path)
            if target is None:
                return _failure(_NOT_FOUND)
            return await self._resource(request, target)
        if path == "/version":
            return _json(discovery.VERSION)
        if path.startswith("/openapi/v3"):
            return self._openapi(path)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path.startswith("/_emulator/"):
            code, body = await testhooks.answer(request, path, hooks=self.hooks, faults=self.faults)
            return _json(body, code)
        return _failure(_NOT_FOUND)

    def _discovery(self, request: web.Request, path: str) -> Obj | status.Failure | None:
        if request.method != "GET":
            return None
        parts = [part for part in path.split("/") if part]
        if parts == ["api"]:
            return discovery.api_versions(f"{self.host}:{self.port}")
        if parts == ["apis"]:
            return discovery.api_group_list(self.registry)
        if len(parts) == 2 and parts[0] == "api":
            return discovery.api_resource_list(self.registry, "", parts[1]) or _NOT_FOUND
        if len(parts) == 2 and parts[0] == "apis":
            return discovery.api_group(self.registry, parts[1]) or _NOT_FOUND
        if len(parts) == 3 and parts[0] == "apis":
            return discovery.api_resource_list(self.registry, parts[1], parts[2]) or _NOT_FOUND
        return None

    def _openapi(self, path: str) -> web.Response:
        rest = path[len("/openapi/v3") :].strip("/")
        if not rest:
            return _json(openapi.index(self.registry))
        parts = rest.split("/")
        document = None
        if len(parts) == 2 and parts[0] == "api":
            document = openapi.document(self.registry, "", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            document = openapi.document(self.registry, parts[1], parts[2])
        return _json(document) if document is not None else _failure(_NOT_FOUND)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        if "protobuf" in (request.content_type or ""):
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError as exc:
                raise _Unsupported(str(exc)) from exc
        if "yaml" in (request.content_type or ""):
            return yaml.safe_load(raw)
        return json.loads(raw)

    async def _resource(self, request: web.Request, target: Target) -> web.StreamResponse:
        if target.group == "" and target.plural == "bindings" and request.method == "POST" and not target.name:
            return await self._binding(request, target, from_collection=True)
        kind = self.registry.lookup(target.group, target.version, target.plural)
        if kind is None:
            return _failure(_NOT_FOUND)
        if target.subresource and target.subresource not in kind.subresources:
            return _failure(_NOT_FOUND)
        if target.namespace and not kind.namespaced:
            return _failure(_NOT_FOUND)
        if kind.namespaced and not target.namespace and (target.name or request.method not in ("GET", "DELETE")):
            if request.method == "POST" and not target.name:
                return _failure(status.method_not_allowed("create a namespaced object under /namespaces/NAME/"))
            return _failure(_NOT_FOUND)
        verb = self._verb(request, target)
        if verb is None:
            return _failure(status.method_not_allowed(f"the server does not allow {request.method} here"))
        effect = self.faults.take(
            verb=verb,
            resource=target.plural,
            subresource=target.subresource,
            namespace=target.namespace,
            name=target.name,
        )
        if effect.delay_s:
            await asyncio.sleep(effect.delay_s)
        if effect.code is not None:
            if verb == "watch" and effect.code == 410:
                return await self._expired_watch(request, status.expired(effect.message))
            return _failure(status.injected(effect.code, effect.message))
        try:
            body = await self._body(request) if request.method in ("POST", "PUT", "PATCH", "DELETE") else None
        except _Unsupported as exc:
            return _failure(status.Failure(code=415, reason="UnsupportedMediaType", message=str(exc)))
        except (ValueError, yaml.YAMLError) as exc:
            return _failure(status.bad_request(f"the body of the request could not be decoded: {exc}"))
        handler = self._handlers[verb]
        return await handler(self, request, kind, target, body)

    @staticmethod
    def _verb(request: web.Request, target: Target) -> str | None:
        method = request.method
        if method == "GET":
            if target.watch_path or _flag(request.query.get("watch")):
                return "watch"
            return "get" if target.name else "list"
        if method == "POST":
            if not target.name:
                return "create"
            return "create" if target.subresource in ("binding", "eviction") else None
        if method == "PUT" and target.name:
            return "update"
        if method == "PATCH" and target.name:
            return "patch"
        if method == "DELETE":
            return "delete" if target.name else "deletecollection"
        return None

    def _view(self, request: web.Request, kind: Kind) -> View | status.Failure:
        return negotiate(request.headers.get("Accept"), kind, include_object=request.query.get("includeObject"))

    def _selectors(
        self, request: web.Request, kind: Kind
    ) -> tuple[selectors.LabelSelector, selectors.FieldSelector] | status.Failure:
        labels = selectors.parse_labels(request.query.get("labelSelector"))
        if isinstance(labels, status.Failure):
            return labels
        fields = selectors.parse_fields(request.query.get("fieldSelector"), kind)
        if isinstance(fields, status.Failure):
            return fields
        return labels, fields

    def _render(self, request: web.Request, kind: Kind, obj: Obj | status.Failure, code: int = 200) -> web.Response:
        if isinstance(obj, status.Failure):
            return _failure(obj)
        view = self._view(request, kind)
        if isinstance(view, status.Failure):
            view = View(kind=kind)
        return _json(view.render(obj, now=self.clock()), code)

    # --- Verbs ---

    async def _get(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        found = self.api.get(kind, target.namespace, target.name)
        if target.subresource == "scale" and not isinstance(found, status.Failure):
            return _json(views.scale(found))
        return self._render(request, kind, found)

    async def _list(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        view = self._view(request, kind)
        if isinstance(view, status.Failure):
            return _failure(view)
        chosen = self._selectors(request, kind)
        if isinstance(chosen, status.Failure):
            return _failure(chosen)
        labels, fields = chosen
        namespace = target.namespace if kind.namespaced and target.namespace else None
        items = self.api.select(kind, namespace, labels, fields)
        rv = self.api.store.resource_version
        return _json(view.render_list(items, resource_version=rv, now=self.clock()))

    async def _watch(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        view = self._view(request, kind)
        if isinstance(view, status.Failure):
            return _failure(view)
        chosen = self._selectors(request, kind)
        if isinstance(chosen, status.Failure):
            return _failure(chosen)
        labels, fields = chosen
        query = request.query
        if target.name:
            fields = selectors.FieldSelector(
                (
                    *fields.requirements,
                    selectors.FieldRequirement(path=("metadata", "name"), value=target.name, negated=False),
                )
            )
        initial = _flag(query.get("sendInitialEvents"))
        since: int | None = None
        version = query.get("resourceVersion") or ""
        if not initial and version not in ("", "0"):
            if not version.isdigit():
                return _failure(status.bad_request(f"invalid resource version: {version}"))
            since = int(version)
        timeout_s = self.config.watch_timeout_max_s
        given = query.get("timeoutSeconds")
        if given is not None and given.isdigit():
            timeout_s = min(float(given), timeout_s)
        watcher = watching.Watcher(
            view=view,
            namespace=target.namespace if kind.namespaced and target.namespace else None,
            labels=labels,
            fields=fields,
            bookmarks=_flag(query.get("allowWatchBookmarks")),
            buffer_events=self.config.watcher_buffer_events,
        )
        failure = self.hub.open(watcher, since=since, initial_events_bookmark=initial and watcher.bookmarks)
        if failure is not None:
            return await self._expired_watch(request, failure)
        response = web.StreamResponse(status=200, headers={**_JSON_HEADERS, "Cache-Control": "no-cache, private"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await watching.stream(
                watcher,
                response.write,
                hub=self.hub,
                timeout_s=timeout_s,
                bookmark_interval_s=self.config.bookmark_interval_s,
                is_connected=lambda: request.transport is not None and not request.transport.is_closing(),
            )
        except (ConnectionError, RuntimeError):
            return response  # the client went away
        finally:
            self.hub.remove(watcher)
            watcher.close()
        if watcher.aborted and request.transport is not None:
            request.transport.abort()
            return response
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response

    async def _expired_watch(self, request: web.Request, failure: status.Failure) -> web.StreamResponse:
        """HTTP 200 with a single ERROR event, then the end: how the API server reports an expired version."""
        response = web.StreamResponse(status=200, headers=_JSON_HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(event_line("ERROR", failure.body()))
        await response.write_eof()
        return response

    async def _create(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        dry_run = request.query.get("dryRun") == "All"
        if target.subresource == "binding":
            return await self._binding(request, target, from_collection=False, body=body)
        if target.subresource == "eviction":
            evicted = await self.api.evict(kind, target.namespace, target.name, body)
            return _failure(evicted) if isinstance(evicted, status.Failure) else _json(evicted, 201)
        created = await self.api.create(kind, target.namespace, body, dry_run=dry_run)
        return self._render(request, kind, created, 201)

    async def _binding(
        self, request: web.Request, target: Target, *, from_collection: bool, body: Any = None
    ) -> web.StreamResponse:
        if from_collection:
            effect = self.faults.take(verb="create", resource="bindings", namespace=target.namespace)
            if effect.delay_s:
                await asyncio.sleep(effect.delay_s)
            if effect.code is not None:
                return _failure(status.injected(effect.code, effect.message))
            try:
                body = await self._body(request)
            except ValueError as exc:
                return _failure(status.bad_request(f"the body of the request could not be decoded: {exc}"))
            name = str(metadata(body).get("name") or "") if isinstance(body, dict) else ""
        else:
            name = target.name
        result = self.api.bind(target.namespace, name, body)
        return _failure(result) if isinstance(result, status.Failure) else _json(result, 201)

    async def _update(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        dry_run = request.query.get("dryRun") == "All"
        if target.subresource == "scale":
            return await self._update_scale(request, kind, target, body, patch_type=None)
        updated = await self.api.update(
            kind, target.namespace, target.name, body, subresource=target.subresource, dry_run=dry_run
        )
        return self._render(request, kind, updated)

    async def _patch(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        dry_run = request.query.get("dryRun") == "All"
        content_type = request.headers.get("Content-Type", "")
        if target.subresource == "scale":
            return await self._update_scale(request, kind, target, body, patch_type=content_type)
        patched = await self.api.patch(
            kind, target.namespace, target.name, content_type, body, subresource=target.subresource, dry_run=dry_run
        )
        return self._render(request, kind, patched)

    async def _update_scale(
        self, request: web.Request, kind: Kind, target: Target, body: Any, *, patch_type: str | None
    ) -> web.StreamResponse:
        current = self.api.get(kind, target.namespace, target.name)
        if isinstance(current, status.Failure):
            return _failure(current)
        scale = views.scale(current)
        if patch_type is not None:
            patched = patches.apply_patch(scale, patch_type, body, strategic_allowed=True)
            if isinstance(patched, status.Failure):
                return _failure(patched)
            scale = patched
        elif isinstance(body, dict):
            scale = body
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return _failure(
                status.invalid(
                    "Scale",
                    target.name,
                    [status.invalid_value("spec.replicas", replicas, "must be a non-negative integer")],
                )
            )
        change = {
            "spec": {"replicas": replicas},
            "metadata": {"resourceVersion": metadata(scale).get("resourceVersion")},
        }
        updated = await self.api.patch(kind, target.namespace, target.name, patches.MERGE_PATCH, change)
        if isinstance(updated, status.Failure):
            return _failure(updated)
        return _json(views.scale(updated))

    async def _delete(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        options = DeleteOptions.from_body(
            body,
            grace=request.query.get("gracePeriodSeconds"),
            propagation=request.query.get("propagationPolicy"),
            dry_run=request.query.get("dryRun") == "All",
        )
        deleted = await self.api.delete(kind, target.namespace, target.name, options)
        return self._render(request, kind, deleted)

    async def _delete_collection(
        self, request: web.Request, kind: Kind, target: Target, body: Any
    ) -> web.StreamResponse:
        chosen = self._selectors(request, kind)
        if isinstance(chosen, status.Failure):
            return _failure(chosen)
        labels, fields = chosen
        options = DeleteOptions.from_body(
            body,
            grace=request.query.get("gracePeriodSeconds"),
            propagation=request.query.get("propagationPolicy"),
            dry_run=request.query.get("dryRun") == "All",
        )
        namespace = target.namespace if kind.namespaced and target.namespace else None
        deleted = []
        for obj in self.api.select(kind, namespace, labels, fields):
            meta = metadata(obj)
            result = await self.api.delete(kind, str(meta.get("namespace") or ""), str(meta.get("name")), options)
            if not isinstance(result, status.Failure):
                deleted.append(result)
        view = View(kind=kind)
        return _json(view.render_list(deleted, resource_version=self.api.store.resource_version, now=self.clock()))

    _handlers: ClassVar[
        dict[str, Callable[[Server, web.Request, Kind, Target, Any], Awaitable[web.StreamResponse]]]
    ] = {
        "get": _get,
        "list": _list,
        "watch": _watch,
        "create": _create,
        "update": _update,
        "patch": _patch,
        "delete": _delete,
        "deletecollection": _delete_collection,
    }

"""The HTTP face of the emulator: aiohttp, one catch-all route, the Kubernetes URL scheme parsed by hand.

Kubernetes paths are regular (``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` and the same under
``/apis/GROUP/VERSION``), and the set of kinds changes when a CRD is applied, so one handler parses the path
against the registry (``routing.py``) rather than registering routes. Every request is first authenticated and
held to RBAC (``access``: a request without a token is the administrator). It maps verbs to the API layer, renders
objects through the negotiated view, streams watches (chunked, one event per line, flushed per batch), serves
discovery and OpenAPI, applies injected faults, and exposes the test hooks under ``/_emulator/`` for tests that run
the emulator as a separate process. Every body is ``application/json`` exactly; every error is a ``Status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from aiohttp import web

from common import logs
from quotient.emulator import (
    accessreviews,
    discovery,
    openapi,
    patches,
    podlogs,
    podproxy,
    routing,
    selectors,
    status,
    testhooks,
    tokenreview,
    views,
    watching,
)
from quotient.emulator.access import Access
from quotient.emulator.api import Api
from quotient.emulator.containerlogs import ContainerLogs
from quotient.emulator.faults import Faults
from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj, metadata
from quotient.emulator.routing import Target, failure_response, json_response
from quotient.emulator.views import View, event_line

log = logs.get("emulator.server")

_MAX_BODY_BYTES = 16 * 1024 * 1024
Handler = Callable[[web.Request, Kind, Target, Any], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    bookmark_interval_s: float = 10.0
    watch_timeout_max_s: float = 1800.0  # the API server's --min-request-timeout
    watcher_buffer_events: int = watching.DEFAULT_BUFFER_EVENTS


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
        logs: ContainerLogs | None = None,
    ) -> None:
        self.api = api
        self.logs = logs or ContainerLogs()
        """What the containers printed (the kubelets'), served as ``pods/log``."""
        self.pod_proxy = podproxy.Proxy()
        """Where pods' ports "listen", for ``pods/proxy``."""
        self.hub = hub
        self.faults = faults
        self.hooks = hooks
        self.access = Access(api.store, clock=clock)
        self.config = config
        self.clock = clock
        self.registry: Registry = api.registry
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._handlers: dict[str, Handler] = {
            "get": self._get,
            "list": self._list,
            "watch": self._watch,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
            "deletecollection": self._delete_collection,
        }

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
        await self.pod_proxy.close()

    # --- Dispatch ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request_failed", method=request.method, path=request.path)
            return failure_response(status.internal("the emulator failed on this request; see its log"))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        # Authentication, then RBAC for paths outside the resource tree (``access``; resources in ``_resource``).
        refused = self.access.authenticate(request) or self.access.check_path(request, path)
        if refused is not None:
            return failure_response(refused)
        proxied = podproxy.parse(request.path)
        if proxied is not None:
            return await self._proxy(request, proxied)
        if path.startswith(("/api/", "/apis/")) or path in ("/api", "/apis"):
            document = self._discovery(request, path)
            if isinstance(document, status.Failure):
                return failure_response(document)
            if document is not None:
                return json_response(document)
            target = routing.parse_resource_path(path)
            if target is None:
                return failure_response(routing.NOT_FOUND)
            return await self._resource(request, target)
        if path == "/version":
            return json_response(discovery.VERSION)
        if path.startswith("/openapi/v3"):
            document = openapi.at(self.registry, path[len("/openapi/v3") :])
            return json_response(document) if document is not None else failure_response(routing.NOT_FOUND)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path.startswith("/_emulator/"):
            code, body = await testhooks.answer(request, path, hooks=self.hooks, faults=self.faults)
            return json_response(body, code)
        return failure_response(routing.NOT_FOUND)

    def _discovery(self, request: web.Request, path: str) -> Obj | status.Failure | None:
        parts = [part for part in path.split("/") if part]
        if request.method != "GET" or not discovery.is_document(parts):
            return None
        address = f"{self.host}:{self.port}"
        return discovery.document(self.registry, parts, server_address=address) or routing.NOT_FOUND

    async def _resource(self, request: web.Request, target: Target) -> web.StreamResponse:
        refused = self.access.check_resource(request, target)
        if refused is not None:
            return failure_response(refused)
        if target.group == "" and target.plural == "bindings" and request.method == "POST" and not target.name:
            return await self._binding(request, target, from_collection=True)
        kind = self.registry.lookup(target.group, target.version, target.plural)
        if kind is None:
            return failure_response(routing.NOT_FOUND)
        if target.subresource and target.subresource not in kind.subresources:
            return failure_response(routing.NOT_FOUND)
        if target.namespace and not kind.namespaced:
            return failure_response(routing.NOT_FOUND)
        if kind.namespaced and not target.namespace and (target.name or request.method not in ("GET", "DELETE")):
            if request.method == "POST" and not target.name:
                return failure_response(status.method_not_allowed("create a namespaced object under /namespaces/NAME/"))
            return failure_response(routing.NOT_FOUND)
        verb = routing.verb(request, target)
        if verb is None or (not target.subresource and verb not in kind.verbs):
            return failure_response(status.method_not_allowed(f"the server does not allow {request.method} here"))
        injected = await self._fault(
            request,
            verb=verb,
            resource=target.plural,
            subresource=target.subresource,
            namespace=target.namespace,
            name=target.name,
        )
        if injected is not None:
            return injected
        try:
            body = await routing.read_body(request) if request.method in ("POST", "PUT", "PATCH", "DELETE") else None
        except routing.UnsupportedBody as exc:
            return failure_response(status.Failure(code=415, reason="UnsupportedMediaType", message=str(exc)))
        except (ValueError, yaml.YAMLError) as exc:
            return failure_response(status.bad_request(f"the body of the request could not be decoded: {exc}"))
        return await self._handlers[verb](request, kind, target, body)

    async def _fault(
        self, request: web.Request, *, verb: str, resource: str, subresource: str = "", namespace: str, name: str = ""
    ) -> web.StreamResponse | None:
        """The injected answer to this request, after any injected delay; None to answer it normally."""
        effect = self.faults.take(verb=verb, resource=resource, subresource=subresource, namespace=namespace, name=name)
        if effect.delay_s:
            await asyncio.sleep(effect.delay_s)
        if effect.code is None:
            return None
        if verb == "watch" and effect.code == 410:
            return await self._expired_watch(request, status.expired(effect.message))
        return failure_response(status.injected(effect.code, effect.message))

    # --- Verbs ---

    def _render(self, request: web.Request, kind: Kind, obj: Obj | status.Failure, code: int = 200) -> web.Response:
        return routing.object_response(request, kind, obj, now=self.clock(), code=code)

    @staticmethod
    def _reading(
        request: web.Request, kind: Kind
    ) -> tuple[View, selectors.LabelSelector, selectors.FieldSelector] | status.Failure:
        """What a list or a watch asks for: its view and its selection."""
        view = routing.view(request, kind)
        if isinstance(view, status.Failure):
            return view
        chosen = routing.selection(request, kind)
        if isinstance(chosen, status.Failure):
            return chosen
        return view, *chosen

    async def _proxy(self, request: web.Request, target: podproxy.ProxyTarget) -> web.StreamResponse:
        verb = podproxy.verb(request.method)
        if verb is None:
            return failure_response(status.method_not_allowed(f"the server does not proxy {request.method}"))
        refused = self.access.check_resource(request, podproxy.attributes_target(target), verb)
        if refused is not None:
            return failure_response(refused)
        namespace, name = target.namespace, target.name
        injected = await self._fault(
            request, verb=verb, resource="pods", subresource="proxy", namespace=namespace, name=name
        )
        if injected is not None:
            return injected
        return await self.pod_proxy.serve(request, target, pod=self.api.store.get("pods", namespace, name))

    async def _get(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        if target.subresource == "log":
            pod = self.api.store.get("pods", target.namespace, target.name)
            return await podlogs.serve(request, pod=pod, name=target.name, logs=self.logs)
        found = self.api.get(kind, target.namespace, target.name)
        if target.subresource == "scale" and not isinstance(found, status.Failure):
            return json_response(views.scale(found))
        return self._render(request, kind, found)

    async def _list(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        reading = self._reading(request, kind)
        if isinstance(reading, status.Failure):
            return failure_response(reading)
        view, labels, fields = reading
        namespace = target.namespace if kind.namespaced and target.namespace else None
        items = self.api.select(kind, namespace, labels, fields)
        rv = self.api.store.resource_version
        return json_response(view.render_list(items, resource_version=rv, now=self.clock()))

    async def _watch(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        reading = self._reading(request, kind)
        if isinstance(reading, status.Failure):
            return failure_response(reading)
        view, labels, fields = reading
        query = request.query
        if target.name:
            fields = selectors.FieldSelector(
                (
                    *fields.requirements,
                    selectors.FieldRequirement(path=("metadata", "name"), value=target.name, negated=False),
                )
            )
        initial = routing.flag(query.get("sendInitialEvents"))
        since: int | None = None
        version = query.get("resourceVersion") or ""
        if not initial and version not in ("", "0"):
            if not version.isdigit():
                return failure_response(status.bad_request(f"invalid resource version: {version}"))
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
            bookmarks=routing.flag(query.get("allowWatchBookmarks")),
            buffer_events=self.config.watcher_buffer_events,
        )
        failure = self.hub.open(watcher, since=since, initial_events_bookmark=initial and watcher.bookmarks)
        if failure is not None:
            return await self._expired_watch(request, failure)
        response = web.StreamResponse(
            status=200, headers={**routing.JSON_HEADERS, "Cache-Control": "no-cache, private"}
        )
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
        response = web.StreamResponse(status=200, headers=routing.JSON_HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(event_line("ERROR", failure.body()))
        await response.write_eof()
        return response

    async def _create(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        if target.subresource == "binding":
            return await self._binding(request, target, from_collection=False, body=body)
        if target.subresource == "token":
            issued = self.access.token_request(target.namespace, target.name, body)
            return failure_response(issued) if isinstance(issued, status.Failure) else json_response(issued, 201)
        if kind.group == tokenreview.GROUP and kind.plural == tokenreview.PLURAL:
            reviewed = tokenreview.review(self.access.tokens, body, now_s=self.clock())
            return failure_response(reviewed) if isinstance(reviewed, status.Failure) else json_response(reviewed, 201)
        if accessreviews.is_review(kind.group, kind.plural):
            reviewed = accessreviews.answer(
                kind.group,
                kind.plural,
                body,
                namespace=target.namespace,
                requester=self.access.user_of(request),
                policy=self.access.policy(),
                now_s=self.clock(),
            )
            return failure_response(reviewed) if isinstance(reviewed, status.Failure) else json_response(reviewed, 201)
        if target.subresource == "eviction":
            evicted = await self.api.evict(kind, target.namespace, target.name, body)
            return failure_response(evicted) if isinstance(evicted, status.Failure) else json_response(evicted, 201)
        writing = routing.writing(request)
        created = await self.api.create(kind, target.namespace, body, dry_run=routing.dry_run(request), writing=writing)
        return routing.warned(self._render(request, kind, created, 201), writing)

    async def _binding(
        self, request: web.Request, target: Target, *, from_collection: bool, body: Any = None
    ) -> web.StreamResponse:
        if from_collection:
            injected = await self._fault(request, verb="create", resource="bindings", namespace=target.namespace)
            if injected is not None:
                return injected
            try:
                body = await routing.read_body(request)
            except ValueError as exc:
                return failure_response(status.bad_request(f"the body of the request could not be decoded: {exc}"))
            name = str(metadata(body).get("name") or "") if isinstance(body, dict) else ""
        else:
            name = target.name
        result = self.api.bind(target.namespace, name, body)
        return failure_response(result) if isinstance(result, status.Failure) else json_response(result, 201)

    async def _update(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        if target.subresource == "scale":
            return await self._update_scale(request, kind, target, body, patch_type=None)
        writing = routing.writing(request)
        updated = await self.api.update(
            kind,
            target.namespace,
            target.name,
            body,
            subresource=target.subresource,
            dry_run=routing.dry_run(request),
            writing=writing,
        )
        return routing.warned(self._render(request, kind, updated), writing)

    async def _patch(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "")
        if target.subresource == "scale":
            return await self._update_scale(request, kind, target, body, patch_type=content_type)
        writing = routing.writing(request)
        patched = await self.api.patch(
            kind,
            target.namespace,
            target.name,
            content_type,
            body,
            subresource=target.subresource,
            dry_run=routing.dry_run(request),
            writing=writing,
        )
        return routing.warned(self._render(request, kind, patched), writing)

    async def _update_scale(
        self, request: web.Request, kind: Kind, target: Target, body: Any, *, patch_type: str | None
    ) -> web.StreamResponse:
        current = self.api.get(kind, target.namespace, target.name)
        if isinstance(current, status.Failure):
            return failure_response(current)
        scale = views.scale(current)
        if patch_type is not None:
            patched = patches.apply_patch(scale, patch_type, body, strategic_allowed=True)
            if isinstance(patched, status.Failure):
                return failure_response(patched)
            scale = patched
        elif isinstance(body, dict):
            scale = body
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return failure_response(
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
            return failure_response(updated)
        return json_response(views.scale(updated))

    async def _delete(self, request: web.Request, kind: Kind, target: Target, body: Any) -> web.StreamResponse:
        options = routing.delete_options(request, body)
        deleted = await self.api.delete(kind, target.namespace, target.name, options)
        return self._render(request, kind, deleted)

    async def _delete_collection(
        self, request: web.Request, kind: Kind, target: Target, body: Any
    ) -> web.StreamResponse:
        chosen = routing.selection(request, kind)
        if isinstance(chosen, status.Failure):
            return failure_response(chosen)
        labels, fields = chosen
        options = routing.delete_options(request, body)
        namespace = target.namespace if kind.namespaced and target.namespace else None
        deleted = []
        for obj in self.api.select(kind, namespace, labels, fields):
            meta = metadata(obj)
            result = await self.api.delete(kind, str(meta.get("namespace") or ""), str(meta.get("name")), options)
            if not isinstance(result, status.Failure):
                deleted.append(result)
        view = View(kind=kind)
        return json_response(
            view.render_list(deleted, resource_version=self.api.store.resource_version, now=self.clock())
        )

"""The Kubernetes adapter: the only module that imports ``kubernetes``. Everything else sees :class:`KubeApi`.

It holds one responsibility, the adapter, and is longer than most modules because the vendor library must stay
inside it (an import-linter contract): every call, its error mapping and its transport details live here.

Why it is shaped this way:
- Objects are plain JSON dicts, not the client's pydantic models. The scheduler reads a handful of fields from
  thousands of pods; a running pod decodes in about 17 us with ``json.loads`` and 300 us as a ``V1Pod`` (measured
  here with client 37.0.2), so models would cost a second per relist of 3,000 pods, and dicts carry the custom
  resources (Queue, PodGroup) and any owner kind the same way. Every call goes through the client's
  ``ApiClient`` (configuration, TLS, bearer tokens and their refresh, connection pool) without preloading the
  answer, and the body is decoded once with ``json.loads``.
- One generic path serves every resource, core or grouped, by its :class:`Resource` (group, version, plural),
  as ``kubectl`` and the dynamic client do; the table of kinds below covers the owners the grouper follows, and
  API discovery covers the rest.
- Binding uses the client's ``create_namespaced_pod_binding_without_preload_content``: the API server answers
  ``201`` with a ``Status``, which the client's own parser would try to read as a ``V1Binding`` and fail on after the
  bind happened. The status code is checked here: 201 bound, 409 already assigned, 404 gone, as values.
- Watches are read line by line from the raw stream (one JSON event per line) with a server-side
  ``timeoutSeconds`` and a client read timeout, because silent hangs happen. The client's ``Watch`` helper is not
  used: it reconnects and retries ``410`` on its own, which hides the gap the reflector must repair by relisting.
- Every ``ApiException``, aiohttp error and timeout becomes a :mod:`scheduler.kube.errors` class here.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client import exceptions as k8s_exceptions
from kubernetes.aio.config import config_exception as k8s_config_exception

from common import logs
from common.errors import ConfigError
from scheduler.kube import errors, watchstream
from scheduler.kube.errors import KubeConflict, KubeError, KubeNotFound, KubeUnavailable
from scheduler.kube.kubeapi import (
    KNOWN_RESOURCES,
    PODS,
    BindOutcome,
    BindResult,
    EvictOutcome,
    EvictResult,
    Obj,
    ObjectList,
    PatchType,
    Resource,
    WatchEvent,
    rfc3339,
)

log = logs.get("scheduler.kube.client")

USER_AGENT = "quotient-scheduler/0.1.0"
# A list is fetched in pages of this many objects (kubectl and the informers use 500): one huge answer holds the
# API server's memory and ours at once.
LIST_PAGE_SIZE = 500
# A TCP connect to a live API server takes milliseconds; past this it is down or unreachable.
CONNECT_TIMEOUT_S = 10.0
_ALREADY_ASSIGNED = re.compile(r'already assigned to node "([^"]+)"')


def _no_kubeconfig(path: str | Path | None) -> str | None:
    """Why no kubeconfig can be read (None when one of its files exists): ``path``, else ``$KUBECONFIG``'s list,
    else ``~/.kube/config``. The client library would say "Invalid kube-config file" for a file that is not there."""
    if path is not None:
        files = [str(path)]
    else:
        listed = [item for item in os.environ.get("KUBECONFIG", "").split(os.pathsep) if item]
        files = listed or [str(Path("~/.kube/config").expanduser())]
    if any(Path(file).is_file() for file in files):
        return None
    return (
        f"--kubeconfig: no kubeconfig file found (looked for {', '.join(files)}); give --kubeconfig FILE, set "
        "$KUBECONFIG, or name the API server with --kube-server URL"
    )


class KubeClient:
    """:class:`KubeApi` over ``kubernetes.aio``. Make one with a ``for_*``/``from_*`` constructor; ``close`` it."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        request_timeout_s: float = 30.0,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self._api = api_client
        self._api.user_agent = USER_AGENT
        self._core = k8s.CoreV1Api(api_client)
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = min(CONNECT_TIMEOUT_S, request_timeout_s)
        self._page_size = page_size
        self._discovered: dict[str, dict[str, Resource]] = {}
        self.malformed_watch_lines = 0
        """Watch lines that were not events (counted and skipped, never fatal)."""

    @classmethod
    def for_server(cls, url: str, *, request_timeout_s: float = 30.0, page_size: int = LIST_PAGE_SIZE) -> KubeClient:
        """A client for a plain server URL without credentials, as the local emulator serves it."""
        configuration = k8s.Configuration(host=url.rstrip("/"))
        # Loopback: never route through a proxy named in the environment.
        configuration.client_session_kwargs = {"trust_env": False}
        api_client = k8s.ApiClient(configuration=configuration)
        return cls(api_client, request_timeout_s=request_timeout_s, page_size=page_size)

    @classmethod
    async def from_kubeconfig(
        cls, path: str | Path | None, *, context: str | None = None, request_timeout_s: float = 30.0
    ) -> KubeClient:
        """``path`` None: ``$KUBECONFIG`` (its files merged, as kubectl does), else ``~/.kube/config``."""
        missing = _no_kubeconfig(path)
        if missing is not None:
            raise ConfigError(missing)
        configuration = k8s.Configuration()
        try:
            await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path) if path is not None else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (k8s_config_exception.ConfigException, OSError, ValueError) as exc:
            where = path if path is not None else "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
            raise ConfigError(f"--kubeconfig: cannot use {where}: {exc}") from exc
        return cls(k8s.ApiClient(configuration=configuration), request_timeout_s=request_timeout_s)

    @classmethod
    def in_cluster(cls, *, request_timeout_s: float = 30.0) -> KubeClient:
        """The pod's service account, as every in-cluster controller authenticates (the token is re-read)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except k8s_config_exception.ConfigException as exc:
            raise ConfigError(f"not running in a cluster and no --kubeconfig given: {exc}") from exc
        return cls(k8s.ApiClient(configuration=configuration), request_timeout_s=request_timeout_s)

    @classmethod
    async def connect(cls, *, kubeconfig: str | Path | None = None, server: str | None = None) -> KubeClient:
        """The client for the scheduler's flags: a server URL, a kubeconfig file, else the in-cluster account."""
        if server is not None:
            return cls.for_server(server)
        if kubeconfig is not None:
            return await cls.from_kubeconfig(kubeconfig)
        return cls.in_cluster()

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- transport ---

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self._request_timeout_s, sock_connect=self._connect_timeout_s)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: object = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout | None = None,
        accept: str = "application/json",
    ) -> aiohttp.ClientResponse:
        """Send one request through the client's ``ApiClient`` (auth, TLS, pool); the raw answer, not yet read."""
        headers = {"Accept": accept, "Content-Type": content_type}
        try:
            serialized = await self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            answer = await self._api.call_api(
                serialized[0],
                serialized[1],
                header_params=serialized[2],
                body=serialized[3],
                _request_timeout=client_timeout or self._timeout(),
            )
        except k8s_exceptions.ApiException as exc:
            raise errors.from_response(exc.status or 0, exc.body, what=f"{method} {path}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        response: aiohttp.ClientResponse = answer.response
        return response

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: object = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request whose answer is a JSON object; any status other than 2xx raises the mapped error."""
        response = await self._send(method, path, query=query, body=body, content_type=content_type)
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(f"{method} {path}: reading the answer: {type(exc).__name__}: {exc}") from exc
        finally:
            response.release()
        if not 200 <= response.status < 300:
            raise errors.from_response(response.status, data, what=f"{method} {path}")
        try:
            decoded = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise KubeError(f"{method} {path}: the answer is not JSON", status=response.status) from exc
        if not isinstance(decoded, dict):
            raise KubeError(f"{method} {path}: the answer is not a JSON object", status=response.status)
        return decoded

    async def get_text(self, path: str, *, accept: str = "text/plain") -> str:
        """A GET whose answer is not a Kubernetes object: a pod's endpoint through ``pods/proxy`` (the scheduler
        leader's ``/metrics`` for ``quotient explain``). Errors map as for every call."""
        response = await self._send("GET", path, accept=accept)
        try:
            data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(f"GET {path}: reading the answer: {type(exc).__name__}: {exc}") from exc
        finally:
            response.release()
        if not 200 <= response.status < 300:
            raise errors.from_response(response.status, data, what=f"GET {path}")
        return data.decode("utf-8", "replace")

    @staticmethod
    def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
        query = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        return query

    # --- KubeApi ---

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        path = resource.path(namespace=namespace)
        items: list[Obj] = []
        resource_version = ""
        token = ""
        while True:
            query = [*self._selectors(label_selector, field_selector), ("limit", str(self._page_size))]
            if token:
                query.append(("continue", token))
            page = await self._call("GET", path, query=query)
            raw_items = page.get("items") or []
            if not isinstance(raw_items, list):
                raise KubeError(f"GET {path}: items is not a list")
            for item in raw_items:
                if isinstance(item, dict):
                    # A list's items carry no kind of their own; a watch's objects do. Make both alike.
                    item.setdefault("apiVersion", resource.api_version)
                    item.setdefault("kind", resource.kind)
                    items.append(item)
                else:
                    log.warning("list_item_not_an_object", resource=resource.plural, item=repr(item)[:200])
            metadata = page.get("metadata") or {}
            if not resource_version:
                # Every page of one list is one snapshot: the first page's version is the list's.
                resource_version = str(metadata.get("resourceVersion") or "")
            token = str(metadata.get("continue") or "")
            if not token:
                return ObjectList(items=items, resource_version=resource_version)

    async def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
        read_timeout_s: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        path = resource.path(namespace=namespace)
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
            *self._selectors(label_selector, field_selector),
        ]
        # The server ends the stream after timeout_s; silence well past that means a dead connection.
        read_timeout = read_timeout_s if read_timeout_s is not None else timeout_s + 30.0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s, sock_read=read_timeout)
        response = await self._send("GET", path, query=query, client_timeout=timeout)
        what = f"watch {path}"
        try:
            if response.status != 200:
                try:
                    data = await response.read()
                except (aiohttp.ClientError, TimeoutError):
                    data = b""
                raise errors.from_response(response.status, data, what=what)
            lines = watchstream.LineBuffer()
            try:
                async for chunk in response.content.iter_any():
                    for line in lines.feed(chunk):
                        event = self._decode(line, what)
                        if isinstance(event, KubeError):
                            raise event
                        if event is not None:
                            yield event
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise KubeUnavailable(f"{what}: the stream broke: {type(exc).__name__}: {exc}") from exc
            tail = lines.rest()
            if tail:
                event = self._decode(tail, what)
                if isinstance(event, KubeError):
                    raise event
                if event is not None:
                    yield event
        finally:
            # Closing (not releasing) a stream read part-way: its connection cannot serve another request.
            response.close()

    def _decode(self, line: bytes, what: str) -> WatchEvent | KubeError | None:
        event = watchstream.decode_watch_line(line)
        if event is None:
            self.malformed_watch_lines += 1
            log.warning("watch_line_malformed", watch=what, line=line[:200].decode("utf-8", "replace"))
        return event

    async def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return await self._call("GET", resource.path(namespace=namespace, name=name))
        except KubeNotFound:
            return None

    async def resolve(self, *, api_version: str, kind: str) -> Resource | None:
        known = KNOWN_RESOURCES.get((api_version, kind))
        if known is not None:
            return known
        if api_version not in self._discovered:
            self._discovered[api_version] = await self._discover(api_version)
        return self._discovered[api_version].get(kind)

    async def _discover(self, api_version: str) -> dict[str, Resource]:
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            listing = await self._call("GET", path)
        except KubeNotFound:
            return {}
        found: dict[str, Resource] = {}
        for entry in listing.get("resources") or []:
            if not isinstance(entry, dict):
                continue
            name, entry_kind = entry.get("name"), entry.get("kind")
            if isinstance(name, str) and "/" not in name and isinstance(entry_kind, str):
                found[entry_kind] = Resource(
                    group=group, version=version, plural=name, kind=entry_kind, namespaced=bool(entry.get("namespaced"))
                )
        return found

    async def create(self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None) -> Obj:
        return await self._call("POST", resource.path(namespace=namespace), body=dict(body))

    async def replace(
        self, resource: Resource, body: Mapping[str, Any], *, name: str, namespace: str | None = None
    ) -> Obj:
        return await self._call("PUT", resource.path(namespace=namespace, name=name), body=dict(body))

    async def patch(
        self,
        resource: Resource,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        name: str,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Obj:
        body: object
        if patch_type is PatchType.JSON:
            if isinstance(patch, Mapping):
                raise ValueError("a JSON patch is a list of operations, not a mapping")
            body = [dict(operation) for operation in patch]
        else:
            if not isinstance(patch, Mapping):
                raise ValueError(f"a {patch_type.name.lower()} patch is a mapping, not a list")
            body = dict(patch)
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._call("PATCH", path, body=body, content_type=patch_type.value)

    async def delete(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        grace_period_s: int | None = None,
    ) -> Obj | None:
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        try:
            return await self._call("DELETE", resource.path(namespace=namespace, name=name), body=options)
        except KubeNotFound:
            return None

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        # The uid makes the bind a precondition on this very pod: a namesake created meanwhile answers 409.
        binding = k8s.V1Binding(
            metadata=k8s.V1ObjectMeta(
                name=name, namespace=namespace, uid=uid, annotations=dict(annotations) if annotations else None
            ),
            target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        what = f"bind pods/{namespace}/{name} to {node}"
        try:
            response = await self._core.create_namespaced_pod_binding_without_preload_content(
                name=name, namespace=namespace, body=binding, _request_timeout=float(self._request_timeout_s)
            )
            try:
                data = await response.read()
            finally:
                response.release()
        except k8s_exceptions.ApiException as exc:
            raise errors.from_response(exc.status or 0, exc.body, what=what) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
        status = response.status
        if 200 <= status < 300:
            return BindResult(outcome=BindOutcome.BOUND)
        error = errors.from_response(status, data, what=what)
        if status == 409:
            assigned = _ALREADY_ASSIGNED.search(error.message)
            return BindResult(
                outcome=BindOutcome.ALREADY_ASSIGNED,
                message=error.message,
                node=assigned.group(1) if assigned else None,
            )
        if status == 404:
            return BindResult(outcome=BindOutcome.POD_GONE, message=error.message)
        raise error

    async def evict_pod(
        self, *, namespace: str, name: str, uid: str, reason: str, message: str, grace_period_s: int | None = None
    ) -> EvictResult:
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": rfc3339(datetime.datetime.now(datetime.UTC)),
        }
        written = False
        try:
            # Strategic merge: conditions merge by type, so the pod's other conditions stay.
            await self.patch(
                PODS,
                {"status": {"conditions": [condition]}},
                name=name,
                namespace=namespace,
                subresource="status",
                patch_type=PatchType.STRATEGIC,
            )
            written = True
        except KubeNotFound:
            return EvictResult(outcome=EvictOutcome.POD_GONE, condition_written=False)
        except KubeError as exc:
            # The condition is a courtesy to the pod's owner; the eviction itself is the delete.
            log.warning("disruption_condition_not_written", pod=f"{namespace}/{name}", error=str(exc))
        try:
            deleted = await self.delete(PODS, name=name, namespace=namespace, uid=uid, grace_period_s=grace_period_s)
        except KubeConflict:
            # The uid precondition failed: the pod we meant is gone and a namesake took its place.
            return EvictResult(outcome=EvictOutcome.POD_GONE, condition_written=written)
        if deleted is None:
            return EvictResult(outcome=EvictOutcome.POD_GONE, condition_written=written)
        return EvictResult(outcome=EvictOutcome.EVICTED, condition_written=written)

"""The ``pods/proxy`` subresource: ``/api/v1/namespaces/NS/pods/[SCHEME:]NAME[:PORT]/proxy/PATH`` forwarded to the
pod, as the API server forwards it (``kubectl get --raw``, ``kubectl quotient explain`` reading the scheduler
leader's ``/metrics``), so a client needs nothing but its kubeconfig to reach a pod.

A real API server dials the pod's IP. An emulated pod has an IP but nothing listens there, so a test or the demo
says where the pod "listens": ``Proxy.route`` (``Emulator.route_pod(ns, name, port, "host:port")``, as
``route_service`` does for webhooks) maps a pod's port to a local address. The request's method, query, body and
headers (less the hop-by-hop ones, the caller's credentials and impersonation) go there, and the answer comes back
with its status, body and content type. A missing pod is a 404 (``pods "x" not found``); a pod with no route, or
a route where nothing answers, a 503 (``error trying to reach service: ...``), as when the API server cannot dial
a pod. Who may proxy is RBAC's ``pods/proxy`` (``get`` for GET and HEAD, ``create`` for POST, ``update``,
``patch``, ``delete``), on the name as the URL gives it (``NAME:PORT``), as the API server's request info reads it.
A port with no number is port 80, as on a real cluster. A route is for the pod's name; it holds while a pod of
that name exists.
"""

from __future__ import annotations

import dataclasses

import aiohttp
import yarl
from aiohttp import web

from quotient.emulator import routing, status
from quotient.emulator.objects import Obj

_PREFIX = ("api", "v1", "namespaces")
_METHOD_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
    }
)
_TIMEOUT_S = 30.0
_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_PORT = "80"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProxyTarget:
    """A pod proxy request's path, parsed."""

    namespace: str
    name: str
    port: str
    scheme: str
    identifier: str
    """The name as the URL gives it (``NAME:PORT``): what RBAC's ``resourceNames`` match."""
    path: str
    """What goes to the pod: the path after ``/proxy`` (at least ``/``)."""


def parse(path: str) -> ProxyTarget | None:
    """The target of a pod proxy path; None for any other path."""
    parts = path.split("/")
    if parts[:1] != [""] or len(parts) < 8 or tuple(parts[1:4]) != _PREFIX:
        return None
    namespace, plural, identifier, subresource = parts[4], parts[5], parts[6], parts[7]
    if plural != "pods" or subresource != "proxy" or not namespace or not identifier:
        return None
    pieces = identifier.split(":")
    scheme = ""
    if len(pieces) == 3:
        scheme, name, port = pieces
    elif len(pieces) == 2:
        name, port = pieces
    elif len(pieces) == 1:
        name, port = pieces[0], ""
    else:
        return None
    if scheme not in ("", "http", "https") or not name:
        return None
    rest = "/" + "/".join(parts[8:])
    return ProxyTarget(
        namespace=namespace,
        name=name,
        port=port or DEFAULT_PORT,
        scheme=scheme or "http",
        identifier=identifier,
        path=rest,
    )


def verb(method: str) -> str | None:
    """RBAC's verb for a proxied request's method; None for a method the API server does not proxy."""
    return _METHOD_VERBS.get(method.upper())


def attributes_target(target: ProxyTarget) -> routing.Target:
    """The request as RBAC and the faults see it: ``pods/proxy`` on ``NAME:PORT`` in the namespace."""
    return routing.Target(
        group="",
        version="v1",
        plural="pods",
        namespace=target.namespace,
        name=target.identifier,
        subresource="proxy",
        watch_path=False,
    )


class Proxy:
    """Where each pod's ports "listen" ((namespace, name, port) -> ``host:port``), and the forwarding there over one
    HTTP client session (closed with ``close``)."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str, str], str] = {}
        self._session: aiohttp.ClientSession | None = None

    def route(self, namespace: str, name: str, port: int | str, address: str) -> None:
        self._routes[(namespace, name, str(port) or DEFAULT_PORT)] = address

    def unroute(self, namespace: str, name: str, port: int | str | None = None) -> None:
        for key in [key for key in self._routes if key[:2] == (namespace, name)]:
            if port is None or key[2] == str(port):
                del self._routes[key]

    def address(self, namespace: str, name: str, port: str) -> str | None:
        return self._routes.get((namespace, name, port))

    async def serve(self, request: web.Request, target: ProxyTarget, *, pod: Obj | None) -> web.Response:
        """The answer to a proxied request RBAC let through: from the pod's route, or why there is none."""
        if pod is None:
            return routing.failure_response(status.not_found("pods", target.name))
        address = self.address(target.namespace, target.name, target.port)
        if address is None:
            return routing.failure_response(no_route(target))
        return await self.forward(request, target, address)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, request: web.Request, target: ProxyTarget, address: str) -> web.Response:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S), auto_decompress=False
            )
        headers = {
            key: value
            for key, value in request.headers.items()
            if key.lower() not in _HOP_BY_HOP and not key.lower().startswith("impersonate-")
        }
        # The path and query go on as the client encoded them, as the API server's proxy passes them.
        raw_path = "/" + "/".join(request.rel_url.raw_path.split("/")[8:])
        query = f"?{request.rel_url.raw_query_string}" if request.rel_url.raw_query_string else ""
        url = yarl.URL(f"{target.scheme}://{address}{raw_path}{query}", encoded=True)
        body = await request.read() if request.body_exists else None
        try:
            async with self._session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                content = await answer.content.read(_MAX_BODY_BYTES)
                # The body is passed as it came (not decompressed), so its Content-Encoding goes with it.
                passed = {key: value for key, value in answer.headers.items() if key.lower() not in _HOP_BY_HOP}
                return web.Response(status=answer.status, body=content, headers=passed)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return routing.failure_response(unreachable(f"{address}: {exc or type(exc).__name__}"))


def unreachable(detail: str) -> status.Failure:
    return status.Failure(code=503, reason="ServiceUnavailable", message=f"error trying to reach service: {detail}")


def no_route(target: ProxyTarget) -> status.Failure:
    return unreachable(
        f"nothing listens on port {target.port} of pod {target.namespace}/{target.name} in the emulator "
        f"(a test or the demo gives it an address with Emulator.route_pod)"
    )

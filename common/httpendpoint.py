"""A minimal asyncio HTTP/1.1 server for plain GET endpoints (``/metrics``, ``/healthz``, ``/readyz``).

prometheus-client's own ``start_http_server`` runs a thread and serves metrics on every path, with no health
endpoints; a readiness probe needs a different answer on ``/healthz``. This server handles one request per
connection (as Prometheus scrapes and kubelet probes do), inside the event loop, with bounded request sizes and a
read timeout so a slow client cannot pin it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping

from common import logs
from common.errors import ConfigError

log = logs.get("http")

_MAX_REQUEST_BYTES = 16 * 1024
_READ_TIMEOUT_S = 5.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    503: "Service Unavailable",
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    status: int = 200
    content_type: str = "text/plain; charset=utf-8"
    body: bytes = b""


Route = Callable[[], Response]


class HttpEndpoint:
    """Serves ``routes`` (path -> function returning a Response) on ``host:port``; port 0 picks a free one."""

    def __init__(self, *, host: str, port: int, routes: Mapping[str, Route], flag: str = "the port") -> None:
        self._host = host
        self._port = port
        self._flag = flag
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen; raises ``ConfigError`` naming the flag when the address cannot be used (a port in use)."""
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)  # asyncio's own text repeats the address
            raise ConfigError(f"{self._flag}: cannot listen on {self._host}:{self._port}: {reason}") from exc
        log.info("http_listening", host=self._host, port=self.port, paths=",".join(sorted(self._routes)))

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_only = False
        try:
            response, head_only = await asyncio.wait_for(self._respond(reader), _READ_TIMEOUT_S)
        except TimeoutError:
            response = Response(status=408, body=b"request timeout\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            response = Response(status=400, body=b"bad request\n")
        except Exception:
            log.exception("http_handler_failed")
            response = Response(status=503, body=b"internal error\n")
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode("ascii") + (b"" if head_only else response.body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_REQUEST_BYTES:
            return Response(status=400, body=b"request too large\n"), False
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3:
            return Response(status=400, body=b"malformed request line\n"), False
        method, target, _version = parts
        if method not in ("GET", "HEAD"):
            return Response(status=405, body=b"only GET\n"), False
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return Response(status=404, body=b"not found\n"), method == "HEAD"
        return route(), method == "HEAD"

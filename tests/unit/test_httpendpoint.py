"""common.httpendpoint: a real asyncio server on a free loopback port, spoken to with raw HTTP/1.1 bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import pytest

from common import httpendpoint
from common.errors import ConfigError
from common.httpendpoint import HttpEndpoint, Response, Route


def failing_route() -> Response:
    raise RuntimeError("the collector broke")


ROUTES: Mapping[str, Route] = {
    "/metrics": lambda: Response(content_type="text/plain; version=0.0.4", body=b"up 1\n"),
    "/healthz": lambda: Response(body=b"ok\n"),
    "/readyz": lambda: Response(status=503, body=b"not ready\n"),
    "/broken": failing_route,
}


@pytest.fixture
async def endpoint() -> AsyncIterator[HttpEndpoint]:
    server = HttpEndpoint(host="127.0.0.1", port=0, routes=ROUTES)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


class Reply:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("ascii").split("\r\n")
        self.version, code, self.reason = status_line.split(" ", 2)
        self.status = int(code)
        self.headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in header_lines)}


async def send(port: int, raw: bytes) -> Reply:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return Reply(await asyncio.wait_for(reader.read(), 5))
    finally:
        writer.close()
        await writer.wait_closed()


async def get(port: int, path: str, method: str = "GET") -> Reply:
    return await send(port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: test\r\n\r\n".encode())


async def test_port_zero_picks_a_free_port_that_the_endpoint_reports(endpoint: HttpEndpoint) -> None:
    assert endpoint.port > 0


def test_the_port_is_the_configured_one_before_start() -> None:
    assert HttpEndpoint(host="127.0.0.1", port=9400, routes={}).port == 9400


async def test_a_get_on_a_route_answers_its_response(endpoint: HttpEndpoint) -> None:
    reply = await get(endpoint.port, "/metrics")
    assert (reply.version, reply.status, reply.reason) == ("HTTP/1.1", 200, "OK")
    assert reply.headers == {
        "content-type": "text/plain; version=0.0.4",
        "content-length": "5",
        "connection": "close",
    }
    assert reply.body == b"up 1\n"


async def test_each_route_answers_for_its_own_path(endpoint: HttpEndpoint) -> None:
    healthz, readyz = await asyncio.gather(get(endpoint.port, "/healthz"), get(endpoint.port, "/readyz"))
    assert (healthz.status, healthz.body, healthz.headers["content-type"]) == (
        200,
        b"ok\n",
        "text/plain; charset=utf-8",
    )
    assert (readyz.status, readyz.reason, readyz.body) == (503, "Service Unavailable", b"not ready\n")


async def test_a_query_string_does_not_change_the_route(endpoint: HttpEndpoint) -> None:
    reply = await get(endpoint.port, "/metrics?name[]=up")
    assert (reply.status, reply.body) == (200, b"up 1\n")


async def test_an_unknown_path_is_404(endpoint: HttpEndpoint) -> None:
    reply = await get(endpoint.port, "/nope")
    assert (reply.status, reply.reason, reply.body) == (404, "Not Found", b"not found\n")


async def test_a_path_that_only_starts_like_a_route_is_404(endpoint: HttpEndpoint) -> None:
    assert (await get(endpoint.port, "/metrics/x")).status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
async def test_a_method_other_than_get_is_405(endpoint: HttpEndpoint, method: str) -> None:
    reply = await get(endpoint.port, "/metrics", method=method)
    assert (reply.status, reply.reason) == (405, "Method Not Allowed")


async def test_a_post_with_a_body_is_405(endpoint: HttpEndpoint) -> None:
    reply = await send(endpoint.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert reply.status == 405


async def test_head_is_accepted_like_get(endpoint: HttpEndpoint) -> None:
    assert (await get(endpoint.port, "/healthz", method="HEAD")).status == 200


@pytest.mark.parametrize(
    "raw",
    [b"GARBAGE\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET / metrics HTTP/1.1\r\n\r\n", b"\r\n\r\n", b"\x00\xff\r\n\r\n"],
    ids=["one_word", "no_version", "four_parts", "empty_line", "binary"],
)
async def test_a_garbage_request_line_is_400(endpoint: HttpEndpoint, raw: bytes) -> None:
    reply = await send(endpoint.port, raw)
    assert (reply.status, reply.reason) == (400, "Bad Request")


async def test_a_request_head_larger_than_the_limit_is_400(endpoint: HttpEndpoint) -> None:
    padding = b"X-Pad: " + b"a" * (20 * 1024) + b"\r\n"
    reply = await send(endpoint.port, b"GET /metrics HTTP/1.1\r\n" + padding + b"\r\n")
    assert (reply.status, reply.body) == (400, b"request too large\n")


async def test_a_request_head_beyond_the_read_buffer_is_400(endpoint: HttpEndpoint) -> None:
    padding = b"X-Pad: " + b"a" * (200 * 1024) + b"\r\n"
    reply = await send(endpoint.port, b"GET /metrics HTTP/1.1\r\n" + padding + b"\r\n")
    assert reply.status == 400


async def test_a_client_that_hangs_up_mid_request_does_not_disturb_the_server(endpoint: HttpEndpoint) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(b"GET /metr")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    assert (await get(endpoint.port, "/healthz")).status == 200


async def test_a_slow_client_does_not_block_other_requests(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long timeout: the slow connection stays pending for the whole test, so the other request cannot have been
    # answered because the slow one timed out first.
    monkeypatch.setattr(httpendpoint, "_READ_TIMEOUT_S", 60.0)
    slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    slow_writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    await slow_writer.drain()
    try:
        replies = await asyncio.wait_for(asyncio.gather(*(get(endpoint.port, "/healthz") for _ in range(5))), 5)
        assert [reply.status for reply in replies] == [200] * 5
        # The slow client was still being waited for, not dropped: finishing its head now gets its answer.
        slow_writer.write(b"\r\n")
        await slow_writer.drain()
        slow = Reply(await asyncio.wait_for(slow_reader.read(), 5))
        assert (slow.status, slow.body) == (200, b"up 1\n")
    finally:
        slow_writer.close()
        await slow_writer.wait_closed()


async def test_a_client_that_never_finishes_its_request_head_gets_408_after_the_timeout(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpendpoint, "_READ_TIMEOUT_S", 0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        await writer.drain()
        reply = Reply(await asyncio.wait_for(reader.read(), 5))
    finally:
        writer.close()
        await writer.wait_closed()
    assert (reply.status, reply.body) == (408, b"request timeout\n")


async def test_a_route_that_raises_answers_503_and_the_server_keeps_serving(
    endpoint: HttpEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    reply = await get(endpoint.port, "/broken")
    assert (reply.status, reply.reason, reply.body) == (503, "Service Unavailable", b"internal error\n")
    assert any(record.getMessage() == "http_handler_failed" and record.exc_info for record in caplog.records)
    assert (await get(endpoint.port, "/metrics")).status == 200


async def test_an_unknown_status_gets_a_generic_reason() -> None:
    server = HttpEndpoint(host="127.0.0.1", port=0, routes={"/teapot": lambda: Response(status=418)})
    await server.start()
    try:
        reply = await get(server.port, "/teapot")
    finally:
        await server.close()
    assert (reply.status, reply.reason, reply.headers["content-length"], reply.body) == (418, "Error", "0", b"")


async def test_a_closed_endpoint_refuses_connections_and_closes_twice_quietly() -> None:
    server = HttpEndpoint(host="127.0.0.1", port=0, routes=ROUTES)
    await server.start()
    port = server.port
    await server.close()
    await server.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_port_in_use_is_a_config_error_that_names_the_flag(endpoint: HttpEndpoint) -> None:
    second = HttpEndpoint(host="127.0.0.1", port=endpoint.port, routes=ROUTES, flag="--metrics-port")
    with pytest.raises(ConfigError) as raised:
        await second.start()
    assert str(raised.value) == f"--metrics-port: cannot listen on 127.0.0.1:{endpoint.port}: address already in use"

"""The ``pods/log`` subresource (``kubectl logs POD [-c C] [--tail N] [--since D] [--timestamps] [--previous] [-f]``):
what the emulated container printed (``containerlogs``), answered as the API server and the kubelet answer it.

The API server picks the container (the ``container`` parameter, or the pod's only one; else a 400 naming the
choices) and, for a pod not yet bound to a node, answers an empty log; the node's kubelet answers a container that
has not started with ``container "C" in pod "P" is waiting to start: REASON`` and ``--previous`` without an earlier
run with ``previous terminated container "C" in pod "P" not found`` (400 each). The text is ``text/plain``, one line
per line printed (RFC 3339 timestamps first with ``timestamps=true``). ``follow=true`` streams: the lines printed so
far, then each new one as it is printed (or as its time comes, for a line written ahead), until the container stops
or the pod is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from quotient.emulator import containerlogs, routing, status
from quotient.emulator.containerlogs import ContainerLogs, LogOptions
from quotient.emulator.objects import Obj, metadata, parse_timestamp

_TEXT_HEADERS = {"Content-Type": "text/plain"}
_IDLE_CHECK_S = 5.0
"""How long a follower waits for a change before it checks its client is still there."""


def options_of(query: Mapping[str, str], *, now_ns: int) -> LogOptions | status.Failure:
    """The log options of a request's query, checked as ``PodLogOptions`` is validated (422 when not valid)."""
    causes: list[status.Cause] = []
    numbers: dict[str, int | None] = {}
    for field in ("tailLines", "sinceSeconds", "limitBytes"):
        raw = query.get(field)
        if raw is None:
            numbers[field] = None
            continue
        try:
            numbers[field] = int(raw)
        except ValueError:
            return status.bad_request(f'{field}: invalid value "{raw}": not an integer')
    if (numbers["tailLines"] or 0) < 0:
        causes.append(status.invalid_value("tailLines", numbers["tailLines"], "must be greater than or equal to 0"))
    if numbers["sinceSeconds"] is not None and numbers["sinceSeconds"] < 1:
        causes.append(status.invalid_value("sinceSeconds", numbers["sinceSeconds"], "must be greater than 0"))
    if numbers["limitBytes"] is not None and numbers["limitBytes"] < 1:
        causes.append(status.invalid_value("limitBytes", numbers["limitBytes"], "must be greater than 0"))
    since_time = parse_timestamp(query.get("sinceTime")) if query.get("sinceTime") else None
    if query.get("sinceTime") and since_time is None:
        causes.append(status.invalid_value("sinceTime", query.get("sinceTime"), "must be an RFC 3339 time"))
    if since_time is not None and numbers["sinceSeconds"] is not None:
        causes.append(
            status.forbidden_field("sinceSeconds", "at most one of `sinceTime` or `sinceSeconds` may be specified")
        )
    if causes:
        return status.invalid("PodLogOptions", "", causes)
    since_ns: int | None = None
    if numbers["sinceSeconds"] is not None:
        since_ns = now_ns - numbers["sinceSeconds"] * 1_000_000_000
    elif since_time is not None:
        since_ns = int(since_time * 1_000_000_000)
    return LogOptions(
        previous=routing.flag(query.get("previous")),
        timestamps=routing.flag(query.get("timestamps")),
        tail_lines=numbers["tailLines"],
        since_ns=since_ns,
        limit_bytes=numbers["limitBytes"],
    )


def container_of(pod: Obj, asked: str) -> str | status.Failure:
    """The container a log request reads (``ValidateContainer`` of the API server's pod strategy)."""
    name = str(metadata(pod).get("name") or "")
    spec = pod.get("spec") or {}
    containers = [str(c.get("name")) for c in spec.get("containers") or [] if isinstance(c, dict)]
    init = [str(c.get("name")) for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    if not asked:
        if len(containers) == 1:
            return containers[0]
        message = f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
        if init:
            message += f" or one of the init containers: [{' '.join(init)}]"
        return status.bad_request(message)
    if asked not in containers and asked not in init:
        return status.bad_request(f"container {asked} is not valid for pod {name}")
    return asked


def _waiting_reason(pod: Obj, container: str) -> str:
    for found in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(found, dict) and found.get("name") == container:
            waiting = (found.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return str(waiting["reason"])
    return "ContainerCreating"


async def serve(
    request: web.Request,
    *,
    pod: Obj | None,
    name: str,
    logs: ContainerLogs,
    clock_ns: Callable[[], int] = time.time_ns,
) -> web.StreamResponse:
    """The answer to ``GET .../pods/NAME/log``."""
    if pod is None:
        return routing.failure_response(status.not_found("pods", name))
    options = options_of(request.query, now_ns=clock_ns())
    if isinstance(options, status.Failure):
        return routing.failure_response(options)
    container = container_of(pod, request.query.get("container", ""))
    if isinstance(container, status.Failure):
        return routing.failure_response(container)
    if not (pod.get("spec") or {}).get("nodeName"):
        return web.Response(body=b"", headers=_TEXT_HEADERS)  # not bound: the API server has no kubelet to ask
    uid = str(metadata(pod).get("uid"))
    if not logs.has_run(uid, container, previous=options.previous):
        if options.previous:
            message = f'previous terminated container "{container}" in pod "{name}" not found'
        else:
            message = f'container "{container}" in pod "{name}" is waiting to start: {_waiting_reason(pod, container)}'
        return routing.failure_response(status.bad_request(message))
    if not routing.flag(request.query.get("follow")):
        reading = logs.read(uid, container, options, now_ns=clock_ns())
        return web.Response(body=_limited(containerlogs.render(reading.lines, options), options), headers=_TEXT_HEADERS)
    return await _follow(request, logs, uid=uid, container=container, options=options, clock_ns=clock_ns)


async def _follow(
    request: web.Request,
    logs: ContainerLogs,
    *,
    uid: str,
    container: str,
    options: LogOptions,
    clock_ns: Callable[[], int],
) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=_TEXT_HEADERS)
    response.enable_chunked_encoding()
    await response.prepare(request)
    changed = logs.changed(uid)
    position = 0
    sent = 0
    first = True
    with contextlib.suppress(ConnectionError, RuntimeError):
        while request.transport is not None and not request.transport.is_closing():
            changed.clear()
            now_ns = clock_ns()
            shaping = options if first else dataclasses.replace(options, tail_lines=None, since_ns=None)
            reading = logs.read(uid, container, shaping, now_ns=now_ns, after=position)
            position = logs.position(uid, container, now_ns=now_ns)
            first = False
            text = containerlogs.render(reading.lines, options)
            if options.limit_bytes is not None:
                text = text[: max(0, options.limit_bytes - sent)]
            if text:
                await response.write(text)
                sent += len(text)
            limited = options.limit_bytes is not None and sent >= options.limit_bytes
            if reading.ended or limited or not logs.has_run(uid, container, previous=options.previous):
                break
            wait_s = _IDLE_CHECK_S
            if reading.next_at_ns is not None:
                wait_s = min(wait_s, max(0.0, (reading.next_at_ns - now_ns) / 1e9))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait_s)
        await response.write_eof()
    return response


def _limited(text: bytes, options: LogOptions) -> bytes:
    return text[: options.limit_bytes] if options.limit_bytes is not None else text

"""The Kubernetes REST conventions over aiohttp: what a request asks for, and the JSON a response carries.

A resource URL (``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]``, the same under ``/apis/GROUP/VERSION``, optionally
``/watch/``-prefixed) parses into a ``Target``; the method and query give the verb (``get``, ``list``, ``watch``,
``create``, ...); the Accept header and ``labelSelector``/``fieldSelector`` give the view and the selection; the body
is JSON, YAML or one of the few protobuf bodies kubectl sends. Responses are ``application/json`` exactly (some
clients ignore error bodies served with a charset), and every error is a ``Status``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import yaml
from aiohttp import web

from quotient.emulator import protobuf, schemas, selectors, status
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, encode
from quotient.emulator.views import CONTENT_TYPE, View, negotiate

JSON_HEADERS = {"Content-Type": CONTENT_TYPE}
NOT_FOUND = status.Failure(code=404, reason="NotFound", message="the server could not find the requested resource")


class UnsupportedBody(Exception):
    """A protobuf body of a kind the emulator does not decode: 415."""


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


def flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def verb(request: web.Request, target: Target) -> str | None:
    """The API verb of a resource request (the names RBAC and the faults use); None when the method is not allowed."""
    method = request.method
    if method == "GET":
        if target.watch_path or flag(request.query.get("watch")):
            return "watch"
        return "get" if target.name else "list"
    if method == "POST":
        if not target.name:
            return "create"
        return "create" if target.subresource in ("binding", "eviction", "token") else None
    if method == "PUT" and target.name:
        return "update"
    if method == "PATCH" and target.name:
        return "patch"
    if method == "DELETE":
        return "delete" if target.name else "deletecollection"
    return None


async def read_body(request: web.Request) -> Any:
    """The decoded body (None when empty); ``ValueError`` or ``yaml.YAMLError`` when it does not decode,
    ``UnsupportedBody`` for a protobuf body the emulator cannot read."""
    raw = await request.read()
    if not raw:
        return None
    if "protobuf" in (request.content_type or ""):
        try:
            return protobuf.decode(raw)
        except protobuf.ProtobufError as exc:
            raise UnsupportedBody(str(exc)) from exc
    if "yaml" in (request.content_type or ""):
        return yaml.safe_load(raw)
    return json.loads(raw)


def dry_run(request: web.Request) -> bool:
    return request.query.get("dryRun") == "All"


def delete_options(request: web.Request, body: Any) -> DeleteOptions:
    return DeleteOptions.from_body(
        body,
        grace=request.query.get("gracePeriodSeconds"),
        propagation=request.query.get("propagationPolicy"),
        dry_run=dry_run(request),
    )


def view(request: web.Request, kind: Kind) -> View | status.Failure:
    return negotiate(request.headers.get("Accept"), kind, include_object=request.query.get("includeObject"))


def selection(
    request: web.Request, kind: Kind
) -> tuple[selectors.LabelSelector, selectors.FieldSelector] | status.Failure:
    labels = selectors.parse_labels(request.query.get("labelSelector"))
    if isinstance(labels, status.Failure):
        return labels
    fields = selectors.parse_fields(request.query.get("fieldSelector"), kind)
    if isinstance(fields, status.Failure):
        return fields
    return labels, fields


def json_response(body: Obj, code: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=code, headers=JSON_HEADERS)


def failure_response(failure: status.Failure) -> web.Response:
    headers = dict(JSON_HEADERS)
    if failure.retry_after_s is not None:
        headers["Retry-After"] = str(failure.retry_after_s)
    return web.Response(body=encode(failure.body()), status=failure.code, headers=headers)


def object_response(
    request: web.Request, kind: Kind, obj: Obj | status.Failure, *, now: float, code: int = 200
) -> web.Response:
    """One object in the view the request asked for (plain JSON when it asked for one the emulator cannot give)."""
    if isinstance(obj, status.Failure):
        return failure_response(obj)
    chosen = view(request, kind)
    if isinstance(chosen, status.Failure):
        chosen = View(kind=kind)
    return json_response(chosen.render(obj, now=now), code)


def writing(request: web.Request) -> schemas.Writing:
    """The request's ``fieldValidation`` (kubectl sends Strict; the server's default is Warn)."""
    chosen = request.query.get("fieldValidation") or schemas.WARN
    return schemas.Writing(field_validation=chosen if chosen in (schemas.STRICT, schemas.IGNORE) else schemas.WARN)


def warned(response: web.Response, written: schemas.Writing) -> web.Response:
    """Each warning as a ``Warning: 299 - "text"`` header (RFC 7234), which kubectl prints as ``Warning: text``."""
    for text in dict.fromkeys(written.warnings):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.add("Warning", f'299 - "{escaped}"')
    return response

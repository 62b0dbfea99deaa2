"""The test hooks over HTTP, under ``/_emulator/``, for tests that run the emulator as a separate process.

``POST /_emulator/compact`` (every older watch version gets 410), ``POST /_emulator/drop-watches[?abort=true]``,
``POST /_emulator/faults`` with a ``Fault``'s fields plus ``duration_s`` and ``count`` (answers the rule's id),
``DELETE /_emulator/faults[/ID]``, ``GET /_emulator/devices/NAMESPACE/NAME`` (the device plugin's allocation),
``GET /_emulator/requests/USER`` (what a user was served and refused: ``access.Record``) and ``POST
/_emulator/tokens`` with ``{"user": ..., "groups": [...]}`` (a static token for any user, answered as ``{"token"}``).
A real API server has no such paths; nothing else uses the prefix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from aiohttp import web

from quotient.emulator import status
from quotient.emulator.faults import Fault, Faults
from quotient.emulator.objects import Obj


class Hooks(Protocol):
    """What the hooks act on (implemented by the Emulator)."""

    def compact(self) -> int: ...

    def drop_watches(self, *, abort: bool = False) -> int: ...

    def devices_of(self, namespace: str, name: str) -> tuple[int, ...] | None: ...

    def access_record(self, user: str) -> Obj: ...

    def static_token(self, user: str, groups: Sequence[str] = ()) -> str: ...


_NOT_FOUND = status.Failure(code=404, reason="NotFound", message="no such test hook")


async def answer(request: web.Request, path: str, *, hooks: Hooks, faults: Faults) -> tuple[int, Obj]:
    """(HTTP code, JSON body) for a request under ``/_emulator/``."""
    parts = [part for part in path.split("/") if part][1:]
    method = request.method
    if parts == ["compact"] and method == "POST":
        return 200, {"floor": hooks.compact()}
    if parts == ["drop-watches"] and method == "POST":
        abort = request.query.get("abort", "").lower() in ("true", "1")
        return 200, {"closed": hooks.drop_watches(abort=abort)}
    if parts[:1] == ["faults"]:
        return await _faults(request, parts[1:], faults)
    if len(parts) == 3 and parts[0] == "devices" and method == "GET":
        devices = hooks.devices_of(parts[1], parts[2])
        return 200, {"devices": list(devices) if devices is not None else None}
    if len(parts) == 2 and parts[0] == "requests" and method == "GET":
        return 200, hooks.access_record(parts[1])
    if parts == ["tokens"] and method == "POST":
        return await _token(request, hooks)
    return 404, _NOT_FOUND.body()


async def _token(request: web.Request, hooks: Hooks) -> tuple[int, Obj]:
    try:
        spec = json.loads(await request.read() or b"{}")
        user, groups = spec["user"], spec.get("groups") or []
        if not (isinstance(user, str) and user and isinstance(groups, list)) or not all(
            isinstance(group, str) for group in groups
        ):
            raise ValueError("user must be a non-empty string and groups a list of strings")
    except (KeyError, TypeError, ValueError) as exc:
        return 400, status.bad_request(f"invalid token request: {exc}").body()
    return 201, {"token": hooks.static_token(user, groups)}


async def _faults(request: web.Request, rest: list[str], faults: Faults) -> tuple[int, Obj]:
    if request.method == "DELETE":
        if rest and rest[0].isdigit():
            return 200, {"removed": faults.remove(int(rest[0]))}
        faults.clear()
        return 200, {"removed": "all"}
    if request.method != "POST":
        return 405, status.method_not_allowed("POST a fault, or DELETE one or all").body()
    try:
        spec = dict(json.loads(await request.read() or b"{}"))
        duration, count = spec.pop("duration_s", None), spec.pop("count", None)
        rule = faults.add(
            Fault(**spec),
            duration_s=float(duration) if duration is not None else None,
            count=int(count) if count is not None else None,
        )
    except (TypeError, ValueError) as exc:
        return 400, status.bad_request(f"invalid fault: {exc}").body()
    return 201, {"id": rule}

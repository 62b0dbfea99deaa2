"""API outcomes that are not the object asked for: ``Failure`` values and the ``Status`` bodies they become.

A request that names a missing pod or a stale version is an expected outcome, so the API layer returns a
``Failure`` (a value) and the HTTP layer renders it as the API server would: a ``Status`` object with ``code``,
``reason``, ``message`` and ``details``, because clients build their errors from it (kubectl's 422 text comes
from ``details.causes`` alone, and the Python client maps ``code`` to its exception classes). Messages follow the
API server's wording, which users and client code match on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from quotient.emulator.objects import Obj


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """One field error of a 422 Invalid (``field.Error``)."""

    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, FieldValueDuplicate, ...
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """An error answer: HTTP ``code`` and the Status fields."""

    code: int
    reason: str
    message: str
    name: str = ""
    group: str = ""
    kind: str = ""
    causes: tuple[Cause, ...] = ()
    retry_after_s: int | None = None

    def body(self) -> Obj:
        details: Obj = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [
                {"reason": cause.reason, "message": cause.message, "field": cause.field} for cause in self.causes
            ]
        if self.retry_after_s is not None:
            details["retryAfterSeconds"] = self.retry_after_s
        status: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            status["details"] = details
        return status


def success(code: int = 200, *, name: str = "", group: str = "", kind: str = "", uid: str = "") -> Obj:
    """A ``Status`` of success (binding answers 201 with one; deletions of some kinds answer 200 with one)."""
    status: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}
    details = {key: value for key, value in (("name", name), ("group", group), ("kind", kind), ("uid", uid)) if value}
    if details:
        status["details"] = details
    return status


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _about(code: int, reason: str, message: str, *, resource: str, name: str, group: str) -> Failure:
    """A failure about one object: its name, group and resource go into the Status's ``details``."""
    return Failure(code=code, reason=reason, message=message, name=name, group=group, kind=resource)


def not_found(resource: str, name: str, *, group: str = "") -> Failure:
    message = f'{_qualified(resource, group)} "{name}" not found'
    return _about(404, "NotFound", message, resource=resource, name=name, group=group)


def already_exists(resource: str, name: str, *, group: str = "") -> Failure:
    message = f'{_qualified(resource, group)} "{name}" already exists'
    return _about(409, "AlreadyExists", message, resource=resource, name=name, group=group)


def conflict(resource: str, name: str, detail: str, *, group: str = "") -> Failure:
    message = f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {detail}'
    return _about(409, "Conflict", message, resource=resource, name=name, group=group)


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, causes: Sequence[Cause], *, group: str = "") -> Failure:
    summary = ", ".join(f"{cause.field}: {cause.message}" if cause.field else cause.message for cause in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    qualified = f"{kind}.{group}" if group else kind
    return Failure(
        code=422,
        reason="Invalid",
        message=f'{qualified} "{name}" is invalid: {summary or "invalid"}',
        name=name,
        group=group,
        kind=kind,
        causes=tuple(causes),
    )


def required(field: str, detail: str = "") -> Cause:
    message = f"Required value: {detail}" if detail else "Required value"
    return Cause(field=field, reason="FieldValueRequired", message=message)


def invalid_value(field: str, value: object, detail: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    return Cause(field=field, reason="FieldValueInvalid", message=f"Invalid value: {shown}: {detail}")


def not_supported(field: str, value: object, supported: Sequence[str]) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    options = ", ".join(f'"{option}"' for option in supported)
    message = f"Unsupported value: {shown}: supported values: {options}"
    return Cause(field=field, reason="FieldValueNotSupported", message=message)


def duplicate(field: str, value: object) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    return Cause(field=field, reason="FieldValueDuplicate", message=f"Duplicate value: {shown}")


def forbidden_field(field: str, detail: str) -> Cause:
    return Cause(field=field, reason="FieldValueForbidden", message=f"Forbidden: {detail}")


def bad_request(message: str) -> Failure:
    return Failure(code=400, reason="BadRequest", message=message)


def forbidden(resource: str, name: str, detail: str, *, group: str = "") -> Failure:
    target = f'{_qualified(resource, group)} "{name}"' if name else _qualified(resource, group)
    return _about(403, "Forbidden", f"{target} is forbidden: {detail}", resource=resource, name=name, group=group)


def method_not_allowed(message: str) -> Failure:
    return Failure(code=405, reason="MethodNotAllowed", message=message)


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> Failure:
    return Failure(
        code=415,
        reason="UnsupportedMediaType",
        message=f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
    )


def expired(message: str) -> Failure:
    return Failure(code=410, reason="Expired", message=message)


def internal(message: str) -> Failure:
    return Failure(code=500, reason="InternalError", message=f"Internal error occurred: {message}")


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def injected(code: int, message: str) -> Failure:
    """A failure that a test asked for: the usual reason for the code, and its message."""
    return Failure(
        code=code,
        reason=_REASONS.get(code, "Unknown"),
        message=message,
        retry_after_s=1 if code in (429, 503) else None,
    )

"""The Kubernetes branch of the error tree, and the one pure function that maps an API answer onto it.

``scheduler.kube.client`` is the only module that sees the vendor's ``ApiException``, aiohttp errors and timeouts;
it translates each into one of these classes with :func:`from_response` (``raise ... from exc``), so the rest of the
scheduler catches ``KubeConflict`` or ``KubeUnavailable``, never a library type. Each error carries the HTTP status
(0 when no answer came back), the API's one-word ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``,
``Expired``, ...) and its message, read from the ``Status`` body the API server sends with every failure.

The classes say what a caller can do: ``KubeConflict`` (re-read and retry), ``KubeAlreadyExists`` (reuse the
object), ``KubeGone`` (relist), ``KubeUnavailable`` (retry later, with backoff), the rest are faults to report.
They would sit in ``common/errors.py`` beside ``BusError``; they live here because only the scheduler talks to
Kubernetes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from common.errors import QuotientError


class KubeError(QuotientError):
    """The Kubernetes API failed or refused a request; ``status`` is the HTTP code, 0 when nothing came back."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else message)
        self.status = status
        self.reason = reason
        self.message = message


class KubeNotFound(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class KubeConflict(KubeError):
    """409 Conflict: a stale ``resourceVersion`` or a failed precondition; re-read the object and try again."""


class KubeAlreadyExists(KubeError):
    """409 AlreadyExists: a create named an object that exists; read it and reuse it."""


class KubeForbidden(KubeError):
    """401 or 403: this identity may not do this (RBAC, or bad credentials); retrying does not help."""


class KubeInvalid(KubeError):
    """400 or 422: the request or the object is malformed; the message names the fields."""


class KubeGone(KubeError):
    """410 Expired: a watch or a list continuation asked for history the server has compacted away; relist."""


class KubeUnavailable(KubeError):
    """5xx, 429, a refused or dropped connection, or a timeout: the API did not answer usefully; retry later."""


def _status_body(body: bytes | str | None) -> Mapping[str, object]:
    if not body:
        return {}
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def from_status(status: int, reason: str, message: str) -> KubeError:
    """The error for an HTTP ``status`` and a ``Status`` reason, as in a watch's ``ERROR`` event."""
    if status == 404:
        return KubeNotFound(message, status=status, reason=reason or "NotFound")
    if status == 409:
        if reason == "AlreadyExists":
            return KubeAlreadyExists(message, status=status, reason=reason)
        return KubeConflict(message, status=status, reason=reason or "Conflict")
    if status == 410:
        return KubeGone(message, status=status, reason=reason or "Expired")
    if status in (401, 403):
        return KubeForbidden(
            message, status=status, reason=reason or ("Unauthorized" if status == 401 else "Forbidden")
        )
    if status in (400, 422):
        return KubeInvalid(message, status=status, reason=reason or ("BadRequest" if status == 400 else "Invalid"))
    if status == 429 or status >= 500 or status == 0:
        return KubeUnavailable(message, status=status, reason=reason)
    return KubeError(message, status=status, reason=reason)


def from_response(status: int, body: bytes | str | None, *, what: str = "") -> KubeError:
    """The error for a failed HTTP answer: the class from the status, reason and message from the ``Status`` body.

    A body that is not a ``Status`` (a proxy's HTML page, an empty 503) still gives a useful message: the status
    code and what was asked (``what``, e.g. ``"GET pods/default/p"``).
    """
    decoded = _status_body(body)
    reason = decoded.get("reason")
    message = decoded.get("message")
    text_reason = reason if isinstance(reason, str) else ""
    if isinstance(message, str) and message:
        text = message
    else:
        snippet = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
        text = f"HTTP {status}" + (f" for {what}" if what else "") + (f": {snippet[:200]}" if snippet else "")
    return from_status(status, text_reason, text)

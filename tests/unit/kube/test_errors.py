"""scheduler.kube.errors: every API failure maps onto one class that says what the caller can do."""

from __future__ import annotations

import json

import pytest

from common.errors import QuotientError
from scheduler.kube import errors
from scheduler.kube.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}
    ).encode()


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (404, "NotFound", KubeNotFound),
        (409, "AlreadyExists", KubeAlreadyExists),
        (409, "Conflict", KubeConflict),
        (410, "Expired", KubeGone),
        (401, "Unauthorized", KubeForbidden),
        (403, "Forbidden", KubeForbidden),
        (400, "BadRequest", KubeInvalid),
        (422, "Invalid", KubeInvalid),
        (429, "TooManyRequests", KubeUnavailable),
        (500, "InternalError", KubeUnavailable),
        (503, "ServiceUnavailable", KubeUnavailable),
        (418, "Teapot", KubeError),
    ],
)
def test_each_status_maps_to_the_class_that_says_what_to_do(code: int, reason: str, expected: type[KubeError]) -> None:
    error = errors.from_response(code, status_body(code, reason, "what went wrong"))

    assert type(error) is expected
    assert isinstance(error, QuotientError)
    assert (error.status, error.reason, error.message) == (code, reason, "what went wrong")


def test_a_conflict_without_a_reason_is_a_conflict_not_an_already_exists() -> None:
    assert type(errors.from_status(409, "", "pod p is already assigned to node n")) is KubeConflict


def test_a_body_that_is_not_a_status_still_gives_the_code_and_what_was_asked() -> None:
    error = errors.from_response(502, b"<html>Bad Gateway</html>", what="GET /api/v1/pods")

    assert isinstance(error, KubeUnavailable)
    assert "HTTP 502" in error.message
    assert "GET /api/v1/pods" in error.message
    assert "Bad Gateway" in error.message


def test_an_empty_body_and_no_answer_at_all_are_unavailable() -> None:
    assert isinstance(errors.from_response(503, b""), KubeUnavailable)
    assert isinstance(errors.from_status(0, "", "connection refused"), KubeUnavailable)


def test_the_error_text_carries_status_reason_and_message() -> None:
    error = errors.from_response(404, status_body(404, "NotFound", 'pods "p" not found'))

    assert str(error) == '404 NotFound: pods "p" not found'

"""Reading fields of Kubernetes JSON without trusting it: every accessor returns a well-typed value or a default.

Everything the API hands the scheduler is untrusted input (a hand-written manifest, a controller with a bug, a
field another version added). The decoders of this package go through these accessors, so a missing or mistyped
field is an absent value, never a ``KeyError`` or ``AttributeError`` in the middle of a watch.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

Json = Mapping[str, Any]


def mapping(value: object) -> Json:
    return value if isinstance(value, dict) else {}


def sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def meta(obj: Json) -> Json:
    return mapping(obj.get("metadata"))


def text(value: object) -> str:
    """A string field: the value when it is one, else ``""``."""
    return value if isinstance(value, str) else ""


def string_map(value: object) -> Mapping[str, str]:
    """Labels or annotations: a map of strings (the API guarantees it; anything else is read as empty)."""
    if not isinstance(value, dict):
        return {}
    if all(isinstance(key, str) and isinstance(item, str) for key, item in value.items()):
        return value
    return {str(key): str(item) for key, item in value.items()}


def timestamp_ns(value: object) -> int:
    """An RFC 3339 timestamp (``2026-11-22T00:00:00Z``) in ns since the epoch; 0 when absent or malformed."""
    if not isinstance(value, str) or not value:
        return 0
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def csv(value: object) -> tuple[str, ...]:
    """A comma-separated annotation (``"a, b,"``) as its non-blank parts."""
    if not isinstance(value, str):
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def indexes(value: object) -> tuple[int, ...]:
    """A comma-separated list of device indexes (``"0,3"``); parts that are not whole numbers are skipped."""
    return tuple(int(part) for part in csv(value) if part.isascii() and part.isdigit())


def whole_number(value: object) -> int | None:
    """An annotation holding a whole number in ASCII digits, or None."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None

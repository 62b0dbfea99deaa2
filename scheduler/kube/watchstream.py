"""Reading a watch stream: one JSON event per line, in chunks that split lines anywhere. Pure.

A watch answer is a chunked body of lines ``{"type": "ADDED", "object": {...}}``; an ``ERROR`` event carries a
``Status`` (410 when the version asked for is compacted away). The client feeds the chunks to a :class:`LineBuffer`
and decodes each line with :func:`decode_watch_line`; a line that is not an event is counted and skipped, never fatal.
"""

from __future__ import annotations

import json

from scheduler.kube import errors
from scheduler.kube.errors import KubeError, KubeUnavailable
from scheduler.kube.kubeapi import WatchEvent, WatchType

# A watch line can hold a large object (etcd's limit is 1.5 MiB); a line growing past this is a broken stream.
MAX_WATCH_LINE_BYTES = 16 * 1024 * 1024


class LineBuffer:
    """Cuts a byte stream into lines: a watch sends one JSON event per line, in chunks that split lines anywhere."""

    __slots__ = ("_limit", "_pending")

    def __init__(self, *, limit: int = MAX_WATCH_LINE_BYTES) -> None:
        self._pending = bytearray()
        self._limit = limit

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete, non-blank lines that ``chunk`` finishes; raises ``KubeUnavailable`` on a runaway line."""
        self._pending += chunk
        if b"\n" not in chunk:
            if len(self._pending) > self._limit:
                raise KubeUnavailable(f"a watch line exceeded {self._limit} bytes without ending")
            return []
        *lines, rest = self._pending.split(b"\n")
        self._pending = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]

    def rest(self) -> bytes:
        """What is left when the stream ends: a last line without its newline, or nothing."""
        return bytes(self._pending).strip()


def decode_watch_line(line: bytes) -> WatchEvent | KubeError | None:
    """One watch line: an event, the error an ``ERROR`` event carries, or None for a line that is not an event."""
    try:
        decoded = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(decoded, dict):
        return None
    kind, obj = decoded.get("type"), decoded.get("object")
    if not isinstance(obj, dict):
        return None
    if kind == "ERROR":
        code, reason, message = obj.get("code"), obj.get("reason"), obj.get("message")
        return errors.from_status(
            code if isinstance(code, int) else 0,
            reason if isinstance(reason, str) else "",
            message if isinstance(message, str) else "the watch sent an ERROR event",
        )
    if not isinstance(kind, str) or kind not in _WATCH_TYPES:
        return None
    return WatchEvent(type=WatchType(kind), object=obj)


_WATCH_TYPES = frozenset(WatchType)

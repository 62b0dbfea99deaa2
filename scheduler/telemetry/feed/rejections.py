"""Why a node has gone quiet when its messages arrive but are refused: the feed's notes for people.

A node whose agent's clock jumped, or whose driver reports what no device can, keeps publishing, and every message is
refused and counted by reason; the node goes stale. The counters say that something is refused, not which node is
affected or why, so the feed also notes, per node it follows, the rejections since its last accepted message, and
``TelemetryStale`` carries the newest (``staleness.StalenessWatch.explain_with``).

Only nodes already followed get a note (forged names cannot grow it), a note is dropped when the node's next message
is accepted, and its text is capped. Noting runs on the rejection path only.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from common.errors import WireReason

_MAX_DETAIL: Final = 512


@dataclasses.dataclass(slots=True)
class _Note:
    count: int
    reason: WireReason
    detail: str


class RejectionNotes:
    """Per node, the rejections of its messages since its last accepted one. ``by_node`` is for the hot path only:
    an accepted message's node is dropped from it (``if by_node: by_node.pop(node, None)``)."""

    def __init__(self) -> None:
        self.by_node: dict[str, _Note] = {}

    def note(self, node: str, reason: WireReason, detail: str) -> None:
        noted = self.by_node.get(node)
        if noted is None:
            self.by_node[node] = _Note(count=1, reason=reason, detail=detail[:_MAX_DETAIL])
        else:
            noted.count += 1
            noted.reason = reason
            noted.detail = detail[:_MAX_DETAIL]

    def why(self, node: str) -> str | None:
        """A sentence on the node's refused messages since its last accepted one, or None when there are none."""
        noted = self.by_node.get(node)
        if noted is None:
            return None
        what = (
            "message since its last accepted one was"
            if noted.count == 1
            else "messages since its last accepted one were"
        )
        return f"{noted.count} {what} rejected, the newest as {noted.reason.value}: {noted.detail}"

    def forget(self, node: str) -> None:
        self.by_node.pop(node, None)


def skewed(*, ts_ns: int, received_ns: int, max_skew_ns: int) -> str:
    """Why a stamp was refused as ``clock_skew``, in numbers."""
    off_s = (ts_ns - received_ns) / 1e9
    side = "ahead of" if off_s > 0 else "behind"
    return (
        f"stamped {abs(off_s):.1f}s {side} the scheduler's clock, more than the {max_skew_ns / 1e9:g}s allowed "
        f"(--telemetry-max-skew): is the node's clock synchronised?"
    )

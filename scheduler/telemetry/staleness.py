"""When a node's telemetry is too old to trust, and the ``TelemetryStale`` alert that says so.

A node's telemetry is stale when the last accepted sample was received more than ``max(3 x interval, floor)`` ago
(DESIGN.md, "Staleness"). Three intervals ride out one or two lost messages without flapping; the floor keeps a
node that samples very fast from turning stale on a scheduler pause (a long cycle, a garbage collection). Stale
telemetry never blocks anything: placement falls back to requests for that node (``headroom``) and the alert fires.

``StalenessWatch`` is pure: it holds the receive time and interval of each node's last sample, and both ``record``
(a sample arrived) and ``check`` (the consumer's periodic sweep) take the time as an argument and return transitions.

A node can also go quiet because its messages arrive and are rejected: an agent whose clock jumped (``clock_skew``),
one reporting what no device can (``memory_over_total``), a broken build. Then the alert says so: the telemetry loop
hands the watch the feed's ``why_rejected`` (``explain_with``), whose answer the firing alert's message carries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final

from common import wire
from scheduler.telemetry import overuse

NS_PER_MS: Final = 1_000_000
INTERVALS_BEFORE_STALE: Final = 3


def threshold_ns(interval_ms: int, *, floor_ns: int) -> int:
    """How old a node's telemetry may get before it is stale: ``max(3 x interval, floor)``."""
    return max(INTERVALS_BEFORE_STALE * interval_ms * NS_PER_MS, floor_ns)


def is_stale(*, received_ns: int, interval_ms: int, now_ns: int, floor_ns: int) -> bool:
    """Older than the threshold, strictly: a sample exactly at the threshold is still fresh."""
    return now_ns - received_ns > threshold_ns(interval_ms, floor_ns=floor_ns)


@dataclasses.dataclass(slots=True)
class _Freshness:
    received_ns: int
    interval_ms: int
    stale_since_ns: int | None = None


class StalenessWatch:
    """Per node, the last sample's receive time and interval, and whether ``TelemetryStale`` is firing."""

    def __init__(self, *, floor_ns: int) -> None:
        self._floor_ns = floor_ns
        self._nodes: dict[str, _Freshness] = {}
        self._explain: Callable[[str], str | None] = _unexplained

    @property
    def floor_ns(self) -> int:
        return self._floor_ns

    def explain_with(self, explain: Callable[[str], str | None]) -> None:
        """Where a firing alert learns why a node went quiet, when it knows (the feed's ``why_rejected``): a sentence,
        or None. It must not raise."""
        self._explain = explain

    def record(self, node: str, *, interval_ms: int, received_ns: int) -> tuple[overuse.Transition, ...]:
        """A sample of ``node`` was accepted; resolves the node's alert if it was firing."""
        previous = self._nodes.get(node)
        self._nodes[node] = _Freshness(received_ns=received_ns, interval_ms=interval_ms)
        if previous is None or previous.stale_since_ns is None:
            return ()
        return (
            _transition(
                node,
                state=wire.AlertState.RESOLVED,
                at_ns=received_ns,
                since_ns=previous.stale_since_ns,
                message=f"telemetry of node {node} is fresh again",
            ),
        )

    def check(self, *, now_ns: int) -> tuple[overuse.Transition, ...]:
        """Fire ``TelemetryStale`` for every node that turned stale since the last check."""
        fired: list[overuse.Transition] = []
        for node, freshness in self._nodes.items():
            if freshness.stale_since_ns is not None:
                continue
            limit = threshold_ns(freshness.interval_ms, floor_ns=self._floor_ns)
            if now_ns - freshness.received_ns <= limit:
                continue
            freshness.stale_since_ns = freshness.received_ns + limit
            age_s = (now_ns - freshness.received_ns) / 1e9
            why = self._explain(node)
            fired.append(
                _transition(
                    node,
                    state=wire.AlertState.FIRING,
                    at_ns=now_ns,
                    since_ns=freshness.stale_since_ns,
                    message=(
                        f"no telemetry from node {node} for {age_s:.1f}s (stale after {limit / 1e9:.1f}s: "
                        f"{INTERVALS_BEFORE_STALE} x {freshness.interval_ms} ms interval or the "
                        f"{self._floor_ns / 1e9:.1f}s floor); placement there falls back to requests"
                        + ("" if why is None else f"; messages for it arrive but are rejected: {why}")
                    ),
                )
            )
        return tuple(fired)

    def is_stale(self, node: str, *, now_ns: int) -> bool:
        """Stale now; a node never heard from counts as stale (there is nothing measured to trust)."""
        freshness = self._nodes.get(node)
        if freshness is None:
            return True
        return is_stale(
            received_ns=freshness.received_ns,
            interval_ms=freshness.interval_ms,
            now_ns=now_ns,
            floor_ns=self._floor_ns,
        )

    def age_ns(self, node: str, *, now_ns: int) -> int | None:
        """How old the node's telemetry is (for the per-node age gauge), or None if never heard from."""
        freshness = self._nodes.get(node)
        return None if freshness is None else now_ns - freshness.received_ns

    def forget(self, node: str, *, now_ns: int) -> tuple[overuse.Transition, ...]:
        """Drop a deleted node; its alert, if firing, resolves."""
        freshness = self._nodes.pop(node, None)
        if freshness is None or freshness.stale_since_ns is None:
            return ()
        return (
            _transition(
                node,
                state=wire.AlertState.RESOLVED,
                at_ns=now_ns,
                since_ns=freshness.stale_since_ns,
                message=f"node {node} was removed",
            ),
        )

    def __len__(self) -> int:
        return len(self._nodes)


def _unexplained(_node: str) -> str | None:
    return None


def _transition(node: str, *, state: wire.AlertState, at_ns: int, since_ns: int, message: str) -> overuse.Transition:
    return overuse.Transition(
        name=overuse.AlertName.TELEMETRY_STALE,
        state=state,
        severity=wire.Severity.WARNING,
        at_ns=at_ns,
        since_ns=since_ns,
        node=node,
        message=message,
    )

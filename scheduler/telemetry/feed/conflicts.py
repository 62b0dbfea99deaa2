"""``TelemetryConflict``: two live publishers claim one node, as alert transitions.

The sequence gate (``common.sequencing``) never lets one publisher's claims decide what another's messages are worth,
so forged telemetry cannot mute a node; what it cannot do is tell the real agent from the forger. It names the
rivals (two live streams of a node that share a boot or interleave), and this module turns them into an alert that
fires while there are rivals and resolves when one publisher remains.

Severity critical: in a cluster deployed as ``deploy/`` describes (one agent per node, replaced, not surged, by its
DaemonSet) no ordinary event makes two live publishers: an agent restart ends one stream before the next begins. So
it means forged telemetry (someone on the node network holding an agent's NATS identity: without the auth callout,
any agent's; with it, this node's own) or a second agent configured for the node; and until it ends the node's
readings come from whichever publisher spoke last, so its measured headroom and its over-consumption, ghost and
unattributed alerts cannot be trusted. Placement and alerts go on (the node is never muted): a person must look.

Only nodes of the cluster alert (a forger may invent names: those are counted by the loop as ``unknown_node``); an
alert that fired resolves when its node leaves the cluster or the feed forgets it. Pure: time is an argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence

from common import sequencing, wire
from scheduler.telemetry import overuse


@dataclasses.dataclass(frozen=True, slots=True)
class _Firing:
    since_ns: int


class ConflictWatch:
    """Which nodes' ``TelemetryConflict`` fires; ``check`` returns the transitions since the last check."""

    def __init__(self) -> None:
        self._firing: dict[str, _Firing] = {}

    @property
    def firing(self) -> frozenset[str]:
        return frozenset(self._firing)

    def check(
        self, gate: sequencing.SequenceGate, *, now_ns: int, known: Container[str]
    ) -> tuple[overuse.Transition, ...]:
        """Fire for each node of the cluster (``known``) that has rivals now; resolve those that no longer do."""
        transitions: list[overuse.Transition] = []
        conflicted: set[str] = set()
        for node in gate.crowded():
            if node not in known:
                continue
            rivals = gate.rivals(node, now_ns=now_ns)
            if not rivals:
                continue
            conflicted.add(node)
            if node not in self._firing:
                since_ns = sorted(stream.first_ns for stream in rivals)[1]
                self._firing[node] = _Firing(since_ns=since_ns)
                transitions.append(_fired(node, rivals, since_ns=since_ns, now_ns=now_ns))
        for node in sorted(set(self._firing) - conflicted):
            firing = self._firing.pop(node)
            transitions.append(
                _transition(
                    node,
                    state=wire.AlertState.RESOLVED,
                    since_ns=firing.since_ns,
                    now_ns=now_ns,
                    message=f"node {node} has one telemetry publisher again",
                )
            )
        return tuple(transitions)


def _fired(node: str, rivals: Sequence[sequencing.Stream], *, since_ns: int, now_ns: int) -> overuse.Transition:
    described = "; ".join(
        f"boot {stream.boot[:16]} at seq {stream.seq}, heard {max(0, now_ns - stream.heard_ns) / 1e9:.1f}s ago"
        + (" (a fork: behind another stream of its boot)" if stream.forked else "")
        for stream in rivals
    )
    return _transition(
        node,
        state=wire.AlertState.FIRING,
        since_ns=since_ns,
        now_ns=now_ns,
        message=(
            f"{len(rivals)} live publishers claim node {node} ({described}): forged telemetry or a second agent for "
            f"the node. Each one's messages are accepted, so the node stays observed, but its readings come from "
            f"whichever spoke last: its measured headroom and telemetry alerts cannot be trusted until one remains"
        ),
    )


def _transition(node: str, *, state: wire.AlertState, since_ns: int, now_ns: int, message: str) -> overuse.Transition:
    return overuse.Transition(
        name=overuse.AlertName.TELEMETRY_CONFLICT,
        state=state,
        severity=wire.Severity.CRITICAL,
        at_ns=now_ns,
        since_ns=since_ns,
        node=node,
        message=message,
    )

"""Did every fault that has an alert fire it and resolve it? Pure: expectations and sightings in, outcomes out.

A NATS restart makes every node's telemetry stale: ``TelemetryStale`` must fire (for some node) while NATS is down and
resolve once it is back. An Xid on a device takes it out of placement: ``GpuUnhealthy`` must fire for that node and
device, and resolve after the operator's clear. The shell sees alerts two ways, as an operator would: the scheduler's
``/metrics`` scraped every second (``Scrape``: the ``quotient_alert`` series firing then) and a third-party subscriber
of ``quotient.v1.alerts.>`` (``Message``). Either shows the alert fired; it resolved when a scrape after the fault was
undone shows no matching series, or when every matching alert that fired on NATS was resolved on NATS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Final

from quotient.bench.chaos_invariants import Invariant, Violation

FIRE_WITHIN_S: Final = 15.0
"""After the fault is undone, how long a late sighting of the firing may take (a firing published while NATS was
down reaches a subscriber after it is back)."""
RESOLVE_WITHIN_S: Final = 30.0
"""After the fault is undone, how long the alert may take to resolve: NATS clients reconnect with a back-off of a few
seconds, the agents publish again, the scheduler's sweep notices."""

AlertKey = tuple[str, str, str]
"""(alert name, node, gpu): the labels of a ``quotient_alert`` series that say what it is about ("" when none)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    fault: str
    """Which fault, in words (``#3 nats_restart``)."""
    alert: str
    node: str | None = None
    """The node it must be about; None: any node."""
    gpu: int | None = None
    start_s: float
    undone_s: float | None = None
    """When the fault was undone (NATS back, the clear written); None while it is not."""

    def matches(self, key: AlertKey) -> bool:
        alert, node, gpu = key
        return (
            alert == self.alert
            and (self.node is None or node == self.node)
            and (self.gpu is None or gpu == str(self.gpu))
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Scrape:
    at_s: float
    firing: frozenset[AlertKey]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    at_s: float
    key: AlertKey
    firing: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    expectation: Expectation
    fired_at_s: float | None
    resolved_at_s: float | None
    seen_on: tuple[str, ...]
    """Where the firing was seen: ``metrics``, ``nats``."""

    def as_json(self) -> dict[str, object]:
        start = self.expectation.start_s
        return {
            "fault": self.expectation.fault,
            "alert": self.expectation.alert,
            "fired_after_s": None if self.fired_at_s is None else round(self.fired_at_s - start, 1),
            "resolved_after_undone_s": (
                None
                if self.resolved_at_s is None or self.expectation.undone_s is None
                else round(self.resolved_at_s - self.expectation.undone_s, 1)
            ),
            "seen_on": list(self.seen_on),
        }


def _fired(expectation: Expectation, scrapes: Sequence[Scrape], messages: Sequence[Message]) -> dict[str, float]:
    """The first time each source saw a matching alert firing, from the fault's start."""
    seen: dict[str, float] = {}
    for scrape in scrapes:
        if scrape.at_s >= expectation.start_s and any(expectation.matches(key) for key in scrape.firing):
            seen["metrics"] = min(seen.get("metrics", scrape.at_s), scrape.at_s)
    for message in messages:
        if message.firing and message.at_s >= expectation.start_s and expectation.matches(message.key):
            seen["nats"] = min(seen.get("nats", message.at_s), message.at_s)
    return seen


def _resolved(
    expectation: Expectation, fired_at_s: float, scrapes: Sequence[Scrape], messages: Sequence[Message]
) -> float | None:
    undone = expectation.undone_s
    if undone is None:
        return None
    after = max(undone, fired_at_s)
    by_scrape = next(
        (
            scrape.at_s
            for scrape in sorted(scrapes, key=lambda s: s.at_s)
            if scrape.at_s >= after and not any(expectation.matches(key) for key in scrape.firing)
        ),
        None,
    )
    last_firing: dict[AlertKey, float] = {}
    resolved: dict[AlertKey, float] = {}
    for message in sorted(messages, key=lambda m: m.at_s):
        if message.at_s < expectation.start_s or not expectation.matches(message.key):
            continue
        if message.firing:
            last_firing[message.key] = message.at_s
            resolved.pop(message.key, None)
        elif message.key in last_firing:
            resolved[message.key] = message.at_s
    by_nats = None
    if last_firing and set(resolved) == set(last_firing) and max(resolved.values()) >= undone:
        by_nats = max(resolved.values())
    found = [at for at in (by_scrape, by_nats) if at is not None]
    return min(found) if found else None


def outcome(expectation: Expectation, scrapes: Sequence[Scrape], messages: Sequence[Message]) -> Outcome:
    seen = _fired(expectation, scrapes, messages)
    fired_at = min(seen.values()) if seen else None
    resolved_at = None if fired_at is None else _resolved(expectation, fired_at, scrapes, messages)
    return Outcome(expectation=expectation, fired_at_s=fired_at, resolved_at_s=resolved_at, seen_on=tuple(sorted(seen)))


def settled(expectation: Expectation, result: Outcome, *, now_s: float) -> bool:
    """Nothing more to wait for: resolved, or past both deadlines."""
    if result.resolved_at_s is not None:
        return True
    return expectation.undone_s is not None and now_s >= expectation.undone_s + max(FIRE_WITHIN_S, RESOLVE_WITHIN_S)


def judge(
    expectations: Iterable[Expectation], scrapes: Sequence[Scrape], messages: Sequence[Message], *, now_s: float
) -> tuple[list[Outcome], list[Violation]]:
    """Each expectation's outcome, and a violation for each alert past its deadline without firing or resolving."""
    outcomes, found = [], []
    for expectation in expectations:
        result = outcome(expectation, scrapes, messages)
        outcomes.append(result)
        undone = expectation.undone_s
        if undone is None:
            continue
        about = expectation.alert + (f" on {expectation.node}" if expectation.node else "")
        about += f" gpu {expectation.gpu}" if expectation.gpu is not None else ""
        if result.fired_at_s is None and now_s >= undone + FIRE_WITHIN_S:
            found.append(
                Violation(
                    invariant=Invariant.ALERT_NOT_FIRED,
                    at_s=now_s,
                    obj=f"fault {expectation.fault}",
                    detail=f"{about} never fired (fault from {expectation.start_s:.0f}s to {undone:.0f}s)",
                    key=f"fired/{expectation.fault}",
                )
            )
        elif result.fired_at_s is not None and result.resolved_at_s is None and now_s >= undone + RESOLVE_WITHIN_S:
            found.append(
                Violation(
                    invariant=Invariant.ALERT_NOT_RESOLVED,
                    at_s=now_s,
                    obj=f"fault {expectation.fault}",
                    detail=f"{about} fired at {result.fired_at_s:.0f}s and was still firing "
                    f"{RESOLVE_WITHIN_S:.0f}s after the fault was undone at {undone:.0f}s",
                    key=f"resolved/{expectation.fault}",
                )
            )
    return outcomes, found

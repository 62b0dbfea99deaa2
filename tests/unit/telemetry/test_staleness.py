"""Staleness: a node's telemetry older than max(3 x interval, floor) is stale; ``TelemetryStale`` fires once and
resolves on the next sample."""

from __future__ import annotations

import pytest

from common import wire
from scheduler.telemetry import overuse, staleness
from tests.unit.telemetry.builders import NODE, S

MS = 1_000_000


@pytest.mark.parametrize(
    ("interval_ms", "floor_ns", "threshold_ns"),
    [
        (250, 2 * S, 2 * S),  # fast agent: the floor wins
        (1000, 2 * S, 3 * S),  # three intervals win
        (5000, 0, 15 * S),
        (1, 0, 3 * MS),
    ],
)
def test_threshold_is_the_larger_of_three_intervals_and_the_floor(
    interval_ms: int, floor_ns: int, threshold_ns: int
) -> None:
    assert staleness.threshold_ns(interval_ms, floor_ns=floor_ns) == threshold_ns


@pytest.mark.parametrize(("age_ns", "stale"), [(0, False), (3 * S - 1, False), (3 * S, False), (3 * S + 1, True)])
def test_telemetry_is_stale_only_when_strictly_older_than_the_threshold(age_ns: int, stale: bool) -> None:
    assert staleness.is_stale(received_ns=10 * S, interval_ms=1000, now_ns=10 * S + age_ns, floor_ns=S) is stale


def test_stale_fires_once_and_resolves_on_the_next_sample() -> None:
    watch = staleness.StalenessWatch(floor_ns=S)
    assert watch.record(NODE, interval_ms=1000, received_ns=0) == ()
    assert watch.check(now_ns=3 * S) == ()
    assert not watch.is_stale(NODE, now_ns=3 * S)
    (fired,) = watch.check(now_ns=3 * S + 1)
    assert (fired.name, fired.state, fired.node, fired.since_ns, fired.at_ns) == (
        overuse.AlertName.TELEMETRY_STALE,
        wire.AlertState.FIRING,
        NODE,
        3 * S,
        3 * S + 1,
    )
    assert watch.is_stale(NODE, now_ns=3 * S + 1)
    assert watch.check(now_ns=10 * S) == ()
    assert watch.age_ns(NODE, now_ns=10 * S) == 10 * S
    (resolved,) = watch.record(NODE, interval_ms=1000, received_ns=11 * S)
    assert (resolved.state, resolved.since_ns, resolved.at_ns) == (wire.AlertState.RESOLVED, 3 * S, 11 * S)
    assert not watch.is_stale(NODE, now_ns=11 * S)
    assert watch.check(now_ns=12 * S) == ()


def test_a_node_never_heard_from_is_stale_without_an_alert() -> None:
    watch = staleness.StalenessWatch(floor_ns=S)
    assert watch.is_stale("unknown", now_ns=0)
    assert watch.age_ns("unknown", now_ns=0) is None
    assert watch.check(now_ns=100 * S) == ()


def test_a_forgotten_stale_node_resolves_and_is_dropped() -> None:
    watch = staleness.StalenessWatch(floor_ns=S)
    watch.record(NODE, interval_ms=250, received_ns=0)
    assert len(watch.check(now_ns=5 * S)) == 1
    (resolved,) = watch.forget(NODE, now_ns=6 * S)
    assert resolved.state is wire.AlertState.RESOLVED
    assert len(watch) == 0
    assert watch.forget(NODE, now_ns=7 * S) == ()


def test_a_stale_transition_becomes_a_wire_alert() -> None:
    watch = staleness.StalenessWatch(floor_ns=S)
    watch.record(NODE, interval_ms=250, received_ns=0)
    (fired,) = watch.check(now_ns=5 * S)
    alert = overuse.to_alert(fired, emitter="quotient-scheduler", boot="b1", seq=1)
    assert wire.decode_alert(wire.encode(alert)) == alert
    assert (alert.name, alert.node_name, alert.pod_uid) == ("TelemetryStale", NODE, None)

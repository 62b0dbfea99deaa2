"""Every fault that has an alert fired it and resolved it: judged from scrapes of ``/metrics`` and NATS messages."""

from __future__ import annotations

from quotient.bench import chaos_alerts as alerts
from quotient.bench.chaos_alerts import Expectation, Message, Scrape
from quotient.bench.chaos_invariants import Invariant

STALE = Expectation(fault="#1 nats_restart", alert="TelemetryStale", start_s=100.0, undone_s=107.0)
XID = Expectation(fault="#2 gpu_xid", alert="GpuUnhealthy", node="node-3", gpu=2, start_s=200.0, undone_s=210.0)


def scrape(at_s: float, *firing: tuple[str, str, str]) -> Scrape:
    return Scrape(at_s=at_s, firing=frozenset(firing))


def test_an_alert_seen_firing_on_metrics_and_gone_after_the_fault_is_fired_and_resolved() -> None:
    scrapes = [
        scrape(99.0),
        scrape(104.0, ("TelemetryStale", "node-0", ""), ("TelemetryStale", "node-1", "")),
        scrape(108.0, ("TelemetryStale", "node-1", "")),
        scrape(110.0),
    ]
    outcomes, violations = alerts.judge([STALE], scrapes, [], now_s=200.0)
    assert violations == []
    [outcome] = outcomes
    assert (outcome.fired_at_s, outcome.resolved_at_s, outcome.seen_on) == (104.0, 110.0, ("metrics",))


def test_an_alert_seen_only_on_nats_counts_when_each_firing_was_resolved_there() -> None:
    messages = [
        Message(at_s=203.0, key=("GpuUnhealthy", "node-3", "2"), firing=True),
        Message(at_s=211.0, key=("GpuUnhealthy", "node-3", "2"), firing=False),
    ]
    [outcome], violations = alerts.judge([XID], [], messages, now_s=300.0)
    assert violations == [] and outcome.resolved_at_s == 211.0 and outcome.seen_on == ("nats",)


def test_an_alert_about_another_device_does_not_count() -> None:
    scrapes = [scrape(203.0, ("GpuUnhealthy", "node-3", "1")), scrape(212.0)]
    _, [violation] = alerts.judge([XID], scrapes, [], now_s=300.0)
    assert violation.invariant is Invariant.ALERT_NOT_FIRED and "GpuUnhealthy on node-3 gpu 2" in violation.detail


def test_an_alert_still_firing_past_the_deadline_after_the_fault_was_undone_did_not_resolve() -> None:
    scrapes = [scrape(at, ("GpuUnhealthy", "node-3", "2")) for at in (205.0, 215.0, 245.0)]
    assert alerts.judge([XID], scrapes, [], now_s=230.0)[1] == []  # not late yet
    _, [violation] = alerts.judge([XID], scrapes, [], now_s=241.0)
    assert violation.invariant is Invariant.ALERT_NOT_RESOLVED and violation.obj == "fault #2 gpu_xid"


def test_a_quiet_scrape_before_the_fault_was_undone_is_no_resolution() -> None:
    scrapes = [scrape(203.0, ("GpuUnhealthy", "node-3", "2")), scrape(206.0)]
    outcome = alerts.outcome(XID, scrapes, [])
    assert outcome.fired_at_s == 203.0 and outcome.resolved_at_s is None


def test_a_fault_not_undone_yet_is_not_judged() -> None:
    running = Expectation(fault="#3 nats_restart", alert="TelemetryStale", start_s=100.0)
    outcomes, violations = alerts.judge([running], [], [], now_s=1000.0)
    assert violations == [] and outcomes[0].fired_at_s is None
    assert not alerts.settled(running, outcomes[0], now_s=1000.0)


def test_an_expectation_is_settled_once_resolved_or_past_both_deadlines() -> None:
    fired = alerts.outcome(XID, [scrape(203.0, ("GpuUnhealthy", "node-3", "2")), scrape(212.0)], [])
    assert alerts.settled(XID, fired, now_s=212.0)
    silent = alerts.outcome(XID, [], [])
    assert not alerts.settled(XID, silent, now_s=220.0)
    assert alerts.settled(XID, silent, now_s=210.0 + alerts.RESOLVE_WITHIN_S)

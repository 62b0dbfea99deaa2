"""What the chaos run reads off the scheduler's ``/metrics``: counters summed over the processes that counted them."""

from __future__ import annotations

from quotient.bench.chaos_observe import Tally


def samples(**by_reason: float) -> list[tuple[str, dict[str, str], float]]:
    return [("quotient_evictions_total", {"reason": reason}, value) for reason, value in by_reason.items()] + [
        ("quotient_evictions_created", {"reason": "reclaim"}, 1.7e9)
    ]


def test_a_counter_is_read_by_its_label() -> None:
    tally = Tally("quotient_evictions_total", "reason")
    tally.update(samples(reclaim=3, preempt=1))
    tally.update(samples(reclaim=5, preempt=1))
    assert tally.totals() == {"preempt": 1, "reclaim": 5}


def test_a_restarted_scheduler_counting_from_zero_keeps_what_the_one_before_counted() -> None:
    tally = Tally("quotient_evictions_total", "reason")
    tally.update(samples(reclaim=5, preempt=2))
    tally.update(samples())  # the new process has evicted nothing yet: no series at all
    tally.update(samples(reclaim=1))
    assert tally.totals() == {"preempt": 2, "reclaim": 6}
    tally.update(samples(reclaim=4, stale_gang=1))
    assert tally.totals() == {"preempt": 2, "reclaim": 9, "stale_gang": 1}

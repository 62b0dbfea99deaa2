"""common.backoff: capped exponential backoff with jitter, deterministic when the uniform draw is injected."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.backoff import Backoff, GiveUp, Retry


def test_the_delay_doubles_with_each_attempt_at_the_top_of_the_jitter() -> None:
    backoff = Backoff(base_s=0.1, cap_s=100.0, min_fraction=0.5)
    decisions = [backoff.decide(attempt, lambda: 1.0) for attempt in range(5)]
    assert all(isinstance(decision, Retry) for decision in decisions)
    assert [decision.delay_s for decision in decisions if isinstance(decision, Retry)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6]
    )


def test_the_delay_is_capped() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0)
    assert backoff.decide(7, lambda: 1.0) == Retry(delay_s=10.0)
    assert backoff.decide(1000, lambda: 1.0) == Retry(delay_s=10.0)


def test_a_huge_attempt_number_does_not_overflow() -> None:
    backoff = Backoff(base_s=1e-9, cap_s=1.0)
    assert backoff.decide(10**9, lambda: 1.0) == Retry(delay_s=1.0)
    assert backoff.delay_s(10**9, lambda: 1.0) == 1.0


def test_the_jitter_scales_the_ceiling_between_min_fraction_and_one() -> None:
    backoff = Backoff(base_s=1.0, cap_s=8.0, min_fraction=0.25)
    assert backoff.decide(3, lambda: 0.0) == Retry(delay_s=2.0)
    assert backoff.decide(3, lambda: 0.5) == Retry(delay_s=5.0)
    assert backoff.decide(3, lambda: 1.0) == Retry(delay_s=8.0)


def test_full_jitter_may_retry_at_once() -> None:
    backoff = Backoff(base_s=1.0, cap_s=8.0, min_fraction=0.0)
    assert backoff.decide(2, lambda: 0.0) == Retry(delay_s=0.0)


def test_the_same_draws_give_the_same_delays() -> None:
    backoff = Backoff()
    first = [backoff.decide(n, random.Random(7).random) for n in range(10)]
    second = [backoff.decide(n, random.Random(7).random) for n in range(10)]
    assert first == second


def test_the_default_draw_is_random_but_within_bounds() -> None:
    backoff = Backoff(base_s=1.0, cap_s=4.0, min_fraction=0.5)
    for _ in range(200):
        decision = backoff.decide(2)
        assert isinstance(decision, Retry)
        assert 2.0 <= decision.delay_s <= 4.0


@settings(max_examples=50)
@given(
    attempt=st.integers(min_value=0, max_value=200),
    u=st.floats(min_value=0.0, max_value=1.0),
    base=st.floats(min_value=1e-3, max_value=10.0),
    factor=st.floats(min_value=1.0, max_value=1000.0),
    min_fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_every_delay_lies_between_min_fraction_of_the_ceiling_and_the_cap(
    attempt: int, u: float, base: float, factor: float, min_fraction: float
) -> None:
    backoff = Backoff(base_s=base, cap_s=base * factor, min_fraction=min_fraction)
    ceiling = min(backoff.cap_s, base * 2.0**attempt)
    decision = backoff.decide(attempt, lambda: u)
    assert isinstance(decision, Retry)
    assert ceiling * min_fraction * (1 - 1e-12) <= decision.delay_s <= backoff.cap_s * (1 + 1e-12)
    assert decision.delay_s == backoff.delay_s(attempt, lambda: u)


def test_without_max_attempts_it_never_gives_up() -> None:
    backoff = Backoff()
    assert all(isinstance(backoff.decide(n, lambda: 0.5), Retry) for n in range(0, 10_000, 97))


def test_it_gives_up_once_the_attempt_number_reaches_max_attempts() -> None:
    backoff = Backoff(max_attempts=3)
    decisions = [backoff.decide(n, lambda: 0.5) for n in range(5)]
    assert [type(d) for d in decisions] == [Retry, Retry, Retry, GiveUp, GiveUp]
    assert decisions[3] == GiveUp(reason="gave up after 4 failed attempts")


def test_max_attempts_zero_gives_up_on_the_first_failure() -> None:
    assert isinstance(Backoff(max_attempts=0).decide(0, lambda: 0.5), GiveUp)


def test_delay_s_ignores_max_attempts_for_loops_that_retry_forever() -> None:
    backoff = Backoff(base_s=1.0, cap_s=4.0, max_attempts=1)
    assert backoff.delay_s(5, lambda: 1.0) == 4.0


def test_decisions_are_values() -> None:
    assert Retry(delay_s=1.0) == Retry(delay_s=1.0)
    assert GiveUp(reason="x") != GiveUp(reason="y")


@pytest.mark.parametrize(
    ("base_s", "cap_s", "min_fraction", "says"),
    [
        (0.0, 10.0, 0.5, "0 < base_s <= cap_s"),
        (-1.0, 10.0, 0.5, "0 < base_s <= cap_s"),
        (2.0, 1.0, 0.5, "base_s=2.0 cap_s=1.0"),
        (0.1, 10.0, -0.1, r"min_fraction must be within \[0, 1\]"),
        (0.1, 10.0, 1.5, r"min_fraction must be within \[0, 1\], got 1.5"),
    ],
)
def test_a_nonsensical_policy_is_refused(base_s: float, cap_s: float, min_fraction: float, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Backoff(base_s=base_s, cap_s=cap_s, min_fraction=min_fraction)


def test_a_cap_equal_to_the_base_is_a_constant_delay() -> None:
    backoff = Backoff(base_s=2.0, cap_s=2.0, min_fraction=1.0)
    assert {backoff.delay_s(n, random.random) for n in range(10)} == {2.0}

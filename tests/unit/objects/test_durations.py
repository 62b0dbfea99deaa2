"""Go durations as KAI's fields and annotations hold them: Go's syntax exactly, no bare numbers."""

from __future__ import annotations

import pytest

from scheduler.objects import durations

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("30s", 30 * S),
        ("5m", 300 * S),
        ("1h30m", 5400 * S),
        ("1.5h", 5400 * S),
        ("500ms", S // 2),
        ("2m0s", 120 * S),
        ("-10s", -10 * S),
        ("+1m", 60 * S),
        ("0", 0),
        ("-0", 0),
        ("1µs", 1000),
        ("1μs", 1000),
        ("1us", 1000),
        (" 5m ", 300 * S),
        (".5s", S // 2),
    ],
)
def test_go_durations_are_read_in_nanoseconds(text: str, ns: int) -> None:
    assert durations.parse_ns(text) == ns


@pytest.mark.parametrize("text", ["", "5", "30", "1d", "m", "5 m", "1h-30m", "s5", "--1s", "9999999999h", "1e3s"])
def test_anything_go_would_refuse_is_none(text: str) -> None:
    assert durations.parse_ns(text) is None


@pytest.mark.parametrize(
    ("ns", "text"),
    [(120 * S, "2m0s"), (5400 * S, "1h30m0s"), (30 * S, "30s"), (-S, "-1s"), (0, "0s"), (S // 2, "500ms")],
)
def test_durations_are_written_as_go_prints_them_and_read_back(ns: int, text: str) -> None:
    assert durations.format_ns(ns) == text
    assert durations.parse_ns(text) == ns

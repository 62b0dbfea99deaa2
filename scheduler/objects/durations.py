"""Go durations (``time.ParseDuration``), as KAI reads ``preemptionDelay``, ``stalenessGracePeriod`` and their
annotations: ``"30s"``, ``"5m"``, ``"1h30m"``, ``"1.5h"``, ``"-10s"``, ``"0"``. Pure.

KAI's fields are ``metav1.Duration``, whose JSON form is exactly Go's syntax, so this reading is strict where the
scheduler's own flags are lenient (``common.quantities.parse_duration_ns`` also takes a bare number of seconds): a
unit-less ``"30"`` is what KAI refuses ("invalid values, including unit-less numbers, are ignored"), and reading it
here as 30 s would make a manifest mean one thing under Quotient and another under KAI.
"""

from __future__ import annotations

import decimal
import re

FORMS = 'a Go duration such as "30s", "5m", "1h30m" or "1.5h" (units ns, us, ms, s, m, h)'

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5, as Go accepts it
    "μs": 1_000,  # U+03BC, likewise
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
# Go's int64 of nanoseconds: about 292 years. A longer duration does not parse there.
_MAX_NS = 2**63 - 1
_MAX_CHARS = 64


def parse_ns(text: str) -> int | None:
    """The duration in nanoseconds (negative where the text says so), or None when it is not Go's syntax."""
    raw = text.strip()
    if not raw or len(raw) > _MAX_CHARS:
        return None
    sign = 1
    if raw[0] in "+-":
        sign = -1 if raw[0] == "-" else 1
        raw = raw[1:]
    if raw == "0":
        return 0
    total = decimal.Decimal(0)
    position = 0
    for match in _PART.finditer(raw):
        if match.start() != position:
            return None
        total += decimal.Decimal(match.group(1)) * _UNITS_NS[match.group(2)]
        position = match.end()
    if position == 0 or position != len(raw):
        return None
    nanoseconds = int(total)
    if nanoseconds > _MAX_NS:
        return None
    return sign * nanoseconds


def format_ns(nanoseconds: int) -> str:
    """A duration as Go prints it for whole seconds and above (``2m0s``, ``1h30m0s``); else in ms or ns."""
    sign = "-" if nanoseconds < 0 else ""
    value = abs(nanoseconds)
    if value == 0:
        return "0s"
    if value % 1_000_000_000:
        if value % 1_000_000 == 0:
            return f"{sign}{value // 1_000_000}ms"
        return f"{sign}{value}ns"
    seconds = value // 1_000_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"

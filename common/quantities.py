"""Parsing and printing of quantities, with integer results only.

Accounting in Quotient is integral: milli-GPU (1000 = one device), bytes, millicores, nanoseconds. This module
turns the strings people and Kubernetes write ("500m", "16Gi", "1.5", "30s") into those integers with exact
decimal arithmetic (``decimal.Decimal``, never binary floats), and refuses anything else with a message that says
what is accepted.
"""

from __future__ import annotations

import decimal
import functools
import re

from common.errors import QuantityError

MILLI_GPU_PER_GPU = 1000
MILLICORES_PER_CORE = 1000
MIB = 1024**2
GIB = 1024**3
NS_PER_S = 1_000_000_000

# Kubernetes resource.Quantity suffixes (k8s.io/apimachinery/pkg/api/resource/suffix.go).
_BINARY_SUFFIXES = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL_SUFFIXES = {
    "n": decimal.Decimal("1e-9"),
    "u": decimal.Decimal("1e-6"),
    "m": decimal.Decimal("1e-3"),
    "": decimal.Decimal(1),
    "k": decimal.Decimal(10**3),
    "M": decimal.Decimal(10**6),
    "G": decimal.Decimal(10**9),
    "T": decimal.Decimal(10**12),
    "P": decimal.Decimal(10**15),
    "E": decimal.Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")
_QUANTITY_FORMS = "a Kubernetes quantity such as 500m, 2, 1.5, 16Gi, 512Mi, 1e9 or 4G"


# A quantity longer than this, or with a larger exponent, cannot be an amount of anything we account (int64 holds
# 9.2e18); refusing early keeps "1e999999" from building a million-digit number (a minute of CPU) in Decimal.
_MAX_QUANTITY_CHARS = 64
_MAX_EXPONENT = 30


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> decimal.Decimal:
    """Return the exact value of a Kubernetes quantity string.

    Memoised: a cluster writes the same few quantities ("1", "500m", "16Gi") on thousands of pods, and the scheduler
    reads them on every change; Decimal values are immutable, so sharing them is safe.
    """
    if len(text) > _MAX_QUANTITY_CHARS:
        raise QuantityError(f"{text[:_MAX_QUANTITY_CHARS]!r}... is too long to be {_QUANTITY_FORMS}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"{text!r} is not {_QUANTITY_FORMS}")
    number, exponent, suffix = match.groups()
    value = decimal.Decimal(number)
    if exponent:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r}: exponent {power} is out of range (at most {_MAX_EXPONENT})")
        return value * (decimal.Decimal(10) ** power)
    if suffix in _BINARY_SUFFIXES:
        return value * _BINARY_SUFFIXES[suffix]
    return value * _DECIMAL_SUFFIXES[suffix or ""]


def _ceil_int(value: decimal.Decimal) -> int:
    # Kubernetes rounds fractional quantities up when it needs an integer (Quantity.Value()).
    return int(value.to_integral_value(rounding=decimal.ROUND_CEILING))


def parse_bytes(text: str | int) -> int:
    """Bytes from a quantity (``16Gi``, ``512Mi``, ``1e9``) or an integer; rounds up like Kubernetes."""
    if isinstance(text, int):
        return _non_negative(text, str(text))
    return _non_negative(_ceil_int(parse_quantity(text)), text)


def parse_millicores(text: str | int | float) -> int:
    """Millicores from a CPU quantity (``500m``, ``2``, ``1.5``) or a number of cores."""
    if isinstance(text, int | float):
        text = repr(text)
    return _non_negative(_ceil_int(parse_quantity(text) * MILLICORES_PER_CORE), text)


def parse_milli_gpu(text: str | int | float) -> int:
    """Milli-GPU from a device count (``1``, ``0.5``, ``"2"``); rounds to the nearest milli-GPU."""
    if isinstance(text, int | float):
        text = repr(text)
    value = parse_quantity(text) * MILLI_GPU_PER_GPU
    return _non_negative(int(value.to_integral_value(rounding=decimal.ROUND_HALF_EVEN)), text)


def parse_count(text: str | int) -> int:
    """A non-negative whole number (pod slots, device counts)."""
    if isinstance(text, int):
        return _non_negative(text, str(text))
    value = parse_quantity(text)
    if value != value.to_integral_value():
        raise QuantityError(f"{text!r} is not a whole number")
    return _non_negative(int(value), text)


def _non_negative(value: int, text: str) -> int:
    if value < 0:
        raise QuantityError(f"{text!r} is negative; a non-negative amount is required")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
}
_DURATION_FORMS = "a duration such as 500ms, 1s, 1.5s, 2m, 1h30m (Go syntax) or a number of seconds"


def parse_duration_ns(text: str | int | float) -> int:
    """Nanoseconds from a Go-style duration (``1s``, ``500ms``, ``1h30m``) or a bare number of seconds."""
    if isinstance(text, int | float):
        text = repr(text)
    raw = text.strip()
    if not raw:
        raise QuantityError(f"empty duration; expected {_DURATION_FORMS}")
    if len(raw) > _MAX_QUANTITY_CHARS:
        raise QuantityError(f"{raw[:_MAX_QUANTITY_CHARS]!r}... is too long to be {_DURATION_FORMS}")
    try:
        seconds = decimal.Decimal(raw)
    except decimal.InvalidOperation:
        seconds = None
    if seconds is not None:
        if not seconds.is_finite() or seconds < 0:
            raise QuantityError(f"{text!r} is not {_DURATION_FORMS}")
        return int(seconds * NS_PER_S)
    position = 0
    total = decimal.Decimal(0)
    for match in _DURATION.finditer(raw):
        if match.start() != position:
            break
        total += decimal.Decimal(match.group(1)) * _DURATION_UNITS_NS[match.group(2)]
        position = match.end()
    if position != len(raw) or position == 0:
        raise QuantityError(f"{text!r} is not {_DURATION_FORMS}")
    return int(total)


def parse_duration_s(text: str | int | float) -> float:
    """Seconds (as a float, for timers and sleeps only, never for accounting) from a duration."""
    return parse_duration_ns(text) / NS_PER_S


def format_bytes(value: int) -> str:
    """A short human form for messages: ``6.1 GiB``, ``512 MiB``, ``900 B``."""
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def format_milli_gpu(value: int) -> str:
    """``0.25 GPU``, ``2 GPU``: milli-GPU as a person reads it."""
    whole, milli = divmod(value, MILLI_GPU_PER_GPU)
    if milli == 0:
        return f"{whole} GPU"
    return f"{whole}.{milli:03d}".rstrip("0") + " GPU"


def format_bytes_quantity(value: int) -> str:
    """A Kubernetes quantity string for bytes, exact (``16Gi``, ``1536Mi`` or plain bytes)."""
    for suffix, size in (("Ti", 1024**4), ("Gi", GIB), ("Mi", MIB), ("Ki", 1024)):
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)

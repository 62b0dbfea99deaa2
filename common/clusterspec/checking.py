"""The checks every part of a cluster spec shares: Kubernetes names, labels and keys, bounded quantities, choices.

They raise ``Invalid``, a problem without a place: the reader that called them knows the file, the line and the
field (or the inline group, or the node) and adds it when it raises ``ClusterSpecError``. So one check serves the
YAML form, the inline form and ``make_node`` alike, and says the same thing in all three.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from common.errors import QuantityError

MAX_INT = 2**63 - 1  # everything travels as int64 on the wire
_MAX_QUANTITY_CHARS = 64
_EXPONENT = re.compile(r"[eE][+-]?([0-9]+)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")

_E = TypeVar("_E", bound=enum.StrEnum)


class Invalid(Exception):
    """A problem found by a parser below the public functions, which add where it was found."""


def check_name(text: str, what: str) -> None:
    if not _is_dns_subdomain(text):
        raise Invalid(
            f"{what} {text!r} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters)"
        )


def check_namespace(text: str) -> None:
    if not (len(text) <= 63 and _DNS_LABEL.fullmatch(text)):
        raise Invalid(f"namespace {text!r} is not a DNS label (lowercase letters, digits and '-', at most 63)")


def check_key(key: str, what: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if (slash and not _is_dns_subdomain(prefix)) or not (len(name) <= 63 and _LABEL_NAME.fullmatch(name)):
        raise Invalid(
            f"{what} key {key!r} is not a Kubernetes qualified name ([prefix/]name, such as example.com/team)"
        )


def check_label(key: str, value: str) -> None:
    check_key(key, "label")
    if value and not (len(value) <= 63 and _LABEL_NAME.fullmatch(value)):
        raise Invalid(
            f"label value {value!r} of {key!r} is not valid (at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )


def _is_dns_subdomain(text: str) -> bool:
    return 0 < len(text) <= 253 and all(len(part) <= 63 and _DNS_LABEL.fullmatch(part) for part in text.split("."))


def parse(parser: Callable[[str], int], text: str, what: str) -> int:
    """``parser(text)`` (a ``common.quantities`` parser), refusing what does not fit in an int64."""
    # Exact decimal parsing turns "1e999999" into a million-digit integer, which takes a minute: refuse such
    # magnitudes before parsing. Nothing we count needs more than 19 digits.
    exponent = _EXPONENT.search(text)
    if len(text) > _MAX_QUANTITY_CHARS or (exponent is not None and len(exponent[1].lstrip("0")) > 2):
        raise Invalid(f"{what} {excerpt(text)} is out of range")
    try:
        value = parser(text)
    except QuantityError as exc:
        raise Invalid(str(exc)) from exc
    except (ArithmeticError, ValueError) as exc:  # decimal overflow on absurd exponents such as 1e999999999
        raise Invalid(f"{what} {text!r} is out of range") from exc
    if value > MAX_INT:
        raise Invalid(f"{what} {text!r} is too large")
    return value


def choice(kind: type[_E], text: str, what: str) -> _E:
    """The member of ``kind`` spelled ``text``."""
    try:
        return kind(text)
    except ValueError:
        accepted = [member.value for member in kind]
        raise Invalid(f"{what} {text!r} is not one of {', '.join(accepted)}{suggest(text, accepted)}") from None


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or nothing when none is close."""
    candidates = list(choices)
    # "gpu" means "nvidia.com/gpu" far more often than it means "cpu", which is what difflib alone would say.
    qualified = [option for option in candidates if option.lower().endswith("/" + word.lower())]
    close = qualified or difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def excerpt(text: str) -> str:
    """``text`` quoted, cut to 80 characters so that an error never repeats a whole file."""
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")

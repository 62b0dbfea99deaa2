from __future__ import annotations

import pytest

from common import quantities
from common.errors import QuantityError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 * 1024**3),
        ("512Mi", 512 * 1024**2),
        ("1e9", 10**9),
        ("4G", 4 * 10**9),
        ("1.5Ki", 1536),
        (7, 7),
    ],
)
def test_bytes_parse_exactly_from_kubernetes_quantities(text: str | int, expected: int) -> None:
    assert quantities.parse_bytes(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("500m", 500), ("2", 2000), ("1.5", 1500), ("0.0001", 1), (3, 3000)])
def test_cpu_parses_to_millicores_rounding_up(text: str | int, expected: int) -> None:
    assert quantities.parse_millicores(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("0.5", 500), ("1", 1000), ("0.25", 250), (2, 2000)])
def test_gpu_counts_parse_to_milli_gpu(text: str | int, expected: int) -> None:
    assert quantities.parse_milli_gpu(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "16GB", "-1", "1Qi"])
def test_bad_quantities_are_rejected_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(QuantityError, match=r"quantity|negative"):
        quantities.parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "expected_ns"),
    [
        ("1s", 10**9),
        ("500ms", 5 * 10**8),
        ("1h30m", 5400 * 10**9),
        ("1.5s", 15 * 10**8),
        ("2", 2 * 10**9),
        (0.5, 5 * 10**8),
    ],
)
def test_durations_parse_in_go_syntax_or_plain_seconds(text: str | float, expected_ns: int) -> None:
    assert quantities.parse_duration_ns(text) == expected_ns


@pytest.mark.parametrize("text", ["", "1x", "s", "-1s", "1s2", "nan"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(QuantityError, match="duration"):
        quantities.parse_duration_ns(text)


def test_formatting_is_for_people() -> None:
    assert quantities.format_bytes(int(6.1 * 1024**3)) == "6.1 GiB"
    assert quantities.format_milli_gpu(250) == "0.25 GPU"
    assert quantities.format_milli_gpu(2000) == "2 GPU"
    assert quantities.format_bytes_quantity(80 * 1024**3) == "80Gi"


def test_absurd_exponents_and_lengths_are_refused_quickly() -> None:
    with pytest.raises(QuantityError, match="exponent"):
        quantities.parse_bytes("1e999999")
    with pytest.raises(QuantityError, match="too long"):
        quantities.parse_bytes("1" * 100)

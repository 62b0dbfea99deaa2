from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import clusterspec
from common.errors import ClusterSpecError

GIB = 1024**3
S = 1_000_000_000


@pytest.mark.parametrize(
    ("offset_s", "expected"),
    [(-1, None), (0, 2 * GIB), (19, 2 * GIB), (20, 30 * GIB), (59, 30 * GIB), (60, 8 * GIB), (10**6, 8 * GIB)],
)
def test_a_memory_script_is_piecewise_constant_from_its_first_point(offset_s: int, expected: int | None) -> None:
    script = clusterspec.parse_memory_script("2Gi@0s,30Gi@20s,8Gi@1m")
    assert script.at(offset_s * S) == expected


def test_nothing_runs_before_a_script_starts() -> None:
    script = clusterspec.parse_memory_script("1Gi@10s")
    assert (script.at(10 * S - 1), script.at(10 * S), script.start_ns) == (None, GIB, 10 * S)


def test_a_point_without_an_offset_starts_at_zero() -> None:
    assert clusterspec.parse_memory_script(" 6Gi ") == clusterspec.MemoryScript.constant(6 * GIB)
    assert clusterspec.parse_memory_script("1Gi, 2Gi@500ms").points == ((0, GIB), (S // 2, 2 * GIB))


def test_a_memory_script_prints_in_a_canonical_form_that_reads_back_equal() -> None:
    script = clusterspec.parse_memory_script("1536Mi@0s, 1073741824@1500ms, 7@2h, 1Ki@7200000001us, 0@7200000001001ns")
    assert script.text() == "1536Mi@0s,1Gi@1500ms,7@7200s,1Ki@7200000001us,0@7200000001001ns"
    assert clusterspec.parse_memory_script(script.text()) == script


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", r"empty"),
        ("2Gi@", r"empty duration"),
        ("abc", r"'abc' is not a Kubernetes quantity"),
        ("2Gi@10s,3Gi@5s", r"offsets must increase"),
        ("2Gi@1s,3Gi@1s", r"offsets must increase"),
        ("-1Gi@0s", r"negative"),
        ("2Gi@-1s", r"not a duration"),
        ("2Gi@1e999s", r"out of range"),
    ],
)
def test_bad_memory_scripts_are_refused_with_the_reason(text: str, expected: str) -> None:
    with pytest.raises(ClusterSpecError, match=r"^memory script ") as caught:
        clusterspec.parse_memory_script(text)
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_a_memory_script_built_in_code_is_checked_too() -> None:
    with pytest.raises(ClusterSpecError, match="at least one point"):
        clusterspec.MemoryScript(points=())
    with pytest.raises(ClusterSpecError, match="offsets must increase"):
        clusterspec.MemoryScript(points=((5, 1), (5, 2)))
    with pytest.raises(ClusterSpecError, match="out of range"):
        clusterspec.MemoryScript(points=((0, -1),))


# --- Properties ---

_SCRIPT_PIECES = st.sampled_from(["1Gi", "2", "@", "0s", "1m", "500ms", ",", " ", "-", "1e9", "Ki", "h", "1.5", "€"])


@settings(deadline=None)
@given(st.one_of(st.text(), st.lists(_SCRIPT_PIECES, max_size=12).map("".join)))
def test_the_memory_script_parser_raises_nothing_but_a_cluster_spec_error(text: str) -> None:
    try:
        script = clusterspec.parse_memory_script(text)
    except ClusterSpecError:
        return
    assert clusterspec.parse_memory_script(script.text()) == script


@given(
    st.lists(
        st.tuples(st.integers(0, 10**15), st.integers(0, 2**50)), min_size=1, max_size=8, unique_by=lambda p: p[0]
    ).map(sorted)
)
def test_any_memory_script_reads_back_from_its_text(points: list[tuple[int, int]]) -> None:
    script = clusterspec.MemoryScript(points=tuple(points))
    assert clusterspec.parse_memory_script(script.text()) == script

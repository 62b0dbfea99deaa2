from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import clusterspec
from common.errors import ClusterSpecError
from tests.conftest import REPO

GIB = 1024**3
MIB = 1024**2
DEMO = REPO / "examples" / "clusters" / "demo.yaml"


def test_the_inline_form_gives_nodes_of_gpus_with_the_documented_defaults() -> None:
    cluster = clusterspec.parse_inline("2x8xA100-80GB")
    assert [node.name for node in cluster.nodes] == ["node-0", "node-1"]
    assert cluster.pods == ()
    for node in cluster.nodes:
        assert (node.milli_cpu, node.memory_bytes, node.pods) == (128_000, 1024 * GIB, 110)
        assert [gpu.index for gpu in node.gpus] == list(range(8))
        assert {(gpu.model, gpu.memory_bytes) for gpu in node.gpus} == {("A100-80GB", 81920 * MIB)}


def test_inline_groups_joined_by_plus_get_names_unique_across_groups() -> None:
    cluster = clusterspec.parse_inline("2x8xA100-80GB + 4x0 + 1x4xT4")
    assert [node.name for node in cluster.nodes] == [f"node-{index}" for index in range(7)]
    assert [len(node.gpus) for node in cluster.nodes] == [8, 8, 0, 0, 0, 0, 4]
    cpu_only = cluster.nodes[2]
    assert (cpu_only.milli_cpu, cpu_only.memory_bytes) == (64_000, 512 * GIB)
    assert not any(key.startswith("nvidia.com/") for key in cpu_only.labels)


def test_inline_overrides_set_cpu_memory_pods_gpu_memory_and_the_name_prefix() -> None:
    cluster = clusterspec.parse_inline(
        "2x8xA100-80GB:cpu=96,mem=768Gi,pods=64,gpumem=80Gi,prefix=gpu-a+1x2xT4:prefix=gpu-a+1x0:cpu=500m"
    )
    assert [node.name for node in cluster.nodes] == ["gpu-a-0", "gpu-a-1", "gpu-a-2", "node-0"]
    first = cluster.nodes[0]
    assert (first.milli_cpu, first.memory_bytes, first.pods) == (96_000, 768 * GIB, 64)
    assert first.gpus[0].memory_bytes == 80 * GIB
    assert first.labels["nvidia.com/gpu.memory"] == "81920"
    assert cluster.nodes[2].gpus[0].model == "T4"
    assert cluster.nodes[3].milli_cpu == 500


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", r"empty group"),
        ("2x8", r"8 GPUs need a model"),
        ("two", r"not NODESxGPUS"),
        ("2x8xFOO", r"unknown GPU model 'FOO'.*give its memory"),
        ("2x8xA100-80G", r"did you mean 'A100-80GB'"),
        ("4x0xT4", r"a node without GPUs takes no GPU model"),
        ("0x8xT4", r"0 nodes"),
        ("1x65xT4", r"65 GPUs per node"),
        ("200000x0", r"200000 nodes"),
        ("2x8xT4:cpu", r"override 'cpu' is not KEY=VALUE"),
        ("2x8xT4:cpux=4", r"unknown override 'cpux' \(did you mean 'cpu'\?\)"),
        ("2x8xT4:cpu=-1", r"negative"),
        ("2x8xT4:mem=1e999999", r"out of range"),
        ("2x8xT4:cpu=1,cpu=2", r"given twice"),
        ("2x8xT4:prefix=GPU", r"node name 'GPU-0' is not a valid"),
        ("1x0:gpumem=8Gi", r"takes no GPU model or memory"),
        ("2x8xT4++1x0", r"group 2 '': empty group"),
    ],
)
def test_bad_inline_specs_are_refused_with_the_accepted_form(text: str, expected: str) -> None:
    with pytest.raises(ClusterSpecError) as caught:
        clusterspec.parse_inline(text)
    assert re.search(expected, str(caught.value)), str(caught.value)
    assert clusterspec.INLINE_FORM in str(caught.value)


def test_resolve_reads_an_existing_file_else_the_inline_form(tmp_path: Path) -> None:
    assert clusterspec.resolve(str(DEMO)) == clusterspec.load(DEMO)
    assert clusterspec.resolve("1x4xT4") == clusterspec.parse_inline("1x4xT4")
    with pytest.raises(ClusterSpecError, match="no such cluster spec file"):
        clusterspec.resolve(str(tmp_path / "absent.yaml"))


# --- Properties ---

_INLINE_PIECES = st.sampled_from(
    [
        *("1", "2", "0", "8", "x", "xA100-80GB", "xT4", "xFOO", ":", "=", ",", "+", "cpu", "mem=", "gpumem=1Gi"),
        *("pods=3", "prefix=a", "1e99", "-1", "500m", "64Gi", " ", "\x00", "é", "٣"),
    ]
)


@settings(deadline=None)
@given(st.one_of(st.text(), st.lists(_INLINE_PIECES, max_size=12).map("".join)))
def test_the_inline_parser_raises_nothing_but_a_cluster_spec_error(text: str) -> None:
    try:
        cluster = clusterspec.parse_inline(text)
    except ClusterSpecError:
        return
    assert cluster.nodes

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.objects import gpurequest
from scheduler.objects.gpurequest import AnnotationProblem, GpuRequest

GIB = 1024**3
MIB = 1024**2


def pod(annotations_: dict[str, str] | None = None, *, gpus: str | None = None, containers: int = 1) -> dict[str, Any]:
    spec_containers: list[dict[str, Any]] = []
    for i in range(containers):
        container: dict[str, Any] = {"name": f"c{i}" if i else "main", "image": "ubuntu"}
        if gpus is not None and i == 0:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        spec_containers.append(container)
    return {"metadata": {"name": "p", "annotations": annotations_ or {}}, "spec": {"containers": spec_containers}}


def test_a_pod_without_gpus_asks_for_nothing() -> None:
    assert gpurequest.parse(pod()) == gpurequest.NO_GPU


def test_whole_gpus_come_from_the_resource_limit() -> None:
    assert gpurequest.parse(pod(gpus="2")) == GpuRequest(whole=2, devices=2)


@pytest.mark.parametrize(("text", "milli"), [("0.5", 500), ("0.25", 250), ("0.7", 700), (".2", 200), ("0.001", 1)])
def test_fractions_become_milli_gpu(text: str, milli: int) -> None:
    assert gpurequest.parse(pod({"gpu-fraction": text})) == GpuRequest(milli_gpu=milli, devices=1, container="main")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3000", 3000 * MIB),
        ("3Gi", 3 * GIB),
        ("3000Mi", 3000 * MIB),
        ("3G", 3 * 10**9),
        ("3GiB", 3 * GIB),
        ("3Gib", 3 * GIB),
        ("3gib", 3 * GIB),
        ("3 GB", 3 * 10**9),
        ("512MiB", 512 * MIB),
    ],
)
def test_gpu_memory_accepts_kai_integers_quantities_and_spelled_units(text: str, expected: int) -> None:
    request = gpurequest.parse(pod({"gpu-memory": text}))
    assert isinstance(request, GpuRequest) and request.memory_bytes == expected and request.is_share


@pytest.mark.parametrize(
    ("annotations_", "gpus", "field", "words"),
    [
        ({"gpu-fraction": "1.5"}, None, "gpu-fraction", "out of range"),
        ({"gpu-fraction": "1.7"}, None, "gpu-fraction", "out of range"),
        ({"gpu-fraction": "0"}, None, "gpu-fraction", "out of range"),
        ({"gpu-fraction": "-0.2"}, None, "gpu-fraction", "not a decimal"),
        ({"gpu-fraction": "abc"}, None, "gpu-fraction", "not a decimal"),
        ({"gpu-fraction": "0.0001"}, None, "gpu-fraction", "smallest share"),
        ({"gpu-fraction": "0.5"}, "1", "nvidia.com/gpu", "must not request"),
        ({"gpu-fraction": "0.5", "gpu-memory": "3Gi"}, None, "gpu-memory", "both set"),
        ({"gpu-memory": "lots"}, None, "gpu-memory", "integer number of MiB"),
        ({"gpu-memory": "0"}, None, "gpu-memory", "more than 0"),
        ({"gpu-memory": "5Ti"}, None, "gpu-memory", "more than any GPU"),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"},
            None,
            "gpu-fraction-container-name",
            "names no container",
        ),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, None, "gpu-fraction-num-devices", "from 1"),
        ({"gpu-fraction-num-devices": "2"}, None, "gpu-fraction-num-devices", "no GPU share"),
    ],
)
def test_invalid_annotations_are_refused_with_a_message_that_says_what_is_accepted(
    annotations_: dict[str, str], gpus: str | None, field: str, words: str
) -> None:
    problem = gpurequest.parse(pod(annotations_, gpus=gpus))
    assert isinstance(problem, AnnotationProblem)
    assert problem.field == field
    assert words in problem.message


def test_num_devices_and_container_name_are_honoured() -> None:
    request = gpurequest.parse(
        pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2", "gpu-fraction-container-name": "c1"}, containers=2)
    )
    assert request == GpuRequest(milli_gpu=500, devices=2, container="c1")


def test_a_non_integer_gpu_limit_is_refused() -> None:
    problem = gpurequest.parse(pod(gpus="1.5"))
    assert isinstance(problem, AnnotationProblem) and "whole number" in problem.message


@given(st.text(max_size=40), st.text(max_size=40))
def test_no_text_in_the_annotations_ever_raises(fraction: str, memory: str) -> None:
    for annotations_ in ({"gpu-fraction": fraction}, {"gpu-memory": memory}):
        result = gpurequest.parse(pod(annotations_))
        assert isinstance(result, GpuRequest | AnnotationProblem)

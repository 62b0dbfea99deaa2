"""KAI v0.18's per-container GPU memory annotations (NvFractions) in the pod's GPU request, with KAI's rules."""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from scheduler.objects import gpurequest, nvfractions, pods
from scheduler.objects.gpurequest import AnnotationProblem, GpuRequest

MIB = 1024**2
GIB = 1024**3
PREFIX = names.CONTAINER_ANNOTATION_PREFIX


def key(container: str, suffix: str) -> str:
    return f"{PREFIX}{container}{suffix}"


REQUEST = key("gpu-workload", names.GPU_MEMORY_REQUEST_SUFFIX)
LIMIT = key("gpu-workload", names.GPU_MEMORY_LIMIT_SUFFIX)
MODE = key("gpu-workload", names.GPU_COMPUTE_MODE_SUFFIX)
DEVICES = key("gpu-workload", names.GPU_DEVICES_SUFFIX)


def pod(
    annotations: dict[str, str], *, containers: tuple[str, ...] = ("gpu-workload",), gpus: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": name, "image": "nvidia/cuda"} for name in containers]}
    if gpus is not None:
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}


def problem(annotations: dict[str, str], **kw: Any) -> AnnotationProblem:
    parsed = gpurequest.parse(pod(annotations, **kw))
    assert isinstance(parsed, AnnotationProblem), parsed
    return parsed


def test_a_request_below_its_limit_reserves_the_request_and_carries_the_limit() -> None:
    parsed = gpurequest.parse(pod({REQUEST: "4096Mi", LIMIT: "8Gi"}))

    assert parsed == GpuRequest(memory_bytes=4 * GIB, memory_limit_bytes=8 * GIB, devices=1, container="gpu-workload")
    assert isinstance(parsed, GpuRequest) and parsed.is_share and parsed.compute_mode == names.TIME_SLICING


def test_a_limit_alone_sets_the_request_to_it_and_a_request_alone_caps_at_itself() -> None:
    limit_only = gpurequest.parse(pod({LIMIT: "7680Mi"}))
    request_only = gpurequest.parse(pod({REQUEST: "2Gi"}))

    assert isinstance(limit_only, GpuRequest) and isinstance(request_only, GpuRequest)
    assert (limit_only.memory_bytes, limit_only.memory_limit_bytes) == (7680 * MIB, 7680 * MIB)
    assert (request_only.memory_bytes, request_only.memory_limit_bytes) == (2 * GIB, 2 * GIB)


def test_the_keys_name_the_shares_container_whatever_its_place() -> None:
    parsed = gpurequest.parse(pod({REQUEST: "1Gi"}, containers=("sidecar", "gpu-workload")))

    assert isinstance(parsed, GpuRequest) and parsed.container == "gpu-workload"


def test_the_share_may_span_devices_with_the_same_memory_on_each() -> None:
    parsed = gpurequest.parse(pod({REQUEST: "1Gi", names.GPU_FRACTION_NUM_DEVICES_ANNOTATION: "2"}))

    assert isinstance(parsed, GpuRequest) and (parsed.devices, parsed.memory_bytes) == (2, GIB)


@pytest.mark.parametrize(
    ("annotations", "mode"),
    [
        ({REQUEST: "1Gi", MODE: "sm-sharing"}, names.SM_SHARING),
        ({REQUEST: "1Gi", MODE: " time-slicing "}, names.TIME_SLICING),
        ({REQUEST: "1Gi", names.GPU_COMPUTE_SHARING_MODE_ANNOTATION: "sm-sharing"}, names.SM_SHARING),
        ({"gpu-fraction": "0.5", names.GPU_COMPUTE_SHARING_MODE_ANNOTATION: "sm-sharing"}, names.SM_SHARING),
        ({"gpu-fraction": "0.5", MODE: "sm-sharing"}, names.SM_SHARING),
        (
            {REQUEST: "1Gi", MODE: "sm-sharing", names.GPU_COMPUTE_SHARING_MODE_ANNOTATION: "sm-sharing"},
            names.SM_SHARING,
        ),
    ],
)
def test_the_compute_mode_comes_from_the_containers_key_or_kais_pod_annotation(
    annotations: dict[str, str], mode: str
) -> None:
    parsed = gpurequest.parse(pod(annotations))

    assert isinstance(parsed, GpuRequest) and parsed.compute_mode == mode


@pytest.mark.parametrize(
    ("annotations", "field", "words"),
    [
        ({REQUEST: "8Gi", LIMIT: "4Gi"}, REQUEST, "the request must be at most the limit"),
        ({REQUEST: "lots"}, REQUEST, "is not a Kubernetes quantity of at least 1Mi"),
        ({LIMIT: "512Ki"}, LIMIT, "is less than 1Mi"),
        ({REQUEST: "2Ti"}, REQUEST, "more than any GPU holds"),
        ({REQUEST: "-1Gi"}, REQUEST, "is not a Kubernetes quantity"),
        ({key("trainer", names.GPU_MEMORY_REQUEST_SUFFIX): "1Gi"}, key("trainer", names.GPU_MEMORY_REQUEST_SUFFIX),
         "names no container of the pod (containers: 'gpu-workload')"),
        ({REQUEST: "1Gi", MODE: "mps"}, MODE, "is not one of 'time-slicing', 'sm-sharing'"),
        ({REQUEST: "1Gi", MODE: ""}, MODE, "is not one of"),
        ({REQUEST: "1Gi", MODE: "sm-sharing", names.GPU_COMPUTE_SHARING_MODE_ANNOTATION: "time-slicing"},
         names.GPU_COMPUTE_SHARING_MODE_ANNOTATION, "disagrees with"),
        ({MODE: "sm-sharing"}, MODE, "sets a compute mode but the pod asks for no GPU share"),
        ({names.GPU_COMPUTE_SHARING_MODE_ANNOTATION: "sm-sharing"}, names.GPU_COMPUTE_SHARING_MODE_ANNOTATION,
         "asks for no GPU share"),
        ({REQUEST: "1Gi", "gpu-fraction": "0.5"}, names.GPU_MEMORY_ANNOTATION, "ask for a share one way only"),
        ({REQUEST: "1Gi", "gpu-memory": "1024"}, names.GPU_MEMORY_ANNOTATION, "ask for a share one way only"),
        ({REQUEST: "1Gi", names.GPU_FRACTION_CONTAINER_ANNOTATION: "other"},
         names.GPU_FRACTION_CONTAINER_ANNOTATION, "names no container"),
        ({f"{PREFIX}gpu-workload.gpu-memory.requests": "1Gi"}, f"{PREFIX}gpu-workload.gpu-memory.requests",
         "is not a key KAI reads"),
        ({key("Trainer", names.GPU_MEMORY_REQUEST_SUFFIX): "1Gi"}, key("Trainer", names.GPU_MEMORY_REQUEST_SUFFIX),
         "is not a container name"),
    ],
)  # fmt: skip
def test_what_kais_admission_refuses_is_a_problem_that_names_the_key(
    annotations: dict[str, str], field: str, words: str
) -> None:
    found = problem(annotations)

    assert found.field == field and words in found.message, found


def test_only_one_container_of_a_pod_may_carry_the_keys() -> None:
    found = problem(
        {REQUEST: "1Gi", key("sidecar", names.GPU_MEMORY_REQUEST_SUFFIX): "1Gi"}, containers=("gpu-workload", "sidecar")
    )

    assert "only one container of a pod may have a GPU share" in found.message


def test_a_share_by_key_with_a_whole_gpu_request_is_refused() -> None:
    found = problem({REQUEST: "1Gi"}, gpus="1")

    assert found.field == names.GPU_RESOURCE and "must not request nvidia.com/gpu" in found.message


def test_the_legacy_container_name_must_agree_with_the_keys() -> None:
    found = problem(
        {"gpu-fraction": "0.5", names.GPU_FRACTION_CONTAINER_ANNOTATION: "sidecar", MODE: "sm-sharing"},
        containers=("gpu-workload", "sidecar"),
    )

    assert "name one container" in found.message
    agreeing = gpurequest.parse(
        pod({REQUEST: "1Gi", names.GPU_FRACTION_CONTAINER_ANNOTATION: "gpu-workload"}, containers=("a", "gpu-workload"))
    )
    assert isinstance(agreeing, GpuRequest) and agreeing.container == "gpu-workload"


def test_the_binders_device_keys_are_not_a_request_so_a_pod_bound_by_kai_reads_cleanly() -> None:
    parsed = gpurequest.parse(pod({REQUEST: "1Gi", DEVICES: "GPU-0f1c"}))

    assert isinstance(parsed, GpuRequest) and parsed.memory_bytes == GIB
    assert nvfractions.device_keys({DEVICES: "GPU-0f1c", REQUEST: "1Gi"}) == (DEVICES,)


def test_other_keys_under_nvidias_prefix_are_left_alone() -> None:
    assert gpurequest.parse(pod({f"{PREFIX}gpu-workload.future-knob": "x"})) == gpurequest.NO_GPU


def test_the_legacy_shares_carry_no_limit_of_their_own() -> None:
    parsed = gpurequest.parse(pod({"gpu-memory": "3000"}))

    assert isinstance(parsed, GpuRequest) and parsed.memory_limit_bytes == 0


@pytest.mark.parametrize(("value", "expected"), [("10", 10), ("0", 0), ("+3", 3), ("-2", -2), (None, None)])
def test_the_task_priority_label_is_an_integer_on_the_pod_record(value: str | None, expected: int | None) -> None:
    labels = {} if value is None else {names.TASK_PRIORITY_LABEL: value}
    record = pods.decode({"metadata": {"name": "p", "uid": "u", "labels": labels}, "spec": {}})

    assert record is not None and record.task_priority == expected


def test_a_task_priority_that_is_not_an_integer_is_a_problem_on_the_record() -> None:
    record = pods.decode({"metadata": {"name": "p", "uid": "u", "labels": {names.TASK_PRIORITY_LABEL: "high"}}})

    assert record is not None and not isinstance(record.task_priority, int) and record.task_priority is not None
    assert record.task_priority.field == f"metadata.labels[{names.TASK_PRIORITY_LABEL}]"

"""The node decoder's reading of the operator's GPU health clear: a time, nothing, or a problem said in words."""

from __future__ import annotations

from typing import Any

from common import names
from scheduler.objects import nodes
from scheduler.objects.records import Problem


def node(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1", "uid": "u1", "resourceVersion": "7", "annotations": annotations},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi", names.GPU_RESOURCE: "2"}},
    }


def test_the_clear_time_is_read_to_the_microsecond() -> None:
    record = nodes.decode(node({names.GPU_HEALTH_CLEARED_ANNOTATION: "2026-11-26T17:00:00.250000Z"}))
    assert record is not None and record.health_cleared_ns == 1_795_712_400_250_000_000


def test_no_annotation_is_no_clear() -> None:
    record = nodes.decode(node({}))
    assert record is not None and record.health_cleared_ns == 0


def test_a_clear_that_is_not_a_time_is_a_problem_that_says_the_format() -> None:
    record = nodes.decode(node({names.GPU_HEALTH_CLEARED_ANNOTATION: "yesterday"}))
    assert record is not None and isinstance(record.health_cleared_ns, Problem)
    assert "'yesterday' is not an RFC 3339 time (like 2026-11-26T17:00:00Z)" in record.health_cleared_ns.message
    assert record.health_cleared_ns.field == f"metadata.annotations[{names.GPU_HEALTH_CLEARED_ANNOTATION}]"

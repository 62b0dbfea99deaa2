"""``quotient explain`` on every pending reason the engine produces: what the scheduler writes (KAI's condition and
``status.quotient``, through ``statusfields``) is read back by the plugin and said in text and in ``-o json``.

The e2e proof (``tests/e2e/test_explain.py``) drives a few reasons through the real processes; this one walks every
``status.Reason`` and every ``status.Remedy`` through the same write and read, so a reason or remedy added to the
engine without an explanation fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from common import names
from quotient.explain import document, explaining, gather, rendering, tables
from scheduler.kube import statusfields
from scheduler.placement import model, status

GIB = 1024**3
NOW_NS = 1_790_000_000_000_000_000


def _pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "w-0", "namespace": "team", "uid": "uid-w-0", "labels": {"kai.scheduler/queue": "q"}},
        "spec": {
            "schedulerName": "quotient",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        "status": {"phase": "Pending"},
    }


def _hint(remedy: status.Remedy) -> status.Hint:
    """A hint of each remedy with the numbers the engine gives it."""
    numbers: dict[status.Remedy, dict[str, Any]] = {
        status.Remedy.RAISE_LIMIT: {"queue": "q", "resource": status.Resource.GPU, "current": 4000, "needed": 6000},
        status.Remedy.RAISE_QUOTA: {"queue": "q", "resource": status.Resource.GPU, "current": 0, "needed": 2000},
        status.Remedy.LARGER_NODE: {"resource": status.Resource.GPU, "current": 8000, "needed": 9000},
        status.Remedy.MORE_NODES: {"resource": status.Resource.GPU, "current": 16000, "needed": 24000},
        status.Remedy.SPARE_ROOM: {"queue": "q", "resource": status.Resource.GPU, "current": 3000, "needed": 2000},
        status.Remedy.PREEMPTION_DELAY: {"at_ns": NOW_NS + 90_000_000_000},
    }
    return status.Hint(remedy=remedy, message=f"do what {remedy.value} says", **numbers.get(remedy, {}))


def _podgroup(current: status.Status) -> dict[str, Any]:
    group = model.Group(id=model.GroupId("team/pg-w"), queue=model.QueueName("q"), min_member=1, members=())
    ours = statusfields.group_fields(current, group=group, evictions=(), pods={}, now_ns=NOW_NS)
    # Through JSON, as the API server stores it.
    ours = json.loads(json.dumps(ours))
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg-w", "namespace": "team"},
        "spec": {"queue": "q", "minMember": 1},
        "status": {
            "schedulingConditions": [
                {
                    "type": names.UNSCHEDULABLE_CONDITION,
                    "reason": current.reason.value,
                    "message": current.message,
                    "lastTransitionTime": "2026-09-21T10:00:00Z",
                }
            ],
            "quotient": ours,
        },
    }


def _explained(inputs: gather.ExplainInputs) -> tuple[str, dict[str, Any]]:
    found = explaining.explain(inputs)
    text = rendering.explanation(found, now_ns=NOW_NS, style=tables.Style())
    return text, json.loads(json.dumps(document.explanation(found)))


@pytest.mark.parametrize("reason", list(status.Reason), ids=str)
def test_every_pending_reason_is_said_with_its_code_message_numbers_and_what_would_unblock_it(
    reason: status.Reason,
) -> None:
    detail = status.Detail(
        resource=status.Resource.GPU,
        requested=2000,
        candidates=(
            status.Candidate(
                node="gpu-a",
                lacks=(status.Lack(resource=status.Resource.GPU, requested=2000, free=1000),),
                measured_free_bytes=3 * GIB,
            ),
        ),
        hints=tuple(_hint(remedy) for remedy in status.Remedy if remedy is not status.Remedy.EVICTIONS_PENDING),
    )
    make = status.never if reason is status.Reason.NEVER_FITS else None
    current = (
        make(f"the words for {reason.value}", detail)
        if make
        else status.unschedulable(reason, f"the words for {reason.value}", detail)
    )
    text, out = _explained(
        gather.ExplainInputs(
            target=gather.Target(namespace="team", name="w-0"), pod=_pod(), podgroup=_podgroup(current)
        )
    )
    assert f"Reason: {reason.value} ({current.code.value})" in text
    assert f"the words for {reason.value}" in text
    assert "Blocked on: gpu, 2 GPUs asked" in text
    assert "gpu-a" in text
    for remedy in status.Remedy:
        if remedy is not status.Remedy.EVICTIONS_PENDING:
            assert f"do what {remedy.value} says" in text, remedy
    pending = out["pending"]
    assert out["apiVersion"] == "quotient.dev/explain/v1" and out["state"] == "Pending"
    assert (pending["reason"], pending["code"], pending["structured"]) == (reason.value, current.code.value, True)
    assert (pending["resource"], pending["requested"]) == ("gpu", 2000)
    assert pending["candidates"][0]["lacking"] == [{"resource": "gpu", "requested": 2000, "free": 1000}]
    assert pending["candidates"][0]["measuredFreeMemoryBytes"] == 3 * GIB
    remedies = {hint["remedy"] for hint in pending["unblock"]}
    assert remedies >= {remedy.value for remedy in status.Remedy} - {status.Remedy.EVICTIONS_PENDING.value}
    limit = next(hint for hint in pending["unblock"] if hint["remedy"] == "RaiseLimit")
    assert (limit["queue"], limit["current"], limit["needed"]) == ("q", 4000, 6000)


def test_a_pod_refused_before_it_joins_a_gang_is_explained_by_the_scheduler_s_event_on_it() -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "w-0.1", "namespace": "team", "creationTimestamp": "2026-09-21T10:00:00Z"},
        "type": "Warning",
        "reason": "Unschedulable",
        "message": 'InvalidGpuRequest: gpu-fraction "1.7" is not a fraction between 0 and 1',
        "lastTimestamp": "2026-09-21T10:00:00Z",
    }
    text, out = _explained(
        gather.ExplainInputs(target=gather.Target(namespace="team", name="w-0"), pod=_pod(), events=[event])
    )
    assert "Reason: InvalidGpuRequest" in text
    assert 'gpu-fraction "1.7" is not a fraction between 0 and 1' in text
    assert (out["pending"]["reason"], out["pending"]["structured"]) == ("InvalidGpuRequest", False)

"""The scheduler as ``app.Scheduler`` composes it, over ``MemoryKube``: watches in, a cycle, a bind out.

The end-to-end tests drive the real process against the emulator; this one constructs the composition itself, so a
wiring mistake (a part not started, a callback not connected) fails in a second, with the part named.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common import config, names
from scheduler import app
from scheduler.kube import kubeapi
from scheduler.metrics import SchedulerMetrics
from scheduler.placement import engine, model, plan
from scheduler.settings import SETTINGS, settings_from
from tests import polling
from tests.unit.kube.fakes import MemoryKube

OPEN = {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def _queue(name: str, parent: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": OPEN, "cpu": OPEN, "memory": OPEN}}
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": names.QUEUE_API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _pod(name: str, *, gpus: int, scheduler: str = "quotient") -> dict[str, Any]:
    resources = {"limits": {names.GPU_RESOURCE: str(gpus)}, "requests": {"cpu": "1", "memory": "1Gi"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "resources": resources}]},
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def cluster() -> AsyncIterator[MemoryKube]:
    api = MemoryKube()
    await api.create(
        kubeapi.NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {names.GPU_MEMORY_LABEL: "81920"}},
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", names.GPU_RESOURCE: "2"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    await api.create(kubeapi.QUEUES, _queue(names.DEFAULT_PARENT_QUEUE))
    await api.create(kubeapi.QUEUES, _queue(names.DEFAULT_QUEUE, names.DEFAULT_PARENT_QUEUE))
    yield api


async def test_the_composed_scheduler_groups_places_and_binds_a_pod_of_ours_and_leaves_the_others(
    cluster: MemoryKube,
) -> None:
    values = config.resolve(SETTINGS, argparse.Namespace(), environ={}, file_values={"cycle_debounce": "10ms"})
    scheduler = app.Scheduler(cluster, settings_from(values), SchedulerMetrics())
    await cluster.create(kubeapi.PODS, _pod("train", gpus=1), namespace="ml")
    await cluster.create(kubeapi.PODS, _pod("theirs", gpus=1, scheduler="default-scheduler"), namespace="ml")
    running = asyncio.create_task(scheduler.run())
    try:

        async def bound() -> dict[str, Any] | None:
            pod = await cluster.get(kubeapi.PODS, name="train", namespace="ml")
            return pod if pod is not None and pod["spec"].get("nodeName") else None

        pod = await polling.until(bound, timeout_s=10, what="the pod bound")
        assert scheduler.ready
        assert pod["spec"]["nodeName"] == "n1"
        annotations = pod["metadata"]["annotations"]
        group = annotations[names.POD_GROUP_ANNOTATION]
        assert annotations[names.GPU_DEVICES_ANNOTATION] in ("0", "1")
        podgroup = await cluster.get(kubeapi.POD_GROUPS, name=group, namespace="ml")
        assert podgroup is not None and podgroup["spec"]["queue"] == names.DEFAULT_QUEUE
        theirs = await cluster.get(kubeapi.PODS, name="theirs", namespace="ml")
        assert theirs is not None and not theirs["spec"].get("nodeName"), "another scheduler's pod is left alone"
        await polling.until(lambda: not scheduler.dispatcher.in_flight, what="nothing left in flight")
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


class _TrippedEngine:
    """The real engine, failing like a bug would whenever a snapshot holds a pod named ``poison``."""

    def __init__(self) -> None:
        self._engine = engine.Engine()

    def run(self, snapshot: model.Snapshot) -> plan.Plan:
        if any(pod.name == "poison" for group in snapshot.groups.values() for pod in group.members):
            raise ZeroDivisionError("a bug the poison pod trips")
        return self._engine.run(snapshot)


async def test_a_group_the_engine_fails_with_is_quarantined_and_everyone_else_is_placed(cluster: MemoryKube) -> None:
    values = config.resolve(SETTINGS, argparse.Namespace(), environ={}, file_values={"cycle_debounce": "10ms"})
    metrics = SchedulerMetrics()
    scheduler = app.Scheduler(cluster, settings_from(values), metrics, make_engine=_TrippedEngine)
    await cluster.create(kubeapi.PODS, _pod("poison", gpus=1), namespace="ml")
    running = asyncio.create_task(scheduler.run())
    try:

        async def quarantined() -> str | None:
            pod = await cluster.get(kubeapi.PODS, name="poison", namespace="ml")
            group = ((pod or {}).get("metadata") or {}).get("annotations", {}).get(names.POD_GROUP_ANNOTATION)
            podgroup = await cluster.get(kubeapi.POD_GROUPS, name=group, namespace="ml") if group else None
            conditions = ((podgroup or {}).get("status") or {}).get("schedulingConditions") or []
            return next(
                (
                    str(c["message"])
                    for c in conditions
                    if c.get("reason") == "SchedulingError" and "left out of scheduling" in str(c.get("message"))
                ),
                None,
            )

        message = await polling.until(quarantined, timeout_s=15, what="the poison pod quarantined")
        assert "ZeroDivisionError: a bug the poison pod trips" in message
        assert metrics.quarantined_groups._value.get() == 1, "the quarantined group, not the struck ones"

        async def event_with_the_error() -> bool:
            listed = await cluster.list(kubeapi.EVENTS, namespace="ml")
            return any(
                (event.get("involvedObject") or {}).get("name") == "poison"
                and "SchedulingError" in str(event.get("message"))
                and "ZeroDivisionError" in str(event.get("message"))
                for event in listed.items
            )

        await polling.until(event_with_the_error, timeout_s=10, what="an Event on the pod carrying the error")
        await cluster.create(kubeapi.PODS, _pod("train", gpus=1), namespace="ml")

        async def bound() -> bool:
            pod = await cluster.get(kubeapi.PODS, name="train", namespace="ml")
            return pod is not None and bool(pod["spec"].get("nodeName"))

        await polling.until(bound, timeout_s=10, what="the healthy pod bound while the poison one is quarantined")
        assert not running.done(), "the scheduler kept running"
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

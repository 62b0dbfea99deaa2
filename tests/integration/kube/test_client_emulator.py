"""KubeClient, the reflector, leader election and the event recorder against the project's Kubernetes emulator.

The same client code as in production, over the emulator's REST protocol: lists and field selectors, watches made
to fail with 410 for a while (the state stays exact), a gap hidden by compaction (its deletes are seen), binding
statuses and binding errors that clear up, evictions, PodGroup and Queue status subresources, a leader handover,
and aggregated events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from common import clusterspec
from quotient.emulator.emulator import Emulator
from quotient.emulator.faults import Fault
from scheduler.kube import client, events, leases, watches
from scheduler.kube.client import BindOutcome, EvictOutcome, KubeClient
from scheduler.kube.errors import KubeAlreadyExists, KubeConflict, KubeForbidden, KubeUnavailable

pytestmark = pytest.mark.integration


def pod(name: str, *, scheduler: str = "quotient", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kai.scheduler/queue": "test"}},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "ubuntu"}]},
    }


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    spec = clusterspec.ClusterSpec(nodes=(clusterspec.make_node("gpu-0", gpu_count=2, gpu_model="A100-80GB"),), pods=())
    async with Emulator(spec) as running:
        yield running


@pytest.fixture
async def kube(emulator: Emulator) -> AsyncIterator[KubeClient]:
    async with KubeClient.for_server(emulator.url, request_timeout_s=5.0) as api:
        yield api


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def pod_names(emulator: Emulator) -> set[tuple[str, str]]:
    return {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in emulator.list("v1", "Pod")}


async def test_a_kubeconfig_file_for_the_emulator_works_as_for_a_cluster(emulator: Emulator, tmp_path: Path) -> None:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")

    async with await KubeClient.from_kubeconfig(path) as api:
        nodes = await api.list(client.NODES)

    assert [n["metadata"]["name"] for n in nodes.items] == ["gpu-0"]


async def test_field_selectors_pick_our_unscheduled_pods(emulator: Emulator, kube: KubeClient) -> None:
    for name, scheduler in [("ours", "quotient"), ("kai", "kai-scheduler"), ("theirs", "default-scheduler")]:
        await kube.create(client.PODS, pod(name, scheduler=scheduler), namespace="default")
    bound = await kube.create(client.PODS, pod("ours-bound"), namespace="default")
    await kube.bind_pod(namespace="default", name="ours-bound", node="gpu-0", uid=bound["metadata"]["uid"])

    pending = await kube.list(client.PODS, field_selector="spec.schedulerName=quotient,spec.nodeName=")

    assert [p["metadata"]["name"] for p in pending.items] == ["ours"]


async def test_a_reflector_stays_exact_while_every_watch_answers_410(emulator: Emulator, kube: KubeClient) -> None:
    for i in range(5):
        await kube.create(client.PODS, pod(f"p{i}"), namespace="default")
    reflector = watches.Reflector(
        kube, client.PODS, handler=_ignore, watch_timeout_s=30, read_timeout_s=5, sleep=_short_sleep
    )
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        emulator.inject(Fault(verb="watch", resource="pods", code=410), duration_s=1.5)
        emulator.drop_watches()
        for i in range(3):
            await kube.delete(client.PODS, name=f"p{i}", namespace="default")
            await kube.create(client.PODS, pod(f"q{i}"), namespace="default")
            await asyncio.sleep(0.2)
        await wait_until(lambda: set(reflector.cache) == pod_names(emulator), timeout_s=10)
        await asyncio.sleep(1.5)  # the faults end; the watch resumes
        await kube.create(client.PODS, pod("after"), namespace="default")
        await wait_until(lambda: set(reflector.cache) == pod_names(emulator), timeout_s=10)

        assert reflector.stats.gone >= 1
        for (namespace, name), cached in reflector.cache.items():
            stored = emulator.get("v1", "Pod", name, namespace)
            assert stored is not None
            assert cached["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _ignore(event: watches.ReflectorEvent) -> None:
    return None


async def _short_sleep(delay_s: float) -> None:
    # Keep the test quick: the backoff's shape is tested in the unit tests.
    await asyncio.sleep(min(delay_s, 0.2))


async def test_deletes_hidden_by_a_compacted_gap_are_emitted_after_the_relist(
    emulator: Emulator, kube: KubeClient
) -> None:
    for i in range(4):
        await kube.create(client.PODS, pod(f"p{i}"), namespace="default")
    deleted: list[str] = []

    async def handle(event: watches.ReflectorEvent) -> None:
        if isinstance(event, watches.Deleted):
            deleted.append(event.obj["metadata"]["name"])

    reflector = watches.Reflector(kube, client.PODS, handler=handle, watch_timeout_s=30, read_timeout_s=5)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        emulator.inject(Fault(verb="watch", resource="pods", code=503), duration_s=0.5)
        emulator.drop_watches(abort=True)
        await kube.delete(client.PODS, name="p1", namespace="default")
        await kube.delete(client.PODS, name="p2", namespace="default")
        emulator.compact()
        await wait_until(lambda: reflector.stats.relists >= 1, timeout_s=10)

        assert sorted(deleted) == ["p1", "p2"]
        assert set(reflector.cache) == pod_names(emulator)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_binding_answers_bound_already_assigned_and_pod_gone(emulator: Emulator, kube: KubeClient) -> None:
    created = await kube.create(client.PODS, pod("p"), namespace="default")
    uid = created["metadata"]["uid"]

    first = await kube.bind_pod(namespace="default", name="p", node="gpu-0", uid=uid)
    second = await kube.bind_pod(namespace="default", name="p", node="gpu-0", uid=uid)
    gone = await kube.bind_pod(namespace="default", name="nobody", node="gpu-0")

    assert first.outcome is BindOutcome.BOUND
    stored = emulator.get("v1", "Pod", "p", "default")
    assert stored is not None and stored["spec"]["nodeName"] == "gpu-0"
    assert (second.outcome, second.node) == (BindOutcome.ALREADY_ASSIGNED, "gpu-0")
    assert gone.outcome is BindOutcome.POD_GONE


async def test_bindings_failing_with_500_raise_unavailable_until_the_server_recovers(
    emulator: Emulator, kube: KubeClient
) -> None:
    created = await kube.create(client.PODS, pod("p"), namespace="default")
    emulator.inject(Fault(verb="create", resource="pods", subresource="binding", code=500), count=3)

    failures = 0
    while True:
        try:
            result = await kube.bind_pod(namespace="default", name="p", node="gpu-0", uid=created["metadata"]["uid"])
            break
        except KubeUnavailable:
            failures += 1

    assert failures == 3
    assert result.outcome is BindOutcome.BOUND


async def test_api_errors_map_to_our_classes(emulator: Emulator, kube: KubeClient) -> None:
    created = await kube.create(client.PODS, pod("p"), namespace="default")

    assert await kube.get(client.PODS, name="missing", namespace="default") is None
    with pytest.raises(KubeAlreadyExists):
        await kube.create(client.PODS, pod("p"), namespace="default")
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "1"}}
    with pytest.raises(KubeConflict):
        await kube.replace(client.PODS, stale, name="p", namespace="default")
    emulator.inject(Fault(verb="list", resource="nodes", code=403), count=1)
    with pytest.raises(KubeForbidden):
        await kube.list(client.NODES)


async def test_an_eviction_marks_the_pod_as_a_disruption_target_and_deletes_it(
    emulator: Emulator, kube: KubeClient
) -> None:
    created = await kube.create(client.PODS, pod("victim"), namespace="default")
    uid = created["metadata"]["uid"]
    await kube.bind_pod(namespace="default", name="victim", node="gpu-0", uid=uid)
    seen: list[dict[str, Any]] = []

    async def handle(event: watches.ReflectorEvent) -> None:
        if isinstance(event, watches.Modified | watches.Deleted):
            seen.append(event.obj)

    reflector = watches.Reflector(kube, client.PODS, handler=handle, watch_timeout_s=30)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        result = await kube.evict_pod(
            namespace="default", name="victim", uid=uid, reason="PreemptionByScheduler", message="reclaimed"
        )
        await wait_until(lambda: emulator.get("v1", "Pod", "victim", "default") is None)
        await wait_until(lambda: ("default", "victim") not in reflector.cache)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert result.outcome is EvictOutcome.EVICTED
    assert result.condition_written
    conditions = [c for obj in seen for c in (obj.get("status") or {}).get("conditions", [])]
    assert any(c["type"] == "DisruptionTarget" and c["reason"] == "PreemptionByScheduler" for c in conditions)
    again = await kube.evict_pod(namespace="default", name="victim", uid=uid, reason="r", message="m")
    assert again.outcome is EvictOutcome.POD_GONE


async def test_podgroups_are_created_and_their_status_and_the_queues_status_written(
    emulator: Emulator, kube: KubeClient
) -> None:
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg-train-0-1234", "namespace": "default"},
        "spec": {"minMember": 4, "queue": "default-queue"},
    }
    await kube.create(client.POD_GROUPS, group, namespace="default")
    conditions = [
        {
            "type": "UnschedulableOnNodePool",
            "status": "True",
            "reason": "Unschedulable",
            "message": "GangDoesNotFit: 4 GPUs needed, 2 free",
            "reasons": [{"reason": "GangDoesNotFit", "message": "4 GPUs needed, 2 free"}],
        }
    ]

    patched = await kube.patch(
        client.POD_GROUPS,
        {"status": {"schedulingConditions": conditions}},
        name="pg-train-0-1234",
        namespace="default",
        subresource="status",
    )
    queue = await kube.patch(
        client.QUEUES,
        {"status": {"allocated": {"nvidia.com/gpu": "0"}, "childQueues": []}},
        name="default-queue",
        subresource="status",
    )

    assert patched["status"]["schedulingConditions"] == conditions
    assert patched["spec"]["minMember"] == 4
    assert queue["status"]["allocated"] == {"nvidia.com/gpu": "0"}
    stored = emulator.get("scheduling.run.ai/v2", "Queue", "default-queue")
    assert stored is not None and stored["status"]["allocated"] == {"nvidia.com/gpu": "0"}


async def test_a_standby_takes_over_from_a_dead_leader_within_the_lease_duration(emulator: Emulator) -> None:
    timeline: list[tuple[float, str, str]] = []
    apis = [KubeClient.for_server(emulator.url, request_timeout_s=2.0) for _ in range(2)]

    def elector(identity: str, api: KubeClient) -> tuple[leases.LeaderElector, Callable[[], Any]]:
        config = leases.ElectionConfig(
            namespace="default",
            name="quotient-scheduler",
            identity=identity,
            lease_duration_s=1.0,
            renew_deadline_s=0.7,
            retry_period_s=0.2,
            release_on_cancel=False,
        )

        async def lead() -> None:
            timeline.append((time.monotonic(), identity, "start"))
            try:
                await asyncio.Event().wait()
            finally:
                timeline.append((time.monotonic(), identity, "stop"))

        return leases.LeaderElector(api, config), lead

    try:
        a, lead_a = elector("a", apis[0])
        b, lead_b = elector("b", apis[1])
        task_a = asyncio.create_task(a.run(lead_a))
        await wait_until(lambda: a.is_leader)
        task_b = asyncio.create_task(b.run(lead_b))
        await asyncio.sleep(0.8)
        assert not b.is_leader
        died = time.monotonic()
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)
        await wait_until(lambda: b.is_leader, timeout_s=3)
        took_over_s = time.monotonic() - died
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)
    finally:
        for api in apis:
            await api.close()

    assert took_over_s <= 1.0 + 2 * 0.2 * 1.2 + 0.2, f"took {took_over_s:.2f} s"
    starts = {who: at for at, who, what in timeline if what == "start"}
    stops = {who: at for at, who, what in timeline if what == "stop"}
    assert stops["a"] <= starts["b"]
    stored = emulator.get("coordination.k8s.io/v1", "Lease", "quotient-scheduler", "default")
    assert stored is not None
    assert (stored["spec"]["holderIdentity"], stored["spec"]["leaseTransitions"]) == ("b", 1)


async def test_repeated_events_become_one_event_with_a_count(emulator: Emulator, kube: KubeClient) -> None:
    target = await kube.create(client.PODS, pod("waiting"), namespace="default")
    recorder = events.EventRecorder(kube, instance="quotient-0")
    task = asyncio.create_task(recorder.run())
    try:
        for _ in range(4):
            recorder.warning(target, "Unschedulable", "GangDoesNotFit: 4 GPUs needed, 2 free")
            await asyncio.wait_for(recorder.flush(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    [event] = emulator.list("v1", "Event", "default")
    assert event["count"] == 4
    assert event["involvedObject"]["name"] == "waiting"
    assert event["type"] == "Warning"

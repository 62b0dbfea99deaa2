"""KubeClient over real HTTP: lists, watches and their failures, binding statuses, error mapping, evictions,
leader election handover and event aggregation, against the small API server of ``apiserver.py`` on loopback.

Every request goes through the official ``kubernetes.aio`` client's ApiClient, as in production; only the server is
small. The server answers ``pods/binding`` with a 201 ``Status``, as the real one does, so the binding test also
proves the adapter is immune to the client's parsing bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scheduler.kube import client, events, leases, watches
from scheduler.kube.client import BindOutcome, EvictOutcome, KubeClient, WatchType
from scheduler.kube.errors import (
    KubeAlreadyExists,
    KubeConflict,
    KubeForbidden,
    KubeGone,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)
from tests.integration.kube.apiserver import ApiServer

pytestmark = pytest.mark.integration


def pod(name: str, *, namespace: str = "ml", node: str = "", scheduler: str = "quotient") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "main", "image": "ubuntu"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    api_server = ApiServer(bookmark_interval_s=0.2)
    await api_server.start()
    try:
        yield api_server
    finally:
        await api_server.stop()


@pytest.fixture
async def kube(server: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.for_server(server.url, request_timeout_s=5.0, page_size=2) as api:
        yield api


async def collect(stream: Any, count: int) -> list[client.WatchEvent]:
    found = []
    async with contextlib.aclosing(stream):
        async for event in stream:
            found.append(event)
            if len(found) == count:
                break
    return found


# --- lists and watches ---


async def test_a_list_reads_every_page_and_gives_the_version_to_watch_from(server: ApiServer, kube: KubeClient) -> None:
    for i in range(5):
        server.put("pods", pod(f"p{i}"))

    listed = await kube.list(client.PODS, namespace="ml", field_selector="spec.schedulerName=quotient")

    assert [item["metadata"]["name"] for item in listed.items] == [f"p{i}" for i in range(5)]
    assert listed.resource_version == "5"
    assert all(item["kind"] == "Pod" and item["apiVersion"] == "v1" for item in listed.items), "kind filled in"
    pages = [query for method, path, query in server.requests if path == "/api/v1/namespaces/ml/pods"]
    assert len(pages) == 3
    assert pages[0]["fieldSelector"] == "spec.schedulerName=quotient"
    assert pages[0]["limit"] == "2"


async def test_a_watch_streams_changes_after_the_version_with_bookmarks(server: ApiServer, kube: KubeClient) -> None:
    server.put("pods", pod("before"))
    listed = await kube.list(client.PODS)
    stream = kube.watch(client.PODS, resource_version=listed.resource_version, timeout_s=10)

    async def change() -> None:
        await asyncio.sleep(0.05)
        server.put("pods", pod("new"))
        server.put("pods", pod("new", node="n1"))
        server.remove("pods", "ml", "before")

    changer = asyncio.create_task(change())
    found = await collect(stream, 4)
    await changer

    assert [(e.type, e.object["metadata"].get("name")) for e in found] == [
        (WatchType.ADDED, "new"),
        (WatchType.MODIFIED, "new"),
        (WatchType.DELETED, "before"),
        (WatchType.BOOKMARK, None),
    ]
    assert found[1].object["spec"]["nodeName"] == "n1"
    assert found[3].object["metadata"]["resourceVersion"] == "4"
    query = next(q for method, path, q in server.requests if q.get("watch") == "true")
    assert query["allowWatchBookmarks"] == "true"
    assert query["timeoutSeconds"] == "10"


async def test_a_watch_ends_when_the_server_ends_it_at_its_timeout(server: ApiServer, kube: KubeClient) -> None:
    started = time.monotonic()
    found = await collect(kube.watch(client.NODES, resource_version="0", timeout_s=1), 100)

    assert 0.9 < time.monotonic() - started < 3
    assert {e.type for e in found} == {WatchType.BOOKMARK}


async def test_a_watch_from_a_compacted_version_raises_gone(server: ApiServer, kube: KubeClient) -> None:
    server.put("pods", pod("a"))
    server.put("pods", pod("b"))
    server.compact()

    with pytest.raises(KubeGone, match="too old resource version"):
        await collect(kube.watch(client.PODS, resource_version="1", timeout_s=5), 1)


async def test_a_silent_watch_fails_at_the_client_read_timeout(server: ApiServer, kube: KubeClient) -> None:
    server.silent_watches = True
    started = time.monotonic()

    with pytest.raises(KubeUnavailable, match="watch"):
        await collect(kube.watch(client.PODS, resource_version="0", timeout_s=30, read_timeout_s=0.5), 1)
    assert time.monotonic() - started < 3


async def test_a_dropped_watch_connection_is_unavailable(server: ApiServer, kube: KubeClient) -> None:
    stream = kube.watch(client.PODS, resource_version="0", timeout_s=30)

    async def drop() -> None:
        await asyncio.sleep(0.1)
        server.drop_watches()

    dropper = asyncio.create_task(drop())
    with pytest.raises(KubeUnavailable):
        await collect(stream, 1000)
    await dropper


# --- the reflector over the real client ---


async def test_a_reflector_stays_exact_through_forced_410s_seeing_the_deletes_made_in_the_gaps(
    server: ApiServer, kube: KubeClient
) -> None:
    for i in range(6):
        server.put("pods", pod(f"p{i}"))
    seen: list[watches.ReflectorEvent] = []

    async def handle(event: watches.ReflectorEvent) -> None:
        seen.append(event)

    reflector = watches.Reflector(kube, client.PODS, handler=handle, watch_timeout_s=30, read_timeout_s=5)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        for round_ in range(3):
            # A gap: the watch is cut, things change, the history is compacted, so the next watch gets 410.
            server.drop_watches()
            server.remove("pods", "ml", f"p{round_}")
            server.put("pods", pod(f"new{round_}"))
            bound = copy.deepcopy(server.objects[("pods", "ml", f"p{5 - round_}")])
            bound["spec"]["nodeName"] = "n1"
            server.put("pods", bound)
            server.compact()
            await wait_until(lambda done=round_: reflector.stats.relists > done)
        await wait_until(lambda: names(reflector.cache) == names_in(server))

        assert reflector.stats.gone >= 3
        deleted = {e.obj["metadata"]["name"] for e in seen if isinstance(e, watches.Deleted)}
        assert deleted == {"p0", "p1", "p2"}
        for (namespace, name), obj in reflector.cache.items():
            assert (
                obj["metadata"]["resourceVersion"]
                == server.objects[("pods", namespace, name)]["metadata"]["resourceVersion"]
            )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def names(cache: Any) -> set[str]:
    return {name for _, name in cache}


def names_in(server: ApiServer) -> set[str]:
    return {name for plural, _, name in server.objects if plural == "pods"}


async def wait_until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


# --- binding ---


async def test_binding_answers_bound_then_already_assigned_then_pod_gone(server: ApiServer, kube: KubeClient) -> None:
    created = server.put("pods", pod("p"))
    uid = created["metadata"]["uid"]

    first = await kube.bind_pod(namespace="ml", name="p", node="gpu-1", uid=uid)
    bound_to = server.objects[("pods", "ml", "p")]["spec"]["nodeName"]
    second = await kube.bind_pod(namespace="ml", name="p", node="gpu-2", uid=uid)
    server.remove("pods", "ml", "p")
    third = await kube.bind_pod(namespace="ml", name="p", node="gpu-1", uid=uid)

    assert (first.outcome, bound_to) == (BindOutcome.BOUND, "gpu-1")
    assert (second.outcome, second.node) == (BindOutcome.ALREADY_ASSIGNED, "gpu-1")
    assert "already assigned" in second.message
    assert third.outcome is BindOutcome.POD_GONE


async def test_binding_a_namesake_with_another_uid_is_refused(server: ApiServer, kube: KubeClient) -> None:
    server.put("pods", pod("p"))

    result = await kube.bind_pod(namespace="ml", name="p", node="gpu-1", uid="the-old-pods-uid")

    assert result.outcome is BindOutcome.ALREADY_ASSIGNED
    assert result.node is None
    assert "nodeName" not in server.objects[("pods", "ml", "p")]["spec"]


async def test_binding_failures_other_than_409_and_404_raise_mapped_errors(server: ApiServer, kube: KubeClient) -> None:
    server.put("pods", pod("p"))
    server.inject("POST", "pods/binding", 500, 403)

    with pytest.raises(KubeUnavailable):
        await kube.bind_pod(namespace="ml", name="p", node="gpu-1")
    with pytest.raises(KubeForbidden):
        await kube.bind_pod(namespace="ml", name="p", node="gpu-1")
    assert (await kube.bind_pod(namespace="ml", name="p", node="gpu-1")).outcome is BindOutcome.BOUND


# --- error mapping and the other operations ---


async def test_every_failure_maps_to_our_error_classes(server: ApiServer, kube: KubeClient) -> None:
    assert await kube.get(client.PODS, name="missing", namespace="ml") is None
    created = await kube.create(client.PODS, pod("p"), namespace="ml")
    with pytest.raises(KubeAlreadyExists):
        await kube.create(client.PODS, pod("p"), namespace="ml")
    stale = {**created, "metadata": {**created["metadata"], "resourceVersion": "0"}}
    with pytest.raises(KubeConflict):
        await kube.replace(client.PODS, stale, name="p", namespace="ml")
    with pytest.raises(KubeNotFound):
        await kube.patch(client.PODS, {"metadata": {"labels": {"a": "b"}}}, name="missing", namespace="ml")
    server.inject("GET", "pods", 403, 422, 429, 500, 502)
    for expected in (KubeForbidden, KubeInvalid, KubeUnavailable, KubeUnavailable, KubeUnavailable):
        with pytest.raises(expected):
            await kube.list(client.PODS)


async def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with KubeClient.for_server(f"http://127.0.0.1:{port}", request_timeout_s=2.0) as api:
        with pytest.raises(KubeUnavailable, match="GET /api/v1/nodes"):
            await api.list(client.NODES)


async def test_patches_merge_labels_and_status_and_delete_honours_the_uid(server: ApiServer, kube: KubeClient) -> None:
    created = server.put("pods", pod("p"))

    labelled = await kube.patch(
        client.PODS,
        {"metadata": {"labels": {"runai-gpu-group": "g-1"}, "annotations": {"quotient.dev/gpu-devices": "0"}}},
        name="p",
        namespace="ml",
    )
    assert labelled["metadata"]["labels"] == {"runai-gpu-group": "g-1"}
    with pytest.raises(KubeConflict):
        await kube.delete(client.PODS, name="p", namespace="ml", uid="someone-else")
    deleted = await kube.delete(client.PODS, name="p", namespace="ml", uid=created["metadata"]["uid"])
    assert deleted is not None and deleted["metadata"]["name"] == "p"
    assert await kube.delete(client.PODS, name="p", namespace="ml") is None


async def test_evicting_records_a_disruption_target_condition_then_deletes_the_pod(
    server: ApiServer, kube: KubeClient
) -> None:
    created = server.put(
        "pods", {**pod("victim", node="gpu-1"), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    uid = created["metadata"]["uid"]
    history_before = len(server.history)

    result = await kube.evict_pod(
        namespace="ml", name="victim", uid=uid, reason="PreemptionByScheduler", message="quotient: reclaimed by queue a"
    )
    again = await kube.evict_pod(namespace="ml", name="victim", uid=uid, reason="r", message="m")

    assert (result.outcome, result.condition_written) == (EvictOutcome.EVICTED, True)
    assert again.outcome is EvictOutcome.POD_GONE
    _, _, kind, patched = server.history[history_before]
    assert kind == "MODIFIED"
    conditions = {c["type"]: c for c in patched["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True", "the strategic patch kept the other conditions"
    assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    assert server.history[-1][2] == "DELETED"


async def test_evicting_a_namesake_deletes_nothing(server: ApiServer, kube: KubeClient) -> None:
    server.put("pods", pod("p"))

    result = await kube.evict_pod(namespace="ml", name="p", uid="an-older-pod", reason="r", message="m")

    assert result.outcome is EvictOutcome.POD_GONE
    assert ("pods", "ml", "p") in server.objects


async def test_kinds_outside_the_table_are_resolved_through_discovery(kube: KubeClient) -> None:
    widget = await kube.resolve(api_version="example.com/v1", kind="Widget")
    unknown = await kube.resolve(api_version="nowhere.io/v1", kind="Thing")
    known = await kube.resolve(api_version="apps/v1", kind="Deployment")

    assert widget == client.Resource(
        group="example.com", version="v1", plural="widgets", kind="Widget", namespaced=True
    )
    assert unknown is None
    assert known is client.DEPLOYMENTS


# --- leader election and events over the wire ---


async def test_a_standby_takes_over_within_the_lease_duration_when_the_leader_dies_and_never_both_lead(
    server: ApiServer,
) -> None:
    timeline: list[tuple[float, str, str]] = []

    clients: list[KubeClient] = []

    def candidate(identity: str) -> tuple[leases.LeaderElector, Any]:
        clients.append(KubeClient.for_server(server.url, request_timeout_s=2.0))
        elector = leases.LeaderElector(
            clients[-1],
            leases.ElectionConfig(
                namespace="quotient-system",
                name="quotient-scheduler",
                identity=identity,
                lease_duration_s=1.0,
                renew_deadline_s=0.7,
                retry_period_s=0.2,
                release_on_cancel=False,  # a crash does not release
            ),
        )

        async def lead() -> None:
            timeline.append((time.monotonic(), identity, "start"))
            try:
                await asyncio.Event().wait()
            finally:
                timeline.append((time.monotonic(), identity, "stop"))

        return elector, lead

    a, lead_a = candidate("a")
    b, lead_b = candidate("b")
    task_a = asyncio.create_task(a.run(lead_a))
    await wait_until(lambda: a.is_leader)
    task_b = asyncio.create_task(b.run(lead_b))
    await asyncio.sleep(0.6)
    assert not b.is_leader

    killed_at = time.monotonic()
    task_a.cancel()  # the leader dies: nothing renews its lease any more
    await asyncio.gather(task_a, return_exceptions=True)
    await wait_until(lambda: b.is_leader, timeout_s=3.0)
    took_over_s = time.monotonic() - killed_at
    task_b.cancel()
    await asyncio.gather(task_b, return_exceptions=True)
    for api in clients:
        await api.close()

    assert took_over_s <= 1.0 + 2 * 0.2 * 1.2 + 0.2, f"took {took_over_s:.2f} s"
    starts = {who: at for at, who, what in timeline if what == "start"}
    stops = {who: at for at, who, what in timeline if what == "stop"}
    assert stops["a"] <= starts["b"], "a stopped leading before b started"
    assert server.objects[("leases", "quotient-system", "quotient-scheduler")]["spec"]["holderIdentity"] == "b"


async def test_repeated_events_reach_the_api_as_one_event_with_a_count(server: ApiServer, kube: KubeClient) -> None:
    recorder = events.EventRecorder(kube, instance="quotient-0")
    task = asyncio.create_task(recorder.run())
    target = server.put("pods", pod("waiting"))
    try:
        for _ in range(3):
            recorder.warning(target, "Unschedulable", "GangDoesNotFit: 4 GPUs needed, 3 free")
            await asyncio.wait_for(recorder.flush(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    [event] = [obj for (plural, _, _), obj in server.objects.items() if plural == "events"]
    assert event["count"] == 3
    assert event["involvedObject"]["uid"] == target["metadata"]["uid"]
    assert event["metadata"]["namespace"] == "ml"

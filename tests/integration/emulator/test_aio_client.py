"""The emulator through ``kubernetes.aio``, running on the test's own event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubernetes.aio import client, watch
from kubernetes.aio.client.exceptions import ApiException

from quotient.emulator.emulator import Emulator
from tests.integration.emulator.conftest import FAST, cluster, pod_manifest
from tests.polling import until


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator(cluster(), config=FAST) as running:
        yield running


@pytest.fixture
async def core(emulator: Emulator) -> AsyncIterator[client.CoreV1Api]:
    configuration = client.Configuration(host=emulator.url)
    async with client.ApiClient(configuration) as api:
        yield client.CoreV1Api(api)


async def test_a_watch_resumes_from_a_list_version_and_advances_on_bookmarks(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod_manifest("one"))
    listed = await core.list_namespaced_pod("default")
    await core.create_namespaced_pod("default", pod_manifest("two"))
    watcher = watch.Watch()
    seen = []
    async with watcher.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ) as stream:
        async for event in stream:
            seen.append(event["type"])
            if event["type"] == "BOOKMARK":
                assert watcher.resource_version == event["raw_object"]["metadata"]["resourceVersion"]
                break
            assert event["object"].metadata.name == "two"
    assert seen == ["ADDED", "BOOKMARK"]


async def test_a_watch_from_a_compacted_version_raises_410_when_a_timeout_is_set(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    listed = await core.list_namespaced_pod("default")
    await core.create_namespaced_pod("default", pod_manifest("later"))
    emulator.compact()
    with pytest.raises(ApiException) as raised:
        async with watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version=listed.metadata.resource_version, timeout_seconds=5
        ) as stream:
            async for _ in stream:
                pass
    assert raised.value.status == 410


async def test_binding_without_preload_content_reports_201_409_404_and_422(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod_manifest("p", schedulerName="quotient"))

    async def bind(pod: str, target: dict[str, str]) -> tuple[int, dict[str, object]]:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": target}
        response = await core.create_namespaced_pod_binding_without_preload_content(pod, "default", body)
        return response.status, json.loads(await response.read())

    node = {"apiVersion": "v1", "kind": "Node", "name": "node-1"}
    assert await bind("p", node) == (
        201,
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
    )
    code, body = await bind("p", node)
    assert code == 409 and body["reason"] == "Conflict"
    assert (
        body["message"]
        == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-1"'
    )
    code, body = await bind("gone", node)
    assert code == 404 and body["message"] == 'pods "gone" not found'
    await core.create_namespaced_pod("default", pod_manifest("q"))
    code, body = await bind("q", {"kind": "Service", "name": ""})
    assert code == 422
    assert {cause["field"] for cause in body["details"]["causes"]} == {"target.kind", "target.name"}  # type: ignore[index]
    assert (await core.read_namespaced_pod("q", "default")).spec.node_name is None


async def test_leases_support_leader_election_style_compare_and_swap(emulator: Emulator) -> None:
    async with client.ApiClient(client.Configuration(host=emulator.url)) as api:
        leases = client.CoordinationV1Api(api)
        body = {
            "metadata": {"name": "lock", "namespace": "kube-system"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 2},
        }
        lease = await leases.create_namespaced_lease("kube-system", body)
        first = lease.metadata.resource_version
        lease.spec.holder_identity = "b"
        await leases.replace_namespaced_lease("lock", "kube-system", lease)
        lease.metadata.resource_version = first
        with pytest.raises(ApiException) as raised:
            await leases.replace_namespaced_lease("lock", "kube-system", lease)
        assert raised.value.status == 409


async def test_hundreds_of_watchers_each_receive_every_event_in_order(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    # Raw streams: the client's Watch() costs ~50 ms to construct (it builds an ApiClient), which is its problem.
    version = (await core.list_namespaced_pod("default")).metadata.resource_version
    url = f"{emulator.url}/api/v1/namespaces/default/pods?watch=true&resourceVersion={version}&timeoutSeconds=10"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def watch_three() -> list[str]:
            names: list[str] = []
            async with session.get(url) as response:
                while len(names) < 3:
                    event = json.loads(await response.content.readline())
                    names.append(event["object"]["metadata"]["name"])
            return names

        watchers = [asyncio.create_task(watch_three()) for _ in range(300)]

        await until(lambda: emulator.hub.count() >= 300, timeout_s=20, what="300 watches open")
        assert emulator.hub.count() == 300
        for name in ("a", "b", "c"):
            await core.create_namespaced_pod("default", pod_manifest(name))
        results = await asyncio.wait_for(asyncio.gather(*watchers), timeout=20)
    assert all(result == ["a", "b", "c"] for result in results)

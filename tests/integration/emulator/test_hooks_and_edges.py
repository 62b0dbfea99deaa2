"""Test hooks (dropped watches, injected 410s and delays) and the less travelled API paths, over raw HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from quotient.emulator import status
from quotient.emulator.emulator import Emulator
from quotient.emulator.faults import Fault
from tests.integration.emulator.conftest import FAST, cluster, pod_manifest
from tests.polling import until


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator(cluster(), config=FAST) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def _create(emulator: Emulator, manifest: dict[str, Any]) -> None:
    created = await emulator.create(manifest)
    assert not isinstance(created, status.Failure), created


async def _phase(emulator: Emulator, name: str, wanted: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        pod = emulator.get("v1", "Pod", name, "default")
        return pod if pod is not None and pod["status"].get("phase") == wanted else None

    return await until(reached, what=f"{name} to reach {wanted}")


async def test_the_bindings_collection_binds_the_pod_named_in_the_body(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    await _create(emulator, pod_manifest("p"))
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "node-1"},
    }
    async with session.post(f"{emulator.url}/api/v1/namespaces/default/bindings", json=body) as response:
        assert response.status == 201 and (await response.json())["status"] == "Success"
    pod = emulator.get("v1", "Pod", "p", "default")
    assert pod is not None and pod["spec"]["nodeName"] == "node-1"


@pytest.mark.parametrize("abort", [False, True])
async def test_dropping_watches_ends_every_stream(
    emulator: Emulator, session: aiohttp.ClientSession, abort: bool
) -> None:
    url = f"{emulator.url}/api/v1/pods?watch=true&resourceVersion={emulator.store.resource_version}"
    responses = [await session.get(url) for _ in range(3)]
    assert emulator.drop_watches(abort=abort) == 3
    for response in responses:
        try:
            assert await asyncio.wait_for(response.content.read(), timeout=5) == b""
        except aiohttp.ClientPayloadError:
            assert abort  # a cut connection ends the chunked body mid-way
        response.release()
    assert emulator.hub.count() == 0


async def test_an_injected_410_answers_every_watch_for_a_while(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    emulator.inject(Fault(verb="watch", code=410, message="too old resource version: 1 (100)"), duration_s=30)
    async with session.get(f"{emulator.url}/api/v1/pods?watch=true&resourceVersion=5") as response:
        assert response.status == 200
        lines = (await response.read()).splitlines()
    event = json.loads(lines[0])
    assert len(lines) == 1 and event["type"] == "ERROR" and event["object"]["code"] == 410
    async with session.get(f"{emulator.url}/api/v1/pods") as listed:
        assert listed.status == 200


async def test_an_injected_delay_holds_matching_requests(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    emulator.inject(Fault(verb="list", resource="nodes", delay_s=0.3), count=1)
    started = time.monotonic()
    async with session.get(f"{emulator.url}/api/v1/nodes") as response:
        assert response.status == 200
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    async with session.get(f"{emulator.url}/api/v1/nodes") as response:
        assert response.status == 200
    assert time.monotonic() - started < 0.3


async def test_eviction_marks_a_disruption_target_then_deletes(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    await _create(emulator, pod_manifest("victim"))
    emulator.api.bind("default", "victim", {"target": {"name": "node-0"}})
    await _phase(emulator, "victim", "Running")
    seen: list[dict[str, Any]] = []
    emulator.store.subscribe(lambda change: seen.append(change.obj) if change.storage == "pods" else None)
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "victim"},
        "deleteOptions": {"gracePeriodSeconds": 0},
    }
    async with session.post(f"{emulator.url}/api/v1/namespaces/default/pods/victim/eviction", json=body) as response:
        assert response.status == 201
    assert emulator.get("v1", "Pod", "victim", "default") is None
    disruption = [c for c in seen[0]["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert disruption and disruption[0]["reason"] == "EvictionByEvictionAPI"


async def test_delete_collection_deletes_what_the_selector_matches(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        await _create(emulator, pod_manifest(name, labels={"team": team}))
    async with session.delete(f"{emulator.url}/api/v1/namespaces/default/pods?labelSelector=team%3Dx") as response:
        assert response.status == 200
        assert sorted(item["metadata"]["name"] for item in (await response.json())["items"]) == ["a", "b"]
    assert [pod["metadata"]["name"] for pod in emulator.list("v1", "Pod", "default")] == ["c"]


async def test_a_dry_run_validates_but_stores_nothing(emulator: Emulator, session: aiohttp.ClientSession) -> None:
    url = f"{emulator.url}/api/v1/namespaces/default/pods?dryRun=All"
    async with session.post(url, json=pod_manifest("dry")) as response:
        assert response.status == 201 and (await response.json())["metadata"]["uid"]
    assert emulator.get("v1", "Pod", "dry", "default") is None


async def test_a_container_that_exits_under_restart_policy_always_is_restarted(emulator: Emulator) -> None:
    await _create(emulator, pod_manifest("looping", annotations={"quotient.dev/sim-duration": "100ms"}))
    emulator.api.bind("default", "looping", {"target": {"name": "node-0"}})

    def restarted_twice() -> dict[str, Any] | None:
        pod = emulator.get("v1", "Pod", "looping", "default")
        statuses = (pod or {}).get("status", {}).get("containerStatuses")
        return pod if statuses and statuses[0]["restartCount"] >= 2 else None

    pod = await until(restarted_twice, what="the container to be restarted twice")
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] == "Completed"


async def test_a_failing_container_under_restart_policy_never_fails_the_pod(emulator: Emulator) -> None:
    script = {"quotient.dev/sim-duration": "50ms", "quotient.dev/sim-exit-code": "3"}
    await _create(emulator, pod_manifest("crash", annotations=script, restartPolicy="Never"))
    emulator.api.bind("default", "crash", {"target": {"name": "node-0"}})
    pod = await _phase(emulator, "crash", "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"


async def test_cluster_scoped_kinds_under_a_namespace_path_are_404(
    emulator: Emulator, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{emulator.url}/api/v1/namespaces/default/nodes") as response:
        assert response.status == 404 and response.headers["Content-Type"] == "application/json"
    async with session.get(f"{emulator.url}/apis/nosuch.group/v1") as response:
        assert response.status == 404 and (await response.json())["kind"] == "Status"


async def test_a_node_can_be_marked_not_ready(emulator: Emulator) -> None:
    updated = emulator.set_node_ready("node-1", False)
    assert updated is not None
    ready = next(c for c in updated["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown" and ready["reason"] == "NodeStatusUnknown"
    emulator.set_node_ready("node-1", True)
    node = emulator.get("v1", "Node", "node-1")
    assert (
        node is not None and next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    )

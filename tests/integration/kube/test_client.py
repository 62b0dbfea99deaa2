"""KubeClient beyond the KubeApi contract (``test_contract_*``): what only the real adapter does, over HTTP.

Credentials from a kubeconfig, paged lists, the mapping of the API's error answers and of an unreachable server
onto our error classes, bindings that fail for a while; and the scheduler's own Kubernetes machinery over the real
client and the emulator: the reflector through 410 storms and compacted gaps, a leader handover, and aggregated
events. Every request goes through the official ``kubernetes.aio`` client's ApiClient, as in production.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from common import clusterspec
from common.errors import ConfigError
from quotient.emulator.emulator import Emulator
from quotient.emulator.faults import Fault
from scheduler.kube import events, kubeapi, leases, watches
from scheduler.kube.client import KubeClient
from scheduler.kube.errors import KubeError, KubeForbidden, KubeInvalid, KubeUnavailable
from scheduler.kube.kubeapi import BindOutcome
from scheduler.objects import pods
from scheduler.objects.records import PodRecord
from tests import polling
from tests.integration.kube.conftest import pod

pytestmark = pytest.mark.integration


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    spec = clusterspec.ClusterSpec(nodes=(clusterspec.make_node("gpu-0", gpu_count=2, gpu_model="A100-80GB"),), pods=())
    async with Emulator(spec) as running:
        yield running


@pytest.fixture
async def api(emulator: Emulator) -> AsyncIterator[KubeClient]:
    async with KubeClient.for_server(emulator.url, request_timeout_s=5.0) as kube:
        yield kube


def pod_names(emulator: Emulator) -> set[tuple[str, str]]:
    return {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in emulator.list("v1", "Pod")}


async def test_a_kubeconfig_file_for_the_emulator_works_as_for_a_cluster(emulator: Emulator, tmp_path: Path) -> None:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")

    async with await KubeClient.from_kubeconfig(path) as kube:
        nodes = await kube.list(kubeapi.NODES)

    assert [n["metadata"]["name"] for n in nodes.items] == ["gpu-0"]


async def test_a_kubeconfig_that_is_not_there_is_said_so_with_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"no kubeconfig file found \\(looked for {missing}\\)"):
        await KubeClient.from_kubeconfig(missing)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    with pytest.raises(ConfigError, match="--kube-server URL"):
        await KubeClient.from_kubeconfig(None)


async def test_a_list_reads_every_page_and_gives_the_first_pages_version() -> None:
    # The emulator answers a list in one piece (it ignores limit), so a few lines of server serve the pages here.
    asked: list[dict[str, str]] = []

    async def pages(request: web.Request) -> web.Response:
        asked.append(dict(request.query))
        start = int(request.query.get("continue") or 0)
        limit = int(request.query["limit"])
        names = [f"p{i}" for i in range(start, min(start + limit, 5))]
        metadata = {"resourceVersion": str(10 + start)}
        if start + limit < 5:
            metadata["continue"] = str(start + limit)
        items = [{"metadata": {"name": name, "namespace": "ml"}} for name in names]
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ml/pods", pages)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with KubeClient.for_server(f"http://{host}:{port}", request_timeout_s=5.0, page_size=2) as kube:
            listed = await kube.list(kubeapi.PODS, namespace="ml", field_selector="spec.schedulerName=quotient")
    finally:
        await runner.cleanup()

    assert [item["metadata"]["name"] for item in listed.items] == [f"p{i}" for i in range(5)]
    assert listed.resource_version == "10", "every page is one snapshot: the first page's version"
    assert all((item["kind"], item["apiVersion"]) == ("Pod", "v1") for item in listed.items), "kind filled in"
    assert [query.get("continue") for query in asked] == [None, "2", "4"]
    assert {(query["limit"], query["fieldSelector"]) for query in asked} == {("2", "spec.schedulerName=quotient")}


async def test_the_apis_error_answers_map_to_our_classes(emulator: Emulator, api: KubeClient) -> None:
    expected = {403: KubeForbidden, 422: KubeInvalid, 429: KubeUnavailable, 500: KubeUnavailable, 502: KubeUnavailable}
    for code, error in expected.items():
        emulator.inject(Fault(verb="list", resource="nodes", code=code, message=f"answered {code}"), count=1)

        with pytest.raises(error) as raised:
            await api.list(kubeapi.NODES)

        assert (raised.value.status, raised.value.message) == (code, f"answered {code}")
    assert [n["metadata"]["name"] for n in (await api.list(kubeapi.NODES)).items] == ["gpu-0"]


async def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with KubeClient.for_server(f"http://127.0.0.1:{port}", request_timeout_s=2.0) as kube:
        with pytest.raises(KubeUnavailable, match="GET /api/v1/nodes"):
            await kube.list(kubeapi.NODES)


async def test_failed_bindings_raise_mapped_errors_until_the_server_recovers(
    emulator: Emulator, api: KubeClient
) -> None:
    created = await api.create(kubeapi.PODS, pod("p"), namespace="default")
    uid = created["metadata"]["uid"]
    raised: list[type[Exception]] = []
    for code in (500, 500, 403):
        emulator.inject(Fault(verb="create", resource="pods", subresource="binding", code=code), count=1)
        with pytest.raises(KubeError) as caught:
            await api.bind_pod(namespace="default", name="p", node="gpu-0", uid=uid)
        raised.append(type(caught.value))
    result = await api.bind_pod(namespace="default", name="p", node="gpu-0", uid=uid)

    assert raised == [KubeUnavailable, KubeUnavailable, KubeForbidden]
    assert result.outcome is BindOutcome.BOUND


# --- the reflector over the real client ---


async def _ignore(event: watches.ReflectorEvent[PodRecord]) -> None:
    return None


async def _short_sleep(delay_s: float) -> None:
    # The reflector's backoff, shortened: its shape is tested in the unit tests.
    await asyncio.sleep(min(delay_s, 0.2))


async def test_a_reflector_stays_exact_while_every_watch_answers_410(emulator: Emulator, api: KubeClient) -> None:
    for i in range(5):
        await api.create(kubeapi.PODS, pod(f"p{i}"), namespace="default")
    reflector = watches.Reflector(
        api, kubeapi.PODS, decode=pods.decode, handler=_ignore, watch_timeout_s=30, read_timeout_s=5, sleep=_short_sleep
    )

    def exact() -> bool:
        return set(reflector.cache) == pod_names(emulator)

    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        storm = emulator.inject(Fault(verb="watch", resource="pods", code=410))
        emulator.drop_watches()
        for i in range(3):
            await api.delete(kubeapi.PODS, name=f"p{i}", namespace="default")
            await api.create(kubeapi.PODS, pod(f"q{i}"), namespace="default")
            await polling.until(exact, what=f"the cache exact after round {i} of the storm")
        gone_in_storm = reflector.stats.gone
        emulator.faults.remove(storm)
        await api.create(kubeapi.PODS, pod("after"), namespace="default")
        await polling.until(exact, what="the cache exact after the storm")

        assert gone_in_storm >= 1
        for (namespace, name), cached in reflector.cache.items():
            stored = emulator.get("v1", "Pod", name, namespace)
            assert stored is not None
            assert cached.resource_version == stored["metadata"]["resourceVersion"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_deletes_hidden_by_a_compacted_gap_are_emitted_after_the_relist(
    emulator: Emulator, api: KubeClient
) -> None:
    for i in range(4):
        await api.create(kubeapi.PODS, pod(f"p{i}"), namespace="default")
    deleted: list[str] = []

    async def handle(event: watches.ReflectorEvent[PodRecord]) -> None:
        if isinstance(event, watches.Deleted):
            deleted.append(event.record.name)

    reflector = watches.Reflector(
        api, kubeapi.PODS, decode=pods.decode, handler=handle, watch_timeout_s=30, read_timeout_s=5
    )
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.wait_synced(), 5)
        outage = emulator.inject(Fault(verb="watch", resource="pods", code=503))
        emulator.drop_watches(abort=True)
        await api.delete(kubeapi.PODS, name="p1", namespace="default")
        await api.delete(kubeapi.PODS, name="p2", namespace="default")
        emulator.compact()
        emulator.faults.remove(outage)
        await polling.until(lambda: reflector.stats.relists >= 1, what="a relist after the gap")

        assert sorted(deleted) == ["p1", "p2"]
        assert set(reflector.cache) == pod_names(emulator)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- leader election and events ---


async def test_a_standby_takes_over_from_a_dead_leader_within_the_lease_duration(emulator: Emulator) -> None:
    timeline: list[tuple[float, str, str]] = []
    apis = [KubeClient.for_server(emulator.url, request_timeout_s=2.0) for _ in range(2)]

    def lease() -> dict[str, Any]:
        found = emulator.get("coordination.k8s.io/v1", "Lease", "quotient-scheduler", "default")
        assert found is not None
        return found

    def elector(identity: str, kube: KubeClient) -> tuple[leases.LeaderElector, Callable[[], Any]]:
        config = leases.ElectionConfig(
            namespace="default",
            name="quotient-scheduler",
            identity=identity,
            lease_duration_s=1.0,
            renew_deadline_s=0.7,
            retry_period_s=0.2,
            release_on_cancel=False,  # a crash does not release
        )

        async def lead() -> None:
            timeline.append((time.monotonic(), identity, "start"))
            try:
                await asyncio.Event().wait()
            finally:
                timeline.append((time.monotonic(), identity, "stop"))

        return leases.LeaderElector(kube, config), lead

    try:
        a, lead_a = elector("a", apis[0])
        b, lead_b = elector("b", apis[1])
        task_a = asyncio.create_task(a.run(lead_a))
        await polling.until(lambda: a.is_leader, what="a leading")
        task_b = asyncio.create_task(b.run(lead_b))
        await polling.until(lambda: b.leader == "a", what="b seeing a lead")
        seen_renewal = lease()["spec"]["renewTime"]
        await polling.until(lambda: lease()["spec"]["renewTime"] != seen_renewal, what="a renewing while b waits")
        assert not b.is_leader
        died = time.monotonic()
        task_a.cancel()  # the leader dies: nothing renews its lease any more
        await asyncio.gather(task_a, return_exceptions=True)
        await polling.until(lambda: b.is_leader, timeout_s=3, what="b taking over")
        took_over_s = time.monotonic() - died
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)
    finally:
        for kube in apis:
            await kube.close()

    assert took_over_s <= 1.0 + 2 * 0.2 * 1.2 + 0.2, f"took {took_over_s:.2f} s"
    starts = {who: at for at, who, what in timeline if what == "start"}
    stops = {who: at for at, who, what in timeline if what == "stop"}
    assert stops["a"] <= starts["b"], "a stopped leading before b started"
    assert (lease()["spec"]["holderIdentity"], lease()["spec"]["leaseTransitions"]) == ("b", 1)


async def test_repeated_events_become_one_event_with_a_count(emulator: Emulator, api: KubeClient) -> None:
    target = await api.create(kubeapi.PODS, pod("waiting"), namespace="default")
    recorder = events.EventRecorder(api, instance="quotient-0")
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
    assert (event["involvedObject"]["name"], event["involvedObject"]["uid"]) == ("waiting", target["metadata"]["uid"])
    assert event["type"] == "Warning"

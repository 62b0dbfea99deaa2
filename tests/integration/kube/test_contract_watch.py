"""The KubeApi contract for watches: the changes after a version in order, every object from "0", 410 below the
compaction floor, selections that objects enter and leave, bookmarks, the server's timeout, the client's read
timeout and broken streams, against ``MemoryKube`` and against ``KubeClient`` over the emulator (``conftest.kube``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeGone, KubeUnavailable
from scheduler.kube.kubeapi import WatchType
from tests.integration.kube.conftest import BOOKMARK_INTERVAL_S, NODE, Backend, changes, pod, version

pytestmark = pytest.mark.integration


def summary(events: list[kubeapi.WatchEvent]) -> list[tuple[WatchType, str]]:
    return [(event.type, event.object["metadata"]["name"]) for event in events]


async def test_a_watch_sends_the_changes_after_the_version_in_order(kube: Backend) -> None:
    await kube.api.create(kubeapi.PODS, pod("before"), namespace="ml")
    listed = await kube.api.list(kubeapi.PODS, namespace="ml")
    stream = kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, namespace="ml", timeout_s=10)

    created = await kube.api.create(kubeapi.PODS, pod("new"), namespace="ml")
    await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"a": "1"}}}, name="new", namespace="ml")
    await kube.api.delete(kubeapi.PODS, name="before", namespace="ml")
    seen = await changes(stream, 3)

    assert summary(seen) == [(WatchType.ADDED, "new"), (WatchType.MODIFIED, "new"), (WatchType.DELETED, "before")]
    assert seen[0].object == created
    assert seen[1].object["metadata"]["labels"] == {"a": "1"}
    versions = [version(event.object) for event in seen]
    assert versions == sorted(versions) and versions[0] > int(listed.resource_version)
    assert seen[2].object["spec"]["containers"][0]["name"] == "main", "a DELETED carries the last state"


async def test_a_watch_from_zero_first_adds_every_object_then_follows(kube: Backend) -> None:
    for name in ("b", "a"):
        await kube.api.create(kubeapi.PODS, pod(name), namespace="ml")
    stream = kube.api.watch(kubeapi.PODS, resource_version="0", namespace="ml", timeout_s=10)

    first = await anext(stream)
    await kube.api.create(kubeapi.PODS, pod("c"), namespace="ml")
    rest = await changes(stream, 2)

    assert summary([first, *rest]) == [(WatchType.ADDED, "a"), (WatchType.ADDED, "b"), (WatchType.ADDED, "c")]


async def test_a_watch_from_a_compacted_version_raises_gone(kube: Backend) -> None:
    created = await kube.api.create(kubeapi.PODS, pod("a"), namespace="ml")
    await kube.api.create(kubeapi.PODS, pod("b"), namespace="ml")
    kube.compact()

    with pytest.raises(KubeGone, match="too old resource version") as raised:
        await changes(kube.api.watch(kubeapi.PODS, resource_version=created["metadata"]["resourceVersion"]), 1)

    assert (raised.value.status, raised.value.reason) == (410, "Expired")


async def test_a_selected_watch_sees_objects_enter_and_leave_its_selection(kube: Backend) -> None:
    listed = await kube.api.list(kubeapi.PODS)
    unscheduled = kube.api.watch(
        kubeapi.PODS,
        resource_version=listed.resource_version,
        field_selector="spec.schedulerName=quotient,spec.nodeName=",
        timeout_s=10,
    )
    labelled = kube.api.watch(
        kubeapi.PODS, resource_version=listed.resource_version, namespace="ml", label_selector="team=a", timeout_s=10
    )

    await kube.api.create(kubeapi.PODS, pod("theirs", scheduler="default-scheduler"), namespace="ml")
    await kube.api.create(kubeapi.PODS, pod("elsewhere", labels={"team": "a"}), namespace="default")
    await kube.api.create(kubeapi.PODS, pod("ours"), namespace="ml")
    await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"team": "a"}}}, name="ours", namespace="ml")
    await kube.api.bind_pod(namespace="ml", name="ours", node=NODE)
    await kube.api.patch(kubeapi.PODS, {"metadata": {"labels": {"team": "b"}}}, name="ours", namespace="ml")
    for_scheduler = await changes(unscheduled, 4)
    for_team = await changes(labelled, 3)

    assert summary(for_scheduler) == [
        (WatchType.ADDED, "elsewhere"),
        (WatchType.ADDED, "ours"),
        (WatchType.MODIFIED, "ours"),
        (WatchType.DELETED, "ours"),
    ]
    left = for_scheduler[3].object
    assert "nodeName" not in left["spec"], "the last state that matched"
    assert version(left) > version(for_scheduler[2].object), "at the version of the write that moved it out"
    assert summary(for_team) == [(WatchType.ADDED, "ours"), (WatchType.MODIFIED, "ours"), (WatchType.DELETED, "ours")]


async def test_an_idle_watch_gets_bookmarks_at_the_current_version(kube: Backend) -> None:
    last = await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    stream = kube.api.watch(kubeapi.PODS, resource_version=last["metadata"]["resourceVersion"], timeout_s=10)

    async with contextlib.aclosing(stream), asyncio.timeout(BOOKMARK_INTERVAL_S * 5):
        pending = asyncio.ensure_future(anext(stream))
        await kube.bookmark()
        bookmark = await pending

    assert bookmark.type is WatchType.BOOKMARK
    assert bookmark.object["metadata"]["resourceVersion"] == last["metadata"]["resourceVersion"]
    assert (bookmark.object["kind"], bookmark.object["apiVersion"]) == ("Pod", "v1")


async def test_a_watch_ends_at_its_timeout(kube: Backend) -> None:
    listed = await kube.api.list(kubeapi.NODES)
    started = time.monotonic()

    async with asyncio.timeout(10):
        found = [
            event
            async for event in kube.api.watch(kubeapi.NODES, resource_version=listed.resource_version, timeout_s=1)
        ]

    assert 0.9 < time.monotonic() - started < 3
    assert {event.type for event in found} <= {WatchType.BOOKMARK}


async def test_a_silent_watch_is_unavailable_at_the_read_timeout(kube: Backend) -> None:
    listed = await kube.api.list(kubeapi.PODS)
    started = time.monotonic()

    with pytest.raises(KubeUnavailable):
        await changes(
            kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, timeout_s=30, read_timeout_s=0.3), 1
        )

    assert time.monotonic() - started < BOOKMARK_INTERVAL_S


async def test_dropped_watches_end_and_cut_ones_are_unavailable(kube: Backend) -> None:
    listed = await kube.api.list(kubeapi.PODS)
    await kube.api.create(kubeapi.PODS, pod("p"), namespace="ml")
    ended = kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, timeout_s=30)
    first = await anext(ended)

    kube.drop_watches(False)
    rest = [event async for event in ended if event.type is not WatchType.BOOKMARK]
    cut = kube.api.watch(kubeapi.PODS, resource_version=listed.resource_version, timeout_s=30)
    again = await anext(cut)
    kube.drop_watches(True)
    with pytest.raises(KubeUnavailable):
        await changes(cut, 1)

    assert (first.type, again.type, rest) == (WatchType.ADDED, WatchType.ADDED, [])

"""The KubeApi contract's fixture: every ``test_contract_*`` test runs once against ``MemoryKube`` (the unit tests'
fake) and once against ``KubeClient`` over the emulator, so the fake cannot drift from the real client.

Each run starts from the same world: namespaces ``default`` and ``ml``, no nodes (so no kubelet writes behind a
test's back; pods are bound to ``node-a``, which no kubelet runs, and a graceful deletion is finished by the
emulator's pod garbage collector at once). ``Backend`` carries what the contract needs from the server side besides
the API: compact the history, drop the watches, serve a new kind through discovery, and ask for a bookmark (the
emulator sends them every second on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.emulator.server import ServerConfig
from scheduler.kube import kubeapi
from scheduler.kube.client import KubeClient
from tests import polling
from tests.unit.kube.fakes import MemoryKube

Obj = dict[str, Any]

NODE = "node-a"
NAMESPACES = ("default", "ml")
BOOKMARK_INTERVAL_S = 1.0
CUSTOM_RESOURCE_DEFINITIONS = kubeapi.Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One ``KubeApi`` under contract and the server-side hooks the contract uses."""

    name: str
    api: kubeapi.KubeApi
    compact: Callable[[], object]
    drop_watches: Callable[[bool], object]
    """End every open watch; ``True``: cut the connections instead."""
    define: Callable[[kubeapi.Resource], Awaitable[None]]
    """Serve a new namespaced kind (a CustomResourceDefinition on a real server)."""
    bookmark: Callable[[], Awaitable[None]]
    """Have the watch being opened sent a bookmark soon (the emulator sends one every ``BOOKMARK_INTERVAL_S``)."""


@pytest.fixture(params=["memory", "emulator"])
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        fake = MemoryKube(require_namespaces=True)
        for namespace in NAMESPACES:
            await fake.create(kubeapi.NAMESPACES, {"metadata": {"name": namespace}})

        async def define_in_memory(resource: kubeapi.Resource) -> None:
            fake.define(resource)

        async def bookmark_when_watched() -> None:
            await polling.until(lambda: fake.open_watches, timeout_s=5, what="a watch open on the fake")
            fake.bookmark()

        yield Backend(
            name="memory",
            api=fake,
            compact=fake.compact,
            drop_watches=lambda abort: fake.drop_watches(abort=abort),
            define=define_in_memory,
            bookmark=bookmark_when_watched,
        )
        return
    config = EmulatorConfig(
        default_queues=False, server=ServerConfig(bookmark_interval_s=BOOKMARK_INTERVAL_S), scripted_pods=False
    )
    async with Emulator(config=config) as emulator, KubeClient.for_server(emulator.url, request_timeout_s=5.0) as api:
        await api.create(kubeapi.NAMESPACES, {"metadata": {"name": "ml"}})

        async def define_by_crd(resource: kubeapi.Resource) -> None:
            await api.create(CUSTOM_RESOURCE_DEFINITIONS, crd(resource))

        async def periodic_bookmarks() -> None:
            return None

        yield Backend(
            name="emulator",
            api=api,
            compact=emulator.compact,
            drop_watches=lambda abort: emulator.drop_watches(abort=abort),
            define=define_by_crd,
            bookmark=periodic_bookmarks,
        )


def crd(resource: kubeapi.Resource) -> Obj:
    """A CustomResourceDefinition serving ``resource`` (namespaced, any fields)."""
    return {
        "metadata": {"name": f"{resource.plural}.{resource.group}"},
        "spec": {
            "group": resource.group,
            "names": {"plural": resource.plural, "singular": resource.kind.lower(), "kind": resource.kind},
            "scope": "Namespaced" if resource.namespaced else "Cluster",
            "versions": [
                {
                    "name": resource.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    scheduler: str = "quotient",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Obj:
    """A valid pod of one container (the emulator validates what it stores)."""
    metadata: Obj = {"name": name, "labels": dict(labels or {})}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "ubuntu"}], **spec},
    }


def queue(name: str) -> Obj:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": {}}


def version(found: Obj) -> int:
    return int(found["metadata"]["resourceVersion"])


async def changes(stream: AsyncGenerator[kubeapi.WatchEvent, None], count: int) -> list[kubeapi.WatchEvent]:
    """The first ``count`` events of a watch that are not bookmarks (the emulator sends those on its own)."""
    found: list[kubeapi.WatchEvent] = []
    async with contextlib.aclosing(stream), asyncio.timeout(10):
        async for event in stream:
            if event.type is not kubeapi.WatchType.BOOKMARK:
                found.append(event)
                if len(found) == count:
                    break
    return found

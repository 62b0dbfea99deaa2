"""The controller manager: a level-triggered work queue in front of the workload controllers, plus the garbage
collector and the namespace controller.

Like kube-controller-manager, each controller is level-triggered: a store change enqueues the object it concerns
(a pod change enqueues its controller), the queue folds duplicates, and one worker reconciles each key from the
current state, retrying after a short delay when a reconcile fails. The garbage collector acts when an owner is
deleted (background propagation; a pod whose owner never existed is left alone, so a scheduler can be tested on
owners it cannot find); the namespace controller empties a terminating namespace, then removes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from common import logs
from quotient.emulator import training
from quotient.emulator.api import Api
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.objects import clone, controller_ref, is_deleting, metadata
from quotient.emulator.store import Change, EventType
from quotient.emulator.workloads import DEPLOYMENTS, JOBS, REPLICASETS, Workloads

log = logs.get("emulator.controllers")

_RECONCILED = (DEPLOYMENTS, REPLICASETS, JOBS, training.PYTORCHJOBS)
_RETRY_S = 0.2
_Key = tuple[str, str, str]  # what, namespace, name


class Controllers:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.store = api.store
        self.workloads = Workloads(api)
        self._queue: asyncio.Queue[_Key] = asyncio.Queue()
        self._pending: set[_Key] = set()
        self._reconcilers: dict[str, Callable[[str, str], Awaitable[None]]] = {
            DEPLOYMENTS: self.workloads.deployment,
            REPLICASETS: self.workloads.replicaset,
            JOBS: self.workloads.job,
            training.PYTORCHJOBS: lambda namespace, name: training.reconcile(self.workloads, namespace, name),
            "gc": self._collect,
            "namespace": self._namespace,
        }
        self.store.subscribe(self._on_change)

    def enqueue(self, key: _Key) -> None:
        if key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    def _later(self, key: _Key) -> None:
        asyncio.get_running_loop().call_later(_RETRY_S, self.enqueue, key)

    def _on_change(self, change: Change) -> None:
        meta = metadata(change.obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if change.storage in _RECONCILED:
            self.enqueue((change.storage, namespace, name))
        if change.storage in ("pods", REPLICASETS):
            ref = controller_ref(change.obj)
            if ref is not None:
                owner = self.api.registry.by_gvk(str(ref.get("apiVersion")), str(ref.get("kind")))
                if owner is not None and owner.storage in _RECONCILED:
                    self.enqueue((owner.storage, namespace, str(ref.get("name"))))
        if change.type is EventType.DELETED and meta.get("uid") and self.store.dependents(str(meta["uid"])):
            self.enqueue(("gc", "", str(meta["uid"])))
        if change.storage == "namespaces" and is_deleting(change.obj) and change.type is not EventType.DELETED:
            self.enqueue(("namespace", "", name))

    async def run(self) -> None:
        while True:
            key = await self._queue.get()
            self._pending.discard(key)
            try:
                await self._reconcilers[key[0]](key[1], key[2])
            except Exception:
                log.exception("reconcile_failed", what=key[0], namespace=key[1], name=key[2])
                self._later(key)

    async def _collect(self, _: str, owner_uid: str) -> None:
        """Delete what a deleted owner owned (background propagation); drop the reference where other owners live."""
        if self.store.by_uid(owner_uid) is not None:
            return
        for storage, dependent in self.store.dependents(owner_uid):
            kind = self.api.registry.by_storage(storage)
            if kind is None:
                continue
            refs = metadata(dependent).get("ownerReferences") or []
            living = [ref for ref in refs if ref.get("uid") != owner_uid and self.store.by_uid(str(ref.get("uid")))]
            meta = metadata(dependent)
            if living:
                trimmed = clone(dependent)
                trimmed["metadata"]["ownerReferences"] = [ref for ref in refs if ref.get("uid") != owner_uid]
                self.api.write(kind, trimmed)
            else:
                await self.api.delete(kind, str(meta.get("namespace") or ""), str(meta.get("name")), DeleteOptions())

    async def _namespace(self, _: str, name: str) -> None:
        namespace = self.store.get("namespaces", "", name)
        if namespace is None or not is_deleting(namespace):
            return
        remaining = 0
        seen: set[str] = set()
        for kind in self.api.registry:
            if not kind.namespaced or kind.storage in seen:
                continue
            seen.add(kind.storage)
            for obj in self.store.objects(kind.storage, name):
                await self.api.delete(kind, name, str(metadata(obj).get("name")), DeleteOptions(grace_period_s=0))
            remaining += len(self.store.objects(kind.storage, name))
        if remaining:
            self._later(("namespace", "", name))
        else:
            self.api.deletion.finish_namespace_deletion(name)

"""Deletion as the API server does it: preconditions, finalizers, graceful pods, namespaces, owner propagation.

A DELETE does not always remove the object at once. A bound pod that is still running is only marked
(``deletionTimestamp`` at the end of its grace period) and its kubelet finishes the deletion once the containers
stopped; an object with finalizers stays, marked, until an update removes the last one (``Api`` then removes it);
a namespace turns Terminating and the namespace controller empties it, then removes it. ``Orphan`` propagation
strips the owner's reference from its dependents first; Background (the default) leaves them to the garbage
collector (``controllers.py``). Deleting a CRD deletes its objects (``crds.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from quotient.emulator import crds, defaulting, status
from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import TERMINAL_PHASES, Obj, clone, is_deleting, metadata, timestamp
from quotient.emulator.store import Store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteOptions:
    grace_period_s: int | None = None
    propagation: str = "Background"  # Background, Foreground (served as Background) or Orphan
    uid: str | None = None  # preconditions
    resource_version: str | None = None
    dry_run: bool = False

    @classmethod
    def from_body(
        cls, body: Any, *, grace: str | None = None, propagation: str | None = None, dry_run: bool = False
    ) -> DeleteOptions:
        """From a ``DeleteOptions`` body and the query parameters (which win)."""
        body = body if isinstance(body, dict) else {}
        preconditions = body.get("preconditions") if isinstance(body.get("preconditions"), dict) else {}
        period = body.get("gracePeriodSeconds")
        if grace is not None and grace.lstrip("-").isdigit():
            period = int(grace)
        return cls(
            grace_period_s=int(period) if isinstance(period, int) else None,
            propagation=str(propagation or body.get("propagationPolicy") or "Background"),
            uid=preconditions.get("uid"),
            resource_version=preconditions.get("resourceVersion"),
            dry_run=dry_run or bool(body.get("dryRun")),
        )


class Deletion:
    """Deletes through the store, and finishes the deletions the kubelets and the namespace controller complete."""

    def __init__(self, *, store: Store, registry: Registry, clock: Callable[[], float]) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock

    def delete(self, kind: Kind, namespace: str, name: str, options: DeleteOptions) -> Obj | status.Failure:
        scope = namespace if kind.namespaced else ""
        current = self.store.get(kind.storage, scope, name)
        if current is None:
            return status.not_found(kind.plural, name, group=kind.group)
        meta = metadata(current)
        if options.uid and options.uid != meta.get("uid"):
            return status.conflict(
                kind.plural,
                name,
                f"Precondition failed: UID in precondition: {options.uid}, UID in object meta: {meta.get('uid')}",
                group=kind.group,
            )
        if options.resource_version and options.resource_version != meta.get("resourceVersion"):
            return status.conflict(
                kind.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {options.resource_version}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
                group=kind.group,
            )
        if options.dry_run:
            return current
        if options.propagation == "Orphan":
            self._orphan_dependents(str(meta.get("uid")))
        if kind.storage == "pods":
            graceful = self._graceful_pod_delete(kind, current, options)
            if graceful is not None:
                return graceful
        elif kind.storage == "namespaces":
            return self._mark(kind, current, phase="Terminating") if not is_deleting(current) else current
        if meta.get("finalizers"):
            return self._mark(kind, current) if not is_deleting(current) else current
        if kind.storage == crds.CRDS:
            crds.drop(current, store=self.store, registry=self.registry)
        removed = self.store.delete(kind.storage, scope, name)
        return removed if removed is not None else current

    def _mark(self, kind: Kind, obj: Obj, *, phase: str | None = None) -> Obj:
        """Mark ``obj`` as being deleted with nothing left to wait for but its finalizers (or its controller)."""
        marked = clone(obj)
        marked["metadata"]["deletionTimestamp"] = timestamp(self.clock())
        marked["metadata"]["deletionGracePeriodSeconds"] = 0
        if phase is not None:
            marked.setdefault("status", {})["phase"] = phase
        return self.store.replace(kind.storage, marked)

    def _graceful_pod_delete(self, kind: Kind, pod: Obj, options: DeleteOptions) -> Obj | None:
        """Mark a running pod for deletion and let its kubelet finish; None when it goes at once (unbound, done,
        or a zero grace period)."""
        spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
        grace = options.grace_period_s
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", defaulting.DEFAULT_GRACE_S))
        if not spec.get("nodeName") or phase in TERMINAL_PHASES or grace <= 0:
            return None
        meta = metadata(pod)
        if is_deleting(pod) and int(meta.get("deletionGracePeriodSeconds") or 0) <= grace:
            return pod
        marked = clone(pod)
        marked["metadata"]["deletionTimestamp"] = timestamp(self.clock() + grace)
        marked["metadata"]["deletionGracePeriodSeconds"] = grace
        return self.store.replace(kind.storage, marked)

    def finish_namespace_deletion(self, name: str) -> None:
        """The namespace controller found it empty: remove it."""
        self.store.delete("namespaces", "", name)

    def finish_pod_deletion(self, pod: Obj) -> None:
        """The kubelet stopped the pod: remove it, unless finalizers hold it (then it stays deleting)."""
        meta = metadata(pod)
        current = self.store.get("pods", str(meta.get("namespace")), str(meta.get("name")))
        if current is None or metadata(current).get("uid") != meta.get("uid"):
            return
        if metadata(current).get("finalizers"):
            if metadata(current).get("deletionGracePeriodSeconds") != 0:
                held = clone(current)
                held["metadata"]["deletionGracePeriodSeconds"] = 0
                self.store.replace("pods", held)
            return
        self.store.delete("pods", str(meta.get("namespace")), str(meta.get("name")))

    def _orphan_dependents(self, owner_uid: str) -> None:
        for storage, dependent in self.store.dependents(owner_uid):
            orphaned = clone(dependent)
            refs = [ref for ref in metadata(orphaned).get("ownerReferences") or [] if ref.get("uid") != owner_uid]
            if refs:
                orphaned["metadata"]["ownerReferences"] = refs
            else:
                orphaned["metadata"].pop("ownerReferences", None)
            self.store.replace(storage, orphaned)

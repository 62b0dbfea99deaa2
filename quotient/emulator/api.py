"""The API semantics: what get, list, create, update, patch, delete and binding do, independent of HTTP.

The HTTP layer (``server.py``), the controllers and the test hooks all write through here, so a pod a ReplicaSet
creates passes the same defaults, admission and validation as one ``kubectl`` creates, and every write lands in the
store (and thus in every watch) the same way. Outcomes a client must handle are values: each call returns the
object or a ``Failure`` (404, 409, 422, ...), which the HTTP layer renders as a ``Status``.

The order of a create follows the API server: a custom resource pruned to its CRD's schema (``schemas``: field
validation refuses or warns of what is dropped), defaults, built-in admission (priority, tolerations, service
account), mutating webhooks, defaults again, then the name from ``generateName`` with a UID and timestamps, then
validation (a custom resource's against its schema too), validating webhooks, and the store. Warnings for the client
(dropped fields, webhooks' warnings) go into the caller's ``schemas.Writing``; the HTTP layer sends them as ``Warning``
headers. Updates check ``metadata.resourceVersion`` (409 Conflict when stale,
which leader election relies on), keep what the caller may not change (status through the main resource, spec
through ``/status``, the object's identity), bump ``generation`` on spec changes, and store nothing when nothing
changed. Deletion (``deletion.py``) and the binding subresource (``binding.py``) have modules of their own.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from common import names
from quotient.emulator import (
    binding,
    conversions,
    crds,
    defaulting,
    identity,
    naming,
    patches,
    schemas,
    selectors,
    status,
    validation,
)
from quotient.emulator.admission import Attributes, Webhooks
from quotient.emulator.deletion import DeleteOptions, Deletion
from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj, clone, is_deleting, metadata, set_condition, timestamp
from quotient.emulator.store import Store

_SYSTEM_FIELDS = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
)
# The API server's ``maxRetryWhenPatchConflicts``: how often a write that lost a race during admission is re-applied.
_RETRIES_WHEN_RACED = 5

# What an update keeps from the stored object whatever the caller sent.
_IDENTITY_FIELDS = (
    "uid",
    "creationTimestamp",
    "namespace",
    "name",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
)


class Api:
    def __init__(self, *, store: Store, registry: Registry, webhooks: Webhooks, clock: Callable[[], float]) -> None:
        self.store = store
        self.registry = registry
        self.webhooks = webhooks
        self.clock = clock
        self.deletion = Deletion(store=store, registry=registry, clock=clock)

    def now(self) -> str:
        return timestamp(self.clock())

    # --- Reads ---

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | status.Failure:
        found = self.store.get(kind.storage, namespace if kind.namespaced else "", name)
        if found is None:
            return status.not_found(kind.plural, name, group=kind.group)
        return found

    def select(
        self,
        kind: Kind,
        namespace: str | None,
        labels: selectors.LabelSelector = selectors.EVERYTHING,
        fields: selectors.FieldSelector = selectors.ALL_FIELDS,
    ) -> list[Obj]:
        """Matching objects in the stored form (selectors see the served form)."""
        scope = namespace if kind.namespaced else None
        exact_name = fields.exact("metadata.name")
        if exact_name is not None and (scope is not None or not kind.namespaced):
            one = self.store.get(kind.storage, scope or "", exact_name)  # a watch or list of one object
            candidates = [one] if one is not None else []
        else:
            candidates = self.store.objects(kind.storage, scope)
        if labels.empty and fields.empty:
            return candidates
        return [
            obj
            for obj in candidates
            if labels.matches_object(obj) and fields.matches(conversions.from_storage(kind, obj))
        ]

    # --- Create ---

    async def create(
        self,
        kind: Kind,
        namespace: str,
        body: Any,
        *,
        dry_run: bool = False,
        writing: schemas.Writing | None = None,
    ) -> Obj | status.Failure:
        """Create an object; takes ownership of ``body`` (a fresh dict)."""
        writing = writing or schemas.Writing()
        obj = identity.stored_form(kind, body, namespace, self.registry)
        if isinstance(obj, status.Failure):
            return obj
        obj = schemas.pruned(kind, obj, writing)
        if isinstance(obj, status.Failure):
            return obj
        meta = obj["metadata"]
        failure = identity.check_namespace(
            self.store, kind, namespace, str(meta.get("name") or meta.get("generateName") or "")
        )
        if failure is not None:
            return failure
        for field in _SYSTEM_FIELDS:
            meta.pop(field, None)
        if kind.has_status and kind.storage != "nodes":  # nodes register with their status; others start empty
            obj.pop("status", None)
        defaulting.apply(kind.storage, obj)
        if kind.storage == "pods":
            failure = defaulting.admit_pod(obj, self.store)
            if failure is not None:
                return failure
        if self.webhooks.configured():
            mutated = await self.webhooks.mutate(self._attributes(kind, "CREATE", obj, None, dry_run), writing.warnings)
            if isinstance(mutated, status.Failure):
                return mutated
            obj = conversions.to_storage(kind, mutated)
            if kind.schema is not None:
                obj = schemas.prune(kind.schema, obj).obj
            meta = obj.setdefault("metadata", {})
            defaulting.apply(kind.storage, obj)
        if not meta.get("name") and meta.get("generateName"):
            scope = namespace if kind.namespaced else ""
            meta["name"] = naming.generate(
                str(meta["generateName"]), taken=lambda name: self.store.get(kind.storage, scope, name) is not None
            )
        name = str(meta.get("name") or "")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.now()
        meta["generation"] = 1
        if kind.storage == "jobs.batch":
            defaulting.job_selector(obj)
        causes = validation.check_metadata(kind.storage, obj, namespaced=kind.namespaced)
        causes += validation.check_create(kind.storage, obj)
        if kind.schema is not None:
            causes += schemas.validate(kind.schema, obj)
        if causes:
            return status.invalid(kind.kind, name, causes, group=kind.group)
        if self.webhooks.configured():
            attributes = self._attributes(kind, "CREATE", obj, None, dry_run)
            failure = await self.webhooks.validate(attributes, writing.warnings)
            if failure is not None:
                return failure
        if self.store.get(kind.storage, meta.get("namespace", ""), name) is not None:
            return status.already_exists(kind.plural, name, group=kind.group)
        if kind.storage == crds.CRDS:
            crds.establish(obj, now=self.now())
        if dry_run:
            return obj
        stored = self.store.create(kind.storage, obj)
        if kind.storage == crds.CRDS:
            self.registry.add_crd(stored)
        return stored

    def _attributes(
        self, kind: Kind, operation: str, obj: Obj | None, old: Obj | None, dry_run: bool, subresource: str = ""
    ) -> Attributes:
        source = obj if obj is not None else old or {}
        return Attributes(
            kind=kind,
            operation=operation,
            namespace=str(metadata(source).get("namespace") or ""),
            name=str(metadata(source).get("name") or ""),
            subresource=subresource,
            obj=conversions.from_storage(kind, obj) if obj is not None else None,
            old=conversions.from_storage(kind, old) if old is not None else None,
            dry_run=dry_run,
        )

    # --- Update and patch ---

    async def update(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        writing: schemas.Writing | None = None,
    ) -> Obj | status.Failure:
        current = self.store.get(kind.storage, namespace if kind.namespaced else "", name)
        if current is None:
            return status.not_found(kind.plural, name, group=kind.group)
        new = identity.stored_form(kind, body, namespace, self.registry)
        if isinstance(new, status.Failure):
            return new
        given = metadata(new).get("name")
        if given and given != name:
            return status.bad_request(f"the name of the object ({given}) does not match the name on the URL ({name})")
        if not kind.builtin and not metadata(new).get("resourceVersion"):
            return status.invalid(
                kind.kind,
                name,
                [status.invalid_value("metadata.resourceVersion", 0, "must be specified for an update")],
                group=kind.group,
            )
        unconditional = not metadata(new).get("resourceVersion")
        pristine = clone(body) if unconditional else body  # the write changes ``new`` in place; a retry starts over
        for _ in range(_RETRIES_WHEN_RACED):
            updated = await self._update(
                kind, current, new, subresource=subresource, dry_run=dry_run, writing=writing or schemas.Writing()
            )
            if not unconditional or not self._raced(kind, current, updated):
                return updated
            current = self.store.get(kind.storage, namespace if kind.namespaced else "", name)
            if current is None:
                return status.not_found(kind.plural, name, group=kind.group)
            new = identity.stored_form(kind, clone(pristine), namespace, self.registry)
            if isinstance(new, status.Failure):
                return new
        return updated

    async def patch(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        writing: schemas.Writing | None = None,
    ) -> Obj | status.Failure:
        for _ in range(_RETRIES_WHEN_RACED):
            current = self.store.get(kind.storage, namespace if kind.namespaced else "", name)
            if current is None:
                return status.not_found(kind.plural, name, group=kind.group)
            patched = patches.apply_patch(
                conversions.from_storage(kind, current), content_type, body, strategic_allowed=kind.strategic_merge
            )
            if isinstance(patched, status.Failure):
                return patched
            new = identity.stored_form(kind, patched, namespace, self.registry)
            if isinstance(new, status.Failure):
                return new
            updated = await self._update(
                kind, current, new, subresource=subresource, dry_run=dry_run, writing=writing or schemas.Writing()
            )
            if not self._raced(kind, current, updated):
                return updated
        return updated

    def _raced(self, kind: Kind, read: Obj, outcome: Obj | status.Failure) -> bool:
        """Whether a write failed only because another writer changed the object while admission ran. The API server
        then applies a patch (or an update that named no resourceVersion) again to the object as it now is, up to
        five times (``maxRetryWhenPatchConflicts``); a patch that carries the old resourceVersion itself still fails,
        since re-applied it names a version that is gone."""
        if not isinstance(outcome, status.Failure) or outcome.code != 409 or outcome.reason != "Conflict":
            return False
        meta = metadata(read)
        return self.store.get(kind.storage, str(meta.get("namespace") or ""), str(meta.get("name"))) is not read

    async def _update(
        self,
        kind: Kind,
        current: Obj,
        new: Obj,
        *,
        subresource: str,
        dry_run: bool,
        writing: schemas.Writing,
    ) -> Obj | status.Failure:
        name = str(metadata(current).get("name"))
        given_rv = metadata(new).get("resourceVersion")
        if given_rv and str(given_rv) != metadata(current).get("resourceVersion"):
            return status.conflict(kind.plural, name, status.STALE, group=kind.group)
        merged: Obj
        if subresource == "status":
            merged = clone(current)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
        else:
            merged = new
            if kind.has_status and kind.storage != "namespaces":
                if "status" in current:
                    merged["status"] = current["status"]
                else:
                    merged.pop("status", None)
            elif kind.storage == "namespaces":
                merged["status"] = current.get("status", {})
            defaulting.apply(kind.storage, merged)
        meta, old_meta = merged.setdefault("metadata", {}), metadata(current)
        for field in _IDENTITY_FIELDS:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        pruned = schemas.pruned(kind, merged, writing)
        if isinstance(pruned, status.Failure):
            return pruned
        merged = pruned
        meta = merged.setdefault("metadata", {})
        if subresource != "status" and _spec_of(kind, merged) != _spec_of(kind, current):
            meta["generation"] = int(old_meta.get("generation") or 1) + 1
        causes = validation.check_metadata(kind.storage, merged, namespaced=kind.namespaced)
        if subresource != "status":
            causes += validation.check_update(kind.storage, merged, current)
        if kind.schema is not None:
            causes += schemas.validate(kind.schema, merged)
        if causes:
            return status.invalid(kind.kind, name, causes, group=kind.group)
        if self.webhooks.configured():
            attributes = self._attributes(kind, "UPDATE", merged, current, dry_run, subresource)
            mutated = await self.webhooks.mutate(attributes, writing.warnings)
            if isinstance(mutated, status.Failure):
                return mutated
            merged = conversions.to_storage(kind, mutated)
            failure = await self.webhooks.validate(dataclasses.replace(attributes, obj=mutated), writing.warnings)
            if failure is not None:
                return failure
            if self.store.get(kind.storage, meta.get("namespace", ""), name) is not current:
                return status.conflict(kind.plural, name, status.STALE, group=kind.group)
        if merged == current:
            return current
        if dry_run:
            return merged
        finished = kind.storage != "pods" or meta.get("deletionGracePeriodSeconds") == 0
        if is_deleting(merged) and not metadata(merged).get("finalizers") and finished:
            removed = self.store.delete(kind.storage, meta.get("namespace", ""), name)
            return removed if removed is not None else merged
        if kind.storage == crds.CRDS:
            self.registry.remove_crd(name)
            self.registry.add_crd(merged)
        return self.store.replace(kind.storage, merged)

    def write(self, kind: Kind, obj: Obj) -> Obj | status.Failure:
        """A controller's own update (spec or status) of an object it read, without admission; a no-op when
        nothing changed, 409 when the object changed since it was read."""
        meta = metadata(obj)
        current = self.store.get(kind.storage, str(meta.get("namespace") or ""), str(meta.get("name")))
        if current is None:
            return status.not_found(kind.plural, str(meta.get("name")), group=kind.group)
        if meta.get("resourceVersion") != metadata(current).get("resourceVersion"):
            return status.conflict(kind.plural, str(meta.get("name")), status.STALE, group=kind.group)
        if obj == current:
            return current
        if _spec_of(kind, obj) != _spec_of(kind, current):
            meta["generation"] = int(metadata(current).get("generation") or 1) + 1
        return self.store.replace(kind.storage, obj)

    def write_status(self, kind: Kind, namespace: str, name: str, new_status: Obj, *, uid: str) -> Obj | None:
        """Replace an object's status (the kubelet's and the controllers' status writes); None when the object is
        gone or is another object of the same name."""
        current = self.store.get(kind.storage, namespace, name)
        if current is None or metadata(current).get("uid") != uid:
            return None
        if current.get("status") == new_status:
            return current
        updated = {**current, "metadata": dict(metadata(current)), "status": new_status}
        return self.store.replace(kind.storage, updated)

    # --- Delete (``deletion.py``) and binding (``binding.py``) ---

    async def delete(self, kind: Kind, namespace: str, name: str, options: DeleteOptions) -> Obj | status.Failure:
        return self.deletion.delete(kind, namespace, name, options)

    def bind(self, namespace: str, name: str, body: Any) -> Obj | status.Failure:
        """``pods/binding``; tests may replace it on the instance to watch what the HTTP layer binds."""
        return binding.bind(self.store, namespace, name, body, now=self.now())

    async def evict(self, kind: Kind, namespace: str, name: str, body: Any) -> Obj | status.Failure:
        """``pods/eviction``: mark the pod with a DisruptionTarget condition, then delete it."""
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return status.not_found("pods", name)
        options = body.get("deleteOptions") if isinstance(body, dict) else None
        new_status = clone(pod.get("status") or {})
        set_condition(
            new_status,
            {
                "type": names.DISRUPTION_TARGET_CONDITION,
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastTransitionTime": self.now(),
            },
        )
        self.write_status(kind, namespace, name, new_status, uid=str(metadata(pod).get("uid")))
        deleted = await self.delete(kind, namespace, name, DeleteOptions.from_body(options))
        if isinstance(deleted, status.Failure):
            return deleted
        return status.success(201)


def _spec_of(kind: Kind, obj: Obj) -> dict[str, Any]:
    """What ``generation`` tracks: everything but metadata (and status, where it is a subresource)."""
    skip = ("metadata", "status") if kind.has_status else ("metadata",)
    return {key: value for key, value in obj.items() if key not in skip}

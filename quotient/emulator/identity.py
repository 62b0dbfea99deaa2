"""A request's object checked against the request that carries it, as the API server checks it before anything else.

The body's ``apiVersion`` and ``kind`` must be the URL's (or absent: then the URL's are written in), its
``metadata`` an object, a namespaced object's ``metadata.namespace`` the URL's namespace (or absent), a
cluster-scoped object's none; and a namespaced object is created only in a namespace that exists and is not being
deleted. The object comes back in its stored form (``conversions``: events.k8s.io Events are stored as core ones).
"""

from __future__ import annotations

from typing import Any

from quotient.emulator import conversions, status
from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj, is_deleting
from quotient.emulator.store import Store


def stored_form(kind: Kind, body: Any, namespace: str, registry: Registry) -> Obj | status.Failure:
    """A request's object in the stored form, with its kind and namespace checked against the request's."""
    if not isinstance(body, dict):
        return status.bad_request("the body of the request must be a JSON object")
    obj = conversions.to_storage(kind, body)
    failure = _check_identity(kind, obj, namespace, registry)
    return obj if failure is None else failure


def _check_identity(kind: Kind, obj: Obj, namespace: str, registry: Registry) -> status.Failure | None:
    api_version, kind_name = obj.get("apiVersion"), obj.get("kind")
    storage_kind = kind
    if kind.api_version == conversions.EVENTS_V1:
        storage_kind = registry.by_gvk("v1", "Event") or kind
    if api_version and api_version != storage_kind.api_version:
        return status.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({kind.api_version})"
        )
    if kind_name and kind_name != kind.kind:
        return status.bad_request(f"the kind in the data ({kind_name}) does not match the expected kind ({kind.kind})")
    obj["apiVersion"], obj["kind"] = storage_kind.api_version, kind.kind
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        return status.bad_request("metadata must be an object")
    if kind.namespaced:
        given = meta.get("namespace")
        if given and given != namespace:
            return status.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    return None


def check_namespace(store: Store, kind: Kind, namespace: str, name: str) -> status.Failure | None:
    """A namespaced object may be created only in a namespace that exists and is not being deleted."""
    if not kind.namespaced:
        return None
    found = store.get("namespaces", "", namespace)
    if found is None:
        return status.not_found("namespaces", namespace)
    if is_deleting(found):
        return status.forbidden(
            kind.plural,
            name,
            f"unable to create new content in namespace {namespace} because it is being terminated",
            group=kind.group,
        )
    return None

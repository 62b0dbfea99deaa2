"""A minimal OpenAPI v3: enough for ``kubectl create -f`` and ``apply -f`` to validate on the server, and for
``kubectl explain`` on the custom resources.

kubectl refuses to create from a file unless it can validate: it reads ``/openapi/v3``, finds the document of the
object's group-version, and looks there for a path whose ``patch`` operation carries the object's
``x-kubernetes-group-version-kind`` and a ``fieldValidation`` query parameter; finding it, it sends
``?fieldValidation=Strict`` and leaves validation to the server. Without a ``requestBody`` on the patch operation
kubectl computes apply patches from its compiled-in types (strategic merge for built-in kinds, JSON merge for custom
resources), which is what it does against any server whose OpenAPI lacks them. Every group-version the registry
serves is listed, so a kind that kubectl may create never misses.

``kubectl explain queue.spec`` looks in the same document for a schema tagged with the kind's
``x-kubernetes-group-version-kind``: each custom kind's CRD schema is published there, under the name the API server
gives it (``io.run.ai.scheduling.v2.Queue``), so a CRD applied at run time is explained at once. The built-in kinds'
schemas (the whole of Kubernetes' OpenAPI) are not served: ``kubectl explain pods`` finds none.
"""

from __future__ import annotations

import hashlib
import json

from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj


def _prefix(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def document(registry: Registry, group: str, version: str) -> Obj | None:
    kinds = registry.resources(group, version)
    if not kinds:
        return None
    paths: Obj = {}
    for kind in sorted(kinds, key=lambda k: k.plural):
        paths[_item_path(kind)] = {
            "patch": {
                "operationId": f"patch{kind.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
                "parameters": [
                    {
                        "name": "fieldValidation",
                        "in": "query",
                        "description": "How the server handles unknown or duplicate fields (Ignore, Warn, Strict).",
                        "schema": {"type": "string", "uniqueItems": True},
                    }
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
    schemas = {schema_name(kind): _published(kind, kind.schema) for kind in kinds if kind.schema is not None}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
    }


def schema_name(kind: Kind) -> str:
    """The name the API server publishes a custom kind's schema under: its group reversed, version and kind
    (``io.run.ai.scheduling.v2.Queue``)."""
    return ".".join([*reversed(kind.group.split(".")), kind.version, kind.kind])


def _published(kind: Kind, schema: Obj) -> Obj:
    """A CRD version's schema as the API server publishes it: tagged with its group-version-kind (what ``kubectl
    explain`` looks for), ``apiVersion``, ``kind`` and ``metadata`` described as on every object."""
    properties = dict(schema.get("properties") or {})
    for field, text in (("apiVersion", _API_VERSION_TEXT), ("kind", _KIND_TEXT)):
        properties[field] = {"description": text, **dict(properties.get(field) or {}), "type": "string"}
    properties["metadata"] = {"type": "object", "description": _METADATA_TEXT}
    return {
        **schema,
        "type": schema.get("type", "object"),
        "properties": properties,
        "x-kubernetes-group-version-kind": [{"group": kind.group, "version": kind.version, "kind": kind.kind}],
    }


# The descriptions every Kubernetes object's common fields carry (``k8s.io/apimachinery``'s TypeMeta, ObjectMeta).
_API_VERSION_TEXT = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
_KIND_TEXT = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this from "
    "the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)
_METADATA_TEXT = (
    "Standard object's metadata. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)


def _item_path(kind: Kind) -> str:
    base = "/" + _prefix(kind.group, kind.version)
    if kind.namespaced:
        return f"{base}/namespaces/{{namespace}}/{kind.plural}/{{name}}"
    return f"{base}/{kind.plural}/{{name}}"


def index(registry: Registry) -> Obj:
    """``/openapi/v3``: each group-version's document URL, with a content hash kubectl caches by."""
    paths: Obj = {}
    for group in registry.groups():
        for version in group.versions:
            found = document(registry, group.name, version)
            if found is None:
                continue
            digest = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:32].upper()
            prefix = _prefix(group.name, version)
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest}"}
    return {"paths": paths}


def at(registry: Registry, rest: str) -> Obj | None:
    """The document at ``/openapi/v3/<rest>``: the index, or one group-version's; None when there is none."""
    parts = [part for part in rest.split("/") if part]
    if not parts:
        return index(registry)
    if len(parts) == 2 and parts[0] == "api":
        return document(registry, "", parts[1])
    if len(parts) == 3 and parts[0] == "apis":
        return document(registry, parts[1], parts[2])
    return None

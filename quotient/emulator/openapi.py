"""A minimal OpenAPI v3, just enough for ``kubectl create -f`` and ``apply -f`` to validate on the server.

kubectl refuses to create from a file unless it can validate: it reads ``/openapi/v3``, finds the document of the
object's group-version, and looks there for a path whose ``patch`` operation carries the object's
``x-kubernetes-group-version-kind`` and a ``fieldValidation`` query parameter; finding it, it sends
``?fieldValidation=Strict`` and leaves validation to the server. No schemas are served: without a
``requestBody`` on the patch operation kubectl computes apply patches from its compiled-in types (strategic merge
for built-in kinds, JSON merge for custom resources), which is what it does against any server whose OpenAPI lacks
them. Every group-version the registry serves is listed, so a kind that kubectl may create never misses.
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
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


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

"""The three PATCH formats: JSON merge patch, strategic merge patch, JSON patch.

kubectl's second ``apply`` of a pod sends a strategic merge patch that names only what changed, with partial
containers and ``$setElementOrder/containers``: lists of built-in types are merged element by element by their
merge key (containers by name, conditions by type, ...) and the ``$`` directives steer it; merging such a patch as
a plain merge patch would replace the containers list and lose fields. The merge keys here are the ``patchMergeKey``
tags of the core, apps and batch types, looked up by field name, which is unambiguous across those types except
``ports`` (container ports by ``containerPort``, service ports by ``port``). Custom resources take merge patches
only, as on a real server. Inputs are never mutated: stored objects are shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quotient.emulator import status
from quotient.emulator.objects import Obj, clone

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# patchMergeKey of list fields with patchStrategy "merge" in core/v1, apps/v1, batch/v1.
MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "addresses": "type",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
    "secrets": "name",
    "ports": "containerPort",
}
# Lists of scalars with patchStrategy "merge": patch elements are added to the set.
PRIMITIVE_MERGE_LISTS = frozenset({"finalizers"})

_DELETE = object()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Obj, patch: Any) -> Obj | status.Failure:
    """A strategic merge patch of a built-in kind."""
    if not isinstance(patch, dict):
        return status.bad_request("a strategic merge patch must be a JSON object")
    merged = _merge_map(target, patch)
    if merged is _DELETE or not isinstance(merged, dict):
        return status.bad_request("a strategic merge patch cannot delete the whole object")
    return merged


def _merge_map(original: Any, patch: Obj) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip_directives(patch)
    result: Obj = clone(original) if isinstance(original, dict) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            if isinstance(value, list):
                orders[key.partition("/")[2]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.partition("/")[2]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _apply_order(field, result[field], order)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        for key in [key for key in result if key not in retain and key not in patch]:
            del result[key]
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    key = MERGE_KEYS.get(field)
    if field == "ports" and any(isinstance(item, dict) and "containerPort" not in item for item in items):
        return "port"  # a Service's ports
    return key


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [_strip_directives(item) for item in patch if not (isinstance(item, dict) and "$patch" in item)]
    current = list(original) if isinstance(original, list) else []
    if field in PRIMITIVE_MERGE_LISTS:
        return current + [item for item in patch if item not in current]
    key = _merge_key(field, [*current, *patch])
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(item) for item in patch]
    merged = [clone(item) for item in current]
    for item in patch:
        position = next(
            (index for index, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item.get(key)),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
            continue
        if position is None:
            merged.append(_strip_directives(item))
        else:
            updated = _merge_map(merged[position], item)
            if updated is _DELETE:
                del merged[position]
            else:
                merged[position] = updated
    return merged


def _apply_order(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    """``$setElementOrder``: the listed elements first, in that order; the others after, as they were."""
    key = _merge_key(field, items)

    def identity(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, dict) else item

    wanted = [identity(item) for item in order]
    ranked = {value: index for index, value in enumerate(wanted) if isinstance(value, str | int | float)}
    listed = sorted((item for item in items if identity(item) in ranked), key=lambda item: ranked[identity(item)])
    return listed + [item for item in items if identity(item) not in ranked]


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _strip_directives(item) for key, item in value.items() if not key.startswith("$") and item is not None
        }
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value


# --- JSON patch (RFC 6902) ---


def _pointer(path: Any) -> list[str] | None:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        return None
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


class _PatchError(Exception):
    """An operation that cannot apply; reported as 422, as the API server does."""


def _walk(document: Any, parts: list[str]) -> Any:
    node = document
    for part in parts:
        if isinstance(node, dict):
            if part not in node:
                raise _PatchError(f"path element {part!r} is missing")
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, allow_end=False)]
        else:
            raise _PatchError(f"cannot descend into a scalar at {part!r}")
    return node


def _index(items: list[Any], part: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(items)
    if not part.isdigit():
        raise _PatchError(f"{part!r} is not an array index")
    index = int(part)
    if index > len(items) or (index == len(items) and not allow_end):
        raise _PatchError(f"array index {index} is out of range")
    return index


def _add(document: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(document, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise _PatchError(f"cannot add to a scalar at {last!r}")
    return document


def _remove(document: Any, parts: list[str]) -> Any:
    if not parts:
        raise _PatchError("cannot remove the whole document")
    parent = _walk(document, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchError(f"path element {last!r} is missing")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, allow_end=False))
    raise _PatchError(f"cannot remove from a scalar at {last!r}")


def json_patch(target: Obj, operations: Any) -> Obj | status.Failure:
    """RFC 6902 operations applied in order to a copy of ``target``; all or nothing."""
    if not isinstance(operations, list):
        return status.bad_request("a JSON patch must be an array of operations")
    document: Any = clone(target)
    try:
        for operation in operations:
            if not isinstance(operation, dict):
                raise _PatchError("each operation must be an object")
            op = operation.get("op")
            parts = _pointer(operation.get("path"))
            if parts is None:
                raise _PatchError(f"invalid path {operation.get('path')!r}")
            if op in ("add", "replace", "test") and "value" not in operation:
                raise _PatchError(f"{op} needs a value")
            if op == "add":
                document = _add(document, parts, clone(operation["value"]))
            elif op == "remove":
                _remove(document, parts)
            elif op == "replace":
                _walk(document, parts)  # must exist
                if parts:
                    _remove(document, parts)
                document = _add(document, parts, clone(operation["value"]))
            elif op in ("move", "copy"):
                source = _pointer(operation.get("from"))
                if source is None:
                    raise _PatchError(f"invalid from {operation.get('from')!r}")
                value = _remove(document, source) if op == "move" else clone(_walk(document, source))
                document = _add(document, parts, value)
            elif op == "test":
                if _walk(document, parts) != operation["value"]:
                    raise _PatchError("testing value failed")
            else:
                raise _PatchError(f"unknown operation {op!r}")
    except _PatchError as exc:
        return status.Failure(code=422, reason="Invalid", message=str(exc))
    if not isinstance(document, dict):
        return status.Failure(code=422, reason="Invalid", message="the patched document is not an object")
    return document


def apply_patch(target: Obj, content_type: str, body: Any, *, strategic_allowed: bool) -> Obj | status.Failure:
    """Dispatch on the request's Content-Type (parameters such as charset ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == MERGE_PATCH:
        if not isinstance(body, dict):
            return status.bad_request("a merge patch must be a JSON object")
        merged = merge_patch(target, body)
        assert isinstance(merged, dict)
        return merged
    if media == JSON_PATCH:
        return json_patch(target, body)
    if media == STRATEGIC_MERGE_PATCH and strategic_allowed:
        return strategic_merge_patch(target, body)
    accepted = [JSON_PATCH, MERGE_PATCH] + ([STRATEGIC_MERGE_PATCH] if strategic_allowed else [])
    return status.unsupported_media_type(media, accepted)

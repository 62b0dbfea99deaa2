"""Custom resources against their CRD's structural schema, as the apiextensions server applies it: prune, default,
validate.

A real API server does three things with a custom resource's body, in this order, and tests must meet all three:

1. **Pruning** (``pruning.Prune``): a field the schema does not declare is dropped, except under
   ``x-kubernetes-preserve-unknown-fields`` and in ``additionalProperties`` maps; ``apiVersion``, ``kind`` and
   ``metadata`` are the server's. A ``null`` where the schema does not say ``nullable`` is dropped too. What was
   dropped is what *field validation* reports: ``?fieldValidation=Strict`` (kubectl's default since 1.27) refuses
   the request with 400 (``strict decoding error: unknown field "spec.minMembers"``), ``Warn`` (the server's
   default) admits it with a warning per field, ``Ignore`` says nothing.
2. **Defaulting**: a missing property with a ``default`` gets it (the Queue's ``priority: 100``).
3. **Validation** (``validation.ValidateCustomResource``): types (an integral number is an integer, as the JSON
   decoder makes it one), ``minimum``/``maximum``, ``enum``, ``required``, ``pattern``, ``minLength``/``maxLength``,
   ``minItems``/``maxItems``, ``x-kubernetes-int-or-string`` and list-type ``map``/``set`` uniqueness, with the
   field paths and messages of kube-openapi, because kubectl prints a 422 from ``details.causes`` alone:
   ``spec.minMember: Invalid value: -1: spec.minMember in body should be greater than or equal to 0``.

Pure: a schema and an object in, the pruned and defaulted object, the pruned paths and the causes out.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from quotient.emulator import status
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, clone
from quotient.emulator.status import Cause, not_supported, required

_ROOT_FIELDS = ("apiVersion", "kind", "metadata")
# The values of the ``fieldValidation`` query parameter; the server's default is Warn.
STRICT, WARN, IGNORE = "Strict", "Warn", "Ignore"


@dataclasses.dataclass(slots=True, kw_only=True)
class Writing:
    """How a write treats the fields a custom resource's schema drops (``?fieldValidation=``: Strict, Warn, Ignore),
    and the warnings it collects for the client (sent as ``Warning`` headers)."""

    field_validation: str = WARN
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pruned:
    """A body after pruning and defaulting, and the paths of the unknown fields that were dropped."""

    obj: Obj
    unknown: tuple[str, ...]


def pruned(kind: Kind, obj: Obj, writing: Writing) -> Obj | status.Failure:
    """A custom resource as its kind's schema keeps it (:func:`prune`), field validation applied to what it drops:
    Strict refuses the request, Warn warns of each field, Ignore says nothing. Kinds without a schema pass as
    they are."""
    if kind.schema is None:
        return obj
    result = prune(kind.schema, obj)
    if result.unknown and writing.field_validation == STRICT:
        unknown = ", ".join(f'unknown field "{path}"' for path in result.unknown)
        return status.bad_request(
            f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: strict decoding error: '
            f"{unknown}"
        )
    if writing.field_validation == WARN:
        writing.warnings.extend(f'unknown field "{path}"' for path in result.unknown)
    return result.obj


def prune(schema: Obj, body: Obj) -> Pruned:
    """Drop what ``schema`` does not declare and fill in its defaults; ``body`` is not changed."""
    obj = clone(body)
    unknown: list[str] = []
    properties = schema.get("properties") or {}
    if not schema.get("x-kubernetes-preserve-unknown-fields"):
        for key in [key for key in obj if key not in _ROOT_FIELDS and key not in properties]:
            unknown.append(key)
            del obj[key]
    for key, sub in properties.items():
        if key in _ROOT_FIELDS or key not in obj:
            continue
        obj[key] = _prune(sub, obj[key], key, unknown)
        if obj[key] is _DROP:
            del obj[key]
    _default(schema, obj)
    return Pruned(obj=obj, unknown=tuple(unknown))


_DROP: Any = object()


def _prune(schema: Any, value: Any, path: str, unknown: list[str]) -> Any:
    if not isinstance(schema, dict):
        return value
    if value is None:
        return None if schema.get("nullable") else _DROP
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return value
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if isinstance(properties, dict):
            for key in list(value):
                if key in properties:
                    pruned = _prune(properties[key], value[key], f"{path}.{key}", unknown)
                    if pruned is _DROP:
                        del value[key]
                    else:
                        value[key] = pruned
                elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                    unknown.append(f"{path}.{key}")
                    del value[key]
        elif isinstance(additional, dict):
            for key in list(value):
                pruned = _prune(additional, value[key], f"{path}[{key}]", unknown)
                if pruned is _DROP:
                    del value[key]
                else:
                    value[key] = pruned
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        kept = []
        for index, item in enumerate(value):
            pruned = _prune(schema["items"], item, f"{path}[{index}]", unknown)
            if pruned is not _DROP:
                kept.append(pruned)
        return kept
    return value


def _default(schema: Any, value: Any) -> None:
    """Fill in ``default`` for missing properties of every object present, depth first."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            if key not in value and "default" in sub:
                value[key] = clone(sub["default"]) if isinstance(sub["default"], dict | list) else sub["default"]
            if key in value:
                _default(sub, value[key])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict) and not schema.get("properties"):
            for item in value.values():
                _default(additional, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


# --- validation -----------------------------------------------------------------------------------------------------


def validate(schema: Obj, obj: Obj) -> list[Cause]:
    """The field errors of ``obj`` (already pruned) against ``schema``, as the API server reports them."""
    causes: list[Cause] = []
    properties = schema.get("properties") or {}
    for key, sub in properties.items():
        if key in _ROOT_FIELDS:
            continue
        if key in obj:
            _validate(sub, obj[key], key, causes)
    for key in schema.get("required") or []:
        if key not in obj and key not in _ROOT_FIELDS:
            causes.append(required(key))
    return causes


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _is_type(value: Any, wanted: str) -> bool:
    actual = _type_name(value)
    if wanted == "integer":
        return actual == "integer" or (actual == "number" and float(value).is_integer())
    if wanted == "number":
        return actual in ("integer", "number")
    return actual == wanted


def _invalid(path: str, value: Any, detail: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else _go_value(value)
    return Cause(field=path, reason="FieldValueInvalid", message=f"Invalid value: {shown}: {detail}")


def _go_value(value: Any) -> str:
    """A value as Go's ``%#v`` prints the ones a schema check meets (numbers as written, bools lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, sort_keys=True)


def _validate(schema: Any, value: Any, path: str, causes: list[Cause]) -> None:
    if not isinstance(schema, dict):
        return
    if value is None:
        return  # kept only where nullable
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is_type(value, "integer") or isinstance(value, str)):
            causes.append(
                Cause(
                    field=path,
                    reason="FieldValueTypeInvalid",
                    message=f'Invalid value: "{_type_name(value)}": {path} in body must be of type integer,string: '
                    f'"{_type_name(value)}"',
                )
            )
        return
    wanted = schema.get("type")
    if isinstance(wanted, str) and not _is_type(value, wanted):
        causes.append(
            Cause(
                field=path,
                reason="FieldValueTypeInvalid",
                message=f'Invalid value: "{_type_name(value)}": {path} in body must be of type {wanted}: '
                f'"{_type_name(value)}"',
            )
        )
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        causes.append(not_supported(path, value, [str(option) for option in enum]))
    if isinstance(value, int | float) and not isinstance(value, bool):
        _numbers(schema, value, path, causes)
    elif isinstance(value, str):
        _strings(schema, value, path, causes)
    elif isinstance(value, list):
        _lists(schema, value, path, causes)
    elif isinstance(value, dict):
        _objects(schema, value, path, causes)


def _numbers(schema: Obj, value: int | float, path: str, causes: list[Cause]) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, int | float) and (value <= low if schema.get("exclusiveMinimum") else value < low):
        relation = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
        causes.append(_invalid(path, value, f"{path} in body should be {relation} {_go_value(low)}"))
    if isinstance(high, int | float) and (value >= high if schema.get("exclusiveMaximum") else value > high):
        relation = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
        causes.append(_invalid(path, value, f"{path} in body should be {relation} {_go_value(high)}"))


def _strings(schema: Obj, value: str, path: str, causes: list[Cause]) -> None:
    low, high, pattern = schema.get("minLength"), schema.get("maxLength"), schema.get("pattern")
    if isinstance(low, int) and len(value) < low:
        causes.append(_invalid(path, value, f"{path} in body should be at least {low} chars long"))
    if isinstance(high, int) and len(value) > high:
        causes.append(
            Cause(
                field=path,
                reason="FieldValueTooLong",
                message=f"Too long: may not be more than {high} bytes",
            )
        )
    if isinstance(pattern, str) and re.search(pattern, value) is None:
        causes.append(_invalid(path, value, f"{path} in body should match '{pattern}'"))


def _lists(schema: Obj, value: list[Any], path: str, causes: list[Cause]) -> None:
    low, high = schema.get("minItems"), schema.get("maxItems")
    if isinstance(low, int) and len(value) < low:
        causes.append(_invalid(path, len(value), f"{path} in body should have at least {low} items"))
    if isinstance(high, int) and len(value) > high:
        causes.append(
            Cause(
                field=path,
                reason="FieldValueTooMany",
                message=f"Too many: {len(value)}: must have at most {high} items",
            )
        )
    items = schema.get("items")
    for index, item in enumerate(value):
        _validate(items, item, f"{path}[{index}]", causes)
    list_type = schema.get("x-kubernetes-list-type")
    keys = schema.get("x-kubernetes-list-map-keys") or []
    seen: list[Any] = []
    for index, item in enumerate(value):
        if list_type == "map" and isinstance(item, dict):
            identity: Any = {key: item.get(key) for key in keys}
        elif list_type == "set":
            identity = item
        else:
            continue
        if identity in seen:
            causes.append(
                Cause(
                    field=f"{path}[{index}]",
                    reason="FieldValueDuplicate",
                    message=f"Duplicate value: {_go_map(identity)}",
                )
            )
        else:
            seen.append(identity)


def _go_map(value: Any) -> str:
    """A list-map key as the API server shows a duplicate: ``map[string]interface {}{"name":"a"}``."""
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(key)}:{json.dumps(item)}" for key, item in value.items())
        return f"map[string]interface {{}}{{{inner}}}"
    return json.dumps(value)


def _objects(schema: Obj, value: Obj, path: str, causes: list[Cause]) -> None:
    properties = schema.get("properties") or {}
    for key, sub in properties.items():
        if key in value:
            _validate(sub, value[key], f"{path}.{key}", causes)
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict) and not properties:
        for key, item in value.items():
            _validate(additional, item, f"{path}[{key}]", causes)
    for key in schema.get("required") or []:
        if key not in value:
            causes.append(required(f"{path}.{key}"))

"""The structural-schema rules the emulator applies to custom resources, pure: pruning (and what it reports to field
validation), defaulting, and the checks with the API server's field paths and messages."""

from __future__ import annotations

from typing import Any

from quotient.emulator import schemas

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "maxLength": 5},
                "priority": {"type": "integer", "default": 100},
                "weight": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                "size": {"x-kubernetes-int-or-string": True},
                "note": {"type": "string", "nullable": True},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "limits": {"type": "object", "additionalProperties": {"type": "integer", "maximum": 10}},
                "items": {
                    "type": "array",
                    "maxItems": 2,
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                },
            },
        },
    },
}


def obj(spec: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x", "labels": {"a": "b"}}, "spec": spec, **top}


def messages(spec: dict[str, Any]) -> list[str]:
    kept = schemas.prune(SCHEMA, obj(spec)).obj
    return [f"{cause.field}: {cause.message}" for cause in schemas.validate(SCHEMA, kept)]


def test_unknown_fields_are_pruned_and_reported_except_where_the_schema_keeps_them() -> None:
    result = schemas.prune(
        SCHEMA,
        obj(
            {"name": "a", "bogus": 1, "extra": {"anything": {"goes": 1}}, "items": [{"name": "i", "x": 2}]},
            status={"phase": "Up"},
        ),
    )

    assert result.unknown == ("status", "spec.bogus", "spec.items[0].x")
    assert result.obj["spec"] == {
        "name": "a",
        "extra": {"anything": {"goes": 1}},
        "items": [{"name": "i"}],
        "priority": 100,
    }
    assert result.obj["metadata"] == {"name": "x", "labels": {"a": "b"}}, "metadata is the server's, never pruned"


def test_a_null_is_dropped_unless_the_field_is_nullable() -> None:
    result = schemas.prune(SCHEMA, obj({"name": "a", "weight": None, "note": None}))

    assert result.obj["spec"] == {"name": "a", "note": None, "priority": 100} and result.unknown == ()


def test_a_default_fills_only_a_missing_field() -> None:
    assert schemas.prune(SCHEMA, obj({"name": "a", "priority": 7})).obj["spec"]["priority"] == 7


def test_each_rule_gives_the_api_servers_cause() -> None:
    found = messages(
        {
            "name": "toolong",
            "priority": 1.5,
            "weight": 0,
            "size": [1],
            "limits": {"gpu": 11, "cpu": "x"},
            "items": [{"name": "a"}, {"name": "a"}, {"name": "b"}],
        }
    )

    assert found == [
        "spec.name: Too long: may not be more than 5 bytes",
        'spec.priority: Invalid value: "number": spec.priority in body must be of type integer: "number"',
        "spec.weight: Invalid value: 0: spec.weight in body should be greater than 0",
        'spec.size: Invalid value: "array": spec.size in body must be of type integer,string: "array"',
        "spec.limits[gpu]: Invalid value: 11: spec.limits[gpu] in body should be less than or equal to 10",
        'spec.limits[cpu]: Invalid value: "string": spec.limits[cpu] in body must be of type integer: "string"',
        "spec.items: Too many: 3: must have at most 2 items",
        'spec.items[1]: Duplicate value: map[string]interface {}{"name":"a"}',
    ]


def test_a_missing_required_field_and_a_whole_float_for_an_integer() -> None:
    assert messages({"priority": 3.0}) == ["spec.name: Required value"]


def test_field_validation_decides_what_dropped_fields_do() -> None:
    from quotient.emulator.kinds import Kind

    kind = Kind(group="x", version="v1", plural="xs", kind="X", namespaced=True, builtin=False, schema=SCHEMA)
    strict = schemas.pruned(kind, obj({"name": "a", "bogus": 1}), schemas.Writing(field_validation=schemas.STRICT))
    warned = schemas.Writing()
    kept = schemas.pruned(kind, obj({"name": "a", "bogus": 1}), warned)
    ignored = schemas.Writing(field_validation=schemas.IGNORE)
    schemas.pruned(kind, obj({"name": "a", "bogus": 1}), ignored)

    assert not isinstance(strict, dict) and strict.code == 400
    assert (
        strict.message
        == 'X in version "v1" cannot be handled as a X: strict decoding error: unknown field "spec.bogus"'
    )
    assert isinstance(kept, dict) and "bogus" not in kept["spec"] and warned.warnings == ['unknown field "spec.bogus"']
    assert ignored.warnings == []

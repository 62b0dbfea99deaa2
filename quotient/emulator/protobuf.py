"""Decoding of the few protobuf request bodies kubectl sends: ``kubectl create namespace`` and friends.

kubectl's imperative commands (``create namespace``, ``create configmap``, ``create secret``, ``create
serviceaccount``, ``create priorityclass``) go through client-go's typed clients, which send Kubernetes protobuf
(``application/vnd.kubernetes.protobuf``) and do not fall back to JSON on a 415. Those few kinds are small, so the
emulator reads them: the ``k8s\\x00`` envelope (``runtime.Unknown``), then the object by the field numbers of
``k8s.io/api/core/v1/generated.proto`` and ``scheduling/v1``. Any other protobuf body is answered 415, with the
kinds that are understood in the message; ``kubectl create -f`` and ``apply`` always send JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from quotient.emulator.objects import Obj

MAGIC = b"k8s\x00"

# A schema maps a field number to (JSON name, how to read it). Readers: "string", "bytes" (base64 in JSON),
# "int", "bool", "strings" (repeated string), "map" (map<string,string>), "bytes_map" (map<string,bytes>), or a
# nested schema.
Schema = Mapping[int, tuple[str, Any]]

_TYPE_META: Schema = {1: ("apiVersion", "string"), 2: ("kind", "string")}
_UNKNOWN: Schema = {
    1: ("typeMeta", _TYPE_META),
    2: ("raw", "raw"),
    3: ("contentEncoding", "string"),
    4: ("contentType", "string"),
}
_OWNER_REFERENCE: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
_OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    11: ("labels", "map"),
    12: ("annotations", "map"),
    13: ("ownerReferences", ("repeated", _OWNER_REFERENCE)),
    14: ("finalizers", "strings"),
}
KINDS: Mapping[tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", "strings")})},
    ("v1", "ConfigMap"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", "map"),
        3: ("binaryData", "bytes_map"),
        4: ("immutable", "bool"),
    },
    ("v1", "Secret"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", "bytes_map"),
        3: ("type", "string"),
        4: ("stringData", "map"),
        5: ("immutable", "bool"),
    },
    ("v1", "ServiceAccount"): {1: ("metadata", _OBJECT_META), 4: ("automountServiceAccountToken", "bool")},
    # `kubectl create token` (k8s.io/api/authentication/v1: TokenRequestSpec; the bound object is not read).
    ("authentication.k8s.io/v1", "TokenRequest"): {
        1: ("metadata", _OBJECT_META),
        2: ("spec", {1: ("audiences", "strings"), 4: ("expirationSeconds", "int")}),
    },
    ("scheduling.k8s.io/v1", "PriorityClass"): {
        1: ("metadata", _OBJECT_META),
        2: ("value", "int"),
        3: ("globalDefault", "bool"),
        4: ("description", "string"),
        5: ("preemptionPolicy", "string"),
    },
}


class ProtobufError(ValueError):
    """A protobuf body that is malformed or of a kind the emulator does not read."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) in order; value is an int (varint, fixed) or bytes (length-delimited)."""
    found: list[tuple[int, int, Any]] = []
    position = 0
    value: int | bytes
    while position < len(data):
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position)
        elif wire == 2:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise ProtobufError("truncated field")
            value, position = data[position : position + length], position + length
        elif wire == 1:
            value, position = int.from_bytes(data[position : position + 8], "little"), position + 8
        elif wire == 5:
            value, position = int.from_bytes(data[position : position + 4], "little"), position + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        found.append((number, wire, value))
    return found


def _message(data: bytes, schema: Schema) -> Obj:
    result: Obj = {}
    for number, _, value in _fields(data):
        entry = schema.get(number)
        if entry is None:
            continue
        name, reader = entry
        if reader == "string":
            result[name] = bytes(value).decode()
        elif reader == "raw":
            result[name] = bytes(value)
        elif reader == "bytes":
            result[name] = base64.b64encode(bytes(value)).decode()
        elif reader == "int":
            result[name] = value - (1 << 64) if value >= 1 << 63 else value
        elif reader == "bool":
            result[name] = bool(value)
        elif reader == "strings":
            result.setdefault(name, []).append(bytes(value).decode())
        elif reader in ("map", "bytes_map"):
            pair = {key: val for key, _, val in _fields(bytes(value))}
            item = bytes(pair.get(2, b""))
            text = item.decode() if reader == "map" else base64.b64encode(item).decode()
            result.setdefault(name, {})[bytes(pair.get(1, b"")).decode()] = text
        elif isinstance(reader, tuple):
            result.setdefault(name, []).append(_message(bytes(value), reader[1]))
        else:
            result[name] = _message(bytes(value), reader)
    return result


def decode(body: bytes) -> Obj:
    """A Kubernetes protobuf body as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf body (no k8s\\0 prefix)")
    envelope = _message(body[len(MAGIC) :], _UNKNOWN)
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = str(type_meta.get("apiVersion", "")), str(type_meta.get("kind", ""))
    schema = KINDS.get((api_version, kind))
    if schema is None:
        readable = ", ".join(f"{k} ({v})" for v, k in KINDS)
        raise ProtobufError(
            f"{kind} ({api_version}) in protobuf is not supported; send JSON (the emulator reads "
            f"protobuf only for {readable})"
        )
    return {"apiVersion": api_version, "kind": kind, **_message(envelope.get("raw", b""), schema)}

"""Decoding of the protobuf request bodies kubectl sends: ``kubectl create deployment``, ``auth can-i`` and friends.

kubectl's imperative commands (``create deployment|job|cronjob|service|role|rolebinding|...``, ``create namespace``,
``auth can-i``, ``auth whoami``, ``drain``'s evictions) go through client-go's typed clients, which send Kubernetes
protobuf (``application/vnd.kubernetes.protobuf``) and do not fall back to JSON on a 415. So the emulator reads them:
the ``k8s\\x00`` envelope (``runtime.Unknown``), then the object by the field numbers of ``k8s.io/api``'s
``generated.proto`` files, which ``protoschemas`` transcribes for the kinds it covers.

Two rules make the result the JSON the same object would have been:

- **Zero values are absent.** gogo-protobuf writes every non-pointer field, empty strings and zeros included, where
  JSON's ``omitempty`` leaves them out; a zero scalar is dropped unless its field is marked ``KEEP`` (a pointer,
  such as ``replicas``, or a field JSON always writes, such as a PriorityClass's ``value``), where zero means zero.
  Items of repeated fields are kept as they are (``apiGroups: [""]`` names the core group).
- **Nothing is lost silently.** A field the schema does not transcribe is refused (``ProtobufError``, answered 415)
  when it carries data, naming its path; one that holds only zero values is what Go wrote for an empty struct, and
  is skipped. Any other kind in protobuf is refused with the kinds that are read; ``kubectl create -f`` and ``apply``
  always send JSON.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from typing import Any

from quotient.emulator import protoschemas
from quotient.emulator.objects import Obj
from quotient.emulator.protoschemas import KEEP, Schema

MAGIC = b"k8s\x00"
_LENGTH_DELIMITED = 2
_VARINT = 0
_SCALAR_READERS = {"int": _VARINT, "bool": _VARINT}
_MAX_DEPTH = 64
# Scalars whose zero value JSON's omitempty leaves out (unless the field is KEEP).
_ZERO_DROPPED = frozenset({"string", "bytes", "int", "bool"})


class ProtobufError(ValueError):
    """A protobuf body that is malformed, of a kind the emulator does not read, or with a field it cannot read."""


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
        if wire == _VARINT:
            value, position = _varint(data, position)
        elif wire == _LENGTH_DELIMITED:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise ProtobufError("truncated field")
            value, position = data[position : position + length], position + length
        elif wire == 1:
            if position + 8 > len(data):
                raise ProtobufError("truncated field")
            value, position = int.from_bytes(data[position : position + 8], "little"), position + 8
        elif wire == 5:
            if position + 4 > len(data):
                raise ProtobufError("truncated field")
            value, position = int.from_bytes(data[position : position + 4], "little"), position + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        found.append((number, wire, value))
    return found


def carries_data(wire: int, value: Any, depth: int = 0) -> bool:
    """Whether a field holds anything but zero values: a non-zero number, or bytes that are not an (all-zero)
    message. A non-empty string may parse as a message by chance; its fields are then rarely all zero."""
    if wire != _LENGTH_DELIMITED:
        return bool(value)
    if not value:
        return False
    if depth >= _MAX_DEPTH:
        return True
    try:
        inner = _fields(bytes(value))
    except ProtobufError:
        return True
    return any(carries_data(inner_wire, inner_value, depth + 1) for _, inner_wire, inner_value in inner)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: Any, path: str) -> str:
    try:
        return bytes(value).decode()
    except UnicodeDecodeError as exc:
        raise ProtobufError(f"{path}: not UTF-8 text") from exc


def _pairs(value: Any) -> tuple[bytes, bytes]:
    """The key and value of a map entry (a message with fields 1 and 2)."""
    entry = {number: item for number, _, item in _fields(bytes(value))}
    return bytes(entry.get(1, b"")), bytes(entry.get(2, b""))


def _time(value: Any) -> str | None:
    """A ``metav1.Time`` (seconds, nanos) as the JSON's RFC 3339 text; None for the zero time (JSON's null)."""
    parts = {number: item for number, _, item in _fields(bytes(value))}
    seconds = _signed(int(parts.get(1, 0)))
    if seconds == 0 and not parts.get(2):
        return None
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_string(value: Any, path: str) -> int | str:
    parts = {number: item for number, _, item in _fields(bytes(value))}
    if int(parts.get(1, 0)) == 1:
        return _text(parts.get(3, b""), path)
    return _signed(int(parts.get(2, 0)))


def _quantity(value: Any, path: str) -> str:
    parts = {number: item for number, _, item in _fields(bytes(value))}
    return _text(parts.get(1, b""), path)


def _read(reader: Any, value: Any, path: str, depth: int) -> Any:
    """One field's JSON value; None when it is the zero value of a scalar (absent in JSON)."""
    if reader == "string":
        return _text(value, path)
    if reader == "bytes":
        return base64.b64encode(bytes(value)).decode()
    if reader == "int":
        return _signed(int(value))
    if reader == "bool":
        return bool(value)
    if reader == "time":
        return _time(value)
    if reader == "int_or_string":
        return _int_or_string(value, path)
    if reader == "quantity":
        return _quantity(value, path)
    if isinstance(reader, Mapping):
        return _message(bytes(value), reader, path, depth + 1)
    raise ProtobufError(f"{path}: the emulator has no reader {reader!r}")  # a mistake in protoschemas


def _message(data: bytes, schema: Schema, path: str, depth: int = 0) -> Obj:
    if depth > _MAX_DEPTH:
        raise ProtobufError(f"{path}: nested too deep")
    result: Obj = {}
    for number, wire, value in _fields(data):
        entry = schema.get(number)
        if entry is None:
            if carries_data(wire, value):
                where = path or "the object"
                raise ProtobufError(
                    f"{where}: field {number} (see its generated.proto) is not read by the emulator; "
                    f"send the object as JSON (kubectl create -f)"
                )
            continue
        name, reader = entry[0], entry[1]
        keep = len(entry) > 2 and entry[2] is KEEP
        here = f"{path}.{name}" if path else name
        expected = _SCALAR_READERS.get(reader, _LENGTH_DELIMITED) if isinstance(reader, str) else _LENGTH_DELIMITED
        if reader == "skip":
            continue
        if wire != expected:
            raise ProtobufError(f"{here}: wire type {wire} where {expected} was expected")
        if isinstance(reader, tuple):
            _collect(result, name, reader, value, here, depth)
            continue
        read = _read(reader, value, here, depth)
        if read is None or (not keep and isinstance(reader, str) and reader in _ZERO_DROPPED and not read):
            continue  # the zero time (null), or a zero JSON leaves out
        result[name] = read
    return result


def _collect(result: Obj, name: str, reader: tuple[str, Any], value: Any, path: str, depth: int) -> None:
    """The readers that add to what is there: repeated fields, maps, and embedded (inline) messages."""
    shape, item = reader
    if shape == "repeated":
        result.setdefault(name, []).append(_read(item, value, f"{path}[{len(result.get(name, []))}]", depth))
    elif shape == "map":
        key, raw = _pairs(value)
        key_text = _text(key, path)
        read = _read_map_value(item, raw, f"{path}[{key_text}]", depth)
        result.setdefault(name, {})[key_text] = read
    elif shape == "inline":
        result.update(_message(bytes(value), item, path.rpartition(".")[0], depth + 1))
    else:
        raise ProtobufError(f"{path}: the emulator has no reader {shape!r}")


def _read_map_value(item: Any, raw: bytes, path: str, depth: int) -> Any:
    if item == "string":
        return _text(raw, path)
    if item == "bytes":
        return base64.b64encode(raw).decode()
    if item == "quantity":
        return _quantity(raw, path)
    if item == "strings":  # ExtraValue: a message of repeated strings, a plain list in JSON
        return [_text(found, path) for number, _, found in _fields(raw) if number == 1]
    return _message(raw, item, path, depth + 1)


_UNKNOWN: Schema = {
    1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
    2: ("raw", "skip"),
    3: ("contentEncoding", "string"),
    4: ("contentType", "string"),
}


def decode(body: bytes) -> Obj:
    """A Kubernetes protobuf body as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf body (no k8s\\0 prefix)")
    envelope = body[len(MAGIC) :]
    head = _message(envelope, _UNKNOWN, "")
    raw = b"".join(bytes(value) for number, wire, value in _fields(envelope) if number == 2 and wire == 2)
    type_meta = head.get("typeMeta") or {}
    api_version, kind = str(type_meta.get("apiVersion", "")), str(type_meta.get("kind", ""))
    schema = protoschemas.KINDS.get((api_version, kind))
    if schema is None:
        readable = ", ".join(f"{k} ({v})" for v, k in protoschemas.KINDS)
        raise ProtobufError(
            f"{kind} ({api_version}) in protobuf is not supported; send JSON (the emulator reads "
            f"protobuf only for {readable})"
        )
    try:
        decoded = _message(raw, schema, "")
    except ProtobufError as exc:
        raise ProtobufError(f"{kind} ({api_version}) in protobuf: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **decoded}

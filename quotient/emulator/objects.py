"""Kubernetes objects as the emulator holds them: plain JSON dicts, never mutated once stored.

The emulator serves every kind generically, so an object is the decoded JSON itself (``Obj``), not a typed model:
that keeps unknown fields intact, as a real API server keeps them for the kinds it does not validate. Stored
objects are shared between the store, its history and every watcher, so they are copy-on-write: a writer clones,
changes the clone and stores it. The helpers here read the parts every kind has (metadata, owner references) and
print timestamps the way the API server does.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
"""A decoded Kubernetes object (or any JSON object inside one)."""
TERMINAL_PHASES = ("Succeeded", "Failed")
"""Pod phases that never change again."""


def clone(value: Any) -> Any:
    """A deep copy of decoded JSON; several times faster than ``copy.deepcopy`` on pod-sized objects."""
    if isinstance(value, dict):
        return {key: clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clone(item) for item in value]
    return value


_last_encoded: tuple[object, bytes] = (None, b"null")


def encode(value: Any) -> bytes:
    """Compact JSON, as the API server writes it.

    A write is usually encoded twice in a row, for the watch event and for the response: stored objects never
    change, so the last encoding is kept by identity and reused.
    """
    global _last_encoded
    last = _last_encoded  # one read: emulators in other threads may replace it meanwhile
    if last[0] is value and value is not None:
        return last[1]
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if isinstance(value, dict):
        _last_encoded = (value, data)
    return data


def child(obj: Mapping[str, Any], key: str) -> Obj:
    """``obj[key]`` when it is an object, else an empty one (for reading, never for writing into)."""
    found = obj.get(key)
    return found if isinstance(found, dict) else {}


def metadata(obj: Mapping[str, Any]) -> Obj:
    found = obj.get("metadata")
    return found if isinstance(found, dict) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("namespace") or "")


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("uid") or "")


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = metadata(obj).get("labels")
    return found if isinstance(found, dict) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = metadata(obj).get("annotations")
    return found if isinstance(found, dict) else {}


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    refs = metadata(obj).get("ownerReferences")
    if not isinstance(refs, list):
        return []
    return [str(ref["uid"]) for ref in refs if isinstance(ref, dict) and ref.get("uid")]


def controller_ref(obj: Mapping[str, Any]) -> Obj | None:
    """The owner reference with ``controller: true``, if any."""
    refs = metadata(obj).get("ownerReferences")
    if isinstance(refs, list):
        for ref in refs:
            if isinstance(ref, dict) and ref.get("controller") is True:
                return ref
    return None


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True) -> Obj:
    """An owner reference to ``owner``, as controllers write them (``blockOwnerDeletion`` with ``controller``)."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(metadata(obj).get("deletionTimestamp"))


_last_timestamp: tuple[int, str] = (-1, "")


def timestamp(epoch_s: float) -> str:
    """RFC 3339 in UTC with whole seconds, as ``metav1.Time`` is serialised."""
    global _last_timestamp
    whole = int(epoch_s)
    last = _last_timestamp
    if last[0] == whole:
        return last[1]
    text = datetime.datetime.fromtimestamp(whole, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _last_timestamp = (whole, text)
    return text


def parse_timestamp(text: object) -> float | None:
    """Seconds since the epoch from an RFC 3339 timestamp, or None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def condition(obj: Mapping[str, Any], kind: str) -> Obj | None:
    """The status condition of type ``kind``."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if isinstance(conditions, list):
        for found in conditions:
            if isinstance(found, dict) and found.get("type") == kind:
                return found
    return None


def status_copy(obj: Mapping[str, Any]) -> Obj:
    """A copy of ``obj``'s status that ``set_condition`` and field assignments may change (the conditions list is
    copied; its entries, which are replaced and never edited, are shared)."""
    copied = dict(child(obj, "status"))
    if isinstance(copied.get("conditions"), list):
        copied["conditions"] = list(copied["conditions"])
    return copied


def set_condition(status: Obj, new: Obj) -> None:
    """Put ``new`` into ``status.conditions``, replacing the one of its type; keeps the transition time when the
    status did not change, as controllers do."""
    conditions = status.setdefault("conditions", [])
    for index, old in enumerate(conditions):
        if isinstance(old, dict) and old.get("type") == new["type"]:
            if old.get("status") == new.get("status") and old.get("lastTransitionTime"):
                new = {**new, "lastTransitionTime": old["lastTransitionTime"]}
            conditions[index] = new
            return
    conditions.append(new)

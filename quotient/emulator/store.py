"""The object store: every object by storage, namespace and name; one global resourceVersion; a bounded history.

Like etcd behind a real API server, every write bumps one global counter, and the object carries the new value as
its ``metadata.resourceVersion``. Writes are recorded in a history of bounded length so a watch can resume from a
version it saw; what falls off the end raises the *compaction floor*, and a watch from below the floor is answered
``410 Expired``, which is exactly the path a client's relist logic must survive (``compact()`` forces it).

Everything runs on one event loop, so the store needs no locks; listeners (the watch hub, controllers, kubelets)
are called synchronously after each write, in order, so they see every change exactly once and in version order.
Stored objects are never mutated: a writer hands over a fresh dict and the store owns it from then on.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from collections.abc import Callable

from common import logs
from quotient.emulator.objects import Obj, metadata, name_of, namespace_of, owner_uids, uid_of

log = logs.get("emulator.store")

# Versions a watch can resume from. Consecutive versions share most of their structure (writes copy only the
# paths they change), so this is tens of megabytes, not gigabytes; older resumptions get 410 and relist.
DEFAULT_HISTORY_EVENTS = 20_000


class EventType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One write. ``obj`` is the new state (for DELETED, the last state carrying the deletion's version);
    ``old`` the state before (None for ADDED)."""

    rv: int
    type: EventType
    storage: str
    obj: Obj
    old: Obj | None


Listener = Callable[[Change], None]
_Key = tuple[str, str, str]  # storage, namespace, name


class Store:
    def __init__(self, *, history_events: int = DEFAULT_HISTORY_EVENTS) -> None:
        self._objects: dict[str, dict[str, dict[str, Obj]]] = {}
        self._uids: dict[str, _Key] = {}
        self._dependents: dict[str, set[_Key]] = {}
        self._rv = 0
        self._floor = 0
        self._history: collections.deque[Change] = collections.deque(maxlen=max(1, history_events))
        self._listeners: list[Listener] = []

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def floor(self) -> int:
        """Watches must start at or above this version; below it the history is gone (410)."""
        return self._floor

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # Reads

    def get(self, storage: str, namespace: str, name: str) -> Obj | None:
        return self._objects.get(storage, {}).get(namespace, {}).get(name)

    def objects(self, storage: str, namespace: str | None = None) -> list[Obj]:
        """Objects of a storage, in one namespace or all, ordered by namespace then name (as etcd keys sort)."""
        spaces = self._objects.get(storage, {})
        if namespace is not None:
            objects = spaces.get(namespace, {})
            return [objects[name] for name in sorted(objects)]
        return [spaces[ns][name] for ns in sorted(spaces) for name in sorted(spaces[ns])]

    def count(self, storage: str) -> int:
        return sum(len(objects) for objects in self._objects.get(storage, {}).values())

    def by_uid(self, uid: str) -> tuple[str, Obj] | None:
        key = self._uids.get(uid)
        if key is None:
            return None
        found = self.get(*key)
        return None if found is None else (key[0], found)

    def dependents(self, owner_uid: str) -> list[tuple[str, Obj]]:
        """Objects whose ownerReferences name ``owner_uid``."""
        found = []
        for key in sorted(self._dependents.get(owner_uid, ())):
            obj = self.get(*key)
            if obj is not None:
                found.append((key[0], obj))
        return found

    # Writes: each takes ownership of ``obj`` and returns it with its new resourceVersion.

    def create(self, storage: str, obj: Obj) -> Obj:
        namespace, name = namespace_of(obj), name_of(obj)
        if self.get(storage, namespace, name) is not None:
            raise KeyError(f"{storage} {namespace}/{name} exists")  # the API layer checks first: a bug if hit
        return self._write(EventType.ADDED, storage, obj, None)

    def replace(self, storage: str, obj: Obj) -> Obj:
        old = self.get(storage, namespace_of(obj), name_of(obj))
        if old is None:
            raise KeyError(f"{storage} {namespace_of(obj)}/{name_of(obj)} is missing")
        return self._write(EventType.MODIFIED, storage, obj, old)

    def delete(self, storage: str, namespace: str, name: str) -> Obj | None:
        old = self.get(storage, namespace, name)
        if old is None:
            return None
        last = {**old, "metadata": dict(metadata(old))}
        return self._write(EventType.DELETED, storage, last, old)

    def _write(self, kind: EventType, storage: str, obj: Obj, old: Obj | None) -> Obj:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        key = (storage, namespace, name)
        spaces = self._objects.setdefault(storage, {})
        if kind is EventType.DELETED:
            objects = spaces.get(namespace, {})
            objects.pop(name, None)
            if not objects:
                spaces.pop(namespace, None)
            self._uids.pop(uid_of(obj), None)
        else:
            spaces.setdefault(namespace, {})[name] = obj
            if uid_of(obj):
                self._uids[uid_of(obj)] = key
        self._index_owners(key, old, None if kind is EventType.DELETED else obj)
        change = Change(self._rv, kind, storage, obj, old)
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(change)
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("store_listener_failed", storage=storage, name=name)
        return obj

    def _index_owners(self, key: _Key, old: Obj | None, new: Obj | None) -> None:
        before = set(owner_uids(old)) if old is not None else set()
        after = set(owner_uids(new)) if new is not None else set()
        for uid in before - after:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard(key)
                if not dependents:
                    del self._dependents[uid]
        for uid in after - before:
            self._dependents.setdefault(uid, set()).add(key)

    # History

    def changes_after(self, rv: int) -> list[Change] | None:
        """The recorded changes with a version above ``rv``, oldest first; None when ``rv`` is below the floor."""
        if rv < self._floor:
            return None
        history = self._history
        start = len(history)
        while start > 0 and history[start - 1].rv > rv:
            start -= 1
        return list(itertools.islice(history, start, None))

    def compact(self) -> int:
        """Forget the whole history, as etcd compaction does: every watch from an older version now gets 410.
        Returns the new floor."""
        self._history.clear()
        self._floor = self._rv
        return self._floor

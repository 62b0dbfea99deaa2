"""Reflectors: a local copy of one resource kept exact through list, watch, and relist after a gap.

A :class:`Reflector` lists its resource, then watches from the list's ``resourceVersion`` with bookmarks, decodes
each object once into its typed record (``scheduler.objects``; an object whose ``resourceVersion`` the cache already
holds is not decoded again), and turns what it sees into typed events (``Added``, ``Modified``, ``Deleted``, and
``Synced`` after every (re)list) for one async callback, which feeds the scheduler's single-writer cluster state.
Raw JSON goes no further than here.

Why it is shaped this way:
- A watch can break at any moment, and when the server has compacted the history it was reading (``410 Gone``)
  the only way back is a fresh list. A list shows what exists, not what happened: a pod deleted during the gap is
  simply absent. So the relist is *diffed* against the cache (:func:`diff`), and the deletes missed in the gap are
  emitted like any other. Without that the scheduler would count a dead pod's GPUs forever.
- The diff and the per-event bookkeeping (:func:`apply`) are pure functions over a mapping, tested on their own.
- Every watch carries a server-side ``timeoutSeconds`` (jittered, as client-go does, so a fleet of watches does not
  reconnect in step) and a client read timeout: silent hangs happen. Reconnects back off with capped jitter.
- A malformed object (no name, not a mapping, or one its decoder refuses) is logged and counted, never fatal; so is a
  callback that raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from common import logs
from common.backoff import Backoff
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeError, KubeGone

log = logs.get("scheduler.kube.watches")

Key = tuple[str, str]
"""``(namespace, name)``; the namespace is ``""`` for cluster-scoped objects."""


class Record(Protocol):
    """What the reflector needs of a decoded object: who it is and which version of it."""

    @property
    def uid(self) -> str: ...
    @property
    def resource_version(self) -> str: ...


R = TypeVar("R", bound=Record)
Decode = Callable[[Mapping[str, Any]], R | None]
"""An object's JSON to its record; None when it cannot be one (counted as malformed)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Added(Generic[R]):
    record: R


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Modified(Generic[R]):
    record: R
    old: R


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Deleted(Generic[R]):
    record: R
    """The last state known: the watch's DELETED object, or the cached one for a delete found by a relist."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Synced:
    """The cache equals a fresh list: every change up to ``resource_version`` has been emitted."""

    resource_version: str
    count: int
    relist: bool
    """False for the first list, True for a list that repaired a gap."""


Change = Added[R] | Modified[R] | Deleted[R]
ReflectorEvent = Added[R] | Modified[R] | Deleted[R] | Synced
Handler = Callable[[ReflectorEvent[R]], Awaitable[None]]


def key_of(obj: object) -> Key | None:
    """The cache key of an object, or None for something that is not a well-formed object."""
    if not isinstance(obj, dict):
        return None
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace") or ""
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return None
    return (namespace, name)


def _meta(obj: Mapping[str, Any], field: str) -> str:
    value = obj.get("metadata", {}).get(field)
    return value if isinstance(value, str) else ""


def _replaced(old: Record, uid: str) -> bool:
    """A namesake: same key, another object (deleted and created again while we looked away)."""
    return bool(old.uid and uid and old.uid != uid)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Diff(Generic[R]):
    changes: list[tuple[Key, Change[R]]]
    malformed: int


def diff(cache: Mapping[Key, R], listed: Iterable[object], decode: Decode[R]) -> Diff[R]:
    """What changed between the cache and a fresh list: deletes first (what the gap hid), then adds and updates.

    An object listed under a known key but with another uid was deleted and recreated in the gap: a ``Deleted``
    of the old one and an ``Added`` of the new. An unchanged ``resourceVersion`` means no event, and no decoding.
    """
    seen: dict[Key, Mapping[str, Any]] = {}
    malformed = 0
    for obj in listed:
        key = key_of(obj)
        if key is None:
            malformed += 1
            continue
        assert isinstance(obj, dict)
        seen[key] = obj
    changes: list[tuple[Key, Change[R]]] = [(key, Deleted(record=old)) for key, old in cache.items() if key not in seen]
    for key, obj in seen.items():
        old = cache.get(key)
        version = _meta(obj, "resourceVersion")
        if old is not None and not _replaced(old, _meta(obj, "uid")) and version and old.resource_version == version:
            continue
        record = decode(obj)
        if record is None:
            malformed += 1
            continue
        if old is None:
            changes.append((key, Added(record=record)))
        elif _replaced(old, record.uid):
            changes.append((key, Deleted(record=old)))
            changes.append((key, Added(record=record)))
        else:
            changes.append((key, Modified(record=record, old=old)))
    return Diff(changes=changes, malformed=malformed)


def apply(
    cache: Mapping[Key, R], event_type: kubeapi.WatchType, obj: Mapping[str, Any], decode: Decode[R]
) -> list[tuple[Key, Change[R]]] | None:
    """The changes one watch event makes to the cache (not applied: see :func:`commit`); None when the object is
    malformed (no key, or its decoder refuses it).

    ADDED for a known object is an update (a watch restarted from an older version replays it); MODIFIED for an
    unknown one is an add; DELETED of something never seen changes nothing.
    """
    if event_type is kubeapi.WatchType.BOOKMARK:
        return []
    key = key_of(obj)
    if key is None:
        return None
    old = cache.get(key)
    if event_type is kubeapi.WatchType.DELETED and old is None:
        return []
    version = _meta(obj, "resourceVersion")
    if (
        event_type is not kubeapi.WatchType.DELETED
        and old is not None
        and not _replaced(old, _meta(obj, "uid"))
        and version
        and old.resource_version == version
    ):
        return []
    record = decode(obj)
    if record is None:
        return None
    if event_type is kubeapi.WatchType.DELETED:
        return [(key, Deleted(record=record))]
    if old is None:
        return [(key, Added(record=record))]
    if _replaced(old, record.uid):
        return [(key, Deleted(record=old)), (key, Added(record=record))]
    return [(key, Modified(record=record, old=old))]


def commit(cache: dict[Key, R], changes: Iterable[tuple[Key, Change[R]]]) -> None:
    """Apply ``changes`` to ``cache`` in order."""
    for key, change in changes:
        if isinstance(change, Deleted):
            cache.pop(key, None)
        else:
            cache[key] = change.record


@dataclasses.dataclass(slots=True)
class ReflectorStats:
    """What a reflector has done, for metrics and tests."""

    lists: int = 0
    relists: int = 0
    watches: int = 0
    gone: int = 0
    errors: int = 0
    malformed: int = 0
    handler_errors: int = 0
    events: int = 0
    last_error: str = ""


class Reflector(Generic[R]):
    """Keeps :attr:`cache` equal to one resource (filtered by namespace and selectors), as records, and reports every
    change.

    ``run`` lists, watches, and repairs gaps until it is cancelled; it never returns otherwise and never raises a
    Kubernetes error (they are logged, counted and retried). The handler is awaited for each event in order, so a
    slow handler slows the reflector down rather than letting events pile up unbounded.
    """

    def __init__(
        self,
        api: kubeapi.KubeApi,
        resource: kubeapi.Resource,
        *,
        decode: Decode[R],
        handler: Handler[R],
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: int = 300,
        read_timeout_s: float | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        if watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be at least 1 second, got {watch_timeout_s}")
        self._api = api
        self.resource = resource
        self._decode = decode
        self._handler = handler
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._watch_timeout_s = watch_timeout_s
        self._read_timeout_s = read_timeout_s
        self._backoff = backoff or Backoff(base_s=0.2, cap_s=30.0)
        self._sleep = sleep
        self._uniform = uniform
        self._cache: dict[Key, R] = {}
        self._resource_version: str | None = None
        self._synced = asyncio.Event()
        self.stats = ReflectorStats()
        self.name = resource.plural + (f"[{field_selector}]" if field_selector else "")

    @property
    def cache(self) -> Mapping[Key, R]:
        return self._cache

    @property
    def resource_version(self) -> str | None:
        """The version the next watch starts from; None until listed, and again after a ``410``."""
        return self._resource_version

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Return once the first list has been emitted."""
        await self._synced.wait()

    async def run(self) -> None:
        # Consecutive attempts that made no progress. Progress is a watch that delivered something or a relist that
        # found changes; without it each retry waits longer, so a server that answers 410 to every watch costs a
        # relist per backoff period, not a tight loop.
        failures = 0
        while True:
            try:
                if self._resource_version is None and await self._list():
                    failures = 0
                if await self._watch():
                    failures = 0
                    continue
                failures += 1
                await self._sleep(self._backoff.delay_s(failures - 1, self._uniform))
            except KubeGone as exc:
                self.stats.gone += 1
                self.stats.last_error = str(exc)
                log.info("watch_expired", reflector=self.name, resource_version=self._resource_version)
                self._resource_version = None
                if failures:
                    await self._sleep(self._backoff.delay_s(failures - 1, self._uniform))
                failures += 1
            except KubeError as exc:
                self.stats.errors += 1
                self.stats.last_error = str(exc)
                delay_s = self._backoff.delay_s(failures, self._uniform)
                log.warning("watch_failed", reflector=self.name, error=str(exc), retry_in_s=round(delay_s, 3))
                failures += 1
                await self._sleep(delay_s)

    async def _list(self) -> int:
        """List, emit the differences from the cache and ``Synced``; how many changes there were."""
        relist = self.stats.lists > 0
        listed = await self._api.list(
            self.resource,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
        )
        self.stats.lists += 1
        self.stats.relists += int(relist)
        found = diff(self._cache, listed.items, self._decode)
        if found.malformed:
            self.stats.malformed += found.malformed
            log.warning("list_objects_malformed", reflector=self.name, count=found.malformed)
        await self._emit(found.changes)
        self._resource_version = listed.resource_version
        await self._deliver(Synced(resource_version=listed.resource_version, count=len(self._cache), relist=relist))
        self._synced.set()
        if relist:
            log.info(
                "relisted",
                reflector=self.name,
                resource_version=listed.resource_version,
                changes=len(found.changes),
                objects=len(self._cache),
            )
        return len(found.changes)

    async def _watch(self) -> bool:
        """Follow one watch stream to its end; whether it delivered anything (an event or a bookmark)."""
        assert self._resource_version is not None
        self.stats.watches += 1
        delivered = False
        # client-go's spread: between one and two times the configured timeout.
        timeout_s = int(self._watch_timeout_s * (1.0 + self._uniform()))
        stream = self._api.watch(
            self.resource,
            resource_version=self._resource_version,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_s=max(1, timeout_s),
            read_timeout_s=self._read_timeout_s,
        )
        async with contextlib.aclosing(stream):
            async for event in stream:
                delivered = True
                version = _meta(event.object, "resourceVersion")
                if event.type is not kubeapi.WatchType.BOOKMARK:
                    changes = apply(self._cache, event.type, event.object, self._decode)
                    if changes is None:
                        self.stats.malformed += 1
                        log.warning("watch_object_malformed", reflector=self.name, object=repr(event.object)[:200])
                    else:
                        await self._emit(changes)
                if version:
                    self._resource_version = version
        return delivered

    async def _emit(self, changes: list[tuple[Key, Change[R]]]) -> None:
        for key, change in changes:
            commit(self._cache, [(key, change)])
            await self._deliver(change)

    async def _deliver(self, event: ReflectorEvent[R]) -> None:
        self.stats.events += 1
        try:
            await self._handler(event)
        except Exception:
            # One bad handler call must not stop the stream of every later change.
            self.stats.handler_errors += 1
            log.exception("reflector_handler_failed", reflector=self.name, event_type=type(event).__name__)

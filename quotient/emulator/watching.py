"""Watches: the hub that fans each write out to every matching watcher, and the watchers' streams.

Each write is turned into bytes at most once per (event type, rendering): the hub renders lazily, caches the line
for the duration of one fan-out, and hands the same ``bytes`` to every watcher that wants it, so hundreds of
watchers cost one ``json.dumps`` per write and format, not hundreds. A watcher is a bounded queue of ready lines
and a task that writes whatever has queued in one chunk; one that cannot keep up is closed (the client re-watches
from its last version, as with a real server's slow-watcher eviction) rather than buffering without bound.

Semantics are the API server's cacher: a watch from version N gets every change after N in order; from "0" or no
version, a synthetic ADDED per current object first; from below the compaction floor, one ``ERROR`` 410 event. A
watcher whose selector stops matching an object gets a DELETED (the object as it was, with the new version), one
that starts matching gets an ADDED, which is what lets a scheduler watch ``spec.nodeName=`` and forget pods as they
are bound. Bookmarks, when asked for, carry the current version, queued behind any pending events so they never
run ahead of them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import logs
from quotient.emulator import selectors, status
from quotient.emulator.objects import Obj, encode, metadata
from quotient.emulator.store import Change, EventType, Store
from quotient.emulator.views import View, event_line

log = logs.get("emulator.watching")

DEFAULT_BUFFER_EVENTS = 100_000
Write = Callable[[bytes], Awaitable[Any]]


class Watcher:
    """One watch request: what it selects, how it renders, and its queue of encoded events."""

    def __init__(
        self,
        *,
        view: View,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        bookmarks: bool,
        buffer_events: int = DEFAULT_BUFFER_EVENTS,
    ) -> None:
        self.view = view
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.bookmarks = bookmarks
        self._buffer_events = buffer_events
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()
        self.closed = False
        self.aborted = False
        self._converted = view.kind.api_version == "events.k8s.io/v1"

    def wants(self, obj: Obj) -> bool:
        if self.namespace is not None and metadata(obj).get("namespace") != self.namespace:
            return False
        if not self.labels.empty and not self.labels.matches_object(obj):
            return False
        if self.fields.empty:
            return True
        return self.fields.matches(self.view.external(obj) if self._converted else obj)

    def push(self, line: bytes) -> None:
        if self.closed:
            return
        if len(self._queue) >= self._buffer_events:
            log.warning("watcher_too_slow", kind=self.view.kind.plural, queued=len(self._queue))
            self.close()
            return
        self._queue.append(line)
        self._wake.set()

    def close(self, *, abort: bool = False) -> None:
        self.closed = True
        self.aborted = self.aborted or abort
        self._wake.set()

    async def take(self, timeout_s: float) -> list[bytes] | None:
        """Everything queued (waiting up to ``timeout_s`` for something); None once closed and drained."""
        if not self._queue and not self.closed:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, timeout_s))
            except TimeoutError:
                return []
        if self._queue:
            batch = list(self._queue)
            self._queue.clear()
            return batch
        return None if self.closed else []


class WatchHub:
    """Every open watch, by storage; subscribed to the store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._watchers: dict[str, list[Watcher]] = collections.defaultdict(list)
        store.subscribe(self._on_change)

    def count(self) -> int:
        return sum(len(watchers) for watchers in self._watchers.values())

    def open(
        self, watcher: Watcher, *, since: int | None, initial_events_bookmark: bool = False
    ) -> status.Failure | None:
        """Queue what the watcher must see first and register it; ``since`` None means a synthetic ADDED for every
        current object. A 410 Failure when ``since`` is below the compaction floor."""
        storage = watcher.view.kind.storage
        if since is None:
            now = self._clock()
            for obj in self._store.objects(storage, watcher.namespace):
                if watcher.wants(obj):
                    watcher.push(event_line("ADDED", watcher.view.render(obj, now=now)))
            if initial_events_bookmark:
                watcher.push(self.bookmark(watcher, initial_events_end=True))
        else:
            changes = self._store.changes_after(since)
            if changes is None:
                return status.expired(f"too old resource version: {since} ({self._store.floor})")
            for change in changes:
                if change.storage == storage:
                    self._deliver(watcher, change, {})
        self._watchers[storage].append(watcher)
        return None

    def remove(self, watcher: Watcher) -> None:
        watchers = self._watchers.get(watcher.view.kind.storage)
        if watchers is not None and watcher in watchers:
            watchers.remove(watcher)

    def close_all(self, *, abort: bool = False) -> int:
        """Close every watch (their streams end; ``abort`` cuts the connections instead); returns how many."""
        closed = 0
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                watcher.close(abort=abort)
                closed += 1
            watchers.clear()
        return closed

    def bookmark(self, watcher: Watcher, *, initial_events_end: bool = False) -> bytes:
        kind = watcher.view.kind
        meta: Obj = {"resourceVersion": str(self._store.resource_version)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            b'{"type":"BOOKMARK","object":'
            + encode({"kind": kind.kind, "apiVersion": kind.api_version, "metadata": meta})
            + b"}\n"
        )

    def _on_change(self, change: Change) -> None:
        watchers = self._watchers.get(change.storage)
        if not watchers:
            return
        cache: dict[tuple[str, bool, View], bytes] = {}
        for watcher in list(watchers):
            self._deliver(watcher, change, cache)

    def _deliver(self, watcher: Watcher, change: Change, cache: dict[tuple[str, bool, View], bytes]) -> None:
        if change.type is EventType.DELETED:
            if watcher.wants(change.obj):
                watcher.push(self._line(cache, "DELETED", change, watcher.view, previous=False))
            return
        now_matches = watcher.wants(change.obj)
        before = change.old is not None and watcher.wants(change.old)
        if now_matches:
            kind = "MODIFIED" if before else "ADDED"
            watcher.push(self._line(cache, kind, change, watcher.view, previous=False))
        elif before:
            watcher.push(self._line(cache, "DELETED", change, watcher.view, previous=True))

    def _line(
        self, cache: dict[tuple[str, bool, View], bytes], kind: str, change: Change, view: View, *, previous: bool
    ) -> bytes:
        key = (kind, previous, view)
        line = cache.get(key)
        if line is None:
            obj = change.obj
            if previous and change.old is not None:
                # The object left the watcher's selection: it sees the last state it matched, at the new version.
                obj = {**change.old, "metadata": {**metadata(change.old), "resourceVersion": str(change.rv)}}
            line = cache[key] = event_line(kind, view.render(obj, now=self._clock()))
        return line


async def stream(
    watcher: Watcher,
    write: Write,
    *,
    hub: WatchHub,
    timeout_s: float,
    bookmark_interval_s: float,
    is_connected: Callable[[], bool],
    idle_check_s: float = 5.0,
) -> None:
    """Write the watcher's events to the client until the timeout, a close, or a disconnect."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    next_bookmark = loop.time() + bookmark_interval_s
    while True:
        now = loop.time()
        if now >= deadline:
            return
        if watcher.bookmarks and now >= next_bookmark:
            watcher.push(hub.bookmark(watcher))
            next_bookmark = now + bookmark_interval_s
        wait = min(deadline, next_bookmark if watcher.bookmarks else deadline, now + idle_check_s) - now
        batch = await watcher.take(wait)
        if batch is None:
            return
        if batch:
            await write(b"".join(batch))
        elif not is_connected():
            return

"""The event recorder: ``core/v1`` Events that tell people why a pod waits, was evicted, or uses too much memory.

The scheduler says the same thing about the same pod every cycle while it stays pending; a naive recorder would
write an Event per cycle and flood the API server (and ``kubectl describe``). So, as client-go's recorder does:
- identical events (same object, type, reason and message) repeated within ``window_s`` of the last one are one
  Event whose ``count`` and ``lastTimestamp`` are patched, not a new object each time;
- writes go out through a token bucket (``rate_per_s``, ``burst``), and an event repeated while its write waits
  only raises the count of that one pending write, so the API sees at most the bucket's rate however often the
  scheduler records;
- the set of remembered events is bounded (least recently used out), and ``record`` never blocks or raises: events
  are advice, and losing one (counted in ``stats.dropped``) never stops scheduling.

``record`` is called from the scheduling loop; ``run`` is the one task that writes. The token bucket
(:class:`TokenBucket`) is pure and takes time as an argument.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import enum
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from common import logs
from common.backoff import Backoff
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeNotFound, KubeUnavailable

log = logs.get("scheduler.kube.events")

# The API server rejects longer messages on events.k8s.io and client-go truncates to this for core events too.
MAX_MESSAGE_BYTES = 1024
# Cluster-scoped objects (nodes, queues) have their events in the default namespace, as kubectl looks for them.
CLUSTER_EVENT_NAMESPACE = "default"


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class Described(Protocol):
    """What an event needs to know of the object it is about; every record of ``scheduler.objects`` has it."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    """The object an event is about (its ``involvedObject``)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def of_record(cls, record: Described) -> ObjectRef:
        """The reference to an object the scheduler holds as a record (``scheduler.objects.records``)."""
        return cls(
            api_version=record.api_version,
            kind=record.kind,
            name=record.name,
            namespace=record.namespace,
            uid=record.uid,
        )

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        metadata = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion") or ""),
            kind=str(obj.get("kind") or ""),
            name=str(metadata.get("name") or ""),
            namespace=str(metadata.get("namespace") or ""),
            uid=str(metadata.get("uid") or ""),
        )

    def as_json(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


class EventSink(Protocol):
    """Where Events go (``EventRecorder``): ``record`` returns at once and never raises; the writes happen later,
    aggregated and rate-limited."""

    def record(self, ref: ObjectRef, *, type: EventType, reason: str, message: str) -> None: ...


@dataclasses.dataclass(slots=True, kw_only=True)
class TokenBucket:
    """``burst`` tokens, refilled at ``rate_per_s``; time is an argument, so it is pure."""

    rate_per_s: float
    burst: int
    _tokens: float = dataclasses.field(init=False)
    _at_s: float | None = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1:
            raise ValueError(f"a token bucket needs rate_per_s > 0 and burst >= 1, got {self.rate_per_s}, {self.burst}")
        self._tokens = float(self.burst)

    def take(self, now_s: float) -> float:
        """Take a token: 0.0 when one was there (and is now used), else the seconds until one will be."""
        if self._at_s is not None:
            self._tokens = min(float(self.burst), self._tokens + (now_s - self._at_s) * self.rate_per_s)
        self._at_s = now_s
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate_per_s


Key = tuple[str, str, str, str, str, str, str]


@dataclasses.dataclass(slots=True, kw_only=True)
class _Entry:
    ref: ObjectRef
    type: EventType
    reason: str
    message: str
    count: int
    first: datetime.datetime
    last: datetime.datetime
    last_s: float
    name: str | None = None
    """The Event object's name once created; None until then."""


@dataclasses.dataclass(slots=True)
class RecorderStats:
    recorded: int = 0
    aggregated: int = 0
    """Records folded into an earlier event's count."""
    created: int = 0
    patched: int = 0
    dropped: int = 0
    """Records whose write was given up (memory bound, or an error that retrying cannot fix)."""
    failed: int = 0


def _truncate(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    return encoded[: MAX_MESSAGE_BYTES - 3].decode("utf-8", "ignore") + "..."


class EventRecorder:
    """Records events about objects and writes them, aggregated and rate-limited, from :meth:`run`."""

    def __init__(
        self,
        api: kubeapi.KubeApi,
        *,
        component: str = "quotient",
        instance: str = "",
        window_s: float = 600.0,
        rate_per_s: float = 10.0,
        burst: int = 50,
        max_events: int = 4096,
        backoff: Backoff | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._component = component
        self._instance = instance
        self._window_s = window_s
        self._bucket = TokenBucket(rate_per_s=rate_per_s, burst=burst)
        self._max_events = max_events
        self._backoff = backoff or Backoff(base_s=0.5, cap_s=30.0)
        self._monotonic = monotonic
        self._wall = wall
        self._sleep = sleep
        self._entries: collections.OrderedDict[Key, _Entry] = collections.OrderedDict()
        self._pending: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._names = itertools.count()
        self.stats = RecorderStats()

    def record(self, ref: ObjectRef, *, type: EventType, reason: str, message: str) -> None:
        """Note that ``reason`` happened to ``ref``; returns at once, the write happens in :meth:`run`."""
        message = _truncate(message)
        key: Key = (ref.namespace, ref.kind, ref.name, ref.uid, type.value, reason, message)
        now_s, now = self._monotonic(), self._wall()
        self.stats.recorded += 1
        entry = self._entries.get(key)
        if entry is not None and now_s - entry.last_s <= self._window_s:
            entry.count += 1
            entry.last, entry.last_s = now, now_s
            self.stats.aggregated += 1
        else:
            if entry is not None and key in self._pending:
                self.stats.dropped += 1
            entry = _Entry(
                ref=ref, type=type, reason=reason, message=message, count=1, first=now, last=now, last_s=now_s
            )
            self._entries[key] = entry
        self._entries.move_to_end(key)
        self._pending[key] = None
        self._pending.move_to_end(key)
        while len(self._entries) > self._max_events:
            old_key, _ = self._entries.popitem(last=False)
            if old_key in self._pending:
                del self._pending[old_key]
                self.stats.dropped += 1
        self._idle.clear()
        self._wake.set()

    def warning(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.record(ObjectRef.of(obj), type=EventType.WARNING, reason=reason, message=message)

    def normal(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.record(ObjectRef.of(obj), type=EventType.NORMAL, reason=reason, message=message)

    async def flush(self) -> None:
        """Return once every event recorded so far has been written (or given up); needs :meth:`run` running."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write pending events until cancelled, one at a time, at most at the bucket's rate."""
        failures = 0
        while True:
            if not self._pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            wait_s = self._bucket.take(self._monotonic())
            if wait_s > 0:
                await self._sleep(wait_s)
                continue
            key, _ = self._pending.popitem(last=False)
            entry = self._entries.get(key)
            if entry is None:
                continue
            try:
                await self._write(entry)
                failures = 0
            except KubeUnavailable as exc:
                # Try this one again after a pause, after what was recorded since.
                self._pending[key] = None
                delay_s = self._backoff.delay_s(failures)
                failures += 1
                log.warning("event_write_failed", reason=entry.reason, error=str(exc), retry_in_s=round(delay_s, 3))
                await self._sleep(delay_s)
            except KubeError as exc:
                self.stats.failed += 1
                self.stats.dropped += 1
                log.warning("event_dropped", reason=entry.reason, object=entry.ref.name, error=str(exc))

    async def _write(self, entry: _Entry) -> None:
        namespace = entry.ref.namespace or CLUSTER_EVENT_NAMESPACE
        if entry.name is not None:
            patch = {"count": entry.count, "lastTimestamp": kubeapi.rfc3339(entry.last)}
            try:
                await self._api.patch(kubeapi.EVENTS, patch, name=entry.name, namespace=namespace)
                self.stats.patched += 1
                return
            except KubeNotFound:
                # The API server dropped it (events live an hour by default): start a new one.
                entry.name = None
        for _attempt in range(2):
            # client-go's form (<object>.<hex time>), with a counter so two events in one tick differ.
            stamp_ns = int(self._wall().timestamp() * 1e9)
            name = f"{entry.ref.name}.{stamp_ns:x}{next(self._names) % 4096:03x}"
            try:
                await self._api.create(kubeapi.EVENTS, self._body(entry, name, namespace), namespace=namespace)
            except KubeAlreadyExists:
                continue
            entry.name = name
            self.stats.created += 1
            return
        raise KubeError(f"could not find a free name for an event about {entry.ref.name}")

    def _body(self, entry: _Entry, name: str, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": entry.ref.as_json(),
            "reason": entry.reason,
            "message": entry.message,
            "type": entry.type.value,
            "count": entry.count,
            "firstTimestamp": kubeapi.rfc3339(entry.first),
            "lastTimestamp": kubeapi.rfc3339(entry.last),
            "source": {"component": self._component},
            "reportingComponent": self._component,
            **({"reportingInstance": self._instance} if self._instance else {}),
        }

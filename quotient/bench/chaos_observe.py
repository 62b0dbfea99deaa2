"""The chaos run's eyes: the emulator's state turned into the invariants' plain observations, and the alerts seen as
an operator sees them (the scheduler's ``/metrics`` and a third-party NATS subscriber).

``StoreWatch`` listens to the emulator's store, which calls it synchronously on every write: each pod write becomes
a ``PodChange`` for the checker at once (so a double binding is caught on the write that makes it), each first
binding of a pod of the load is timed, and the scheduler's Warning Events about pods are remembered as reasons.
``observe`` reads every pod and PodGroup as they are now. ``AlertWatch`` scrapes ``quotient_alert`` every second and
subscribes to ``quotient.v1.alerts.>`` over a connection that reconnects by itself after a NATS restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from common import logs, names, subjects, wire
from common.errors import QuotientError
from common.natsconn import NatsBus
from quotient.bench import chaos_alerts, chaos_invariants
from quotient.emulator.emulator import Emulator
from quotient.emulator.store import Change, EventType

log = logs.get("bench.chaos")

SCHEDULER_COMPONENT: Final = "quotient-scheduler"
SCRAPE_PERIOD_S: Final = 1.0
_SCHEDULER_NAMES: Final = frozenset({"quotient"})

Obj = dict[str, Any]


def _meta(obj: Obj) -> Obj:
    found = obj.get("metadata")
    return found if isinstance(found, dict) else {}


def _annotations(obj: Obj) -> dict[str, str]:
    found = _meta(obj).get("annotations")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _indexes(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    return tuple(int(part) for part in parts if part.isascii() and part.isdigit())


def _whole_gpus(pod: Obj) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(names.GPU_RESOURCE) or (resources.get("requests") or {}).get(
            names.GPU_RESOURCE
        )
        with contextlib.suppress(TypeError, ValueError):
            total += int(str(amount)) if amount is not None else 0
    return total


class StoreWatch:
    """What the store's writes tell: pod changes for the checker, bind times, the scheduler's reasons for pods."""

    def __init__(
        self,
        emulator: Emulator,
        *,
        clock: Callable[[], float],
        on_change: Callable[[chaos_invariants.PodChange], None],
        timed_namespace: str,
    ) -> None:
        self._emulator = emulator
        self._timed_namespace = timed_namespace
        self._clock = clock
        self._on_change = on_change
        self._pods = emulator.kind_of("v1", "Pod").storage
        self._events = emulator.kind_of("v1", "Event").storage
        self._groups = emulator.kind_of(names.POD_GROUP_API_VERSION, "PodGroup").storage
        self.bound_at: dict[str, float] = {}
        """``namespace/name`` -> when it first got a node (pods of ``timed_namespace``: the load's)."""
        self.reasons: dict[tuple[str, str], set[str]] = {}
        self.pod_writes = 0
        self.errors = 0
        emulator.store.subscribe(self._listen)

    def close(self) -> None:
        self._emulator.store.unsubscribe(self._listen)

    def _listen(self, change: Change) -> None:
        # Called inside every store write: it must never raise into the emulator.
        try:
            if change.storage == self._pods and change.type is not EventType.DELETED:
                self.pod_writes += 1
                self._pod(change)
            elif change.storage == self._events and change.type is not EventType.DELETED:
                self._event(change.obj)
        except Exception:
            self.errors += 1
            log.exception("chaos_watch_failed", storage=change.storage)

    def _pod(self, change: Change) -> None:
        before = str(((change.old or {}).get("spec") or {}).get("nodeName") or "")
        after = str((change.obj.get("spec") or {}).get("nodeName") or "")
        if before == after:
            return
        meta = _meta(change.obj)
        now = self._clock()
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if after and not before and namespace == self._timed_namespace:
            self.bound_at.setdefault(f"{namespace}/{name}", now)
        self._on_change(
            chaos_invariants.PodChange(
                at_s=now,
                uid=str(meta.get("uid") or ""),
                namespace=namespace,
                name=name,
                node_before=before,
                node_after=after,
            )
        )

    def _event(self, event: Obj) -> None:
        involved = event.get("involvedObject") or {}
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        if involved.get("kind") != "Pod" or source != SCHEDULER_COMPONENT or event.get("type") != "Warning":
            return
        key = (str(involved.get("namespace") or ""), str(involved.get("name") or ""))
        self.reasons.setdefault(key, set()).add(str(event.get("reason") or ""))

    def observe(self, at_s: float) -> chaos_invariants.Observation:
        """Every pod and PodGroup as they are now."""
        uuids: dict[str, dict[str, int]] = {}
        pods = []
        for pod in self._emulator.store.objects(self._pods):
            seen = self._pod_seen(pod, uuids)
            pods.append(seen)
        groups = [self._group_seen(group) for group in self._emulator.store.objects(self._groups)]
        return chaos_invariants.Observation(at_s=at_s, pods=pods, groups=groups)

    def _pod_seen(self, pod: Obj, uuids: dict[str, dict[str, int]]) -> chaos_invariants.PodSeen:
        meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
        annotations = _annotations(pod)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        node = str(spec.get("nodeName") or "")
        reservation = namespace == names.RESERVATION_NAMESPACE
        share_milli = 0
        with contextlib.suppress(ValueError):
            share_milli = int(annotations.get(names.GPU_SHARE_ANNOTATION, "0") or 0)
        real: tuple[int, ...] | None = None
        if node and share_milli and not reservation:
            if node not in uuids:
                plugin = self._emulator.kubelets.device_plugin
                uuids[node] = {uuid: index for index, uuid in enumerate(plugin.uuids_of(node))}
            named = [part.strip() for part in annotations.get(names.GPU_UUIDS_ANNOTATION, "").split(",")]
            found = tuple(uuids[node][uuid] for uuid in named if uuid in uuids[node])
            real = found or None
        elif node:
            real = self._emulator.devices_of(namespace, name)
        conditions = status.get("conditions") or []
        unscheduled = any(
            c.get("type") == names.POD_SCHEDULED_CONDITION and c.get("status") == "False" for c in conditions
        )
        return chaos_invariants.PodSeen(
            uid=str(meta.get("uid") or ""),
            namespace=namespace,
            name=name,
            node=node,
            phase=str(status.get("phase") or "Pending"),
            reason=str(status.get("reason") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            ours=spec.get("schedulerName") in _SCHEDULER_NAMES and not reservation,
            reservation=reservation,
            whole_gpus=_whole_gpus(pod),
            share_milli=share_milli,
            scheduled_devices=_indexes(annotations.get(names.GPU_DEVICES_ANNOTATION, "")),
            real_devices=real,
            pod_group=annotations.get(names.POD_GROUP_ANNOTATION, ""),
            has_reason=unscheduled or bool(self.reasons.get((namespace, name))),
        )

    @staticmethod
    def _group_seen(group: Obj) -> chaos_invariants.GroupSeen:
        meta, spec = _meta(group), group.get("spec") or {}
        conditions = (group.get("status") or {}).get("schedulingConditions") or []
        min_member = spec.get("minMember")
        return chaos_invariants.GroupSeen(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            min_member=min_member if isinstance(min_member, int) else 1,
            conditions=tuple(str(c.get("reason") or "") for c in conditions if isinstance(c, dict)),
        )


def scrape(url: str, *, timeout_s: float = 2.0) -> list[tuple[str, dict[str, str], float]] | None:
    """Every sample on a ``/metrics`` page (name, labels, value); None when it cannot be read. Blocking."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


class Tally:
    """A counter of the scheduler's ``/metrics`` by one label, summed over the processes that counted it: a new
    process counts from zero, so what the one before had counted (at its last scrape) is kept."""

    def __init__(self, metric: str, label: str) -> None:
        self._metric = metric
        self._label = label
        self._now: dict[str, float] = {}
        self._before: dict[str, float] = {}

    def update(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        found = {labels.get(self._label, ""): value for name, labels, value in samples if name == self._metric}
        restarted = any(value < self._now.get(key, 0.0) for key, value in found.items()) or (self._now and not found)
        if restarted:
            for key, value in self._now.items():
                self._before[key] = self._before.get(key, 0.0) + value
        self._now = found

    def totals(self) -> dict[str, int]:
        found = dict(self._before)
        for key, value in self._now.items():
            found[key] = found.get(key, 0.0) + value
        return {key: round(value) for key, value in sorted(found.items()) if value}


class AlertWatch:
    """The alerts as an operator sees them: ``/metrics`` every second and ``quotient.v1.alerts.>`` on NATS."""

    def __init__(self, *, nats_url: str, metrics_url: str, clock: Callable[[], float]) -> None:
        self._nats_url = nats_url
        self._metrics_url = metrics_url
        self._clock = clock
        self.scrapes: list[chaos_alerts.Scrape] = []
        self.messages: list[chaos_alerts.Message] = []
        self.undecodable = 0
        self.internal_errors = Tally("quotient_internal_errors_total", "where")
        """Faults the scheduler caught at a boundary and survived, by where."""
        self.evictions = Tally("quotient_evictions_total", "reason")
        self._bus = NatsBus(servers=nats_url, name="chaos-alert-listener")

    async def run(self) -> None:
        """Scrape and listen until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._listen())
                group.create_task(self._scrape_forever())
        finally:
            with contextlib.suppress(QuotientError, OSError):
                await self._bus.close()

    async def _listen(self) -> None:
        await self._bus.connect()
        # nats-py subscribes again by itself after every reconnect.
        await self._bus.subscribe(subjects.ALERTS_ALL, self._on_alert)

    async def _on_alert(self, _subject: str, data: bytes) -> None:
        try:
            alert = wire.decode_alert(data)
        except QuotientError:
            self.undecodable += 1
            return
        key = (alert.name, alert.node_name or "", "" if alert.gpu_index is None else str(alert.gpu_index))
        firing = alert.state is wire.AlertState.FIRING
        self.messages.append(chaos_alerts.Message(at_s=self._clock(), key=key, firing=firing))

    async def _scrape_forever(self) -> None:
        while True:
            started = time.monotonic()
            samples = await asyncio.to_thread(scrape, self._metrics_url)
            if samples is not None:
                self._record(samples)
            await asyncio.sleep(max(0.0, SCRAPE_PERIOD_S - (time.monotonic() - started)))

    def _record(self, samples: list[tuple[str, dict[str, str], float]]) -> None:
        firing = frozenset(
            (labels.get("alert", ""), labels.get("node", ""), labels.get("gpu", ""))
            for name, labels, value in samples
            if name == "quotient_alert" and value >= 1.0
        )
        self.scrapes.append(chaos_alerts.Scrape(at_s=self._clock(), firing=firing))
        self.internal_errors.update(samples)
        self.evictions.update(samples)

"""``quotient scheduler``: the Kubernetes scheduler around the placement engine.

One process, one event loop (uvloop). Shape:

- Leader election over a ``coordination.k8s.io`` Lease. Only the leader watches and schedules; a replica that loses
  the lease stops at once and exits (its Deployment restarts it as a standby), because its in-memory state may be
  stale: the next leader rebuilds everything from the API.
- Reflectors (list, then watch with bookmarks, relist and diff on ``410``) for pods, nodes, Queues, PodGroups and
  PriorityClasses feed one ``ClusterState``; each change marks the state dirty.
- The cycle runs whenever the state is dirty, coalescing bursts: snapshot (rebuilding only what changed), the
  engine, then the plan is *assumed* in the state at once and handed to the binder, which carries it out with
  bounded concurrency. Status (PodGroup conditions, events, Queue status) is written after each cycle, only where it
  changed.
- New pods without a group go to the grouper, which reads their owners, creates their PodGroup and annotates them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from common import config, logs, quantities, wire
from common.config import Setting
from common.errors import BusError, ConfigError, QuotientError
from common.httpendpoint import HttpEndpoint, Response
from common.natsconn import NatsBus
from scheduler import alerts, audit, sharing
from scheduler.kube import (
    binding,
    client,
    events,
    grouper,
    grouping,
    leases,
    reservations,
    statuswriter,
    watches,
    webhook,
)
from scheduler.kube.errors import KubeError
from scheduler.metrics import CONTENT_TYPE, SchedulerMetrics
from scheduler.placement import decisions, engine, model, plan
from scheduler.state import cache, snapshot
from scheduler.telemetry import consumer as telemetry_consumer
from scheduler.telemetry import live, overuse

log = logs.get("scheduler")

RESERVATION_RECONCILE_S = 0.5
QUARANTINE_MIN_S = 30.0
"""A node where a reservation pod got no GPU takes no new pods for at least this long (or the UUID timeout)."""
"""How often reservations are reconciled with their groups (drains, timeouts, vanished reservations)."""
QUEUE_STATUS_PERIOD_S = 2.0
"""Queue status sums every running pod of the subtree: written at most this often, not after every cycle."""


def _names(raw: object) -> tuple[str, ...]:
    names = tuple(part.strip() for part in str(raw).split(",") if part.strip())
    if not names:
        raise ValueError("at least one scheduler name is needed")
    return names


def _bytes(raw: object) -> int:
    value = quantities.parse_bytes(raw if isinstance(raw, int) else str(raw))
    if value < 0:
        raise ValueError(f"{raw!r} must not be negative")
    return value


def _percent(raw: object) -> int:
    text = str(raw).strip().removesuffix("%")
    if not (text.isascii() and text.isdigit()) or int(text) > 100:
        raise ValueError(f"{raw!r} is not a whole percentage within 0..100")
    return int(text)


TELEMETRY_SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="overuse_policy",
        parse=config.choice(*(policy.value for policy in overuse.OverusePolicy)),
        default=overuse.OverusePolicy.ALERT.value,
        help="what a pod over its GPU memory allotment gets, unless its Queue's quotient.dev/overuse-policy says",
    ),
    Setting(
        name="overuse_grace",
        parse=config.parse_positive_duration_s,
        default=30.0,
        help="how long a pod stays over its allotment (or memory of no pod stays) before the alert fires",
    ),
    Setting(
        name="overuse_evict_grace",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="under the evict policy, how long the over-consumption alert fires before the pod is evicted",
    ),
    Setting(
        name="overuse_tolerance",
        parse=_bytes,
        default=512 * quantities.MIB,
        help="bytes a pod may use above its allotment without alerting (allocators round up, CUDA contexts)",
    ),
    Setting(
        name="overuse_tolerance_percent",
        parse=_percent,
        default=5,
        help="the same slack as a percentage of the allotment; the larger of the two applies",
    ),
    Setting(
        name="unattributed_threshold",
        parse=_bytes,
        default=quantities.GIB,
        help="GPU memory of processes of no pod on one device above which UnattributedGpuMemory fires",
    ),
    Setting(
        name="ghost_grace",
        parse=config.parse_positive_duration_s,
        default=300.0,
        help="how long a Running pod may hold a GPU with no process on it before GhostAllocation fires",
    ),
    Setting(
        name="telemetry_stale_floor",
        parse=config.parse_positive_duration_s,
        default=10.0,
        help="a node's telemetry is stale after max(3 x its interval, this floor)",
    ),
    Setting(
        name="headroom_window",
        parse=config.parse_positive_duration_s,
        default=30.0,
        help="window of the peak of used GPU memory that placement subtracts from a device",
    ),
    Setting(
        name="headroom_margin",
        parse=_bytes,
        default=model.DEFAULT_CONFIG.headroom_margin_bytes,
        help="GPU memory kept free on top of the measured peak",
    ),
)


def _ns(seconds: object) -> int:
    return int(float(str(seconds)) * quantities.NS_PER_S)


def live_settings_from(values: Mapping[str, object], *, queue_label: str) -> live.LiveSettings:
    """The telemetry analysis' settings from resolved ``TELEMETRY_SETTINGS`` values."""
    detector = overuse.Settings(
        tolerance_bytes=int(str(values["overuse_tolerance"])),
        tolerance_percent=int(str(values["overuse_tolerance_percent"])),
        grace_ns=_ns(values["overuse_grace"]),
        evict_grace_ns=_ns(values["overuse_evict_grace"]),
        ghost_threshold_ns=_ns(values["ghost_grace"]),
        unattributed_threshold_bytes=int(str(values["unattributed_threshold"])),
        default_policy=overuse.OverusePolicy(str(values["overuse_policy"])),
    )
    return live.LiveSettings(
        detector=detector,
        stale_floor_ns=_ns(values["telemetry_stale_floor"]),
        headroom_window_ns=_ns(values["headroom_window"]),
        queue_label=queue_label,
    )


SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="kubeconfig", parse=config.parse_existing_file, default=None, help="kubeconfig file (default: in-cluster)"
    ),
    Setting(
        name="kube_server",
        parse=config.parse_str,
        default=None,
        help="API server URL without credentials (the emulator)",
    ),
    Setting(
        name="scheduler_name",
        parse=_names,
        default=("quotient",),
        help="the spec.schedulerName values this scheduler serves, comma-separated (e.g. quotient,kai-scheduler)",
    ),
    Setting(
        name="queue_label",
        parse=config.parse_str,
        default=grouping.QUEUE_LABEL,
        help="the pod/owner label naming the queue",
    ),
    Setting(name="nats", parse=config.parse_nats_url, default=None, help="NATS server URL(s) for telemetry and alerts"),
    Setting(
        name="nats_nkey_seed", parse=config.parse_existing_file, default=None, help="the scheduler's nkey seed file"
    ),
    *TELEMETRY_SETTINGS,
    Setting(name="metrics_port", parse=config.parse_port, default=8080, help="port of /metrics and /healthz (0: off)"),
    Setting(name="metrics_host", parse=config.parse_str, default="0.0.0.0", help="address /metrics listens on"),
    Setting(name="leader_elect", parse=config.parse_bool, default=True, help="elect a leader through a Lease"),
    Setting(name="lease_namespace", parse=config.parse_str, default="quotient-system", help="namespace of the Lease"),
    Setting(name="lease_name", parse=config.parse_str, default="quotient-scheduler", help="name of the Lease"),
    Setting(name="lease_duration", parse=config.parse_positive_duration_s, default=15.0, help="Lease duration"),
    Setting(name="renew_deadline", parse=config.parse_positive_duration_s, default=10.0, help="Lease renew deadline"),
    Setting(name="retry_period", parse=config.parse_positive_duration_s, default=2.0, help="Lease retry period"),
    Setting(
        name="identity", parse=config.parse_str, default=None, help="this replica's identity (default: hostname-pid)"
    ),
    Setting(
        name="cycle_debounce", parse=config.parse_positive_duration_s, default=0.02, help="coalescing window of cycles"
    ),
    Setting(name="bind_concurrency", parse=config.parse_str, default="32", help="API calls of the binder in flight"),
    Setting(
        name="watch_timeout", parse=config.parse_positive_duration_s, default=300.0, help="server-side watch timeout"
    ),
    Setting(
        name="stale_gang_grace",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="grace of a gang below minMember",
    ),
    Setting(
        name="gpu_strategy", parse=config.choice("binpack", "spread"), default="binpack", help="node order for GPU pods"
    ),
    Setting(
        name="cpu_strategy", parse=config.choice("binpack", "spread"), default="binpack", help="node order for CPU pods"
    ),
    *webhook.SETTINGS,
    *reservations.SETTINGS,
    *config.LOG_SETTINGS,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    kubeconfig: str | None
    kube_server: str | None
    scheduler_names: tuple[str, ...]
    queue_label: str
    metrics_host: str
    metrics_port: int
    leader_elect: bool
    election: leases.ElectionConfig
    cycle_debounce_s: float
    bind_concurrency: int
    watch_timeout_s: int
    nats: str | None
    nats_seed: Path | None
    engine_config: model.Config
    webhook: webhook.WebhookSettings
    reservation: reservations.Settings = dataclasses.field(default_factory=reservations.Settings)
    telemetry: live.LiveSettings | None = None
    """The telemetry analysis (over-consumption, staleness, headroom); used when ``nats`` is set."""


def settings_from(values: Mapping[str, object]) -> Settings:
    try:
        concurrency = int(str(values["bind_concurrency"]))
    except ValueError:
        raise ConfigError(f"--bind-concurrency: {values['bind_concurrency']!r} is not a whole number") from None
    if not 1 <= concurrency <= 1024:
        raise ConfigError(f"--bind-concurrency: {concurrency} must be within 1..1024")
    identity = str(values["identity"] or f"{socket.gethostname()}-{os.getpid()}")
    election = leases.ElectionConfig(
        namespace=str(values["lease_namespace"]),
        name=str(values["lease_name"]),
        identity=identity,
        lease_duration_s=float(str(values["lease_duration"])),
        renew_deadline_s=float(str(values["renew_deadline"])),
        retry_period_s=float(str(values["retry_period"])),
    )
    names = values["scheduler_name"]
    assert isinstance(names, tuple)
    engine_config = dataclasses.replace(
        model.DEFAULT_CONFIG,
        gpu_strategy=model.Strategy(str(values["gpu_strategy"])),
        cpu_strategy=model.Strategy(str(values["cpu_strategy"])),
        stale_gang_grace_ns=int(float(str(values["stale_gang_grace"])) * 1_000_000_000),
        headroom_margin_bytes=int(str(values["headroom_margin"])),
    )
    return Settings(
        kubeconfig=str(values["kubeconfig"]) if values["kubeconfig"] else None,
        kube_server=str(values["kube_server"]) if values["kube_server"] else None,
        scheduler_names=tuple(str(name) for name in names),
        queue_label=str(values["queue_label"]),
        metrics_host=str(values["metrics_host"]),
        metrics_port=int(str(values["metrics_port"])),
        leader_elect=bool(values["leader_elect"]),
        election=election,
        cycle_debounce_s=float(str(values["cycle_debounce"])),
        bind_concurrency=concurrency,
        watch_timeout_s=max(1, int(float(str(values["watch_timeout"])))),
        nats=str(values["nats"]) if values["nats"] else None,
        nats_seed=Path(str(values["nats_nkey_seed"])) if values["nats_nkey_seed"] else None,
        engine_config=engine_config,
        webhook=webhook.settings_from(values),
        reservation=reservations.settings_from(values),
        telemetry=live_settings_from(values, queue_label=str(values["queue_label"])),
    )


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class Scheduler:
    """The leader's work: watch, schedule, bind, report. ``run()`` until cancelled."""

    def __init__(
        self,
        api: client.KubeApi,
        settings: Settings,
        metrics: SchedulerMetrics,
        *,
        decisions: audit.DecisionPublisher | None = None,
        bus: NatsBus | None = None,
    ) -> None:
        self.api = api
        self.decisions = decisions
        self._placing: dict[str, tuple[tuple[int, ...], str | None, str | None, int]] = {}
        self.settings = settings
        self.metrics = metrics
        self.state = cache.ClusterState(scheduler_names=settings.scheduler_names)
        # Live telemetry (with NATS): measured headroom for the snapshot, alerts three ways, evict-policy evictions.
        self.live = live.LiveTelemetry(settings.telemetry) if bus is not None and settings.telemetry else None
        self.consumer = telemetry_consumer.TelemetryConsumer(bus=bus) if bus is not None and self.live else None
        self.builder = snapshot.SnapshotBuilder(self.state, config=settings.engine_config, measured=self.live)
        self.engine = engine.Engine()
        self.recorder = events.EventRecorder(api, component="quotient-scheduler", instance=settings.election.identity)
        self.alerts = alerts.AlertSink(
            metrics=metrics, recorder=self.recorder, bus=bus, identity=settings.election.identity
        )
        self._analysed_nodes: set[str] = set()
        """Nodes whose telemetry the live analysis holds (forgotten there when they leave the cluster)."""
        self._evict_reasons: dict[str, str] = {}
        """Pods being evicted for a reason of the telemetry (its Decision says so), by uid."""
        self._counted_nodes: Mapping[model.NodeName, model.Node] | None = None
        self._evicting: set[str] = set()
        self.sharing = sharing.GroupKeeper(
            api,
            settings.reservation,
            self.state,
            self.recorder,
            self.metrics,
            decisions=decisions,
            evicting=self._evicting,
            cycle=lambda: self.cycles,
            on_change=self._mark,
        )
        self.reservations = self.sharing.manager
        self.binder = binding.Binder(
            api, report=self._on_report, concurrency=settings.bind_concurrency, reservations=self.reservations
        )
        self.grouper = grouper.Grouper(
            api,
            queue_label=settings.queue_label,
            on_event=self._event,
            on_grouped=self._grouped,
            still_unannotated=self._unannotated,
        )
        self.writer = statuswriter.StatusWriter(api, on_event=self._event)
        self._dirty = asyncio.Event()
        self._status_due = asyncio.Event()
        self._queues_written_at = 0.0
        self._bind_started: dict[str, float] = {}
        self._synced: set[str] = set()
        self.cycles = 0
        self.ready = False
        """True once every watch has listed: the first cycle can see the whole cluster."""
        self._pending_write: tuple[snapshot.Built, plan.Plan] | None = None

    async def _event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorder.record(events.ObjectRef.of(obj), type=events.EventType(type_), reason=reason, message=message)

    # --- live telemetry ----------------------------------------------------------------------------------------

    async def _telemetry_loop(self) -> None:
        """Apply the consumer's changes to the live analysis (coalesced like cycles), sweep for staleness on a
        timer, and send what follows: alerts, evictions, metrics, and a cycle when measured headroom moved."""
        assert self.consumer is not None and self.live is not None and self.settings.telemetry is not None
        consumer, telemetry = self.consumer, self.live
        # A node is stale after max(3 x interval, floor): checking at a quarter of the floor (at most every second)
        # notices it within a fraction of the threshold.
        period_s = max(0.05, min(1.0, self.settings.telemetry.stale_floor_ns / quantities.NS_PER_S / 4))
        next_check = 0.0
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(consumer.changed.wait(), timeout=max(0.0, next_check - loop.time()))
            changes = consumer.take_changes()
            now_ns = time.time_ns()
            # Telemetry of a node the cluster does not have (deleted, or a name nobody registered) is not analysed:
            # it would only raise alerts about nothing, TelemetryStale first. A node deleted from the cluster is
            # forgotten at once (its alerts resolve).
            nodes = self.state.nodes
            unknown = {node for node in changes.telemetry if node not in nodes}
            vanished = {node for node in self._analysed_nodes if node not in nodes}
            self._analysed_nodes -= vanished | changes.forgotten
            if unknown:
                self.metrics.count_rejected("unknown_node", len(unknown))
            if changes.telemetry - unknown or changes.forgotten or vanished:
                latest = consumer.latest()
                samples = [
                    overuse.NodeSample(telemetry=latest[node].telemetry, received_ns=latest[node].received_ns)
                    for node in sorted(changes.telemetry - unknown)
                    if node in latest
                ]
                self._analysed_nodes.update(sample.telemetry.node for sample in samples)
                self._telemetry_result(
                    telemetry.apply(samples, state=self.state, now_ns=now_ns, forgotten=changes.forgotten | vanished)
                )
            if loop.time() >= next_check:
                next_check = loop.time() + period_s
                self._telemetry_result(telemetry.check(now_ns=now_ns))
                self.metrics.set_telemetry_ages(telemetry.ages_s(now_ns=now_ns))
                self._count_telemetry()
            await asyncio.sleep(self.settings.cycle_debounce_s)

    def _telemetry_result(self, result: live.LiveResult) -> None:
        self.alerts.send(result.transitions)
        for node, rows in result.rows.items():
            self.metrics.set_node_rows(node, rows)
        for node in result.forgotten:
            self.metrics.forget_node(node)
        self.metrics.count_rejected("foreign_claim", result.foreign_claims)
        for problem in result.policy_problems:
            log.warning("overuse_policy_invalid", annotation=problem.annotation, message=problem.message)
        for eviction in result.evictions:
            self._evict_overuse(eviction)
        if result.headroom_changed:
            self._mark()

    def _count_telemetry(self) -> None:
        if self.consumer is None:
            return
        counters = self.consumer.counters
        rejected = {reason.value: count for reason, count in counters.rejected.items()}
        rejected["buffer_full"] = counters.dropped_buffer_full
        rejected["node_limit"] = counters.dropped_node_limit
        self.metrics.count_telemetry(accepted=counters.accepted_telemetry + counters.accepted_health, rejected=rejected)

    def _evict_overuse(self, eviction: overuse.Eviction) -> None:
        """A pod over its allotment past the evict grace under the ``evict`` policy: through the binder's eviction
        path, with an Event now and a Decision when the API confirms."""
        pod = self.state.pods.get(eviction.pod_uid)
        if pod is None or eviction.pod_uid in self._evicting:
            return
        self._evicting.add(eviction.pod_uid)
        self._evict_reasons[eviction.pod_uid] = eviction.reason
        group = self.state.group_of(pod)
        ref = binding.PodRef(namespace=eviction.pod_namespace, name=eviction.pod_name, uid=eviction.pod_uid)
        self.metrics.evictions.labels(eviction.reason).inc()
        self.binder.submit_evict(
            ref,
            decisions.Eviction(
                pod=model.PodUid(eviction.pod_uid),
                group=snapshot.group_id(*group) if group is not None else model.GroupId(eviction.pod_uid),
                node=model.NodeName(eviction.node),
                # No beneficiary and no room to make: the scheduler ends the pod on its queue's overuse policy
                # (disruption condition TerminationByScheduler).
                reason=decisions.EvictionReason.OVERUSE,
                beneficiary=None,
                message=eviction.message,
            ),
        )
        self.recorder.record(
            events.ObjectRef.of(pod), type=events.EventType.WARNING, reason="Evict", message=eviction.message
        )
        log.warning("overuse_eviction", pod=f"{eviction.pod_namespace}/{eviction.pod_name}", message=eviction.message)

    def _grouped(self, uid: str, name: str) -> None:
        self.state.note_group(uid, name)
        self._mark()

    def _unannotated(self, uid: str) -> bool:
        pod = self.state.pods.get(uid)
        return pod is not None and cache.group_key(pod) is None

    # --- events from the watches --------------------------------------------------------------------------------

    def _mark(self) -> None:
        self._dirty.set()

    def _handler(self, kind: str) -> watches.Handler:
        async def handle(event: watches.ReflectorEvent) -> None:
            if isinstance(event, watches.Synced):
                self._synced.add(kind)
                self._mark()
                return
            obj = event.obj
            deleted = isinstance(event, watches.Deleted)
            if kind == "pods":
                if reservations.is_reservation(obj):
                    if deleted:
                        self.reservations.removed(obj)
                    else:
                        self.reservations.observe(obj)
                if deleted:
                    self.state.delete_pod(_uid(obj))
                    self._evicting.discard(_uid(obj))
                else:
                    self.state.put_pod(obj)
                    if self.state.is_ours(obj) and self.grouper.wants(
                        obj, self.state.podgroups, self.state.decided.get(_uid(obj))
                    ):
                        self.grouper.submit(obj)
            elif kind == "nodes":
                name = str((obj.get("metadata") or {}).get("name") or "")
                if deleted:
                    self.state.delete_node(name)
                else:
                    self.state.put_node(obj)
            elif kind == "queues":
                name = str((obj.get("metadata") or {}).get("name") or "")
                if deleted:
                    self.state.delete_queue(name)
                else:
                    self.state.put_queue(obj)
            elif kind == "podgroups":
                meta = obj.get("metadata") or {}
                if deleted:
                    self.state.delete_podgroup(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                else:
                    self.state.put_podgroup(obj)
                self._regroup_waiting(str(meta.get("namespace") or ""), str(meta.get("name") or ""), deleted)
            elif kind == "priorityclasses":
                name = str((obj.get("metadata") or {}).get("name") or "")
                if deleted:
                    self.state.delete_priority_class(name)
                else:
                    self.state.put_priority_class(obj)
            self._mark()

        return handle

    def _regroup_waiting(self, namespace: str, name: str, deleted: bool) -> None:
        """A PodGroup vanished: its pods need one again (a user deleted it, or it was garbage collected)."""
        if not deleted:
            return
        for uid in sorted(self.state.group_members.get((namespace, name), ())):
            pod = self.state.pods.get(uid)
            if pod is not None and self.grouper.wants(pod, self.state.podgroups, self.state.decided.get(uid)):
                self.grouper.submit(pod)

    # --- the cycle ------------------------------------------------------------------------------------------------

    def run_cycle(self) -> None:
        """One synchronous cycle: snapshot, engine, assume, hand over to the binder. Status is written after."""
        started = time.perf_counter()
        built = self.builder.build(time.time_ns())
        built_at = time.perf_counter()
        result = self.engine.run(built.snapshot)
        engine_at = time.perf_counter()
        self.cycles += 1
        for placement in result.placements:
            uid = str(placement.pod)
            pod = self.state.pods.get(uid)
            if pod is None or uid in self.state.assumed:
                continue
            groups = tuple(binding.label_safe_group(str(group)) for group in placement.gpu_groups)
            self.state.assume(
                uid,
                cache.Assumption(
                    node=str(placement.node),
                    devices=placement.devices,
                    share_milli=placement.share_milli[0] if placement.share_milli else 0,
                    gpu_groups=groups,
                ),
            )
            meta = pod.get("metadata") or {}
            ref = binding.PodRef(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")), uid=uid)
            self._bind_started[uid] = time.perf_counter()
            group = built.snapshot.groups.get(placement.group)
            self._placing[uid] = (
                placement.devices,
                groups[0] if groups else None,
                str(group.queue) if group is not None else None,
                self.cycles,
            )
            extra = {}
            if cache.group_key(pod) is None and uid in self.state.decided:
                extra[cache.POD_GROUP_ANNOTATION] = self.state.decided[uid]
            configmap = (meta.get("annotations") or {}).get(webhook.CONFIGMAP_ANNOTATION)
            self.binder.submit_bind(ref, placement, groups, extra, configmap=str(configmap) if configmap else None)
        for nomination in result.nominations:
            uid = str(nomination.pod)
            pod = self.state.pods.get(uid)
            if pod is None or (pod.get("status") or {}).get("nominatedNodeName") == str(nomination.node):
                continue
            meta = pod.get("metadata") or {}
            ref = binding.PodRef(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")), uid=uid)
            self.binder.submit_nomination(ref, str(nomination.node))
        for eviction in result.evictions:
            uid = str(eviction.pod)
            pod = self.state.pods.get(uid)
            if pod is None or uid in self._evicting:
                continue
            self._evicting.add(uid)
            meta = pod.get("metadata") or {}
            ref = binding.PodRef(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")), uid=uid)
            self.metrics.evictions.labels(eviction.reason.value).inc()
            self.binder.submit_evict(ref, eviction)
            self.recorder.record(
                events.ObjectRef.of(pod), type=events.EventType.WARNING, reason="Evict", message=eviction.message
            )
        self.metrics.cycles.inc()
        self.metrics.cycle_seconds.observe(time.perf_counter() - started)
        counts: dict[str, int] = {}
        for group_status in result.statuses.values():
            counts[group_status.reason.value] = counts.get(group_status.reason.value, 0) + 1
        self.metrics.set_pending(counts)
        self._cluster_metrics(built.snapshot, result)
        rejected: dict[str, int] = {}
        for issue in built.pod_issues:
            rejected[issue.reason] = rejected.get(issue.reason, 0) + 1
        for reason in ("InvalidGpuRequest", "InvalidPodSpec"):
            self.metrics.rejected_pods.labels(reason).set(rejected.get(reason, 0))
        self._pending_write = (built, result)
        if result.placements or result.evictions:
            log.info(
                "cycle",
                cycle=self.cycles,
                placed=len(result.placements),
                evicted=len(result.evictions),
                pending=len(result.statuses),
                ms=round((time.perf_counter() - started) * 1000, 2),
                snapshot_ms=round((built_at - started) * 1000, 2),
                engine_ms=round((engine_at - built_at) * 1000, 2),
            )

    def _cluster_metrics(self, snap: model.Snapshot, result: plan.Plan) -> None:
        """GPUs total and allocated (recounted only when the nodes mapping changed), and per queue how long its
        oldest pending group has waited."""
        if snap.nodes is not self._counted_nodes:
            self._counted_nodes = snap.nodes
            total = allocated = 0
            for node in snap.nodes.values():
                total += len(node.devices) * model.MILLI_GPU_PER_DEVICE
                allocated += sum(device.allotted_milli_gpu for device in node.devices)
            self.metrics.set_cluster_gpus(total_milli=total, allocated_milli=allocated)
        oldest: dict[str, float] = dict.fromkeys((str(name) for name in snap.queues), 0.0)
        for group_id in result.statuses:
            group = snap.groups.get(group_id)
            if group is None:
                continue
            waited_s = max(0, snap.now_ns - group.created_ns) / quantities.NS_PER_S
            oldest[str(group.queue)] = max(oldest.get(str(group.queue), 0.0), waited_s)
        self.metrics.set_oldest_pending(oldest)

    async def _write_status(self) -> None:
        if self._pending_write is None:
            return
        built, outcome = self._pending_write
        state = self.state
        pending_pods: dict[model.GroupId, list[dict[str, Any]]] = {}
        group_queues: dict[model.GroupId, str] = {}
        for group_id in outcome.statuses:
            group = built.snapshot.groups.get(group_id)
            if group is None:
                continue
            group_queues[group_id] = str(group.queue)
            pending_pods[group_id] = [
                state.pods[str(pod.uid)]
                for pod in group.members
                if pod.phase is model.PodPhase.PENDING and str(pod.uid) in state.pods
            ]
        issues = {issue.queue: issue for issue in built.queue_issues}
        await self.writer.groups(outcome.statuses, built.podgroups, pending_pods, issues, group_queues)
        await self.writer.pod_issues(built.pod_issues, state.pods)
        now = time.monotonic()
        if now - self._queues_written_at < QUEUE_STATUS_PERIOD_S:
            self._status_due.set()  # come back for the queues once the period is over
            await asyncio.sleep(QUEUE_STATUS_PERIOD_S - (now - self._queues_written_at))
            return
        self._queues_written_at = now
        queue_status = statuswriter.queue_statuses(
            built.snapshot, outcome.queues, built.queue_issues, sorted(state.queues)
        )
        await self.writer.queues(queue_status)
        for name, share in outcome.queues.items():
            current = queue_status.get(str(name))
            queue = built.snapshot.queues.get(name)
            if current is None or queue is None:
                continue
            self.metrics.set_queue(
                str(name),
                fair=(share.fair.milli_gpu, share.fair.milli_cpu, share.fair.memory_bytes),
                deserved=(share.deserved.milli_gpu, share.deserved.milli_cpu, share.deserved.memory_bytes),
                quota=(queue.gpu.quota, queue.cpu.quota, queue.memory.quota),
                limit=(queue.gpu.limit, queue.cpu.limit, queue.memory.limit),
                allocated=current.allocated,
                requested=current.requested,
            )
        self.metrics.forget_queues({str(name) for name in outcome.queues})

    async def _on_report(self, report: binding.Report) -> None:
        uid = report.pod.uid
        started = self._bind_started.pop(uid, None)
        placing = self._placing.pop(uid, None)
        evicted_for = self._evict_reasons.pop(uid, None) if report.outcome is not binding.Outcome.BOUND else None
        if self.decisions is not None and report.outcome in (binding.Outcome.BOUND, binding.Outcome.EVICTED):
            devices, gpu_group, queue, cycle_number = placing or ((), None, None, self.cycles)
            await self.decisions.publish(
                action=wire.DecisionAction.BIND
                if report.outcome is binding.Outcome.BOUND
                else wire.DecisionAction.EVICT,
                namespace=report.pod.namespace,
                name=report.pod.name,
                uid=uid,
                node=report.node,
                gpu_indices=devices,
                gpu_group=gpu_group,
                queue=queue,
                reason="Scheduled" if report.outcome is binding.Outcome.BOUND else evicted_for or "Evicted",
                message=report.message,
                cycle=cycle_number,
            )
        if report.outcome is binding.Outcome.EVICTED or (
            report.outcome is binding.Outcome.GONE and uid in self._evicting
        ):
            return
        self.metrics.binds.labels(report.outcome.value).inc()
        if started is not None:
            self.metrics.bind_seconds.observe(time.perf_counter() - started)
        if report.outcome is binding.Outcome.BOUND:
            return
        self.state.forget(uid)
        self._mark()
        if (
            report.outcome is binding.Outcome.NOT_RESERVED
            and report.node
            and report.reason
            in (
                "ReservationTimeout",
                "ReservationFailed",
            )
        ):
            # The node could not hold a GPU for a share (its device plugin or NVML is failing): place elsewhere.
            cool_off_s = max(QUARANTINE_MIN_S, self.settings.reservation.uuid_timeout_s)
            self.builder.quarantine(report.node, until_ns=time.time_ns() + int(cool_off_s * 1e9))
        pod = self.state.pods.get(uid)
        if report.outcome is not binding.Outcome.GONE and pod is not None:
            log.warning(
                "bind_failed",
                pod=f"{report.pod.namespace}/{report.pod.name}",
                outcome=report.outcome.value,
                message=report.message,
            )
            self.recorder.record(
                events.ObjectRef.of(pod), type=events.EventType.WARNING, reason="FailedBinding", message=report.message
            )

    async def _cycle_loop(self) -> None:
        kinds = {"pods", "nodes", "queues", "podgroups", "priorityclasses"}
        while True:
            await self._dirty.wait()
            if not kinds <= self._synced:
                self._dirty.clear()
                continue
            self.ready = True
            await asyncio.sleep(self.settings.cycle_debounce_s)
            self._dirty.clear()
            self.run_cycle()
            self._status_due.set()

    async def _status_loop(self) -> None:
        """Writes the newest cycle's status; a cycle never waits for the API, and a slow API skips stale statuses."""
        while True:
            await self._status_due.wait()
            self._status_due.clear()
            try:
                await self._write_status()
            except KubeError as exc:
                log.warning("status_write_failed", error=str(exc))

    async def run(self) -> None:
        reflectors = [
            watches.Reflector(
                self.api, client.PODS, handler=self._handler("pods"), watch_timeout_s=self.settings.watch_timeout_s
            ),
            watches.Reflector(
                self.api, client.NODES, handler=self._handler("nodes"), watch_timeout_s=self.settings.watch_timeout_s
            ),
            watches.Reflector(
                self.api, client.QUEUES, handler=self._handler("queues"), watch_timeout_s=self.settings.watch_timeout_s
            ),
            watches.Reflector(
                self.api,
                client.POD_GROUPS,
                handler=self._handler("podgroups"),
                watch_timeout_s=self.settings.watch_timeout_s,
            ),
            watches.Reflector(
                self.api,
                client.PRIORITY_CLASSES,
                handler=self._handler("priorityclasses"),
                watch_timeout_s=self.settings.watch_timeout_s,
            ),
        ]
        self.metrics.leader.set(1)
        await self.reservations.ensure_namespace()
        try:
            async with asyncio.TaskGroup() as group:
                for reflector in reflectors:
                    group.create_task(reflector.run())
                group.create_task(self.recorder.run())
                group.create_task(self._cycle_loop())
                group.create_task(self._status_loop())
                group.create_task(self.sharing.run(lambda: self.ready))
                group.create_task(self.alerts.run())
                if self.consumer is not None:
                    group.create_task(self.consumer.run())
                    group.create_task(self._telemetry_loop())
        finally:
            self.sharing.cancel()
            self.metrics.leader.set(0)
            await self.binder.cancel()
            await self.grouper.cancel()


async def serve(settings: Settings) -> None:
    metrics = SchedulerMetrics()
    api = await client.KubeClient.connect(kubeconfig=settings.kubeconfig, server=settings.kube_server)
    current: dict[str, Scheduler | None] = {"scheduler": None}

    def ready() -> bool:
        scheduler = current["scheduler"]
        return scheduler is not None and scheduler.ready

    endpoint: HttpEndpoint | None = None
    if settings.metrics_port:
        endpoint = HttpEndpoint(
            host=settings.metrics_host,
            port=settings.metrics_port,
            routes={
                "/metrics": lambda: Response(content_type=CONTENT_TYPE, body=metrics.render()),
                "/healthz": lambda: Response(body=b"ok\n"),
                "/readyz": lambda: Response(
                    status=200 if ready() else 503, body=b"leading and synced\n" if ready() else b"standby\n"
                ),
            },
        )
        await endpoint.start()
    log.info("scheduler_starting", names=",".join(settings.scheduler_names), identity=settings.election.identity)
    # NATS (optional): declare the telemetry stream and publish every decision on quotient.v1.decisions.
    bus: NatsBus | None = None
    nats_task: asyncio.Task[None] | None = None
    decisions: audit.DecisionPublisher | None = None
    if settings.nats:
        bus = NatsBus(
            servers=settings.nats, name=f"quotient-scheduler-{settings.election.identity}", nkey_seed=settings.nats_seed
        )
        decisions = audit.DecisionPublisher(bus, identity=settings.election.identity)
        nats_task = asyncio.ensure_future(guard(_connect_nats(bus), "nats"))
    # Every replica serves the admission webhook (a standby too: pod creation must not wait for an election).
    admission: asyncio.Task[None] | None = None
    if settings.webhook.enabled:
        admission = asyncio.ensure_future(
            guard(webhook.serve(api, settings.webhook, scheduler_names=settings.scheduler_names), "webhook")
        )
    try:

        async def lead() -> None:
            scheduler = Scheduler(api, settings, metrics, decisions=decisions, bus=bus)
            current["scheduler"] = scheduler
            try:
                await scheduler.run()
            finally:
                current["scheduler"] = None

        if not settings.leader_elect:
            await lead()
            return
        elector = leases.LeaderElector(api, settings.election)

        await elector.run(lead)
        log.warning("leadership_lost", identity=settings.election.identity)
    finally:
        if nats_task is not None:
            nats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await nats_task
        if bus is not None:
            await bus.close()
        if admission is not None:
            admission.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await admission
        if endpoint is not None:
            await endpoint.close()
        await api.close()


async def _connect_nats(bus: NatsBus) -> None:
    """Connect (retrying with backoff for as long as it takes) and declare the telemetry stream."""
    await bus.connect()
    try:
        await bus.declare_telemetry_stream()
    except BusError as exc:
        log.error("telemetry_stream_not_declared", error=str(exc))


async def guard(work: Coroutine[Any, Any, None], name: str) -> None:
    """A side task that logs its failure at once instead of when someone awaits it."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("task_failed", task=name)
        raise


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient scheduler", description="the Quotient Kubernetes scheduler")
    config.add_arguments(parser, SETTINGS)
    try:
        values = config.resolve(SETTINGS, parser.parse_args(list(argv)))
        settings = settings_from(values)
    except ConfigError as exc:
        print(f"quotient scheduler: {exc}", file=sys.stderr)
        return 2
    logs.setup(level=str(values["log_level"]), fmt=str(values["log_format"]))
    import uvloop

    async def main_task() -> None:
        task = asyncio.ensure_future(serve(settings))
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        uvloop.run(main_task())
    except QuotientError as exc:
        log.error("scheduler_failed", error=str(exc))
        return 1
    return 0

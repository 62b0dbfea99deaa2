"""``quotient scheduler``: the composition of the scheduler's parts, and the process around them.

One process, one event loop (uvloop). Shape:

- Leader election over a ``coordination.k8s.io`` Lease. Only the leader watches and schedules; a replica that loses
  the lease stops at once and exits (its Deployment restarts it as a standby), because its in-memory state may be
  stale: the next leader rebuilds everything from the API.
- The leader's parts (``Scheduler``): reflectors for the kinds of ``intake.KINDS``, whose records the intake applies
  to one ``ClusterState``; the cycle (``scheduling.Cycles``: snapshot, engine, dispatcher) whenever the state is
  dirty; the dispatcher (``dispatch``) carrying plans out through the binder; the status reporter; the grouper;
  the reservation keeper (``sharing``); with NATS, the telemetry loop and the alert sink.
- Every replica serves ``/metrics``, ``/healthz`` and ``/readyz``, and the admission webhook (pod creation must not
  wait for an election); with ``--nats`` every replica publishes decisions and the leader follows telemetry.

The walk of a pod from its watch event to its binding, and of a sample to an alert, is in ``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from common import command, logs, tasks
from common.errors import BusError
from common.httpendpoint import HttpEndpoint, Response
from common.natsconn import NatsBus
from scheduler import audit, containment, gcpolicy, intake, reporting, scheduling, sharing, startup
from scheduler.alerts import AlertSink
from scheduler.dispatch import Dispatcher
from scheduler.kube import binding, client, events, grouper, kubeapi, leases, statuswriter, watches
from scheduler.metrics import CONTENT_TYPE, SchedulerMetrics
from scheduler.natsauth import callout
from scheduler.placement import engine
from scheduler.settings import SETTINGS, Settings, settings_from
from scheduler.state import cache, snapshot
from scheduler.telemetry import live
from scheduler.telemetry import loop as telemetry_loop
from scheduler.telemetry.feed.consumer import TelemetryConsumer

log = logs.get("scheduler")


class Scheduler:
    """The leader's work: watch, schedule, bind, report. ``run()`` until cancelled."""

    def __init__(
        self,
        api: kubeapi.KubeApi,
        settings: Settings,
        metrics: SchedulerMetrics,
        *,
        decisions: audit.DecisionPublisher | None = None,
        bus: NatsBus | None = None,
        make_engine: Callable[[], containment.Planner] = engine.Engine,
    ) -> None:
        """``make_engine`` makes the placement engine (a new one after a failed cycle); tests of containment pass
        one that fails on purpose."""
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.state = cache.ClusterState(scheduler_names=settings.scheduler_names)
        # Live telemetry (with NATS): measured headroom for the snapshot, alerts three ways, evict-policy evictions.
        self.live = (
            live.LiveTelemetry(settings.telemetry, self.state) if bus is not None and settings.telemetry else None
        )
        self.builder = snapshot.SnapshotBuilder(
            self.state, config=settings.engine_config, measured=self.live, on_error=self._failed
        )
        self.recorder = events.EventRecorder(api, component="quotient-scheduler", instance=settings.election.identity)
        self.dispatcher = Dispatcher(
            self.state,
            metrics=metrics,
            recorder=self.recorder,
            decisions=decisions,
            quarantine=self._quarantine,
            reservation_timeout_s=settings.reservation.uuid_timeout_s,
            on_change=self._mark,
            on_error=self._failed,
        )
        self.sharing = sharing.GroupKeeper(
            api,
            settings.reservation,
            self.state,
            self.recorder,
            self.dispatcher,
            decisions=decisions,
            on_change=self._mark,
            on_failure=self._failed,
        )
        self.dispatcher.binder = binding.Binder(
            api,
            report=self.dispatcher.on_report,
            concurrency=settings.bind_concurrency,
            reservations=self.sharing.manager,
            on_failure=self._failed,
        )
        self.grouper = grouper.Grouper(
            api,
            queue_label=settings.queue_label,
            recorder=self.recorder,
            on_grouped=self._grouped,
            still_unannotated=self.state.is_unannotated,
            still_present=lambda uid: uid in self.state.pods,
            on_failure=self._failed,
        )
        self.intake = intake.Intake(
            self.state,
            grouper=self.grouper,
            reservations=self.sharing.manager,
            on_change=self._mark,
            forget_pod=self.dispatcher.pod_deleted,
            on_error=self._failed,
        )
        self.reporter = reporting.StatusReporter(
            self.state, statuswriter.StatusWriter(api, recorder=self.recorder), metrics, on_error=self._failed
        )
        self.cycles = scheduling.Cycles(
            self.builder,
            self.dispatcher,
            metrics,
            synced=lambda: self.intake.all_synced,
            on_cycle=self.reporter.offer,
            debounce_s=settings.cycle_debounce_s,
            make_engine=make_engine,
        )
        self.alerts = AlertSink(metrics=metrics, recorder=self.recorder, bus=bus, identity=settings.election.identity)
        self.consumer: TelemetryConsumer | None = None
        self.telemetry: telemetry_loop.TelemetryLoop | None = None
        if bus is not None and self.live is not None:
            self.consumer = TelemetryConsumer(bus=bus, config=settings.telemetry_feed)
            self.telemetry = telemetry_loop.TelemetryLoop(
                self.consumer,
                self.live,
                self.state,
                alerts=self.alerts,
                dispatcher=self.dispatcher,
                recorder=self.recorder,
                metrics=metrics,
                on_headroom=self._mark,
                debounce_s=settings.cycle_debounce_s,
                on_error=self._failed,
            )

    @property
    def ready(self) -> bool:
        """True once every watch has listed and a cycle could see the whole cluster."""
        return self.cycles.ready

    def _mark(self) -> None:
        self.cycles.mark()

    def _loop_failed(self, name: str, exc: BaseException) -> None:
        """A supervised loop failed (and restarts): counted apart from the faults its steps catch themselves."""
        self._failed(f"loop_{name}", exc)

    def _failed(self, where: str, exc: BaseException) -> None:
        """A fault caught at a boundary and survived: counted by where it was caught (a bounded set of names)."""
        self.metrics.internal_error(where.split(":", 1)[0])

    def _grouped(self, uid: str, name: str) -> None:
        self.state.note_group(uid, name)
        self._mark()

    def _quarantine(self, node: str, seconds: float) -> None:
        self.builder.quarantine(node, until_ns=time.time_ns() + int(seconds * 1e9))

    async def run(self) -> None:
        reflectors = [
            watches.Reflector(
                self.api,
                kind.resource,
                decode=kind.decode,
                handler=self.intake.handler(kind),
                watch_timeout_s=self.settings.watch_timeout_s,
            )
            for kind in intake.KINDS
        ]
        self.metrics.leader.set(1)
        try:
            # Every loop is supervised: a fault in one is logged, counted and the loop started again; the others and
            # the process go on (issue "never down").
            loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
                *((f"watch:{reflector.name}", reflector.run) for reflector in reflectors),
                ("events", self.recorder.run),
                ("cycles", self.cycles.run),
                ("status", self.reporter.run),
                ("sharing", lambda: self.sharing.run(lambda: self.ready)),
                ("alerts", self.alerts.run),
            ]
            if self.consumer is not None and self.telemetry is not None:
                loops += [("telemetry-consumer", self.consumer.run), ("telemetry", self.telemetry.run)]
            async with asyncio.TaskGroup() as group:
                for name, work in loops:
                    group.create_task(tasks.supervise(work, name=name, on_failure=self._loop_failed))
        finally:
            self.metrics.leader.set(0)
            await self.sharing.cancel()
            await self.dispatcher.cancel()
            await self.grouper.cancel()


def _endpoint(
    settings: Settings, metrics: SchedulerMetrics, leading: Sequence[Scheduler], problems: startup.Readiness
) -> HttpEndpoint:
    def readiness() -> Response:
        if problems.problem:
            return Response(status=503, body=f"not ready: {problems.problem}\n".encode())
        if leading and leading[0].ready:
            return Response(body=b"leading and synced\n")
        return Response(status=503, body=b"standby\n")

    return HttpEndpoint(
        host=settings.metrics_host,
        port=settings.metrics_port,
        flag="--metrics-port",
        routes={
            "/metrics": lambda: Response(content_type=CONTENT_TYPE, body=metrics.render()),
            "/healthz": lambda: Response(body=b"ok\n"),
            "/readyz": readiness,
        },
    )


async def _connect_nats(bus: NatsBus, auth_callout: callout.CalloutService | None = None) -> None:
    """Connect (retrying with backoff for as long as it takes), declare the telemetry stream, and serve the auth
    callout where this replica has its key (every replica does: agents connect whoever leads)."""
    await bus.connect()
    try:
        await bus.declare_telemetry_stream()
    except BusError as exc:
        log.error("telemetry_stream_not_declared", error=str(exc))
    if auth_callout is not None:
        await auth_callout.start(bus)


async def serve(settings: Settings) -> None:
    """Run a replica: endpoints, NATS and the webhook on every replica; the ``Scheduler`` while leading."""
    gcpolicy.apply()
    metrics = SchedulerMetrics()
    api = await client.KubeClient.connect(kubeconfig=settings.kubeconfig, server=settings.kube_server)
    leading: list[Scheduler] = []
    side = tasks.TaskSet("scheduler")
    readiness = startup.Readiness()
    endpoint = _endpoint(settings, metrics, leading, readiness) if settings.metrics_port else None
    bus: NatsBus | None = None
    serving: asyncio.Task[None] | None = None
    try:
        if endpoint is not None:
            await endpoint.start()
        log.info("scheduler_starting", names=",".join(settings.scheduler_names), identity=settings.election.identity)
        # NATS (optional): declare the telemetry stream and publish every decision on quotient.v1.decisions.
        decisions: audit.DecisionPublisher | None = None
        if settings.nats:
            bus = NatsBus(
                servers=settings.nats,
                name=f"quotient-scheduler-{settings.election.identity}",
                nkey_seed=settings.nats_seed,
                tls_ca=settings.nats_ca,
                stream_replicas=settings.telemetry_stream_replicas,
            )
            decisions = audit.DecisionPublisher(bus, identity=settings.election.identity)
            auth_callout = (
                callout.CalloutService(api=api, settings=settings.nats_callout, registry=metrics.registry)
                if settings.nats_callout is not None
                else None
            )
            side.spawn(_connect_nats(bus, auth_callout), name="nats")
        # Every replica serves the admission webhook (a standby too: pod creation must not wait for an election).
        if settings.webhook.enabled:
            serving = await startup.start_webhook(api, settings.webhook, scheduler_names=settings.scheduler_names)
        # A fresh cluster: the namespaces written into exist, or are made, or the reason is logged and on /readyz.
        needed = [
            (
                settings.election.namespace,
                "the scheduler's Lease",
                "or apply the deploy manifests (kubectl apply -k deploy/base), or set --lease-namespace to one that "
                "exists",
            ),
            (
                settings.reservation.namespace,
                "the reservation pods of shared GPUs",
                "or apply the deploy manifests (kubectl apply -k deploy/base), or set --reservation-namespace to one "
                "that exists",
            ),
        ]
        await startup.namespaces_ready(api, needed, readiness)

        async def lead() -> None:
            scheduler = Scheduler(api, settings, metrics, decisions=decisions, bus=bus)
            leading.append(scheduler)
            try:
                await scheduler.run()
            finally:
                leading.clear()

        if not settings.leader_elect:
            await lead()
            return
        elector = leases.LeaderElector(
            api, settings.election, on_problem=lambda problem: readiness.say("lease", problem)
        )
        await elector.run(lead)
        log.warning("leadership_lost", identity=settings.election.identity)
    finally:
        if serving is not None:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        await side.cancel()
        if bus is not None:
            await bus.close()
        if endpoint is not None:
            await endpoint.close()
        await api.close()


def main(argv: Sequence[str]) -> int:
    return command.run_service(
        argv,
        prog="quotient scheduler",
        description="the Quotient Kubernetes scheduler",
        settings=SETTINGS,
        prepare=settings_from,
        serve=serve,
    )

"""The agent's loop: sample every interval, attribute, publish; publish health when it changes.

Why it is shaped this way:
- NVML calls and /proc reads block, so one tick's probe, attribution and encoding run together in one worker
  thread (one hop per tick, not one per call) and the event loop stays free for NATS and the metrics endpoint.
- If NATS is down the agent keeps sampling (metrics stay live) and keeps only the newest telemetry and health;
  when the connection comes back the newest of each is published at once. Nothing queues up without bound.
- Ticks are scheduled on a fixed grid (``start + k * interval``), so a slow tick does not drift the rate, and a
  tick that overran is skipped rather than run twice.
- ``seq`` counts every message of this boot, telemetry and health alike, so (boot, seq) orders them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from agent import sampling
from agent.gpus.probe import GpuProbe, HealthEvent, ProbeSample
from agent.metrics import AgentMetrics
from agent.podmap import PodRef
from common import logs, messaging, subjects, tasks, wire
from common.errors import BusError, GpuError, GpuLibraryUnavailable, GpuLost, WireError, WireReason

log = logs.get("agent")

# 8 devices x 128 processes with 64-hex container ids stay far below the 1 MiB message limit.
_FALLBACK_PROCESSES_PER_GPU = 128


class PodLookup(Protocol):
    """pid -> pod attribution (``agent.podmap.PodMapper``): blocking file reads, called from the worker thread;
    forgets pids not in the latest call, so its cache follows the live processes."""

    def lookup_many(self, pids: Iterable[int]) -> dict[int, PodRef | None]: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Tick:
    telemetry: wire.NodeTelemetry | None
    payload: bytes | None
    seconds: float


def new_boot_id() -> str:
    """A random id for this agent start: a reader orders messages by (boot, seq) and accepts a new boot."""
    return secrets.token_hex(8)


class AgentLoop:
    """One node's agent. ``run()`` until cancelled; ``healthy()`` backs the liveness endpoint."""

    def __init__(
        self,
        *,
        node: str,
        probe: GpuProbe,
        pods: PodLookup,
        bus: messaging.MessageBus,
        metrics: AgentMetrics,
        interval_s: float,
        clock_ns: Callable[[], int] = time.time_ns,
        boot: str | None = None,
        problem_hold_ns: int = sampling.DEFAULT_PROBLEM_HOLD_NS,
    ) -> None:
        """``problem_hold_ns``: how long a critical Xid or an uncorrectable-ECC rise keeps its device reported
        unhealthy after it was last seen (``--problem-hold``)."""
        self.node = node
        self.boot = boot or new_boot_id()
        self._probe = probe
        self._pods = pods
        self._bus = bus
        self._metrics = metrics
        self._interval_s = interval_s
        self._interval_ms = max(1, round(interval_s * 1000))
        self._clock_ns = clock_ns
        self._seq = 0
        self._opened = False
        self._health = sampling.HealthTracker(hold_ns=problem_hold_ns)
        self._latest_payload: bytes | None = None
        self._latest_published = True
        self._last_tick_monotonic: float | None = None
        self.latest: wire.NodeTelemetry | None = None
        self._subject = subjects.telemetry(node)
        self._health_subject = subjects.health(node)

    # -- liveness ----------------------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        """The loop is alive: it finished a tick within the last three intervals (or is just starting)."""
        if self._last_tick_monotonic is None:
            return True
        return time.monotonic() - self._last_tick_monotonic < max(3 * self._interval_s, 5.0)

    # -- one tick, in the worker thread --------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _tick_blocking(self, seq: int) -> _Tick:
        started = time.perf_counter()
        if not self._opened:
            self._probe.open()
            self._opened = True
            log.info("gpu_probe_opened", node=self.node)
        sample: ProbeSample = self._probe.sample()
        pids = sampling.pids_of(sample)
        pods = self._pods.lookup_many(pids)
        telemetry = sampling.build_telemetry(
            sample=sample, pods=pods, node=self.node, boot=self.boot, seq=seq, interval_ms=self._interval_ms
        )
        try:
            payload = wire.encode(telemetry)
        except WireError as exc:
            if exc.reason != WireReason.OVERSIZED:
                raise
            # Thousands of processes with long ids: report the largest few per device rather than nothing.
            telemetry = sampling.build_telemetry(
                sample=sample,
                pods=pods,
                node=self.node,
                boot=self.boot,
                seq=seq,
                interval_ms=self._interval_ms,
                max_processes_per_gpu=_FALLBACK_PROCESSES_PER_GPU,
            )
            payload = wire.encode(telemetry)
        self._health.sample_ok(sample)
        return _Tick(telemetry=telemetry, payload=payload, seconds=time.perf_counter() - started)

    async def tick(self) -> None:
        """Sample once and publish (or keep the newest, if NATS is down)."""
        seq = self._next_seq()
        try:
            result = await asyncio.to_thread(self._tick_blocking, seq)
        except GpuLibraryUnavailable as exc:
            self._opened = False
            self._metrics.sample_errors.labels(self.node, f"library_{exc.kind}").inc()
            self._metrics.clear_sample()
            self._health.library_unavailable(str(exc))
            log.warning("gpu_library_unavailable", node=self.node, kind=exc.kind, error=str(exc))
        except GpuLost as exc:
            self._metrics.sample_errors.labels(self.node, "gpu_lost").inc()
            self._health.gpu_lost(exc.index, str(exc))
            log.error("gpu_lost", node=self.node, gpu=exc.index, error=str(exc))
        except GpuError as exc:
            self._metrics.sample_errors.labels(self.node, "probe").inc()
            log.error("gpu_probe_failed", node=self.node, error=str(exc))
        except WireError as exc:
            # A value the schema refuses (a driver reporting nonsense): say so, keep sampling.
            self._metrics.sample_errors.labels(self.node, "encode").inc()
            log.error("telemetry_not_encodable", node=self.node, reason=exc.reason.value, error=str(exc))
        else:
            assert result.telemetry is not None and result.payload is not None
            self.latest = result.telemetry
            self._metrics.observe_sample(result.telemetry, result.seconds)
            self._latest_payload = result.payload
            self._latest_published = False
            await self._publish_latest()
        self._last_tick_monotonic = time.monotonic()
        await self.publish_health_if_changed()

    # -- publishing ------------------------------------------------------------------------------------------------

    async def _publish_latest(self) -> None:
        if self._latest_payload is None or self._latest_published:
            return
        if not self._bus.connected:
            self._metrics.unpublished.labels(self.node, "telemetry").inc()
            return
        try:
            await self._bus.publish(self._subject, self._latest_payload)
        except BusError as exc:
            self._metrics.unpublished.labels(self.node, "telemetry").inc()
            log.debug("telemetry_not_published", node=self.node, error=str(exc))
            return
        self._latest_published = True
        self._metrics.published.labels(self.node, "telemetry").inc()

    async def publish_health_if_changed(self, *, force: bool = False) -> None:
        now = self._clock_ns()
        if not (force or self._health.changed(now)):
            return
        status, problems = self._health.current(now)
        self._metrics.healthy.labels(self.node).set(1 if status == wire.HealthStatus.HEALTHY else 0)
        if not self._bus.connected:
            self._metrics.unpublished.labels(self.node, "health").inc()
            return
        message = self._health.message(node=self.node, boot=self.boot, seq=self._next_seq(), now_ns=now)
        try:
            await self._bus.publish(self._health_subject, wire.encode(message))
        except BusError as exc:
            self._metrics.unpublished.labels(self.node, "health").inc()
            log.debug("health_not_published", node=self.node, error=str(exc))
            return
        self._health.mark_published(now)
        self._metrics.published.labels(self.node, "health").inc()
        log.info("health_published", node=self.node, status=status.value, problems=len(problems))

    async def on_reconnect(self) -> None:
        """Called when NATS comes back: publish the newest sample and the current health at once."""
        await self._publish_latest()
        await self.publish_health_if_changed(force=True)

    # -- loops -------------------------------------------------------------------------------------------------------

    async def _sampling_loop(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        k = 0
        while True:
            await self.tick()
            self._metrics.nats_connected.labels(self.node).set(1 if self._bus.connected else 0)
            k += 1
            next_at = start + k * self._interval_s
            now = loop.time()
            if next_at < now:  # overran: skip the missed ticks instead of bursting
                k = int((now - start) / self._interval_s) + 1
                next_at = start + k * self._interval_s
            await asyncio.sleep(next_at - now)

    def _wait_events_blocking(self) -> list[HealthEvent]:
        if not self._opened:
            time.sleep(min(self._interval_s, 1.0))
            return []
        return list(self._probe.wait_health_events(1000))

    async def _health_loop(self) -> None:
        while True:
            try:
                events = await asyncio.to_thread(self._wait_events_blocking)
            except GpuError as exc:
                log.warning("gpu_event_wait_failed", node=self.node, error=str(exc))
                await asyncio.sleep(self._interval_s)
                continue
            if events:
                for event in events:
                    log.warning(
                        "gpu_health_event",
                        node=self.node,
                        kind=event.kind.value,
                        gpu=event.gpu_index,
                        code=event.code,
                        critical=event.critical,
                        message=event.message,
                    )
                self._health.events(events, self._clock_ns())
                await self.publish_health_if_changed()

    async def run(self) -> None:
        """Run the sampling and health loops until cancelled; closes the probe on the way out."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(tasks.guard(self._sampling_loop(), name=f"sampling:{self.node}"))
                group.create_task(tasks.guard(self._health_loop(), name=f"health:{self.node}"))
        finally:
            with contextlib.suppress(GpuError):
                await asyncio.to_thread(self._probe.close)

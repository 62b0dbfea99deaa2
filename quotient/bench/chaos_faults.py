"""The chaos run's hands: each planned fault injected into the running stack and undone, and the scheduler process
watched like a supervisor would (an exit nobody injected is counted, and the process started again).

Every fault is a task of its own that records when it started, when it was undone and when the system had
recovered (``FaultRecord``). Faults of one kind never overlap, nor do the exclusive kinds (``chaos_schedule``); the
plan already spaces them, and locks hold the line when one takes longer than planned. The faults that stop the
scheduler from acting (a kill, API errors, expired watches) and the scheduler's own unplanned exits are the
*disruptive windows* the invariants that wait give time to (``chaos_invariants.Window``). The faults that have an
alert (a NATS restart, an Xid) add an ``chaos_alerts.Expectation`` and hold their lock until it resolved or its
deadline passed, so the next exclusive fault does not blur it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import random
from collections.abc import Callable, Sequence
from typing import Any, Final

from common import logs, names, tasks
from quotient.bench import chaos_alerts, chaos_invariants, chaos_schedule, chaos_workload
from quotient.bench.chaos_schedule import FaultKind, PlannedFault
from quotient.bench.chaos_stack import Stack
from quotient.emulator import patches
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.faults import Fault

log = logs.get("bench.chaos")

XID_FELL_OFF_THE_BUS: Final = 79
READY_TIMEOUT_S: Final = 120.0
"""How long a restarted scheduler may take to lead and sync on a loaded 2-core machine."""
DISRUPTIVE: Final = frozenset({FaultKind.SCHEDULER_KILL, FaultKind.API_500, FaultKind.API_410})
_INJECTED: Final = "injected by quotient bench chaos"


@dataclasses.dataclass(slots=True, kw_only=True)
class FaultRecord:
    planned: PlannedFault
    target: str = ""
    started_s: float | None = None
    undone_s: float | None = None
    recovered_s: float | None = None
    ended_s: float | None = None
    """When the fault's task ended: recovered, or given up (an error, a scheduler that never got ready)."""
    error: str = ""
    """The fault could not be injected or undone (the run goes on; the JSON says so)."""

    @property
    def name(self) -> str:
        return f"#{self.planned.index} {self.planned.kind.value}"

    def as_json(self) -> dict[str, object]:
        def after(at: float | None) -> float | None:
            return None if at is None or self.started_s is None else round(at - self.started_s, 1)

        return {
            "index": self.planned.index,
            "kind": self.planned.kind.value,
            "variant": self.planned.variant or None,
            "target": self.target or None,
            "at_s": None if self.started_s is None else round(self.started_s, 1),
            "undone_after_s": after(self.undone_s),
            "recovered_after_s": after(self.recovered_s),
            **({"error": self.error} if self.error else {}),
        }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerExit:
    at_s: float
    code: int | None
    log_tail: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {"at_s": round(self.at_s, 1), "code": self.code, "log_tail": list(self.log_tail)}


def rfc3339_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


class FaultRunner:
    def __init__(
        self,
        stack: Stack,
        *,
        queues: Sequence[chaos_workload.QueueSpec],
        clock: Callable[[], float],
        alert_outcome: Callable[[chaos_alerts.Expectation], chaos_alerts.Outcome],
        out: Callable[[str], None],
    ) -> None:
        self._stack = stack
        self._queues = {queue.name: queue for queue in queues}
        self._clock = clock
        self._alert_outcome = alert_outcome
        self._out = out
        self._exclusive = asyncio.Lock()
        self._by_kind = {kind: asyncio.Lock() for kind in FaultKind}
        self._running = tasks.TaskSet("chaos-faults")
        self._killing = False
        self._xid_nodes: set[str] = set()
        self.records: list[FaultRecord] = []
        self.expectations: dict[int, chaos_alerts.Expectation] = {}
        self.exits: list[SchedulerExit] = []
        self._exit_windows: list[chaos_invariants.Window] = []

    # --- what the checks read ---

    def windows(self) -> list[chaos_invariants.Window]:
        found = [
            chaos_invariants.Window(kind=record.planned.kind.value, start_s=record.started_s, end_s=record.ended_s)
            for record in self.records
            if record.planned.kind in DISRUPTIVE and record.started_s is not None
        ]
        return found + self._exit_windows

    def injected(self) -> list[FaultRecord]:
        return [record for record in self.records if record.started_s is not None]

    # --- the plan ---

    async def run(self, plan: Sequence[PlannedFault]) -> None:
        """Start each fault at its time (or later, when its locks say so); returns once all have been started."""
        for planned in plan:
            delay = planned.at_s - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            record = FaultRecord(planned=planned)
            self.records.append(record)
            self._running.spawn(self._one(record), name=f"fault-{planned.index}")

    async def drain(self, timeout_s: float) -> None:
        """Wait for the faults under way to be undone and recovered; cancel what is left after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._running.drain(), timeout_s)
        await self._running.cancel()

    async def cancel(self) -> None:
        """Stop every fault under way where it is (the stack is being stopped)."""
        await self._running.cancel()

    async def _one(self, record: FaultRecord) -> None:
        kind = record.planned.kind
        exclusive = self._exclusive if chaos_schedule.TIMINGS[kind].exclusive else None
        async with self._by_kind[kind], exclusive or contextlib.nullcontext():
            record.started_s = self._clock()
            try:
                await _ACTIONS[kind](self, record, random.Random(record.planned.pick))
            except Exception as exc:  # one fault that cannot be injected must not end the run
                record.error = repr(exc)
                self._say(record, f"FAILED: {record.error}")
            finally:
                record.ended_s = self._clock()

    def _say(self, record: FaultRecord, text: str) -> None:
        self._out(f"t={self._clock():6.1f}s fault {record.name}: {text}")

    # --- the faults ---

    async def _scheduler_kill(self, record: FaultRecord, _rng: random.Random) -> None:
        scheduler = self._stack.scheduler
        assert scheduler is not None
        record.target = f"pid {scheduler.pid}"
        self._say(record, f"SIGKILL the scheduler ({record.target}), start it again in {record.planned.effect_s}s")
        self._killing = True
        try:
            await scheduler.kill()
            await asyncio.sleep(record.planned.effect_s)
            await scheduler.start()
        finally:
            self._killing = False
        record.undone_s = self._clock()
        if await scheduler.wait_ready(READY_TIMEOUT_S):
            record.recovered_s = self._clock()
            self._say(record, f"scheduler pid {scheduler.pid} ready after {record.recovered_s - record.undone_s:.1f}s")
        else:
            record.error = f"the restarted scheduler was not ready within {READY_TIMEOUT_S:.0f}s"
            self._say(record, record.error)

    async def _nats_restart(self, record: FaultRecord, _rng: random.Random) -> None:
        nats = self._stack.nats
        record.target = nats.url
        self._say(record, f"stop nats-server {nats.url}, start it again in {record.planned.effect_s}s")
        expectation = chaos_alerts.Expectation(fault=record.name, alert="TelemetryStale", start_s=self._clock())
        self.expectations[record.planned.index] = expectation
        await asyncio.to_thread(nats.stop)
        await asyncio.sleep(record.planned.effect_s)
        await asyncio.to_thread(nats.start)
        record.undone_s = self._clock()
        await self._until_resolved(record, dataclasses.replace(expectation, undone_s=record.undone_s))

    async def _api_500(self, record: FaultRecord, _rng: random.Random) -> None:
        variant, duration = record.planned.variant, record.planned.effect_s
        if variant == "writes":
            rules = [Fault(verb=verb, code=500, message=_INJECTED) for verb in ("create", "update", "patch", "delete")]
        elif variant == "bindings":
            rules = [Fault(verb="create", resource="pods", subresource="binding", code=500, message=_INJECTED)]
        else:
            rules = [Fault(code=500, message=_INJECTED)]
        record.target = f"{variant} requests"
        self._say(record, f"the API answers 500 to {variant} requests for {duration}s")
        for rule in rules:
            self._stack.emulator.inject(rule, duration_s=duration)
        await asyncio.sleep(duration)
        record.undone_s = record.recovered_s = self._clock()

    async def _api_410(self, record: FaultRecord, _rng: random.Random) -> None:
        emulator = self._stack.emulator
        if record.planned.variant == "compact":
            record.target = "every watch"
            floor = emulator.compact()
            dropped = emulator.drop_watches()
            self._say(record, f"history compacted (floor {floor}) and {dropped} watches dropped: every resume is 410")
            record.undone_s = self._clock()
            await asyncio.sleep(record.planned.effect_s)
        else:
            record.target = "watch requests"
            self._say(record, f"every watch request answered 410 Expired for {record.planned.effect_s}s")
            emulator.inject(Fault(verb="watch", code=410, message=_INJECTED), duration_s=record.planned.effect_s)
            await asyncio.sleep(record.planned.effect_s)
            record.undone_s = self._clock()
        record.recovered_s = self._clock()

    async def _agent_restart(self, record: FaultRecord, rng: random.Random) -> None:
        nodes = self._stack.nodes
        assert nodes is not None
        candidates = sorted(set(nodes.agents) - self._xid_nodes)
        if not candidates:
            return
        node = rng.choice(candidates)
        record.target = node
        self._say(record, f"restart the agent of {node} ({record.planned.effect_s}s down)")
        await nodes.restart_agent(node, down_s=record.planned.effect_s)
        record.undone_s = record.recovered_s = self._clock()

    async def _gpu_xid(self, record: FaultRecord, rng: random.Random) -> None:
        nodes = self._stack.nodes
        assert nodes is not None
        node = rng.choice(sorted(nodes.fakes))
        gpu = rng.randrange(len(nodes.fakes[node].spec.gpus))
        record.target = f"{node} gpu {gpu}"
        self._say(
            record,
            f"Xid {XID_FELL_OFF_THE_BUS} on {record.target}; the operator clears it after {record.planned.effect_s}s",
        )
        expectation = chaos_alerts.Expectation(
            fault=record.name, alert="GpuUnhealthy", node=node, gpu=gpu, start_s=self._clock()
        )
        self.expectations[record.planned.index] = expectation
        self._xid_nodes.add(node)
        try:
            nodes.fakes[node].probe.inject_xid(gpu, XID_FELL_OFF_THE_BUS)
            await asyncio.sleep(record.planned.effect_s)
            patch = {"metadata": {"annotations": {names.GPU_HEALTH_CLEARED_ANNOTATION: rfc3339_now()}}}
            emulator = self._stack.emulator
            result = await emulator.api.patch(emulator.kind_of("v1", "Node"), "", node, patches.MERGE_PATCH, patch)
            if not isinstance(result, dict):
                self._say(record, f"the operator's clear was refused: {result.message}")
            record.undone_s = self._clock()
            await self._until_resolved(record, dataclasses.replace(expectation, undone_s=record.undone_s))
        finally:
            self._xid_nodes.discard(node)

    async def _queue_delete(self, record: FaultRecord, rng: random.Random) -> None:
        emulator = self._stack.emulator
        running: dict[str, int] = {}
        for pod in emulator.list("v1", "Pod", chaos_workload.NAMESPACE):
            queue = ((pod.get("metadata") or {}).get("labels") or {}).get(names.QUEUE_LABEL)
            if queue in self._queues and (pod.get("spec") or {}).get("nodeName"):
                running[queue] = running.get(queue, 0) + 1
        name = rng.choice(sorted(running) or sorted(self._queues))
        record.target = f"queue {name} ({running.get(name, 0)} pods bound)"
        self._say(record, f"delete {record.target}; re-create it in {record.planned.effect_s}s")
        kind = emulator.kind_of(names.QUEUE_API_VERSION, "Queue")
        deleted = await emulator.api.delete(kind, "", name, DeleteOptions())
        if not isinstance(deleted, dict):
            self._say(record, f"the deletion was refused: {deleted.message}")
        await asyncio.sleep(record.planned.effect_s)
        manifest = chaos_workload.queue_manifest(self._queues[name])
        for _ in range(20):
            created: Any = await emulator.create(manifest)
            if isinstance(created, dict):
                break
            await asyncio.sleep(0.5)  # a queue that is still being deleted (finalizers): try again
        record.undone_s = record.recovered_s = self._clock()

    async def _until_resolved(self, record: FaultRecord, expectation: chaos_alerts.Expectation) -> None:
        """Hold the fault (and its locks) until its alert resolved or its deadline passed."""
        self.expectations[record.planned.index] = expectation
        while True:
            outcome = self._alert_outcome(expectation)
            if chaos_alerts.settled(expectation, outcome, now_s=self._clock()):
                break
            await asyncio.sleep(0.5)
        record.recovered_s = self._clock()
        fired = "fired" if outcome.fired_at_s is not None else "did NOT fire"
        resolved = "resolved" if outcome.resolved_at_s is not None else "did NOT resolve"
        self._say(record, f"{expectation.alert} {fired} and {resolved} ({', '.join(outcome.seen_on) or 'unseen'})")

    # --- the scheduler's supervisor ---

    async def supervise_scheduler(self) -> None:
        """Count every exit of the scheduler that no fault caused, and start it again (as Kubernetes would)."""
        scheduler = self._stack.scheduler
        assert scheduler is not None
        while True:
            await asyncio.sleep(0.5)
            if self._killing or scheduler.returncode is None:
                continue
            at = self._clock()
            exit_ = SchedulerExit(at_s=at, code=scheduler.returncode, log_tail=tuple(scheduler.log_tail()))
            self.exits.append(exit_)
            self._out(f"t={at:6.1f}s the scheduler EXITED by itself with {exit_.code}; started again")
            window = chaos_invariants.Window(kind="scheduler_exit", start_s=at, end_s=None)
            self._exit_windows.append(window)
            await scheduler.start()
            await scheduler.wait_ready(READY_TIMEOUT_S)
            self._exit_windows[self._exit_windows.index(window)] = dataclasses.replace(window, end_s=self._clock())


_ACTIONS: Final[dict[FaultKind, Callable[[FaultRunner, FaultRecord, random.Random], Any]]] = {
    FaultKind.SCHEDULER_KILL: FaultRunner._scheduler_kill,
    FaultKind.NATS_RESTART: FaultRunner._nats_restart,
    FaultKind.API_500: FaultRunner._api_500,
    FaultKind.API_410: FaultRunner._api_410,
    FaultKind.AGENT_RESTART: FaultRunner._agent_restart,
    FaultKind.GPU_XID: FaultRunner._gpu_xid,
    FaultKind.QUEUE_DELETE: FaultRunner._queue_delete,
}

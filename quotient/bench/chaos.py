"""``quotient bench chaos --minutes N [--seed S]``: the local stack under a seeded random schedule of faults, while
pods of every kind come and go, with the invariants checked all the time. It runs for minutes: it is not in ``all``.

The stack is ``quotient demo``'s (``chaos_stack``): a real nats-server, the API emulator with its kubelets, the real
agents of the emulated GPU nodes, and the real scheduler as its own process. The faults (``chaos_schedule``, from
``random.Random(seed)``; injected by ``chaos_faults``): the scheduler SIGKILLed and started again, NATS restarted,
API 500s, expired watches (410), an agent restarted, a GPU's Xid cleared by the operator, a queue with running pods
deleted and re-created. The load (``chaos_workload``, ``chaos_load``): whole-GPU pods, ``gpu-fraction`` and
``gpu-memory`` shares, gangs and CPU-only pods over three queues whose quotas make reclaim and preemption happen.
The checks (``chaos_invariants``, ``chaos_alerts``: pure) run on every pod write and every second
(``chaos_observe``): no pod bound twice, no device over-committed, no gang half bound past its grace, no pod waiting
without a reason, every alert of a fault fired and resolved.

Exactly one JSON object goes to stdout (the bench runner prints it); progress to stderr. Everything started is
stopped on the way out, Ctrl-C included. The work directory (the scheduler's log, NATS's) is removed after a clean
run and kept, and named in the JSON, otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from common import clusterspec, command, logs
from common.errors import QuotientError
from quotient.bench import chaos_alerts, chaos_invariants, chaos_schedule, chaos_workload
from quotient.bench.chaos_faults import READY_TIMEOUT_S, FaultRunner
from quotient.bench.chaos_load import Load
from quotient.bench.chaos_observe import AlertWatch, StoreWatch
from quotient.bench.chaos_stack import Stack

SWEEP_PERIOD_S: Final = 1.0
PROGRESS_PERIOD_S: Final = 30.0
DRAIN_TIMEOUT_S: Final = 150.0
"""After the last minute: how long the faults under way get to be undone and their alerts to resolve."""
LISTED_VIOLATIONS: Final = 10
_EXECUTOR_THREADS: Final = 32
"""Each in-process agent keeps a thread waiting for GPU health events; the default pool (cores + 4) would leave its
samples queueing behind them."""


class Violations:
    """Every violation, counted once per key, in the order found; each new one said on stderr at once."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self.found: dict[str, chaos_invariants.Violation] = {}

    def add(self, violations: Sequence[chaos_invariants.Violation]) -> None:
        for violation in violations:
            key = f"{violation.invariant.value}/{violation.key or violation.obj}"
            if key in self.found:
                continue
            self.found[key] = violation
            self._out(
                f"t={violation.at_s:6.1f}s VIOLATION {violation.invariant.value}: {violation.obj}: {violation.detail}"
            )

    def by_invariant(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for violation in self.found.values():
            counts[violation.invariant.value] = counts.get(violation.invariant.value, 0) + 1
        return counts


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (a value that was measured); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))], 3)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotient bench chaos",
        description="the local stack under a seeded schedule of faults, with invariants checked all the time",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule and of the load (default 1)")
    parser.add_argument("--nodes", default="6x4xA100-80GB", help="cluster spec: a file or inline form")
    parser.add_argument("--gang-grace", type=float, default=30.0, help="seconds a gang may stay half bound")
    parser.add_argument("--pending-grace", type=float, default=20.0, help="seconds a pod may wait without a reason")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after a disruptive fault before graces")
    parser.add_argument("--workdir", type=Path, default=None, help="where the logs go (default: a temporary one)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory after a clean run")
    parser.add_argument("--scheduler-log-level", default="info", help="the scheduler process's --log-level")
    return parser


async def _sweep(
    *,
    watch: StoreWatch,
    checker: chaos_invariants.Checker,
    runner: FaultRunner,
    alerts: AlertWatch,
    violations: Violations,
    stack: Stack,
    load: Load,
    clock: Callable[[], float],
    out: Callable[[str], None],
) -> None:
    """Every second: the state's invariants and the alerts' deadlines; a progress line every half minute."""
    next_progress = PROGRESS_PERIOD_S
    while True:
        await asyncio.sleep(SWEEP_PERIOD_S)
        failed = stack.nodes_failed()
        if failed is not None:
            raise QuotientError(f"the emulated nodes stopped: {failed!r}")
        now = clock()
        violations.add(checker.on_observation(watch.observe(now), runner.windows()))
        _, late = chaos_alerts.judge(runner.expectations.values(), alerts.scrapes, alerts.messages, now_s=now)
        violations.add(late)
        if now >= next_progress:
            next_progress += PROGRESS_PERIOD_S
            out(
                f"t={now:6.1f}s {len(runner.injected())} faults, {load.pods_created()} pods created, "
                f"{len(watch.bound_at)} placed, {len(load.live)} jobs live, {len(violations.found)} violations, "
                f"{len(runner.exits)} unplanned scheduler exits"
            )


async def run_chaos(args: argparse.Namespace, out: Callable[[str], None]) -> dict[str, Any]:
    spec = clusterspec.resolve(args.nodes)
    gpus = sum(len(node.gpus) for node in spec.nodes)
    if gpus == 0:
        raise QuotientError(f"--nodes {args.nodes}: the cluster has no GPU, nothing to shake")
    duration_s = args.minutes * 60
    plan = chaos_schedule.plan(seed=args.seed, duration_s=duration_s)
    queues = chaos_workload.queues_for(gpus)
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="quotient-chaos-")) if temporary else Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=_EXECUTOR_THREADS, thread_name_prefix="chaos")
    )
    origin = [time.monotonic()]

    def clock() -> float:
        return time.monotonic() - origin[0]

    checker = chaos_invariants.Checker(
        chaos_invariants.Graces(gang_s=args.gang_grace, pending_s=args.pending_grace, settle_s=args.settle)
    )
    violations = Violations(out)
    stack = Stack(spec, workdir=workdir, log_level=args.scheduler_log_level)
    background: list[asyncio.Task[None]] = []
    watch: StoreWatch | None = None
    runner: FaultRunner | None = None
    interrupted = False
    result: dict[str, Any] = {"seed": args.seed, "minutes": args.minutes, "nodes": args.nodes, "gpus": gpus}
    try:
        await stack.start()
        assert stack.scheduler is not None
        out(
            f"stack up in {workdir}: emulator {stack.emulator.url}, {stack.nats.url}, "
            f"scheduler pid {stack.scheduler.pid}"
        )
        for obj in [chaos_workload.namespace_manifest(), *map(chaos_workload.queue_manifest, queues)]:
            created = await stack.emulator.create(obj)
            if not isinstance(created, dict):
                raise QuotientError(f"could not create {obj['kind']} {obj['metadata']['name']}: {created.message}")
        watch = StoreWatch(
            stack.emulator,
            clock=clock,
            on_change=lambda change: violations.add(checker.on_change(change)),
            timed_namespace=chaos_workload.NAMESPACE,
        )
        alerts = AlertWatch(nats_url=stack.nats.url, metrics_url=stack.scheduler.metrics_url, clock=clock)
        background.append(asyncio.create_task(alerts.run(), name="alerts"))
        if not await stack.scheduler.wait_ready(READY_TIMEOUT_S):
            raise QuotientError(f"the scheduler did not become ready; its log: {stack.scheduler.log_path}")
        origin[0] = time.monotonic()
        out(f"scheduler ready; {len(plan)} faults planned over {args.minutes:g} min (seed {args.seed})")
        load = Load(
            stack.emulator,
            rng=random.Random(f"chaos-load-{args.seed}"),
            queues=queues,
            capacity_milli=gpus * 1000,
            clock=clock,
        )
        runner = FaultRunner(
            stack,
            queues=queues,
            clock=clock,
            alert_outcome=lambda e: chaos_alerts.outcome(e, alerts.scrapes, alerts.messages),
            out=out,
        )
        background += [
            asyncio.create_task(load.run(), name="load"),
            asyncio.create_task(runner.supervise_scheduler(), name="supervisor"),
            asyncio.create_task(
                _sweep(
                    watch=watch,
                    checker=checker,
                    runner=runner,
                    alerts=alerts,
                    violations=violations,
                    stack=stack,
                    load=load,
                    clock=clock,
                    out=out,
                ),
                name="sweep",
            ),
        ]

        async def minutes_of_chaos() -> None:
            await asyncio.wait_for(runner.run(plan), duration_s + DRAIN_TIMEOUT_S)
            await asyncio.sleep(max(0.0, duration_s - clock()))
            load.creating = False
            out(f"t={clock():6.1f}s {args.minutes:g} min done: waiting for the faults under way to recover")
            await runner.drain(DRAIN_TIMEOUT_S)

        phase = asyncio.create_task(minutes_of_chaos(), name="chaos")
        try:
            done, _ = await asyncio.wait({phase, *background}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            interrupted = True
            out("interrupted: stopping everything")
            done = set()
        if phase not in done:
            phase.cancel()
            await asyncio.gather(phase, return_exceptions=True)
        for task in done:
            task.result()  # the load, a check or the alert watch that failed fails the run
            if task is not phase:
                raise QuotientError(f"the chaos run's {task.get_name()} task ended by itself")
        now = clock()
        outcomes, late = chaos_alerts.judge(runner.expectations.values(), alerts.scrapes, alerts.messages, now_s=now)
        violations.add(late)
        result.update(
            _summary(
                now=now,
                plan=plan,
                stack=stack,
                runner=runner,
                load=load,
                watch=watch,
                alerts=alerts,
                outcomes=outcomes,
                violations=violations,
                checker=checker,
            )
        )
        result["interrupted"] = interrupted
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if runner is not None:
            await runner.cancel()
        if watch is not None:
            watch.close()
        await stack.stop()
    clean = not interrupted and result.get("invariant_violations") == 0 and result.get("scheduler_exits") == 0
    if temporary and clean and not args.keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
        result["logs"] = None
    else:
        result["logs"] = str(workdir)
    return result


def _summary(
    *,
    now: float,
    plan: Sequence[chaos_schedule.PlannedFault],
    stack: Stack,
    runner: FaultRunner,
    load: Load,
    watch: StoreWatch,
    alerts: AlertWatch,
    outcomes: Sequence[chaos_alerts.Outcome],
    violations: Violations,
    checker: chaos_invariants.Checker,
) -> dict[str, Any]:
    injected = runner.injected()
    latencies = [watch.bound_at[key] - created for key, created in load.created_at.items() if key in watch.bound_at]
    return {
        "duration_s": round(now, 1),
        "faults_planned": len(plan),
        "faults_injected": len(injected),
        "faults_by_kind": chaos_schedule.by_kind(tuple(record.planned for record in injected)),
        "faults": [record.as_json() for record in injected],
        "invariant_violations": len(violations.found),
        "violations_by_invariant": violations.by_invariant(),
        "violations": [violation.as_json() for violation in list(violations.found.values())[:LISTED_VIOLATIONS]],
        "scheduler_exits": len(runner.exits),
        "scheduler_exit_details": [exit_.as_json() for exit_ in runner.exits],
        "scheduler_starts": 0 if stack.scheduler is None else stack.scheduler.starts,
        "pods_created": load.pods_created(),
        "pods_placed": len(latencies),
        "pods_deleted": load.pods_deleted,
        "pods_evicted": load.pods_evicted,
        "jobs_by_kind": dict(sorted(load.jobs_by_kind.items())),
        "creates_refused": len(load.refused),
        "creates_refused_first": load.refused[:5],
        "create_to_bound_p50_s": _percentile(latencies, 0.5),
        "create_to_bound_p99_s": _percentile(latencies, 0.99),
        "create_to_bound_max_s": _percentile(latencies, 1.0),
        "alerts": [outcome.as_json() for outcome in outcomes],
        "alert_messages_received": len(alerts.messages),
        "alert_messages_undecodable": alerts.undecodable,
        "scheduler_evictions": alerts.evictions.totals(),
        "internal_errors": alerts.internal_errors.totals(),
        "checks": {
            "observations": checker.observations,
            "pod_writes": watch.pod_writes,
            "node_changes": checker.changes,
            "watch_errors": watch.errors,
        },
    }


def run(argv: Sequence[str]) -> dict[str, Any]:
    args = _parser().parse_args(list(argv))
    if args.minutes <= 0:
        raise SystemExit("quotient bench chaos: --minutes must be positive")
    logs.setup(level="error")

    def out(text: str) -> None:
        # The wall time (UTC, as the scheduler's log lines have it) lets a line be found in the logs.
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 10)}Z"
        print(f"chaos {stamp}: {text}", file=sys.stderr, flush=True)

    holder: list[dict[str, Any]] = []

    async def main() -> None:
        holder.append(await run_chaos(args, out))

    try:
        command.run_until_signalled(main())
    except QuotientError as exc:  # the stack could not start or broke: everything is stopped already
        raise SystemExit(f"quotient bench chaos: {exc}") from None
    if not holder:  # stopped before the run could say anything (Ctrl-C while starting)
        return {"seed": args.seed, "minutes": args.minutes, "interrupted": True}
    return holder[0]

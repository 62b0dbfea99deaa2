"""``quotient bench kai-scale``: KAI Scheduler's published end-to-end scale tests, run against Quotient, side by side.

KAI publishes end-to-end figures for its scale tests (``test/e2e/scale/``; ``kai_scale_figures`` has the figures,
their source and how each is timed). This bench runs the same scenarios, in KAI's order and timed as KAI times
them, through the real scheduler process and the emulator (``kai_scale_stack``), with KAI's objects
(``kai_scale_world``: Kubernetes Jobs, grouped by the scheduler's own grouper as KAI's podgrouper groups them):

1. ``fill_4000_s``: one single-GPU Job per GPU (4,000 on 500 nodes x 8 GPUs) created while the scheduler is stopped;
   once all their pods exist the scheduler starts, and the clock runs from its start until the last pod is bound.
   (KAI's podgrouper runs while its scheduler is off, so its PodGroups exist before the clock starts; ours are made
   by the scheduler process, after it starts, inside the time.)
2. The first queue is then given no quota (quota 0, over-quota weight 0, limit -1), as KAI's reclaim tests do, and
   keeps the cluster full.
3. ``unschedulable_verdict_s``: its quota set to all GPUs but 79, a gang Job of 10 pods x 8 GPUs in the second
   queue (only 79 GPUs can be reclaimed for it); from the Job's creation until its PodGroup shows the
   ``UnschedulableOnNodePool`` condition (KAI starts at the PodGroup's creation, later). Each sample's Job is deleted
   before the next; the mean of ``--samples`` (KAI's 10). The quota goes back to 0.
4. ``big_job_2000_gpus_s``: one gang Job of nodes/2 pods x 8 GPUs (250 pods, 2,000 GPUs) in the second queue, from
   its creation until its last pod is bound (it reclaims half the cluster); then it is deleted and the first queue
   fills the cluster again.
5. ``reclaim_one_gpu_s``: ``--samples`` single-GPU Jobs in the second queue, one after another, each from its
   creation until its pod is bound; the mean. Then they are deleted and the cluster fills again.
6. ``reclaim_4000_s``: the scheduler stopped, one single-GPU Job per GPU created in the second queue; from the
   scheduler's start until the last of them is bound (every GPU reclaimed).

Every time is this process's monotonic clock at the watch event that showed the change (``Observations``), which is
finer than KAI's whole-second condition timestamps. A scenario that does not complete within ``--timeout`` reports
None with the reason, and the run goes on. KAI ran on a real control plane with simulated nodes; this bench runs on
the emulator on this machine: the output says so.

``--nodes N`` is KAI's ``NODE_COUNT``: every size follows from it as in KAI's tests (at least 10 nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from quotient.bench import kai_scale_figures as figures
from quotient.bench import kai_scale_world as world
from quotient.bench.kai_scale_figures import Outcome, Sizes
from quotient.bench.kai_scale_stack import Stack
from scheduler.kube import kubeapi

FIRST = world.namespace_of(world.FIRST_QUEUE)
SECOND = world.namespace_of(world.SECOND_QUEUE)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Scenarios:
    """KAI's scenarios over one stack, in KAI's order; each returns an ``Outcome``."""

    def __init__(self, stack: Stack, sizes: Sizes, *, samples: int, timeout_s: float) -> None:
        self.stack = stack
        self.sizes = sizes
        self.samples = samples
        self.timeout_s = timeout_s

    async def _until(self, condition: Callable[[], bool], what: str) -> str | None:
        """None once ``condition`` holds; else what was awaited (and why, if the scheduler died)."""
        if await self.stack.until(
            lambda: condition() or self.stack.scheduler_exited() is not None, timeout_s=self.timeout_s
        ):
            exited = self.stack.scheduler_exited()
            return None if exited is None else f"{what}: {exited}"
        return f"{what}: not within {self.timeout_s:g} s"

    def _ready(self) -> bool:
        """Where each reclaim scenario starts: the first queue holds every GPU (each of its single-GPU jobs has a
        live pod, bound) and the second queue has no pods."""
        seen = self.stack.seen
        return seen.live[FIRST] == self.sizes.gpus == seen.bound[FIRST] and not seen.live[SECOND]

    def _marked(self, job: str) -> bool:
        return self.stack.seen.verdict(SECOND, job) is not None

    def _bound(self, job: str, pods: int) -> bool:
        return self.stack.seen.bound_in_job[SECOND, job] == pods

    async def _spent(self, base: dict[str, float]) -> dict[str, object]:
        """What the scheduler did since ``base`` (its counters then): cycles, their seconds, binds, evictions."""
        now = await self.stack.scheduler_counters()
        return {"scheduler": {name: round(value - base.get(name, 0.0), 3) for name, value in sorted(now.items())}}

    def _waiting(self, job: str) -> dict[str, object]:
        """Why ``job``'s PodGroup waits, as its condition said last (for a report of a scenario that timed out)."""
        seen = self.stack.seen.group_of(SECOND, job)
        if seen is None or seen.reason is None:
            return {}
        return {"last_condition": f"{seen.reason}: {seen.message}"}

    async def _jobs(self, queue_name: str, prefix: str, count: int) -> None:
        bodies = [world.job(f"{prefix}-{index:05d}", queue_name=queue_name, gpus_per_pod=1) for index in range(count)]
        started = time.monotonic()
        await self.stack.create_all(kubeapi.JOBS, bodies)
        _progress(f"kai-scale: {count} single-GPU Jobs created in {time.monotonic() - started:.1f} s")

    async def _delete_jobs(self, namespace: str, names: Sequence[str]) -> str | None:
        for name in names:
            await self.stack.delete_job(namespace, name)
        gone = set(names)
        return await self._until(
            lambda: not any(self.stack.seen.live_in_job[namespace, name] for name in gone),
            "the deleted Jobs' pods gone",
        )

    async def fill(self) -> Outcome:
        count = self.sizes.fill_jobs
        await self._jobs(world.FIRST_QUEUE, "fill", count)
        problem = await self._until(lambda: self.stack.seen.live[FIRST] == count, f"{count} pods created")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        started = time.monotonic()
        await self.stack.start_scheduler()
        problem = await self._until(lambda: self.stack.seen.bound[FIRST] == count, f"{count} pods bound")
        bound = self.stack.seen.bound_times(FIRST)
        detail = {
            "jobs": count,
            "bound": len(bound),
            "first_bound_s": round(min(bound) - started, 3) if bound else None,
            **await self._spent({}),
        }
        return Outcome(seconds=figures.span_s(started, bound, expected=count), problem=problem, detail=detail)

    async def no_quota_for_the_first_queue(self) -> None:
        await self.stack.set_queue_gpu(world.FIRST_QUEUE, quota=0, over_quota_weight=0, limit=-1)
        # The next scenario starts once the scheduler judges by it (a running scheduler; else it reads it at start).
        if self.stack.scheduler is not None and self.stack.scheduler_exited() is None:
            await self.stack.scheduler_sees_gpu_quota(world.FIRST_QUEUE, 0, timeout_s=self.timeout_s)

    async def unschedulable(self) -> Outcome:
        problem = await self._until(self._ready, "the cluster full, the second queue empty")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        quota = self.sizes.unschedulable_quota
        await self.stack.set_queue_gpu(world.FIRST_QUEUE, quota=quota, over_quota_weight=0, limit=-1)
        if not await self.stack.scheduler_sees_gpu_quota(world.FIRST_QUEUE, quota, timeout_s=self.timeout_s):
            await self.no_quota_for_the_first_queue()
            return Outcome(seconds=None, problem=f"the scheduler did not show queue {world.FIRST_QUEUE}'s new quota")
        pods = self.sizes.distributed_pods
        samples: list[float] = []
        from_podgroup: list[float] = []
        reasons: set[str] = set()
        base = await self.stack.scheduler_counters()
        try:
            for index in range(self.samples):
                name = f"unschedulable-{index:02d}"
                started = time.monotonic()
                await self.stack.create(
                    kubeapi.JOBS,
                    world.job(name, queue_name=world.SECOND_QUEUE, gpus_per_pod=figures.GPUS_PER_NODE, pods=pods),
                )
                problem = await self._until(
                    functools.partial(self._marked, name), f"sample {index}: the PodGroup marked unschedulable"
                )
                verdict = self.stack.seen.verdict(SECOND, name)
                if verdict is not None and verdict.unschedulable_at is not None:
                    samples.append(verdict.unschedulable_at - started)
                    from_podgroup.append(verdict.unschedulable_at - verdict.seen_at)
                    reasons.add(str(verdict.reason))
                placed = self.stack.seen.bound_in_job[SECOND, name]
                cleaned = await self._delete_jobs(SECOND, [name])
                problem = problem or cleaned
                if problem is not None or placed:
                    return Outcome(
                        seconds=None,
                        problem=problem or f"sample {index}: {placed} of its pods were bound",
                        detail={"samples_s": [round(s, 3) for s in samples]},
                    )
        finally:
            await self.no_quota_for_the_first_queue()
        detail = {
            "pods": pods,
            "gpus": pods * figures.GPUS_PER_NODE,
            "first_queue_quota": quota,
            "reasons": sorted(reasons),
            "samples_s": [round(s, 3) for s in samples],
            "from_podgroup_s": [round(s, 3) for s in from_podgroup],
            "from_podgroup_mean_s": _rounded(figures.mean(from_podgroup)),
            **await self._spent(base),
        }
        return Outcome(seconds=figures.mean(samples), detail=detail)

    async def big_job(self) -> Outcome:
        problem = await self._until(self._ready, "the cluster full, the second queue empty")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        pods = self.sizes.big_job_pods
        base = await self.stack.scheduler_counters()
        started = time.monotonic()
        await self.stack.create(
            kubeapi.JOBS, world.job("big", queue_name=world.SECOND_QUEUE, gpus_per_pod=figures.GPUS_PER_NODE, pods=pods)
        )
        problem = await self._until(functools.partial(self._bound, "big", pods), f"{pods} pods bound")
        seconds = figures.span_s(started, self.stack.seen.bound_times(SECOND, job="big"), expected=pods)
        detail = {
            "pods": pods,
            "gpus": pods * figures.GPUS_PER_NODE,
            "bound": self.stack.seen.bound_in_job[SECOND, "big"],
            **(self._waiting("big") if problem else {}),
            **await self._spent(base),
        }
        cleaned = await self._delete_jobs(SECOND, ["big"])
        problem = problem or cleaned
        return Outcome(seconds=seconds, problem=problem, detail=detail)

    async def reclaim_one(self) -> Outcome:
        problem = await self._until(self._ready, "the cluster full, the second queue empty")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        samples: list[float] = []
        names: list[str] = []
        base = await self.stack.scheduler_counters()
        for index in range(self.samples):
            name = f"one-{index:02d}"
            names.append(name)
            started = time.monotonic()
            await self.stack.create(kubeapi.JOBS, world.job(name, queue_name=world.SECOND_QUEUE, gpus_per_pod=1))
            problem = await self._until(functools.partial(self._bound, name, 1), f"sample {index}: its pod bound")
            if problem is not None:
                break
            samples.append(max(self.stack.seen.bound_times(SECOND, job=name)) - started)
        spent = await self._spent(base)
        cleaned = await self._delete_jobs(SECOND, names)
        problem = problem or cleaned
        detail = {"running_jobs": self.sizes.gpus, "samples_s": [round(s, 3) for s in samples], **spent}
        return Outcome(seconds=None if problem else figures.mean(samples), problem=problem, detail=detail)

    async def reclaim_all(self) -> Outcome:
        problem = await self._until(self._ready, "the cluster full, the second queue empty")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        await self.stack.stop_scheduler()
        count = self.sizes.fill_jobs
        await self._jobs(world.SECOND_QUEUE, "reclaim", count)
        problem = await self._until(lambda: self.stack.seen.live[SECOND] == count, f"{count} pods created")
        if problem is not None:
            return Outcome(seconds=None, problem=problem)
        started = time.monotonic()
        await self.stack.start_scheduler()
        problem = await self._until(lambda: self.stack.seen.bound[SECOND] == count, f"{count} pods bound")
        bound = self.stack.seen.bound_times(SECOND)
        seconds = figures.span_s(started, bound, expected=count)
        seen = self.stack.seen
        detail = {
            "jobs": count,
            "bound": len(bound),
            "first_queue_pods": seen.live[FIRST],
            "first_queue_bound": seen.bound[FIRST],
            **await self._spent({}),
        }
        return Outcome(seconds=seconds, problem=problem, detail=detail)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def _setup(stack: Stack) -> None:
    for queue_name in (world.FIRST_QUEUE, world.SECOND_QUEUE):
        await stack.create(kubeapi.NAMESPACES, world.namespace(world.namespace_of(queue_name)))
    await stack.create(kubeapi.QUEUES, world.queue(world.PARENT_QUEUE, parent=None))
    for queue_name in (world.FIRST_QUEUE, world.SECOND_QUEUE):
        await stack.create(kubeapi.QUEUES, world.queue(queue_name, parent=world.PARENT_QUEUE))


async def _run(
    sizes: Sizes, *, samples: int, timeout_s: float, workdir: Path, scheduler_log_level: str
) -> dict[str, object]:
    stack = Stack(
        nodes=sizes.nodes,
        gpus_per_node=figures.GPUS_PER_NODE,
        workdir=workdir,
        scheduler_log_level=scheduler_log_level,
    )
    run = Scenarios(stack, sizes, samples=samples, timeout_s=timeout_s)
    outcomes: dict[str, Outcome] = {}
    try:
        await stack.start()
        await _setup(stack)
        for key, scenario in (
            ("fill_4000_s", run.fill),
            ("unschedulable_verdict_s", run.unschedulable),
            ("big_job_2000_gpus_s", run.big_job),
            ("reclaim_one_gpu_s", run.reclaim_one),
            ("reclaim_4000_s", run.reclaim_all),
        ):
            _progress(f"kai-scale: {key} ...")
            outcomes[key] = await scenario()
            _progress(f"kai-scale: {key} = {outcomes[key].seconds} ({outcomes[key].problem or 'completed'})")
            if key == "fill_4000_s":
                await run.no_quota_for_the_first_queue()
    finally:
        await stack.stop()
    result = figures.result(sizes, outcomes, samples=samples)
    result["watch_relists"] = stack.relists
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quotient bench kai-scale", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=figures.KAI_NODES, help="KAI's NODE_COUNT (8 GPUs each)")
    parser.add_argument("--samples", type=int, default=figures.SAMPLES, help="samples of the averaged scenarios")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each wait of a scenario may take")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs (kept anyway on a failure)")
    parser.add_argument("--scheduler-log-level", default="warning", help="the scheduler's --log-level (info: cycles)")
    return parser


def run(argv: Sequence[str]) -> dict[str, object]:
    """Run the scenarios; returns the figures (see the module docstring)."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    try:
        sizes = Sizes.of(args.nodes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="quotient-kai-scale-"))
    result: dict[str, object] = {"completed": False}
    try:
        result = asyncio.run(
            _run(
                sizes,
                samples=args.samples,
                timeout_s=args.timeout,
                workdir=workdir,
                scheduler_log_level=args.scheduler_log_level,
            )
        )
    except KeyboardInterrupt:  # Ctrl-C: every process is stopped by then; say so in the one JSON object
        result = {"completed": False, "interrupted": True}
    finally:
        if args.keep or not result.get("completed"):
            result["logs"] = str(workdir)
            _progress(f"kai-scale: the processes' logs are in {workdir}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
    return result

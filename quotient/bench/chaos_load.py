"""The chaos run's users: jobs created through the emulator's API (admission and validation apply) and deleted when
their time is up, keeping the GPUs asked for at ``DEMAND_FACTOR`` times the cluster's.

A job whose pod vanished or was marked for deletion without its user asking (the scheduler evicted it: reclaim,
preemption, a stale gang) ends early, as a user whose job was killed would see it; the rest of it is deleted then.
Each pod's creation time is kept for the create-to-bound figure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Final

from common import logs, names
from quotient.bench import chaos_workload
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.emulator import Emulator

log = logs.get("bench.chaos")

TICK_S: Final = 0.5
MAX_NEW_PER_TICK: Final = 2
"""At most four new jobs a second: the load of a busy team, and what two cores carry next to the scheduler."""


@dataclasses.dataclass(slots=True, kw_only=True)
class LiveJob:
    job: chaos_workload.Job
    ends_s: float


class Load:
    def __init__(
        self,
        emulator: Emulator,
        *,
        rng: random.Random,
        queues: Sequence[chaos_workload.QueueSpec],
        capacity_milli: int,
        clock: Callable[[], float],
    ) -> None:
        self._emulator = emulator
        self._rng = rng
        self._queues = queues
        self._target_milli = round(capacity_milli * chaos_workload.DEMAND_FACTOR)
        self._clock = clock
        self._next_index = 0
        self.live: dict[str, LiveJob] = {}
        self.created_at: dict[str, float] = {}
        """``namespace/name`` -> when the load created the pod."""
        self.jobs_by_kind: dict[str, int] = {}
        self.pods_deleted = 0
        self.pods_evicted = 0
        """Pods that vanished or were marked for deletion without the load asking."""
        self.refused: list[str] = []
        self.creating = True

    async def run(self) -> None:
        """Until cancelled: end the jobs whose time is up (or that were evicted), start new ones while there is room."""
        while True:
            now = self._clock()
            for name, live in list(self.live.items()):
                evicted = self._evicted(live.job)
                if live.ends_s <= now or evicted:
                    self.pods_evicted += evicted
                    await self._end(name)
            demand = sum(live.job.milli_gpu for live in self.live.values())
            for _ in range(MAX_NEW_PER_TICK):
                if not self.creating or demand >= self._target_milli:
                    break
                job = chaos_workload.draw(self._rng, index=self._next_index, queues=self._queues)
                self._next_index += 1
                await self._start(job)
                demand += job.milli_gpu
            await asyncio.sleep(TICK_S)

    def _evicted(self, job: chaos_workload.Job) -> int:
        count = 0
        for name in job.pod_names:
            pod = self._emulator.get("v1", "Pod", name, chaos_workload.NAMESPACE)
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                count += f"{chaos_workload.NAMESPACE}/{name}" in self.created_at
        return count

    async def _start(self, job: chaos_workload.Job) -> None:
        self.jobs_by_kind[job.kind.value] = self.jobs_by_kind.get(job.kind.value, 0) + 1
        self.live[job.name] = LiveJob(job=job, ends_s=self._clock() + job.lifetime_s)
        for obj in ([job.podgroup] if job.podgroup else []) + list(job.pods):
            created = await self._emulator.create(obj)
            if not isinstance(created, dict):
                self.refused.append(f"{obj['kind']} {job.name}: {created.message}")
                continue
            if obj["kind"] == "Pod":
                self.created_at[f"{chaos_workload.NAMESPACE}/{obj['metadata']['name']}"] = self._clock()

    async def _end(self, name: str) -> None:
        live = self.live.pop(name)
        pods = self._emulator.kind_of("v1", "Pod")
        for pod_name in live.job.pod_names:
            current = self._emulator.get("v1", "Pod", pod_name, chaos_workload.NAMESPACE)
            if current is None or (current.get("metadata") or {}).get("deletionTimestamp"):
                continue
            deleted = await self._emulator.api.delete(pods, chaos_workload.NAMESPACE, pod_name, DeleteOptions())
            self.pods_deleted += isinstance(deleted, dict)
        if live.job.podgroup is not None:
            groups = self._emulator.kind_of(names.POD_GROUP_API_VERSION, "PodGroup")
            await self._emulator.api.delete(groups, chaos_workload.NAMESPACE, name, DeleteOptions())

    def pods_created(self) -> int:
        return len(self.created_at)

"""The reservation pods' own part, played by the emulator: report the UUID of the GPU the device plugin gave.

On a real node a reservation pod runs ``quotient reserve``, which reads its one visible device's UUID through NVML
and writes it (with the device's index) to its own annotations. Here the emulated kubelet starts the pod with the
device plugin's allocation, and this runtime writes the same annotations through the API, as the entry point would.
``enabled = False`` makes the UUID never arrive anywhere, ``broken_nodes`` on those nodes (NVML or the runtime is
broken there), and ``delay_s`` delays it.
"""

from __future__ import annotations

import asyncio

from common import logs, names, tasks
from quotient.emulator import patches
from quotient.emulator.api import Api
from quotient.emulator.runtime import PodLaunch
from quotient.emulator.status import Failure

log = logs.get("emulator.reservations")


class ReservationAgent:
    """A ``ContainerRuntime`` for reservation pods; other pods pass untouched."""

    def __init__(self, api: Api, *, delay_s: float = 0.0) -> None:
        self.api = api
        self.enabled = True
        self.broken_nodes: set[str] = set()
        self.delay_s = delay_s
        self.reported = 0
        self._reports = tasks.TaskSet("emulator.reservations")

    def start_pod(self, launch: PodLaunch) -> None:
        if not launch.labels.get(names.RESERVATION_GROUP_LABEL) or not self.enabled or launch.node in self.broken_nodes:
            return
        if not launch.gpu_uuids:
            log.warning("reservation_without_gpu", pod=f"{launch.namespace}/{launch.name}")
            return
        self._reports.spawn(self._report(launch), name=f"report-{launch.namespace}-{launch.name}")

    def stop_pod(self, launch: PodLaunch) -> None:
        return None

    async def _report(self, launch: PodLaunch) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not self.enabled:
            return
        kind = self.api.registry.by_storage("pods")
        assert kind is not None
        body = {
            "metadata": {
                "annotations": {
                    names.RESERVATION_UUID_ANNOTATION: launch.gpu_uuids[0],
                    names.RESERVATION_INDEX_ANNOTATION: str(launch.gpu_indices[0]),
                }
            }
        }
        result = await self.api.patch(kind, launch.namespace, launch.name, patches.MERGE_PATCH, body)
        if isinstance(result, Failure):
            log.warning("reservation_report_failed", pod=f"{launch.namespace}/{launch.name}", error=result.message)
            return
        self.reported += 1

    async def close(self) -> None:
        """Cancel the reports still under way (the emulator is stopping)."""
        await self._reports.cancel()

"""Emulated GPU nodes as the emulator's container runtime: a pod the emulated kubelet starts runs its processes on
the fake GPUs of its node, on the devices it really got, and the real agent of that node measures them.

Whole-GPU pods use the device plugin's allocation; a shared pod uses the devices the scheduler recorded on it
(``quotient.dev/gpu-devices``) until reservation pods carry the real device. The processes' memory follows the
pod's ``quotient.dev/sim-gpu-memory`` script; a pod without one runs no GPU process.
"""

from __future__ import annotations

from common import clusterspec, logs
from common.errors import ClusterSpecError
from quotient.emulator.runtime import PodLaunch
from quotient.nodes import EmulatedNodes

log = logs.get("nodes.runtime")

GPU_DEVICES_ANNOTATION = "quotient.dev/gpu-devices"


def devices_of(launch: PodLaunch) -> tuple[int, ...]:
    if launch.gpu_indices:
        return launch.gpu_indices
    text = launch.annotations.get(GPU_DEVICES_ANNOTATION, "")
    return tuple(int(part) for part in text.split(",") if part.strip().isascii() and part.strip().isdigit())


class GpuNodesRuntime:
    """A ``quotient.emulator.runtime.ContainerRuntime`` over ``EmulatedNodes``."""

    def __init__(self, nodes: EmulatedNodes) -> None:
        self._nodes = nodes

    def start_pod(self, launch: PodLaunch) -> None:
        fake = self._nodes.fakes.get(launch.node)
        script_text = launch.annotations.get(clusterspec.SIM_GPU_MEMORY_ANNOTATION)
        devices = devices_of(launch)
        if fake is None or not script_text or not devices:
            return
        try:
            script = clusterspec.parse_memory_script(script_text)
        except ClusterSpecError as exc:
            log.warning("bad_memory_script", pod=f"{launch.namespace}/{launch.name}", error=str(exc))
            return
        fake.run_pod(pod_uid=launch.uid, gpu_indices=devices, memory=script, start_ns=launch.started_ns)

    def stop_pod(self, launch: PodLaunch) -> None:
        fake = self._nodes.fakes.get(launch.node)
        if fake is not None:
            fake.stop_pod(launch.uid)

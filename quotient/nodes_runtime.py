"""Emulated GPU nodes as the emulator's container runtime: a pod the emulated kubelet starts runs its processes on
the fake GPUs of its node, on the devices it really got, and the real agent of that node measures them.

Which devices a pod really got: a whole-GPU pod's are the device plugin's allocation; a share's are those its
reservation pods hold, which reach the pod as the UUIDs in its container's ``NVIDIA_VISIBLE_DEVICES`` (resolved from
the ConfigMap the binder wrote), or, for a share admitted without the webhook, the UUIDs the binder recorded
(``quotient.dev/gpu-uuids``). A share bound before reservation pods existed falls back to the indices the scheduler
recorded (``quotient.dev/gpu-devices``). The processes' memory follows the pod's ``quotient.dev/sim-gpu-memory``
script; a pod without one runs no GPU process.

What the fake process does is printed into the log of the container that sees the GPUs (``kubectl logs``): that it
started, with its pid, device and UUID, then the memory it holds at each step of its script, each line at the time
the step comes (a step the pod does not live to see is never printed); a script that cannot be read is said there too.
"""

from __future__ import annotations

from collections.abc import Mapping

from common import clusterspec, logs, names, quantities
from common.errors import ClusterSpecError
from quotient.emulator.runtime import PodLaunch
from quotient.nodes import EmulatedNodes

log = logs.get("nodes.runtime")

# NVIDIA_VISIBLE_DEVICES values that name no device: every device, no device but the driver, nothing (as runc).
_NOT_UUIDS = ("all", "none", names.NO_DEVICES)


def _visible_uuids(launch: PodLaunch) -> tuple[str, ...]:
    for env in launch.env.values():
        value = env.get(names.VISIBLE_DEVICES_ENV, "")
        if value and value not in _NOT_UUIDS:
            return tuple(part.strip() for part in value.split(",") if part.strip())
    text = launch.annotations.get(names.GPU_UUIDS_ANNOTATION, "")
    return tuple(part.strip() for part in text.split(",") if part.strip())


def gpu_container(launch: PodLaunch) -> str:
    """The container that sees the pod's GPUs (whose environment names them); "" (the first) when none does."""
    for container, env in launch.env.items():
        if env.get(names.VISIBLE_DEVICES_ENV, "") not in ("", *_NOT_UUIDS):
            return container
    return ""


def devices_of(launch: PodLaunch, uuids_of_node: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """The device indices ``launch`` really runs on (see the module's docstring for where each comes from)."""
    if launch.gpu_indices:
        return launch.gpu_indices
    if uuids_of_node:
        found = tuple(uuids_of_node[uuid] for uuid in _visible_uuids(launch) if uuid in uuids_of_node)
        if found:
            return found
    text = launch.annotations.get(names.GPU_DEVICES_ANNOTATION, "")
    return tuple(int(part) for part in text.split(",") if part.strip().isascii() and part.strip().isdigit())


class GpuNodesRuntime:
    """A ``quotient.emulator.runtime.ContainerRuntime`` over ``EmulatedNodes``."""

    def __init__(self, nodes: EmulatedNodes) -> None:
        self._nodes = nodes

    def start_pod(self, launch: PodLaunch) -> None:
        fake = self._nodes.fakes.get(launch.node)
        script_text = launch.annotations.get(names.SIM_GPU_MEMORY_ANNOTATION)
        if fake is None or not script_text:
            return
        devices = devices_of(launch, {gpu.uuid: gpu.index for gpu in fake.spec.gpus})
        if not devices:
            return
        container = gpu_container(launch)
        try:
            script = clusterspec.parse_memory_script(script_text)
        except ClusterSpecError as exc:
            log.warning("bad_memory_script", pod=f"{launch.namespace}/{launch.name}", error=str(exc))
            launch.output.write(f"no GPU process runs: {exc}", container=container)
            return
        pids = fake.run_pod(pod_uid=launch.uid, gpu_indices=devices, memory=script, start_ns=launch.started_ns)
        uuids = {gpu.index: gpu.uuid for gpu in fake.spec.gpus}
        for pid, index in zip(pids, devices, strict=False):
            launch.output.write(
                f"GPU process {pid} started on GPU {index} ({uuids.get(index, '?')}) of {launch.node}",
                container=container,
                at_ns=launch.started_ns,
            )
        where = ", ".join(f"GPU {index}" for index in devices)
        for offset_ns, memory_bytes in script.points:
            launch.output.write(
                f"holds {quantities.format_bytes(memory_bytes)} of GPU memory on {where}",
                container=container,
                at_ns=launch.started_ns + offset_ns,
            )

    def stop_pod(self, launch: PodLaunch) -> None:
        fake = self._nodes.fakes.get(launch.node)
        if fake is not None:
            fake.stop_pod(launch.uid)

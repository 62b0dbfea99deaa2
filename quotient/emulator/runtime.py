"""The seam between the emulated kubelets and whatever runs a pod's containers.

The kubelet decides when a pod starts and stops (admission, the device plugin's allocation, scripted exits,
deletion); a ``ContainerRuntime`` makes that visible somewhere. The emulated GPU nodes (``quotient/nodes.py``,
``agent/fakenode.py``) register one so a running pod's processes appear on the devices it got, with the memory its
``quotient.dev/sim-gpu-memory`` script says, for the real agents to measure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol


class ContainerOutput(Protocol):
    """Where a runtime prints for a pod: a line (or lines) into a container's log, at ``at_ns`` (default now; a line
    for a later time is shown from then on, unless the pod stops first). ``container`` "" is the pod's first
    container. Never blocks or raises."""

    def write(self, text: str, *, container: str = "", at_ns: int | None = None) -> None: ...


class _Discarded:
    def write(self, text: str, *, container: str = "", at_ns: int | None = None) -> None:
        return None


DISCARDED: ContainerOutput = _Discarded()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodLaunch:
    """A pod that started on a node: what the runtime needs to run its processes."""

    node: str
    namespace: str
    name: str
    uid: str
    gpu_indices: tuple[int, ...]  # the device plugin's allocation (empty for pods without nvidia.com/gpu)
    gpu_uuids: tuple[str, ...]
    env: Mapping[str, Mapping[str, str]]  # container name -> resolved environment
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    started_ns: int
    containers: tuple[str, ...] = ()
    output: ContainerOutput = dataclasses.field(default=DISCARDED, compare=False, repr=False)
    """This run's containers' logs (``containerlogs``)."""


class ContainerRuntime(Protocol):
    """Runs the containers of pods on an emulated node.

    Called on the emulator's event loop, so neither method may block (hand slow work to a thread). ``start_pod``
    is called when a pod starts and again after each restart (with a new ``started_ns``); ``stop_pod`` when its
    containers exit, it fails, or it is deleted; both are idempotent. An exception is logged and does not stop
    the kubelet.
    """

    def start_pod(self, launch: PodLaunch) -> None: ...

    def stop_pod(self, launch: PodLaunch) -> None: ...

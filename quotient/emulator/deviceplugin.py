"""The NVIDIA device plugin of the emulated nodes: which GPUs each admitted pod holds, and their UUIDs.

When a kubelet admits a pod that asks for ``nvidia.com/gpu``, the device plugin hands out the lowest free device
indices of the node and keeps the map until the pod stops; when too few are free, the kubelet fails the pod with
``UnexpectedAdmissionError`` and the plugin's message, as on a node whose scheduler over-committed its GPUs. The
containers that asked for GPUs see them as ``NVIDIA_VISIBLE_DEVICES``, a list of UUIDs: the cluster spec's, or
ones derived from the node's name for nodes created at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from common import clusterspec, names


class DevicePlugin:
    """The device allocations of every node; ``gpus_of(node)`` says how many devices a node has."""

    def __init__(
        self, *, gpus_of: Callable[[str], int], gpu_uuids: Mapping[str, tuple[str, ...]] | None = None
    ) -> None:
        self._gpus_of = gpus_of
        self._gpu_uuids = dict(gpu_uuids or {})
        self._allocated: dict[str, dict[int, str]] = {}  # node -> device index -> pod uid

    def uuids_of(self, node: str) -> tuple[str, ...]:
        """Every device UUID of ``node``, by index."""
        if node in self._gpu_uuids:
            return self._gpu_uuids[node]
        return tuple(clusterspec.gpu_uuid(node, index) for index in range(self._gpus_of(node)))

    def uuids_for(self, node: str, devices: Sequence[int]) -> tuple[str, ...]:
        uuids = self.uuids_of(node)
        return tuple(uuids[index] for index in devices if index < len(uuids))

    def _free(self, node: str) -> list[int]:
        taken = self._allocated.get(node, {})
        return [index for index in range(self._gpus_of(node)) if index not in taken]

    def allocate(self, node: str, uid: str, count: int) -> tuple[int, ...] | None:
        """The lowest ``count`` free devices, now held by pod ``uid``; None when fewer are free."""
        if count == 0:
            return ()
        free = self._free(node)[:count]
        if len(free) < count:
            return None
        taken = self._allocated.setdefault(node, {})
        for index in free:
            taken[index] = uid
        return tuple(free)

    def shortage(self, node: str, count: int) -> tuple[str, str]:
        """The (reason, message) a kubelet fails a pod with when ``allocate`` found too few devices."""
        return (
            "UnexpectedAdmissionError",
            f"Allocate failed due to requested number of devices unavailable for {names.GPU_RESOURCE}. Requested: "
            f"{count}, Available: {len(self._free(node))}, which is unexpected",
        )

    def release(self, node: str, uid: str, devices: Sequence[int]) -> None:
        taken = self._allocated.get(node, {})
        for index in devices:
            if taken.get(index) == uid:
                del taken[index]

    def forget(self, node: str) -> None:
        """The node is gone, and every allocation on it."""
        self._allocated.pop(node, None)

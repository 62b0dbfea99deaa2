"""How a choice of node and devices is scored for a pod: the seam where placement strategies plug in.

A scorer sees plain values only (a ``NodeState`` and a ``GpuRequest``: integers, strings and tuples of them), so it
can be written, tested and memoised without the engine: the engine calls it once per distinct node look and pod
shape and caches the answer, since the same value always scores the same. Higher is better; ties go to the node
whose name sorts first, then to the lowest device indexes, so a plan never depends on hashing. A scorer that wants
its ties drawn at random instead (the simulator's Random baseline) says so by being ``DrawsTies``.

The built-in strategies, composed from a node-level and a device-level policy. The node comes first, then the device
on it, as in KAI (its node order, then its GPU order on the chosen node):

- the node: for a share, a node with a shared device the share fits in before any other (KAI's GPU-sharing node
  order: whole devices stay whole); then ``binpack`` (the default) takes the node with the fewest free whole
  devices, so nodes with many free devices stay free for the big requests, and ``spread`` the node with the most.
  For whole GPUs, the node left with the fewest (binpack) or most (spread) free whole devices.
- the device on that node, for a share: ``binpack`` an already shared device before opening a free one, and among
  shared devices first one whose remainder after the share is zero or a size the pending workload asks for (so the
  hole left behind gets filled), then the tightest fit; ``spread`` a free device before a shared one, then the
  device with the most room.

Whether a node has a shared device the share fits in is read from the node's state, which does not say which GPU
models a pod allows: on a node with devices of several models, a device of a model the pod does not allow still
counts (nodes hold one GPU model in practice). A shared device of another compute mode than the share's does not
count (``device_modes``: shares of different modes never share a device).

The score is built from explicit, bounded parts (``lexicographic``), never from magnitudes that only order
correctly by accident. The simulator adds other scorers (FGD and a fragmentation-aware one) through the same
Protocol; a scorer must be a pure function of its arguments.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from common import names, quantities

MILLI_GPU_PER_DEVICE = quantities.MILLI_GPU_PER_GPU
# Every part of a built-in score lies in [0, _PART): milli-GPU per device is at most 1000, a node's free devices are
# a few, and CPU left is capped there (2**21 millicores, 2,097 cores: more than any node has).
_PART = 1 << 21


class Strategy(enum.StrEnum):
    """Node- or device-level placement policy (``model.Strategy`` is this: scoring imports nothing of placement).

    ``FRAGMENTATION`` is a GPU strategy only (``learning``): the fragmentation score over the workload the engine
    learned, then binpack; as a node or device policy of the built-in scorer it means binpack."""

    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """A node as a scorer sees it, before the placement being scored.

    ``device_free_milli``: per device (index order) the milli-GPU a share could still take there (request-based
    free, lowered by measured free memory where telemetry is fresh); 0 for a device held whole or unhealthy.
    ``device_models``: the GPU model of each device (``nvidia.com/gpu.product`` as the node reports it).
    ``device_whole_free``: the device is free for a whole-GPU pod or a new GPU group. ``device_shared``: the device
    belongs to a GPU group (a share may join it). ``device_pod_gpus``: for a device a pod holds whole, the number of
    devices of the node that pod holds (so one 2-GPU pod and two 1-GPU pods look different); 0 for a free or shared
    device, or one held by something the scheduler does not know. ``device_modes``: per shared device the compute
    mode of its GPU group ("" for the others); empty when every group on the node is in KAI's default mode,
    time-slicing.
    """

    free_milli_cpu: int
    free_memory_bytes: int
    allocatable_milli_cpu: int
    allocatable_memory_bytes: int
    device_free_milli: tuple[int, ...]
    device_memory_bytes: tuple[int, ...]
    device_models: tuple[str, ...]
    device_whole_free: tuple[bool, ...]
    device_shared: tuple[bool, ...]
    device_pod_gpus: tuple[int, ...]
    device_modes: tuple[str, ...] = ()

    @property
    def whole_free_count(self) -> int:
        return sum(self.device_whole_free)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuRequest:
    """What one pod asks for: CPU, memory, and either ``whole_gpus`` or ``share_milli`` on each of ``share_devices``.

    ``share_milli`` is already converted for the node being scored (a gpu-memory share differs per device size;
    the engine passes the per-device shares in ``share_milli_per_device`` then, in device index order).
    ``compute_mode`` is a share's compute mode (KAI's ``gpu-compute.mode``).
    """

    milli_cpu: int = 0
    memory_bytes: int = 0
    whole_gpus: int = 0
    share_milli: int = 0
    share_devices: int = 0
    share_milli_per_device: tuple[int, ...] = ()
    compute_mode: str = names.TIME_SLICING

    @property
    def is_share(self) -> bool:
        return self.share_devices > 0

    def share_on(self, device: int) -> int:
        """The milli-GPU this request takes on ``device``."""
        if self.share_milli_per_device:
            return self.share_milli_per_device[device]
        return self.share_milli


class GpuPlacementScorer(Protocol):
    """Scores putting ``request`` on ``devices`` of a node in ``state``; higher is better.

    Must be pure and deterministic (the engine memoises it by value) and fast (it runs once per distinct state).
    ``devices`` is the choice being scored: device indexes on the node, empty for a CPU-only pod.
    """

    def __call__(self, state: NodeState, request: GpuRequest, devices: tuple[int, ...]) -> int: ...


@runtime_checkable
class DrawsTies(Protocol):
    """A scorer whose best-scored nodes are drawn uniformly at random, not taken in node order.

    The searcher calls ``draw_tie(count)`` once per pod that has a placement, with the number of nodes sharing the
    best score, and gives the pod to that node (counted in node order). The draw is the scorer's own business (a
    seeded source keeps a run reproducible); the engine's default scorers do not draw.
    """

    def draw_tie(self, count: int) -> int:
        """An index in ``[0, count)``."""
        ...


def lexicographic(*parts: int) -> int:
    """Pack non-negative parts, each below 2**21, into one integer that orders like the tuple of parts."""
    score = 0
    for part in parts:
        if not 0 <= part < _PART:
            raise ValueError(f"score part {part} outside [0, {_PART})")
        score = score * _PART + part
    return score


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BuiltinScorer:
    """The built-in ``binpack``/``spread`` scorer, node and device policies chosen separately.

    ``demanded`` are the share sizes (milli-GPU, ascending) that pending pods ask for; binpack prefers leaving a
    remainder of one of those sizes (or nothing) on the device it fills.
    """

    node: Strategy = Strategy.BINPACK
    device: Strategy = Strategy.BINPACK
    demanded: tuple[int, ...] = ()

    def __call__(self, state: NodeState, request: GpuRequest, devices: tuple[int, ...]) -> int:
        if request.is_share:
            return lexicographic(
                int(_has_group_for(state, request)),
                self._whole_part(state.whole_free_count),
                *self._device_parts(state, request, devices),
            )
        if request.whole_gpus:
            return lexicographic(0, 0, 0, self._node_part(state, request, devices))
        return lexicographic(0, 0, *self._cpu_parts(state, request))

    def _device_parts(self, state: NodeState, request: GpuRequest, devices: tuple[int, ...]) -> tuple[int, int, int]:
        # A share on several devices is as good as its worst device.
        parts: list[tuple[int, int, int]] = []
        for device in devices:
            left = state.device_free_milli[device] - request.share_on(device)
            joins_group = state.device_shared[device]
            if self.device is Strategy.BINPACK:
                # joins a group, leaves a useful remainder, fits tightest: each strictly more important than the next
                fills_hole = joins_group and (left == 0 or left in self.demanded)
                parts.append((int(joins_group), int(fills_hole), MILLI_GPU_PER_DEVICE - left if joins_group else 0))
            else:
                parts.append((int(not joins_group), left, 0))
        return min(parts) if parts else (0, 0, 0)

    def _node_part(self, state: NodeState, request: GpuRequest, devices: tuple[int, ...]) -> int:
        return self._whole_part(state.whole_free_count - request.whole_gpus)

    def _whole_part(self, whole_left: int) -> int:
        whole_left = min(max(0, whole_left), _PART - 1)
        return _PART - 1 - whole_left if self.node is Strategy.BINPACK else whole_left

    def _cpu_parts(self, state: NodeState, request: GpuRequest) -> tuple[int, int]:
        # A CPU-only pod: packing keeps it off nodes with free GPUs, then packs by CPU left; spread the opposite.
        cpu_left = min(max(0, state.free_milli_cpu - request.milli_cpu), _PART - 1)
        gpus_free = min(state.whole_free_count, _PART - 1)
        if self.node is Strategy.BINPACK:
            return _PART - 1 - gpus_free, _PART - 1 - cpu_left
        return gpus_free, cpu_left


def _has_group_for(state: NodeState, request: GpuRequest) -> bool:
    """Has the node a shared device the share fits in (KAI's GPU-sharing node order)?"""
    free = state.device_free_milli
    modes = state.device_modes
    return any(
        shared
        and free[device] >= request.share_on(device)
        and (modes[device] == request.compute_mode if modes else request.compute_mode == names.TIME_SLICING)
        for device, shared in enumerate(state.device_shared)
    )


def builtin(*, node: Strategy, device: Strategy, demanded: Sequence[int] = ()) -> BuiltinScorer:
    """The built-in scorer for a node and a device strategy (``FRAGMENTATION`` falls back to binpack here)."""
    return BuiltinScorer(node=_plain(node), device=_plain(device), demanded=tuple(sorted(set(demanded))))


def _plain(strategy: Strategy) -> Strategy:
    return Strategy.SPREAD if strategy is Strategy.SPREAD else Strategy.BINPACK

"""The openb replay through the real placement engine: ``engine.Engine`` with a policy plugged in as its scorer.

The trace's nodes become ``model.Node`` values (the GPU model on every device and in the ``nvidia.com/gpu.product``
label, the device memory of that model), each pod becomes a one-pod group of one queue, and a policy's scorer is
handed to the engine through ``model.Config.scorer``, so the engine's own filters (``gpu_spec`` constraints are the
pods' GPU models, checked by the engine's model filter), device choice, gang gate and plan run, exactly as in the
scheduler. One cycle per whole percent of arrived demand takes the pods that arrived in that step, oldest first;
the pods it leaves pending have failed and are not submitted again.

Node order matters for ties (the engine gives a tie to the node whose name sorts first), so nodes are named after
their rank in the run's node order, as the public FGD simulator does with its random name prefixes.

What the engine's scorer sees is a ``scoring.NodeState``; ``EngineScorer`` turns it into the ``NodeFree`` the
policies score: the GPU model from the devices, and, for GpuClustering, the kinds of GPU pods on the node (``share``
when a device is in a GPU group, ``k-gpu`` for a pod holding k devices whole). The Random baseline's ties are drawn
through the engine's ``scoring.DrawsTies`` seam from a source seeded like the fast path's, so the engine replays
every policy; Random's draws fall differently from the fast path's (the same distribution, not the same nodes).

The engine scores each distinct node look once per pod shape (``search``), which brings a seed of the default trace
at 130% to a few seconds. It agrees with the fast path (``replay``) where nothing ties; where scores tie the two
can part (the fast path sorts a node's devices by free share, the engine keeps device indexes), by less than the
seed-to-seed spread.
"""

from __future__ import annotations

import dataclasses
import fractions
import random
from collections.abc import Iterable, Mapping, Sequence

from common import names
from common.quantities import GIB, MIB
from common.resources import Resources
from scheduler.placement import applying, decisions, engine, model, scoring
from scheduler.placement.fragmentation import MILLI_GPU_PER_DEVICE, NodeFree, PodShape
from scheduler.sim import replay
from scheduler.sim.openb import TraceNode, TracePod

QUEUE = model.QueueName("openb")
# Pod slots are not part of the experiment; a reservation pod per shared device must never be the limit.
_POD_SLOTS = 10_000
# Device memory per known model (the public simulator's MapGpuTypeMemoryMiB); other models get 16 GiB.
_KNOWN_MEMORY_MIB = {
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "V100M32": 32510,
    "A100": 81251,
}


def device_memory_by_model(nodes: Iterable[TraceNode]) -> dict[str, int]:
    """The device memory (bytes) of every GPU model of the trace."""
    return {
        node.gpu_model: _KNOWN_MEMORY_MIB.get(node.gpu_model, 16 * GIB // MIB) * MIB for node in nodes if node.gpu_count
    }


def engine_node(node: TraceNode, *, rank: int, memory: Mapping[str, int]) -> model.Node:
    name = model.NodeName(f"n{rank:05d}-{node.name}")
    return model.Node(
        name=name,
        allocatable=Resources(
            milli_cpu=node.milli_cpu,
            memory_bytes=node.memory_bytes,
            milli_gpu=node.gpu_count * MILLI_GPU_PER_DEVICE,
            pods=_POD_SLOTS,
        ),
        labels={names.GPU_PRODUCT_LABEL: node.gpu_model} if node.gpu_count else {},
        devices=tuple(
            model.Device(
                index=index,
                uuid=model.GpuUuid(f"{name}-gpu{index}"),
                model=node.gpu_model,
                memory_bytes=memory[node.gpu_model],
            )
            for index in range(node.gpu_count)
        ),
    )


def engine_group(pod: TracePod, *, index: int) -> model.Group:
    """A pod of the trace as a one-pod group; ``index`` (its place in the arrival order) is its age."""
    if pod.gpu_count and pod.milli_gpu < MILLI_GPU_PER_DEVICE:
        requests = Resources(milli_cpu=pod.milli_cpu, memory_bytes=pod.memory_bytes, pods=1)
        share: model.GpuShare | None = model.GpuShare(milli_gpu=pod.milli_gpu)
    else:
        requests = Resources(
            milli_cpu=pod.milli_cpu,
            memory_bytes=pod.memory_bytes,
            milli_gpu=pod.total_milli_gpu,
            pods=1,
        )
        share = None
    uid = model.PodUid(f"p{index:07d}")
    return model.Group(
        id=model.GroupId(f"g{index:07d}"),
        queue=QUEUE,
        created_ns=index,
        members=(
            model.Pod(
                uid=uid,
                name=pod.name,
                requests=requests,
                share=share,
                gpu_models=tuple(sorted(pod.gpu_models)),
                created_ns=index,
            ),
        ),
    )


def resident_kinds(state: scoring.NodeState) -> frozenset[str]:
    """The GPU request classes of the pods on a node (``replay.request_kind``), as far as its devices show them."""
    kinds = {f"{count}-gpu" for count in state.device_pod_gpus if count}
    if any(state.device_shared):
        kinds.add("share")
    return frozenset(kinds)


class EngineScorer:
    """A replay ``Scorer`` seen through the engine's scoring seam (``scoring.GpuPlacementScorer``)."""

    def __init__(self, scorer: replay.Scorer) -> None:
        self._scorer = scorer
        self._kinds = scorer.needs_resident_kinds

    def __call__(self, state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        node = NodeFree(
            gpu_model=state.device_models[0] if state.device_models else "",
            milli_cpu=state.free_milli_cpu,
            memory_bytes=state.free_memory_bytes,
            devices=state.device_free_milli,
            resident_kinds=resident_kinds(state) if self._kinds else frozenset(),
        )
        if request.is_share:
            pod = PodShape(
                milli_cpu=request.milli_cpu,
                memory_bytes=request.memory_bytes,
                gpu_count=request.share_devices,
                milli_gpu=request.share_milli,
            )
        else:
            pod = PodShape(
                milli_cpu=request.milli_cpu,
                memory_bytes=request.memory_bytes,
                gpu_count=request.whole_gpus,
                milli_gpu=MILLI_GPU_PER_DEVICE if request.whole_gpus else 0,
            )
        return self._scorer(node, pod, devices)


class DrawingEngineScorer(EngineScorer):
    """An ``EngineScorer`` for a policy that breaks ties at random: the engine asks it to draw (``DrawsTies``)."""

    def __init__(self, scorer: replay.Scorer, *, seed: int) -> None:
        super().__init__(scorer)
        self._ties = random.Random(f"ties-{seed}")

    def draw_tie(self, count: int) -> int:
        return self._ties.randrange(count)


PRODUCTION = model.Config(gpu_strategy=model.Strategy.FRAGMENTATION, actions=(model.Action.ALLOCATE,))
"""``--policy production``: the scheduler's default placement (``quotient scheduler``'s ``--gpu-strategy
fragmentation``, every other placement setting at its default) under the experiment's rules: allocate only, so
nothing is moved or evicted. A test holds it to the scheduler's settings."""


def _held_milli(placements: Iterable[decisions.Placement]) -> int:
    return sum(
        sum(placement.share_milli) if placement.share_milli else MILLI_GPU_PER_DEVICE * len(placement.devices)
        for placement in placements
    )


class EngineCluster:
    """The trace's cluster held as an engine snapshot; ``submit`` runs one cycle for a batch of arrived pods.

    With a ``scorer`` (a policy of ``policies``) every policy is plugged into the engine as its scorer. Without one
    it is ``PRODUCTION``: the scheduler's own configuration, which learns the workload from the pods it sees, so
    pods are offered one cycle each (the distribution is learned from the pods already seen, the one being placed
    included, and from no later one). ``consolidate_budget`` (production only) adds consolidation beyond the
    experiment's rules: a pod that finds no room may have running pods moved for it, as long as the moves so far
    stay within ``consolidate_budget`` moves per placed pod; moved pods land where the plan proved they fit.
    """

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        scorer: replay.Scorer | None,
        *,
        seed: int,
        consolidate_budget: fractions.Fraction | None = None,
    ) -> None:
        memory = device_memory_by_model(nodes)
        if scorer is None:
            config = PRODUCTION
        else:
            if consolidate_budget is not None:
                raise ValueError("a consolidation budget applies to the production policy only")
            adapted = DrawingEngineScorer(scorer, seed=seed) if scorer.breaks_ties_at_random else EngineScorer(scorer)
            config = model.Config(scorer=adapted, actions=(model.Action.ALLOCATE,))
        self._one_by_one = scorer is None
        self._budget = consolidate_budget
        self._engine = engine.Engine()
        self.snapshot = model.snapshot(
            nodes=[engine_node(node, rank=rank, memory=memory) for rank, node in enumerate(nodes)],
            queues=[model.Queue(name=QUEUE)],
            groups=[],
            now_ns=0,
            config=config,
        )
        self.total_milli_gpu = sum(node.gpu_count for node in nodes) * MILLI_GPU_PER_DEVICE
        self.allocated_milli_gpu = 0
        self.placed = 0
        self.moves = 0
        """Pods moved by consolidation (``consolidate_budget``)."""
        self._next_index = 0
        self._free: dict[model.NodeName, tuple[model.Node, NodeFree]] = {}

    def submit(self, pods: Sequence[TracePod]) -> list[bool]:
        """Offer ``pods`` (in arrival order) to one engine cycle (production: one cycle each); which were placed."""
        if self._one_by_one:
            return [self._cycle([pod])[0] for pod in pods]
        return self._cycle(pods)

    def _cycle(self, pods: Sequence[TracePod]) -> list[bool]:
        groups = [engine_group(pod, index=self._next_index + offset) for offset, pod in enumerate(pods)]
        self._next_index += len(pods)
        # Placed groups are dropped (their pods live on in the nodes' usage) unless consolidation may move them.
        kept = dict(self.snapshot.groups)
        kept.update((group.id, group) for group in groups)
        offered = dataclasses.replace(self.snapshot, groups=kept, config=self._config())
        plan = self._engine.run(offered)
        if plan.moves:
            # The plan proved that the moved pods and the pod they made room for fit together: carry all of it out.
            plan = dataclasses.replace(plan, placements=(*plan.placements, *plan.moves, *plan.nominations))
            self.moves += len(plan.moves)
        placed = {placement.group for placement in plan.placements}
        applied = applying.apply(offered, plan)
        new = {group.id for group in groups}
        if self._budget is None:
            kept = {}
        else:  # running groups stay (victims for consolidation); a pod that found no room is dropped
            kept = {key: group for key, group in applied.groups.items() if key not in new or key in placed}
        self.snapshot = dataclasses.replace(applied, groups=kept)
        # A moved pod leaves its place and takes as much elsewhere: only the pods placed anew add to the allocation.
        moved = {placement.pod for placement in plan.moves}
        self.allocated_milli_gpu += _held_milli(p for p in plan.placements if p.pod not in moved)
        self.placed += sum(1 for group in groups if group.id in placed)
        return [group.id in placed for group in groups]

    def _config(self) -> model.Config:
        config = self.snapshot.config
        if self._budget is None:
            return config
        allowed = int(self._budget * max(1, self.placed)) - self.moves
        if allowed < 1:
            return dataclasses.replace(config, actions=(model.Action.ALLOCATE,))
        return dataclasses.replace(
            config,
            actions=(model.Action.ALLOCATE, model.Action.CONSOLIDATE),
            consolidation_max_moves=min(allowed, model.DEFAULT_CONFIG.consolidation_max_moves),
        )

    def states(self) -> Iterable[tuple[NodeFree, int]]:
        """Every node's free state (for the fragmentation measure), one node at a time."""
        known = self._free
        for name, node in self.snapshot.nodes.items():
            cached = known.get(name)
            if cached is None or cached[0] is not node:  # a cycle replaces the nodes it changed, and only those
                cached = known[name] = (node, _free_state(node))
            yield cached[1], 1


def _free_state(node: model.Node) -> NodeFree:
    free = node.allocatable - node.used
    return NodeFree(
        gpu_model=node.devices[0].model if node.devices else "",
        milli_cpu=free.milli_cpu,
        memory_bytes=free.memory_bytes,
        devices=tuple(
            0
            if device.whole or (device.gpu_group is None and device.allotted_milli_gpu)
            else MILLI_GPU_PER_DEVICE - device.allotted_milli_gpu
            for device in node.devices
        ),
    )

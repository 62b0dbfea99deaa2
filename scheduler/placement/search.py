"""Finding the best node and devices for one pod against the current working state.

Two paths give the same answer for the built-in binpack scorer (a property test holds them to it):

- the *indexed* path, used for the default strategy (binpack at node and device level) and for whole GPUs under
  either strategy: it walks the capacity indexes (free whole devices per node, shared devices by free share) in the
  order the scorer would rank them and stops at the first node that also has the CPU, memory and pod slot. Its cost
  does not grow with the number of nodes, which is what makes thousands of pods per second on 5,000 nodes possible.
- the *scored* path, for everything else (spread for shares, custom scorers, CPU-only pods, shares on several
  devices, gpu-memory shares): every node of the eligible classes is scored, the scorer memoised by value.

Both break ties by node order (name order), then by device index, so a plan never depends on hashing.
"""

from __future__ import annotations

import bisect
import dataclasses

from scheduler.placement import capacity, devices, filters, model, scoring

_MEMO_LIMIT = 500_000


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """Everything placement reads from a pod; pods of equal shape are placed alike (and share memo entries)."""

    milli_cpu: int
    memory_bytes: int
    pods: int
    whole_gpus: int
    share: model.GpuShare | None
    constraints: filters.Constraints

    @property
    def wants_gpu(self) -> bool:
        return self.whole_gpus > 0 or self.share is not None


def shape_of(pod: model.Pod) -> Shape:
    return Shape(
        milli_cpu=pod.requests.milli_cpu,
        memory_bytes=pod.requests.memory_bytes,
        pods=pod.requests.pods,
        whole_gpus=pod.whole_gpus,
        share=pod.share,
        constraints=filters.constraints(pod),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """Where a pod goes: a node and its devices, with the milli-GPU taken on each for a share."""

    work: capacity.NodeWork
    devices: tuple[int, ...]
    share_milli: tuple[int, ...] = ()


class Searcher:
    """Finds placements on a ``Capacity``; holds the filter and score caches that survive between cycles."""

    def __init__(self, cap: capacity.Capacity) -> None:
        self.capacity = cap
        self._verdicts: dict[tuple[int, filters.Constraints], str | None] = {}
        self._eligible: dict[filters.Constraints, tuple[int, tuple[int, ...]]] = {}
        self._ever: dict[Shape, bool] = {}
        self._offered: dict[filters.Constraints, int] = {}
        self._memo: dict[tuple[scoring.NodeState, scoring.GpuRequest, tuple[int, ...]], int] = {}
        self.scorer: scoring.GpuPlacementScorer = scoring.builtin(
            node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK
        )
        self.cpu_scorer: scoring.GpuPlacementScorer = self.scorer
        self.indexed_whole = True
        self.indexed_cpu = True
        self.indexed_share = True
        self.spread_whole = False
        self.demanded: tuple[int, ...] = ()
        self._config_key: tuple[object, ...] = ()
        self._class_epoch = -1

    def configure(self, config: model.Config, demanded: tuple[int, ...]) -> None:
        """Set the scorers for this cycle (the demanded share sizes come from the pending pods)."""
        key = (config.scorer, config.gpu_strategy, config.cpu_strategy, config.device_strategy, demanded)
        if key == self._config_key:
            return
        self._config_key = key
        self._memo.clear()
        self.demanded = demanded
        builtin = config.scorer is None
        self.scorer = config.scorer or scoring.builtin(
            node=config.gpu_strategy, device=config.device_strategy, demanded=demanded
        )
        # A configured scorer places every pod, CPU-only ones included: a policy judges the whole node it fills
        # (the simulator's baselines and ours are defined that way), and a CPU-only pod can strand a node's GPUs.
        self.cpu_scorer = config.scorer or scoring.builtin(
            node=config.cpu_strategy, device=config.device_strategy, demanded=demanded
        )
        self.indexed_whole = builtin
        self.indexed_cpu = builtin and config.cpu_strategy is scoring.Strategy.BINPACK
        self.spread_whole = config.gpu_strategy is scoring.Strategy.SPREAD
        self.indexed_share = (
            builtin
            and config.gpu_strategy is scoring.Strategy.BINPACK
            and config.device_strategy is scoring.Strategy.BINPACK
        )

    # --- static filters -------------------------------------------------------------------------------------

    def verdict(self, cls: int, constraints: filters.Constraints) -> str | None:
        key = (cls, constraints)
        try:
            return self._verdicts[key]
        except KeyError:
            found = filters.check(self.capacity.classes[cls].node_class, constraints)
            self._verdicts[key] = found
            return found

    def eligible(self, constraints: filters.Constraints) -> tuple[int, ...]:
        """The node classes whose static filters pass for these constraints, in class order."""
        classes = self.capacity.classes
        cached = self._eligible.get(constraints)
        if cached is not None and cached[0] == len(classes) and self._class_epoch == self.capacity.structure_version:
            return cached[1]
        if self._class_epoch != self.capacity.structure_version:
            self._eligible.clear()
            self._verdicts.clear()
            self._ever.clear()
            self._offered.clear()
            self._class_epoch = self.capacity.structure_version
        if len(self._eligible) > _MEMO_LIMIT // 10:
            # Constraints that many are unique per pod (hostname affinity): keep the caches bounded.
            self._eligible.clear()
            self._verdicts.clear()
            self._ever.clear()
            self._offered.clear()
        found = tuple(cls for cls in range(len(classes)) if self.verdict(cls, constraints) is None)
        self._eligible[constraints] = (len(classes), found)
        return found

    def could_ever_hold(self, shape: Shape) -> bool:
        """Could some empty node the pod may use hold it (enough CPU, memory, slots and healthy devices)?"""
        self.eligible(shape.constraints)  # resets the caches when the node structure changed
        found = self._ever.get(shape)
        if found is None:
            cap = self.capacity
            found = any(
                _could_hold_when_empty(cap.by_order[order], shape)
                for cls in self.eligible(shape.constraints)
                for order in cap.classes[cls].members
            )
            self._ever[shape] = found
        return found

    def devices_offered(self, constraints: filters.Constraints) -> int:
        """How many healthy devices the nodes a pod may use have in all."""
        eligible = self.eligible(constraints)
        found = self._offered.get(constraints)
        if found is None:
            cap = self.capacity
            found = sum(sum(cap.by_order[order].dev_healthy) for cls in eligible for order in cap.classes[cls].members)
            self._offered[constraints] = found
        return found

    # --- the search -----------------------------------------------------------------------------------------

    def find(self, shape: Shape) -> Choice | None:
        """The best placement for a pod of ``shape`` now, or None when no node can take it."""
        eligible = self.eligible(shape.constraints)
        if not eligible:
            return None
        share = shape.share
        if share is None and shape.whole_gpus and self.indexed_whole:
            return self._find_whole(shape, eligible)
        if share is not None and share.milli_gpu and share.devices == 1 and self.indexed_share:
            return self._find_share(shape, share.milli_gpu, eligible)
        if share is None and not shape.whole_gpus and self.indexed_cpu:
            return self._find_cpu(shape, eligible)
        return self._find_scored(shape, eligible)

    def _find_cpu(self, shape: Shape, eligible: tuple[int, ...]) -> Choice | None:
        """Binpack for a CPU-only pod: the node with the fewest free devices, then the least CPU left after it."""
        classes = self.capacity.classes
        by_order = self.capacity.by_order
        best: tuple[int, int, int] | None = None
        for cls in eligible:
            entries = classes[cls].cpu
            position = 0
            while position < len(entries):
                whole, free_cpu, order = entries[position]
                if free_cpu < shape.milli_cpu:
                    # skip to this free-device count's first node with enough CPU
                    position = bisect.bisect_left(entries, (whole, shape.milli_cpu, -1), position + 1)
                    continue
                if best is not None and (whole, free_cpu, order) >= best:
                    break
                if by_order[order].fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods):
                    best = (whole, free_cpu, order)
                    # a later entry of the same class is worse; move on to the next class
                    break
                position += 1
        if best is None:
            return None
        return Choice(work=by_order[best[2]], devices=())

    def _find_whole(self, shape: Shape, eligible: tuple[int, ...]) -> Choice | None:
        classes = self.capacity.classes
        by_order = self.capacity.by_order
        counts = sorted(
            {count for cls in eligible for count, bucket in classes[cls].whole.items() if bucket},
            reverse=self.spread_whole,
        )
        models = shape.constraints.gpu_models
        for count in counts:
            if count < shape.whole_gpus:
                continue
            best: Choice | None = None
            for cls in eligible:
                for order in classes[cls].whole.get(count, ()):
                    if best is not None and order >= best.work.order:
                        break
                    work = by_order[order]
                    if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods):
                        continue
                    chosen = devices.pick_whole(work, shape.whole_gpus, models)
                    if chosen is not None:
                        best = Choice(work=work, devices=chosen)
                        break
            if best is not None:
                return best
        return None

    def _find_share(self, shape: Shape, milli: int, eligible: tuple[int, ...]) -> Choice | None:
        classes = self.capacity.classes
        by_order = self.capacity.by_order
        models = shape.constraints.gpu_models
        # 1. A shared device left with nothing, or with a remainder some pending pod asks for, smallest first.
        for remainder in (0, *self.demanded):
            target = milli + remainder
            if target > devices.FULL:
                break
            best: tuple[int, int, int, int] | None = None
            for cls in eligible:
                shared = classes[cls].shared
                position = bisect.bisect_left(shared, (target, -1, -1, -1))
                while position < len(shared) and shared[position][0] == target:
                    entry = shared[position]
                    position += 1
                    if best is not None and entry >= best:
                        break
                    work = by_order[entry[2]]
                    if work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods) and devices.model_allowed(
                        work, entry[3], models
                    ):
                        best = entry
                        break
            if best is not None:
                return Choice(work=by_order[best[2]], devices=(best[3],), share_milli=(milli,))
        # 2. The tightest shared device with room.
        best = None
        for cls in eligible:
            shared = classes[cls].shared
            position = bisect.bisect_left(shared, (milli, -1, -1, -1))
            while position < len(shared):
                entry = shared[position]
                position += 1
                if best is not None and entry >= best:
                    break
                work = by_order[entry[2]]
                if work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods) and devices.model_allowed(
                    work, entry[3], models
                ):
                    best = entry
                    break
        if best is not None:
            return Choice(work=by_order[best[2]], devices=(best[3],), share_milli=(milli,))
        # 3. Open a new group on a free device of the node with the fewest free devices (one more pod slot).
        counts = sorted({count for cls in eligible for count, bucket in classes[cls].whole.items() if bucket})
        for count in counts:
            found: Choice | None = None
            for cls in eligible:
                for order in classes[cls].whole.get(count, ()):
                    if found is not None and order >= found.work.order:
                        break
                    work = by_order[order]
                    if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods + 1):
                        continue
                    device = _first_free_device(work, milli, models)
                    if device is not None:
                        found = Choice(work=work, devices=(device,), share_milli=(milli,))
                        break
            if found is not None:
                return found
        return None

    def _find_scored(self, shape: Shape, eligible: tuple[int, ...]) -> Choice | None:
        scorer = self.scorer if shape.wants_gpu else self.cpu_scorer
        memo = self._memo
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        classes = self.capacity.classes
        by_order = self.capacity.by_order
        best_key: tuple[int, int, tuple[int, ...]] | None = None
        best: Choice | None = None
        fixed_request = _request(shape, None)
        # Nodes of one class that look the same to the filters and the scorer (same state, pod slots and device
        # models) offer the same choices with the same scores; members come in node order, so the first of them
        # wins every tie and the others can be skipped. Exact, and on a large uniform cluster most nodes are alike.
        seen: set[tuple[scoring.NodeState, int, tuple[str, ...]]] = set()
        for cls in eligible:
            seen.clear()
            for order in classes[cls].members:
                work = by_order[order]
                look = (work.state(), work.free_pods, work.dev_model)
                if look in seen:
                    continue
                seen.add(look)
                for chosen, per_device in _device_choices(work, shape):
                    slots = shape.pods + (_opened_groups(work, chosen) if shape.share is not None else 0)
                    if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, slots):
                        continue
                    request = fixed_request if not per_device or shape.share is None else _request(shape, per_device)
                    state = work.state()
                    memo_key = (state, request, chosen)
                    score = memo.get(memo_key)
                    if score is None:
                        score = scorer(state, request, chosen)
                        memo[memo_key] = score
                    key = (-score, order, chosen)
                    if best_key is None or key < best_key:
                        best_key = key
                        share_milli = tuple(per_device[device] for device in chosen) if shape.share else ()
                        best = Choice(work=work, devices=chosen, share_milli=share_milli)
        return best


def _could_hold_when_empty(work: capacity.NodeWork, shape: Shape) -> bool:
    allocatable = work.node.allocatable
    if (
        allocatable.milli_cpu < shape.milli_cpu
        or allocatable.memory_bytes < shape.memory_bytes
        or allocatable.pods < shape.pods
    ):
        return False
    healthy = sum(work.dev_healthy)
    share = shape.share
    if shape.whole_gpus and healthy < shape.whole_gpus:
        return False
    if share is not None:
        if healthy < share.devices:
            return False
        if share.memory_bytes and not any(
            model.share_milli_on(share, memory) <= model.MILLI_GPU_PER_DEVICE for memory in work.dev_mem
        ):
            return False
    return True


def _request(shape: Shape, per_device: tuple[int, ...] | None) -> scoring.GpuRequest:
    share = shape.share
    if share is None:
        return scoring.GpuRequest(
            milli_cpu=shape.milli_cpu, memory_bytes=shape.memory_bytes, whole_gpus=shape.whole_gpus
        )
    if share.milli_gpu:
        return scoring.GpuRequest(
            milli_cpu=shape.milli_cpu,
            memory_bytes=shape.memory_bytes,
            share_milli=share.milli_gpu,
            share_devices=share.devices,
        )
    return scoring.GpuRequest(
        milli_cpu=shape.milli_cpu,
        memory_bytes=shape.memory_bytes,
        share_milli=max(per_device or (0,)),
        share_devices=share.devices,
        share_milli_per_device=per_device or (),
    )


def _first_free_device(work: capacity.NodeWork, milli: int, models: tuple[str, ...]) -> int | None:
    for device, whole in enumerate(work.dev_whole):
        if whole and work.dev_free[device] >= milli and devices.model_allowed(work, device, models):
            return device
    return None


def _opened_groups(work: capacity.NodeWork, chosen: tuple[int, ...]) -> int:
    return sum(1 for device in chosen if work.dev_whole[device] and work.dev_group[device] is None)


def _device_choices(work: capacity.NodeWork, shape: Shape) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The device choices offered to the scorer on one node, with the per-device share (empty for whole GPUs)."""
    models = shape.constraints.gpu_models
    if shape.share is None:
        if not shape.whole_gpus:
            return [((), ())]
        chosen = devices.pick_whole(work, shape.whole_gpus, models)
        return [] if chosen is None else [(chosen, ())]
    per_device = devices.share_on_each(shape.share, work)
    candidates = devices.share_candidates(work, per_device, models)
    if shape.share.devices == 1:
        return [((device,), per_device) for device in candidates]
    # Several devices: every candidate device is distinct after collapsing equal ones, which would hide the
    # duplicates a multi-device share needs; take all fitting devices, packed first, then the lowest indexes.
    fitting = [
        device
        for device, free in enumerate(work.dev_free)
        if per_device[device] <= free
        and devices.model_allowed(work, device, models)
        and (work.dev_group[device] is not None or work.dev_whole[device])
    ]
    if len(fitting) < shape.share.devices:
        return []
    fitting.sort(key=lambda device: (work.dev_group[device] is None, work.dev_free[device], device))
    return [(tuple(sorted(fitting[: shape.share.devices])), per_device)]

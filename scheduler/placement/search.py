"""Finding the best node and devices for one pod against the current working state.

Two paths give the same answer for the built-in scorers (a property test holds them to it):

- the *indexed* path (``indexed``), used for the built-in strategies with binpack on the device level (the
  scheduler's ``binpack`` and ``spread``: the node level either way) and for whole GPUs under either strategy: it
  walks the capacity indexes in the order the scorer would rank them and stops at the first node that fits, so its
  cost does not grow with the number of nodes.
- the *scored* path, for everything else (spread on the device level, custom scorers, CPU-only pods under
  spread, shares on several
  devices, gpu-memory shares, shares that name GPU models): every distinct *look* of the eligible classes
  (``capacity.Look``: nodes that the filters, the device choice and the scorer cannot tell apart) is scored once,
  and its answer kept on the look for the next pod of the same shape, so the cost follows the number of distinct
  node states, not of nodes, and a node state is never hashed during a search. The looks are kept ranked by score
  per shape (``lookrank``), so the next pod of a shape reads the best looks and the looks that changed since, not
  every look. A pod that needs more pod slots than
  a look records goes node by node (``group_alike`` off does the same for every pod: the reference the tests hold
  the grouped search to).

Both break ties by node order (name order), then by device index, so a plan never depends on hashing; a scorer that
is ``scoring.DrawsTies`` has its tied nodes drawn instead. This module holds the ``Searcher`` (its configuration,
the filter caches that survive between cycles, the choice of path) and the scored path.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

from scheduler.placement import capacity, filters, indexed, lookrank, model, nodework, scoring, shapes

_MEMO_LIMIT = 500_000
# Pod shapes are numbered for the looks' caches; past this many the numbering (and every cache) starts afresh.
_SHAPE_LIMIT = 20_000
# A shape that fitted nowhere is searched in full again once more nodes than this may have gained room since.
_RECHECKED_NODES = 256
# What a look's cache holds for a shape that fits none of its device choices (told apart by identity).
_NOWHERE: capacity.LookBest = (0, (-1,), ())


class Searcher:
    """Finds placements on a ``Capacity``; holds the filter and score caches that survive between cycles."""

    def __init__(self, cap: capacity.Capacity) -> None:
        self.capacity = cap
        self._verdicts: dict[tuple[int, filters.Constraints], str | None] = {}
        self._eligible: dict[filters.Constraints, tuple[int, tuple[int, ...]]] = {}
        self._nowhere: dict[shapes.Shape, tuple[int, int]] = {}
        """Shapes that fitted nowhere, with where the verdict stands in ``Capacity.grown``."""
        self._ever: dict[shapes.Shape, bool] = {}
        self._offered: dict[filters.Constraints, int] = {}
        self._shape_ids: dict[shapes.Shape, int] = {}
        self._ranks = lookrank.LookRanks()
        self._epoch = 0
        """Bumped when the scorers or the shape numbering change: what the looks cached before is void."""
        self.group_alike = True
        """Score each look once (False: every node, the slow reference the tests compare against)."""
        self.draw_tie: scoring.DrawsTies | None = None
        self.scorer: scoring.GpuPlacementScorer = scoring.builtin(
            node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK
        )
        self.cpu_scorer: scoring.GpuPlacementScorer = self.scorer
        self.indexed_whole = True
        self.indexed_cpu = True
        self.indexed_share = True
        self.spread_nodes = False
        self.demanded: tuple[int, ...] = ()
        self._config_key: tuple[object, ...] = ()
        self._class_epoch = -1

    def configure(
        self,
        config: model.Config,
        demanded: tuple[int, ...],
        learned: scoring.GpuPlacementScorer | None = None,
    ) -> None:
        """Set the scorers for this cycle (the demanded share sizes come from the pending pods; ``learned`` is the
        fragmentation strategy's scorer, None while it has no history and places as binpack)."""
        if config.gpu_strategy is not scoring.Strategy.FRAGMENTATION or config.scorer is not None:
            learned = None
        configured = config.scorer or learned
        builtin = configured is None
        self.demanded = demanded
        # The demanded sizes only shape the built-in scorer; a configured one keeps its caches from cycle to cycle.
        key = (
            config.scorer,
            learned,
            config.gpu_strategy,
            config.cpu_strategy,
            config.device_strategy,
            demanded if builtin else (),
        )
        if key == self._config_key:
            return
        self._config_key = key
        self._epoch += 1
        self.draw_tie = config.scorer if isinstance(config.scorer, scoring.DrawsTies) else None
        self.scorer = configured or scoring.builtin(
            node=config.gpu_strategy, device=config.device_strategy, demanded=demanded
        )
        # A configured scorer places every pod, CPU-only ones included: a policy judges the whole node it fills
        # (the simulator's baselines and ours are defined that way), and a CPU-only pod can strand a node's GPUs.
        # The learned one places CPU-only pods under the default CPU strategy, binpack; spread keeps KAI's spread.
        cpu_scored = config.scorer or (learned if config.cpu_strategy is not scoring.Strategy.SPREAD else None)
        self.cpu_scorer = cpu_scored or scoring.builtin(
            node=config.cpu_strategy, device=config.device_strategy, demanded=demanded
        )
        self.indexed_whole = builtin
        self.indexed_cpu = cpu_scored is None and config.cpu_strategy is not scoring.Strategy.SPREAD
        self.spread_nodes = config.gpu_strategy is scoring.Strategy.SPREAD
        # Spread on the node level walks the same indexes in the other order; spread on the device level is scored.
        self.indexed_share = builtin and config.device_strategy is not scoring.Strategy.SPREAD

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

    def could_ever_hold(self, shape: shapes.Shape) -> bool:
        """Could some empty node the pod may use hold it (enough CPU, memory, slots and devices)?

        Devices out of placement as unhealthy count here: a device the agent reports broken may come back (the
        agent's hold ends, an operator clears it), so it makes a pod wait, not ``NeverFits``.
        """
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
        """How many devices the nodes a pod may use have in all, unhealthy ones included (see ``could_ever_hold``)."""
        eligible = self.eligible(constraints)
        found = self._offered.get(constraints)
        if found is None:
            cap = self.capacity
            found = sum(len(cap.by_order[order].dev_healthy) for cls in eligible for order in cap.classes[cls].members)
            self._offered[constraints] = found
        return found

    # --- the search -----------------------------------------------------------------------------------------

    def find(self, shape: shapes.Shape) -> shapes.Choice | None:
        """The best placement for a pod of ``shape`` now, or None when no node can take it.

        A shape that fitted nowhere is searched again only if one of the nodes that may have gained room since
        (``Capacity.grown``) can take it now: in a full cluster with a backlog, most searches are such repeats, and
        an eviction frees room on one node, not on all of them."""
        if self._still_nowhere(shape):
            return None
        found = self._find(shape)
        if found is None:
            self._note_nowhere(shape)
        return found

    def find_on(self, shape: shapes.Shape, node: model.NodeName) -> shapes.Choice | None:
        """The best placement for a pod of ``shape`` on ``node`` alone (its devices by the scorer), or None when the
        pod may not use the node or it cannot take the pod now. For room held on a nominated node."""
        cap = self.capacity
        work = cap.by_name.get(node)
        if work is None or work.cls not in self.eligible(shape.constraints):
            return None
        look = cap.look_of[work.order]
        if look is None:
            raise RuntimeError(f"node {work.name} is out of the indexes during a search")
        scorer = self.scorer if shape.wants_gpu else self.cpu_scorer
        found = _best_on(work, look, shape, scorer, _request(shape, None))
        if found is None:
            return None
        _, chosen, share_milli = found
        return shapes.Choice(work=work, devices=chosen, share_milli=share_milli)

    def fits(self, shape: shapes.Shape) -> bool:
        """Would ``find`` place a pod of ``shape`` now? Without choosing where: on the scored path any look that
        takes it answers, not the best one (room-making asks this of every victim it may move)."""
        if self._still_nowhere(shape):
            return False
        eligible = self.eligible(shape.constraints)
        if not eligible:
            found = False
        elif self._scored(shape):
            found = self._fits_scored(shape, eligible)
        else:
            found = self._find_indexed(shape, eligible) is not None
        if not found:
            self._note_nowhere(shape)
        return found

    def _still_nowhere(self, shape: shapes.Shape) -> bool:
        """Did the shape fit nowhere last time, with none of the nodes that may have gained room since taking it?"""
        cap = self.capacity
        known = self._nowhere.get(shape)
        if known is not None and known[0] == cap.generation:
            since = _distinct(cap.grown, known[1], _RECHECKED_NODES)
            if since is not None and not self._fits_any(shape, since):
                self._nowhere[shape] = cap.nowhere()
                return True
        return False

    def _note_nowhere(self, shape: shapes.Shape) -> None:
        nowhere = self._nowhere
        if len(nowhere) >= _SHAPE_LIMIT:
            nowhere.clear()
        nowhere[shape] = self.capacity.nowhere()

    def _fits_any(self, shape: shapes.Shape, orders: Iterable[int]) -> bool:
        """Could one of these nodes (by order) take a pod of ``shape`` now?"""
        eligible = self.eligible(shape.constraints)
        by_order = self.capacity.by_order
        cpu, memory, pods, whole = shape.milli_cpu, shape.memory_bytes, shape.pods, shape.whole_gpus
        for order in orders:
            work = by_order[order]
            # What ``_fits_on`` would find missing first, without listing the device choices.
            if work.free_cpu < cpu or work.free_mem < memory or work.free_pods < pods or work.whole_count < whole:
                continue
            if work.cls in eligible and _fits_on(work, shape):
                return True
        return False

    def _find(self, shape: shapes.Shape) -> shapes.Choice | None:
        eligible = self.eligible(shape.constraints)
        if not eligible:
            return None
        if self._scored(shape):
            return self._find_scored(shape, eligible)
        return self._find_indexed(shape, eligible)

    def _scored(self, shape: shapes.Shape) -> bool:
        """Does the pod take the scored path (see the module docstring), not an indexed one?"""
        share = shape.share
        if share is None and shape.whole_gpus:
            return not self.indexed_whole
        if share is None:
            return not self.indexed_cpu
        # A share that names GPU models takes the scored path: its node order reads the node state as the scorer does.
        return not (share.milli_gpu and share.devices == 1 and self.indexed_share and not shape.constraints.gpu_models)

    def _find_indexed(self, shape: shapes.Shape, eligible: tuple[int, ...]) -> shapes.Choice | None:
        share = shape.share
        if share is None and shape.whole_gpus:
            return indexed.find_whole(self.capacity, shape, eligible, spread=self.spread_nodes)
        if share is not None:
            return indexed.find_share(
                self.capacity, shape, share.milli_gpu, eligible, demanded=self.demanded, spread=self.spread_nodes
            )
        return indexed.find_cpu(self.capacity, shape, eligible)

    def _fits_scored(self, shape: shapes.Shape, eligible: tuple[int, ...]) -> bool:
        share = shape.share
        if not self.group_alike or shape.pods + (share.devices if share is not None else 0) > capacity.LOOK_POD_SLOTS:
            return self._find_scored(shape, eligible) is not None
        scorer = self.scorer if shape.wants_gpu else self.cpu_scorer
        return self._ranks.any(self._ranking(shape, eligible, scorer, _request(shape, None)))

    def _ranking(
        self,
        shape: shapes.Shape,
        eligible: tuple[int, ...],
        scorer: scoring.GpuPlacementScorer,
        fixed_request: scoring.GpuRequest,
    ) -> lookrank.Ranking:
        shape_id = self._shape_id(shape)  # may start a new epoch: read before the epoch
        scored = self._look_scorer(shape, scorer, fixed_request)
        return self._ranks.heap(self.capacity, shape_id, eligible, scored, epoch=self._epoch)

    def _find_scored(self, shape: shapes.Shape, eligible: tuple[int, ...]) -> shapes.Choice | None:
        scorer = self.scorer if shape.wants_gpu else self.cpu_scorer
        share = shape.share
        classes = self.capacity.classes
        by_order = self.capacity.by_order
        fixed_request = _request(shape, None)
        # The best score so far and every candidate with it: (its first node, its nodes in node order, its answer).
        top_score = 0
        top: list[tuple[int, Sequence[int], capacity.LookBest]] = []
        if self.group_alike and shape.pods + (share.devices if share is not None else 0) <= capacity.LOOK_POD_SLOTS:
            top = self._ranks.best(
                self._ranking(shape, eligible, scorer, fixed_request), every=self.draw_tie is not None
            )
        else:
            look_of = self.capacity.look_of
            for cls in eligible:
                for order in classes[cls].members:
                    work = by_order[order]
                    filed = look_of[order]
                    if filed is None:
                        raise RuntimeError(f"node {work.name} is out of the indexes during a search")
                    found = _best_on(work, filed, shape, scorer, fixed_request)
                    if found is None:
                        continue
                    if not top or found[0] > top_score:
                        top_score = found[0]
                        top = [(order, (order,), found)]
                    elif found[0] == top_score:
                        top.append((order, (order,), found))
        if not top:
            return None
        # Every node is in one candidate, so first nodes differ and tuples compare on them alone.
        if self.draw_tie is None:
            first, _, (_, chosen, share_milli) = min(top)
            return shapes.Choice(work=by_order[first], devices=chosen, share_milli=share_milli)
        tied = sorted(itertools.chain.from_iterable(nodes for _, nodes, _ in top))
        drawn = self.draw_tie.draw_tie(len(tied))
        if not 0 <= drawn < len(tied):
            raise ValueError(f"draw_tie drew {drawn} of {len(tied)} tied nodes")
        order = tied[drawn]
        for first, nodes, (_, chosen, share_milli) in top:
            if first <= order <= nodes[-1] and nodes[bisect.bisect_left(nodes, order)] == order:
                return shapes.Choice(work=by_order[order], devices=chosen, share_milli=share_milli)
        raise RuntimeError(f"tied node {order} belongs to no candidate")

    def _look_scorer(
        self, shape: shapes.Shape, scorer: scoring.GpuPlacementScorer, fixed_request: scoring.GpuRequest
    ) -> lookrank.Scored:
        """A look's answer for ``shape`` (kept on the look for the next search of the shape), None where it cannot
        take the pod; the quick rejections read what the look copied from its nodes."""
        shape_id = self._shape_id(shape)
        epoch = self._epoch
        by_order = self.capacity.by_order
        cpu, memory, pods, whole = shape.milli_cpu, shape.memory_bytes, shape.pods, shape.whole_gpus
        milli = shape.share.milli_gpu if shape.share is not None else 0

        def scored(look: capacity.Look) -> capacity.LookBest | None:
            if (
                look.free_cpu < cpu
                or look.free_mem < memory
                or look.free_pods < pods
                or look.whole_count < whole
                or look.most_share < milli
            ):
                return None
            known = look.best
            if look.epoch != epoch:
                known.clear()
                look.epoch = epoch
            found = known.get(shape_id)
            if found is None:
                work = by_order[look.members[0]]
                found = known[shape_id] = _best_on(work, look, shape, scorer, fixed_request) or _NOWHERE
            return None if found is _NOWHERE else found

        return scored

    def _shape_id(self, shape: shapes.Shape) -> int:
        found = self._shape_ids.get(shape)
        if found is None:
            if len(self._shape_ids) >= _SHAPE_LIMIT:
                self._shape_ids.clear()
                self._epoch += 1
            found = self._shape_ids[shape] = len(self._shape_ids)
        return found


def _best_on(
    work: nodework.NodeWork,
    look: capacity.Look,
    shape: shapes.Shape,
    scorer: scoring.GpuPlacementScorer,
    fixed_request: scoring.GpuRequest,
) -> capacity.LookBest | None:
    """The best-scored device choice for ``shape`` on ``work`` (the lowest devices among equal scores), if any."""
    best: capacity.LookBest | None = None
    for chosen, per_device in _device_choices(work, shape):
        slots = shape.pods + (_opened_groups(work, chosen) if shape.share is not None else 0)
        if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, slots):
            continue
        request = fixed_request if not per_device or shape.share is None else _request(shape, per_device)
        score = scorer(look.scoring_state(work), request, chosen)
        if best is None or score > best[0] or (score == best[0] and chosen < best[1]):
            share_milli = tuple(per_device[device] for device in chosen) if shape.share else ()
            best = (score, chosen, share_milli)
    return best


def _distinct(log: list[int], start: int, limit: int) -> set[int] | None:
    """The distinct entries of ``log`` from ``start`` on, or None when there are more than ``limit`` (read no further:
    a busy cycle's log holds thousands)."""
    found: set[int] = set()
    for index in range(start, len(log), limit):
        found.update(log[index : index + limit])
        if len(found) > limit:
            return None
    return found


def _fits_on(work: nodework.NodeWork, shape: shapes.Shape) -> bool:
    """Does some device choice for ``shape`` on ``work`` fit now (CPU, memory, pod slots)?"""
    for chosen, _ in _device_choices(work, shape):
        slots = shape.pods + (_opened_groups(work, chosen) if shape.share is not None else 0)
        if work.fits_basics(shape.milli_cpu, shape.memory_bytes, slots):
            return True
    return False


def _could_hold_when_empty(work: nodework.NodeWork, shape: shapes.Shape) -> bool:
    allocatable = work.node.allocatable
    if (
        allocatable.milli_cpu < shape.milli_cpu
        or allocatable.memory_bytes < shape.memory_bytes
        or allocatable.pods < shape.pods
    ):
        return False
    devices = len(work.dev_healthy)
    share = shape.share
    if shape.whole_gpus and devices < shape.whole_gpus:
        return False
    if share is not None:
        if devices < share.devices:
            return False
        if share.memory_bytes and not any(
            model.share_milli_on(share, memory) <= model.MILLI_GPU_PER_DEVICE for memory in work.dev_mem
        ):
            return False
    return True


def _request(shape: shapes.Shape, per_device: tuple[int, ...] | None) -> scoring.GpuRequest:
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
            compute_mode=share.compute_mode.value,
        )
    return scoring.GpuRequest(
        milli_cpu=shape.milli_cpu,
        memory_bytes=shape.memory_bytes,
        share_milli=max(per_device or (0,)),
        share_devices=share.devices,
        share_milli_per_device=per_device or (),
        compute_mode=share.compute_mode.value,
    )


def _opened_groups(work: nodework.NodeWork, chosen: tuple[int, ...]) -> int:
    return sum(1 for device in chosen if work.dev_whole[device] and work.dev_group[device] is None)


def _device_choices(work: nodework.NodeWork, shape: shapes.Shape) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The device choices offered to the scorer on one node, with the per-device share (empty for whole GPUs)."""
    models = shape.constraints.gpu_models
    if shape.share is None:
        if not shape.whole_gpus:
            return [((), ())]
        chosen = work.pick_whole(shape.whole_gpus, models)
        return [] if chosen is None else [(chosen, ())]
    per_device = work.share_on_each(shape.share)
    mode = shape.share.compute_mode
    candidates = work.share_candidates(per_device, models, mode)
    if shape.share.devices == 1:
        return [((device,), per_device) for device in candidates]
    # Several devices: every candidate device is distinct after collapsing equal ones, which would hide the
    # duplicates a multi-device share needs; take all fitting devices, packed first, then the lowest indexes.
    fitting = [
        device
        for device, free in enumerate(work.dev_free)
        if per_device[device] <= free
        and work.model_allowed(device, models)
        and (work.dev_group[device] is not None or work.dev_whole[device])
        and work.joinable(device, mode)
    ]
    if len(fitting) < shape.share.devices:
        return []
    fitting.sort(key=lambda device: (work.dev_group[device] is None, work.dev_free[device], device))
    return [(tuple(sorted(fitting[: shape.share.devices])), per_device)]

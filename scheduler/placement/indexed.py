"""The indexed search: built-in placements found by walking the capacity indexes, without scoring any node.

Used for the built-in strategies with binpack on the device level (binpack or spread on the node level: the
scheduler's ``binpack`` and ``spread``) and for whole GPUs under either strategy. Each walk visits the candidates in
the order the built-in scorer would rank them (free whole devices per node, fewest first for binpack and most first
for spread; for a share the nodes with a fitting shared device by their free whole devices, then the devices on them
by free share; nodes by free devices then CPU) and stops at the first node that also has the CPU, memory and pod
slots, so its cost does not grow with the number of nodes, which is what makes thousands of pods per second on
5,000 nodes possible. A property test holds it to the scored search with the built-in scorer (``search``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from scheduler.placement import capacity, devices, model, nodework, shapes


def find_cpu(cap: capacity.Capacity, shape: shapes.Shape, eligible: tuple[int, ...]) -> shapes.Choice | None:
    """Binpack for a CPU-only pod: the node with the fewest free devices, then the least CPU left after it."""
    classes = cap.classes
    by_order = cap.by_order
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
    return shapes.Choice(work=by_order[best[2]], devices=())


def find_whole(
    cap: capacity.Capacity, shape: shapes.Shape, eligible: tuple[int, ...], *, spread: bool
) -> shapes.Choice | None:
    """Whole GPUs: the node left with the fewest free devices (the most with ``spread``), then node order."""
    classes = cap.classes
    by_order = cap.by_order
    counts = sorted(
        {count for cls in eligible for count, bucket in classes[cls].whole.items() if bucket},
        reverse=spread,
    )
    models = shape.constraints.gpu_models
    for count in counts:
        if count < shape.whole_gpus:
            continue
        best: shapes.Choice | None = None
        for cls in eligible:
            for order in classes[cls].whole.get(count, ()):
                if best is not None and order >= best.work.order:
                    break
                work = by_order[order]
                if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods):
                    continue
                chosen = work.pick_whole(shape.whole_gpus, models)
                if chosen is not None:
                    best = shapes.Choice(work=work, devices=chosen)
                    break
        if best is not None:
            return best
    return None


def find_share(
    cap: capacity.Capacity,
    shape: shapes.Shape,
    milli: int,
    eligible: tuple[int, ...],
    *,
    demanded: tuple[int, ...],
    spread: bool = False,
) -> shapes.Choice | None:
    """A share of one device, node first, binpacked on the device: a node with a shared device (of the share's
    compute mode) the share fits in, the one with the fewest free whole devices (``spread``: the most), and on it the
    best shared device (a remainder of nothing or of a size some pending pod asks for, smallest first; else the
    tightest); else a new group on the node with the fewest (``spread``: the most) free whole devices.

    The built-in scorer ranks a share by (a fitting shared device on the node, the node strategy's order of free
    whole devices, the device parts), so spread walks the same buckets in the opposite order of free whole devices,
    and each bucket exactly as binpack does."""
    classes = cap.classes
    by_order = cap.by_order
    models = shape.constraints.gpu_models
    mode = shape.share.compute_mode if shape.share is not None else model.ComputeMode.TIME_SLICING
    plain = mode is model.ComputeMode.TIME_SLICING  # joins any group of a node that records no other mode
    counts = sorted(
        {count for cls in eligible for count, bucket in classes[cls].shared.items() if bucket}, reverse=spread
    )

    def takes(entry: tuple[int, int, int]) -> bool:
        work = by_order[entry[1]]
        return (
            work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods)
            and work.model_allowed(entry[2], models)
            and ((plain and not work.modes) or work.joinable(entry[2], mode))
        )

    for count in counts:
        buckets = [bucket for cls in eligible if (bucket := classes[cls].shared.get(count))]
        # 1. A shared device left with nothing, or with a remainder some pending pod asks for, smallest first.
        for remainder in (0, *demanded):
            target = milli + remainder
            if target > devices.FULL:
                break
            best = _first_taken(buckets, target, takes, exact=True)
            if best is not None:
                return shapes.Choice(work=by_order[best[1]], devices=(best[2],), share_milli=(milli,))
        # 2. The tightest shared device with room on these nodes.
        best = _first_taken(buckets, milli, takes, exact=False)
        if best is not None:
            return shapes.Choice(work=by_order[best[1]], devices=(best[2],), share_milli=(milli,))
    # 3. Open a new group on a free device of the node with the fewest (spread: most) free devices (one more slot).
    counts = sorted(
        {count for cls in eligible for count, bucket in classes[cls].whole.items() if bucket}, reverse=spread
    )
    for count in counts:
        found: shapes.Choice | None = None
        for cls in eligible:
            for order in classes[cls].whole.get(count, ()):
                if found is not None and order >= found.work.order:
                    break
                work = by_order[order]
                if not work.fits_basics(shape.milli_cpu, shape.memory_bytes, shape.pods + 1):
                    continue
                device = _first_free_device(work, milli, models)
                if device is not None:
                    found = shapes.Choice(work=work, devices=(device,), share_milli=(milli,))
                    break
        if found is not None:
            return found
    return None


def _first_taken(
    buckets: list[list[tuple[int, int, int]]],
    free_milli: int,
    takes: Callable[[tuple[int, int, int]], bool],
    *,
    exact: bool,
) -> tuple[int, int, int] | None:
    """The smallest (free share, node order, device) entry of the buckets that ``takes`` accepts, from ``free_milli``
    up (``exact``: with exactly that free share). Each bucket is sorted, so it is walked only until its first taker or
    past the best so far."""
    best: tuple[int, int, int] | None = None
    for bucket in buckets:
        position = bisect.bisect_left(bucket, (free_milli, -1, -1))
        while position < len(bucket) and (not exact or bucket[position][0] == free_milli):
            entry = bucket[position]
            position += 1
            if best is not None and entry >= best:
                break
            if takes(entry):
                best = entry
                break
    return best


def _first_free_device(work: nodework.NodeWork, milli: int, models: tuple[str, ...]) -> int | None:
    for device, whole in enumerate(work.dev_whole):
        if whole and work.dev_free[device] >= milli and work.model_allowed(device, models):
            return device
    return None

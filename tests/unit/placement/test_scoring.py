"""The scoring seam: explicit lexicographic parts, and the built-in binpack and spread preferences."""

from __future__ import annotations

import pytest

from scheduler.placement import scoring


def _state(free: tuple[int, ...], *, shared: tuple[bool, ...] | None = None) -> scoring.NodeState:
    shared = shared if shared is not None else tuple(0 < value < 1000 for value in free)
    return scoring.NodeState(
        free_milli_cpu=8000,
        free_memory_bytes=1 << 34,
        allocatable_milli_cpu=8000,
        allocatable_memory_bytes=1 << 34,
        device_free_milli=free,
        device_memory_bytes=(1 << 34,) * len(free),
        device_models=("A100",) * len(free),
        device_whole_free=tuple(value == 1000 and not is_shared for value, is_shared in zip(free, shared, strict=True)),
        device_shared=shared,
        device_pod_gpus=tuple(1 if value == 0 else 0 for value in free),
    )


def test_lexicographic_orders_like_the_tuple_of_its_parts() -> None:
    assert scoring.lexicographic(1, 0) > scoring.lexicographic(0, (1 << 21) - 1)
    assert scoring.lexicographic(2, 3) > scoring.lexicographic(2, 2)
    with pytest.raises(ValueError, match="outside"):
        scoring.lexicographic(1 << 21)


def test_binpack_joins_a_shared_device_before_opening_a_free_one() -> None:
    scorer = scoring.builtin(node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK, demanded=(250,))
    request = scoring.GpuRequest(share_milli=250, share_devices=1)
    state = _state((1000, 600))
    assert scorer(state, request, (1,)) > scorer(state, request, (0,))


def test_binpack_prefers_leaving_a_hole_of_a_demanded_size() -> None:
    scorer = scoring.builtin(node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK, demanded=(250, 500))
    request = scoring.GpuRequest(share_milli=250, share_devices=1)
    state = _state((300, 750))
    # 750 - 250 leaves 500, which a pending pod asks for; 300 - 250 leaves 50, which nobody can use
    assert scorer(state, request, (1,)) > scorer(state, request, (0,))


def test_binpack_keeps_nodes_with_many_free_devices_for_big_requests() -> None:
    scorer = scoring.builtin(node=scoring.Strategy.BINPACK, device=scoring.Strategy.BINPACK)
    request = scoring.GpuRequest(whole_gpus=1)
    busy, empty = _state((0, 0, 1000, 1000)), _state((1000,) * 4)
    assert scorer(busy, request, (2,)) > scorer(empty, request, (0,))


def test_spread_prefers_the_emptiest_node_and_a_free_device() -> None:
    scorer = scoring.builtin(node=scoring.Strategy.SPREAD, device=scoring.Strategy.SPREAD)
    busy, empty = _state((0, 0, 1000, 1000)), _state((1000,) * 4)
    assert scorer(empty, scoring.GpuRequest(whole_gpus=1), (0,)) > scorer(busy, scoring.GpuRequest(whole_gpus=1), (2,))
    share = scoring.GpuRequest(share_milli=250, share_devices=1)
    state = _state((1000, 600))
    assert scorer(state, share, (0,)) > scorer(state, share, (1,))

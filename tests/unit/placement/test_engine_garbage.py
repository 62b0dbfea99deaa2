"""A cycle leaves no cyclic garbage: the scheduler freezes what a busy cycle keeps instead of collecting it
(``scheduler.gcpolicy``), so a reference cycle among a cycle's objects (a cache holding a closure over the scene that
holds the cache, say) would keep every cycle's working state alive until the next full collection."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator

import pytest

from scheduler.placement import applying, engine, model
from tests.unit.placement import builders

NS = 1_000_000_000


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The collector off while the test runs (nothing collected behind its back), as it found it after."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _full_cluster_with_a_waiting_pod() -> model.Snapshot:
    """Three 2-GPU nodes running four one-GPU pods, the last two CPU-hungry; a 2-GPU pod waits: consolidation walks its
    steps node by node (two failed tries, then room), reclaim and preemption look too."""
    nodes = [builders.node(f"n{index}", gpus=2, cpu=16_000, labels={"slot": f"n{index}"}) for index in range(3)]
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=[], now_ns=NS)
    for index, (uid, node, cpu) in enumerate(
        (("a", "n0", 2000), ("b", "n0", 2000), ("c", "n1", 12000), ("d", "n2", 10000))
    ):
        pod = dataclasses.replace(builders.pod(uid, gpus=1, cpu=cpu, created=index), node_selector=(("slot", node),))
        group = builders.group(uid, pod, created=index)
        snapshot = dataclasses.replace(snapshot, groups={**snapshot.groups, group.id: group})
        snapshot = applying.apply(snapshot, engine.Engine().run(snapshot), now_ns=(index + 2) * NS)
    running = {
        gid: dataclasses.replace(
            group, members=tuple(dataclasses.replace(pod, node_selector=()) for pod in group.members)
        )
        for gid, group in snapshot.groups.items()
    }
    waiting = builders.group("p", builders.pod("p", gpus=2, cpu=2000, created=10), created=10)
    return dataclasses.replace(snapshot, groups={**running, waiting.id: waiting}, now_ns=10 * NS)


def test_cycles_that_make_room_leave_no_cyclic_garbage(collector_off: None) -> None:
    snapshot = _full_cluster_with_a_waiting_pod()
    gc.collect()
    warm = engine.Engine()
    for second in range(3):
        result = warm.run(dataclasses.replace(snapshot, now_ns=(10 + second) * NS))
        assert result.evictions, "room was made (the cycle went through the room-making actions)"
    del result
    assert gc.collect() == 0, "a cycle's objects were left in reference cycles"

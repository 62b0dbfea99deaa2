"""Small clusters several placement tests share, each built the way the engine would leave it."""

from __future__ import annotations

import dataclasses

from scheduler.placement import applying, engine, model
from tests.unit.placement import builders

NS = 1_000_000_000


def awaiting_consolidation() -> model.Snapshot:
    """Three 2-GPU nodes: one-GPU pods ``a`` and ``b`` on ``n0``, ``c`` (12 CPUs) on ``n1``, ``d`` (10 CPUs) on ``n2``,
    each placed by a cycle of its own; a 2-GPU pod ``p`` waits. Consolidation's walk finds ``n2`` ready first, then
    ``n1``: neither try can move its victim (no node has the CPUs and a GPU for it); ``n0`` is ready third, and then
    every victim moves."""
    nodes = [builders.node(f"n{index}", gpus=2, cpu=16_000, labels={"slot": f"n{index}"}) for index in range(3)]
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=[], now_ns=NS)
    placed = (("a", "n0", 2000), ("b", "n0", 2000), ("c", "n1", 12000), ("d", "n2", 10000))
    for index, (uid, node, cpu) in enumerate(placed):
        pod = dataclasses.replace(builders.pod(uid, gpus=1, cpu=cpu, created=index), node_selector=(("slot", node),))
        group = builders.group(uid, pod, created=index)
        snapshot = dataclasses.replace(snapshot, groups={**snapshot.groups, group.id: group})
        snapshot = applying.apply(snapshot, engine.Engine().run(snapshot), now_ns=(index + 2) * NS)
    # Placed where the tests want them; free to move from now on.
    running = {
        gid: dataclasses.replace(
            group, members=tuple(dataclasses.replace(pod, node_selector=()) for pod in group.members)
        )
        for gid, group in snapshot.groups.items()
    }
    waiting = builders.group("p", builders.pod("p", gpus=2, cpu=2000, created=10), created=10)
    return dataclasses.replace(snapshot, groups={**running, waiting.id: waiting}, now_ns=10 * NS)

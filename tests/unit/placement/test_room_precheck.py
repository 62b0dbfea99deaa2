"""Room-making's precheck: once an attempt for some shapes failed in a cycle, a later attempt for the same shapes (a
group of another queue, say) first asks whether any node could gain room at all with every candidate gone, and
gives up without the scan when none could.

The precheck is a necessary condition only: it never changes what is placed, evicted or nominated. Here a full 2-GPU
node holds, on GPU 0, a share of queue ``a`` (over its fair share: a giver) and a share of queue ``c`` that is not
preemptible, and on GPU 1 a whole pod of ``c``. Queues ``b1`` and ``b2`` each ask for a whole GPU. No eviction can
give one: ``c``'s share stays on GPU 0 whatever ``a`` gives up. ``x`` (of ``b1``) finds so by scanning; ``z`` (of
``b2``, which KAI's scheduling signatures do not skip, being another queue) is answered by the precheck. The
cluster sets a reclaim eviction budget (``reclaim_eviction_multiple``), which changes nothing here but keeps these
one-pod reclaims on the walk: without one, room-making finds a one-pod group's first step node by node
(``earliest``), whose bounds answer such a cluster as fast, and the precheck is not asked.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from scheduler.placement import applying, engine, model, roommaking, status
from tests.unit.placement import builders

NS = 1_000_000_000
A, B1, B2, C = (model.QueueName(name) for name in ("a", "b1", "b2", "c"))
NO_QUOTA = model.QueueResource(quota=0, limit=model.UNLIMITED, over_quota_weight=0)


def _queues() -> list[model.Queue]:
    parent = model.QueueName("parent")
    return [
        model.Queue(name=parent),
        model.Queue(name=A, parent=parent, gpu=NO_QUOTA),
        model.Queue(name=B1, parent=parent),
        model.Queue(name=B2, parent=parent),
        model.Queue(name=C, parent=parent),
    ]


def _cluster() -> model.Snapshot:
    """The full node, placed by the engine (binpack puts both shares on GPU 0), then ``x`` and ``z``."""
    running = [
        builders.group("a-share", builders.pod("a-share", fraction=500), queue=A),
        builders.group("c-share", builders.pod("c-share", fraction=500), queue=C, priority=100, created=1),
        builders.group("c-whole", builders.pod("c-whole", gpus=1), queue=C, priority=100, created=2),
    ]
    config = dataclasses.replace(model.DEFAULT_CONFIG, gpu_strategy=model.Strategy.BINPACK, reclaim_eviction_multiple=1)
    first = model.snapshot(
        nodes=[builders.node("n0", gpus=2)], queues=_queues(), groups=running, now_ns=NS, config=config
    )
    placed = engine.Engine().run(first)
    assert len(placed.placements) == 3
    after = applying.apply(first, placed, now_ns=2 * NS)
    devices = after.nodes[model.NodeName("n0")].devices
    assert [device.allotted_milli_gpu for device in devices] == [1000, 1000]
    assert devices[0].gpu_group is not None, "both shares share GPU 0"
    pending = [
        builders.group("x", builders.pod("x", gpus=1), queue=B1, created=10),
        builders.group("z", builders.pod("z", gpus=1), queue=B2, created=11),
    ]
    return dataclasses.replace(after, groups={**after.groups, **{group.id: group for group in pending}}, now_ns=3 * NS)


@contextmanager
def _counting(*, precheck: bool) -> Iterator[collections.Counter[str]]:
    """Count scans and prechecks per group and action; with ``precheck`` False the precheck always says "maybe"."""
    counted: collections.Counter[str] = collections.Counter()
    scan, could_gain = roommaking._Search.run, roommaking._Search.could_gain

    def counting_scan(self: Any) -> bool:
        counted[f"scan {self.group.id} {self.reason.value}"] += 1
        return bool(scan(self))

    def counting_precheck(self: Any) -> bool:
        counted[f"precheck {self.group.id} {self.reason.value}"] += 1
        return bool(could_gain(self)) if precheck else True

    with (
        mock.patch.object(roommaking._Search, "run", counting_scan),
        mock.patch.object(roommaking._Search, "could_gain", counting_precheck),
    ):
        yield counted


def test_a_second_queue_asking_for_shapes_no_eviction_can_serve_is_answered_without_a_scan() -> None:
    with _counting(precheck=True) as counted:
        result = engine.Engine().run(_cluster())
    assert not result.evictions and not result.nominations
    assert counted["scan x reclaim"] == 1 and counted["precheck x reclaim"] == 0, counted
    assert counted["precheck z reclaim"] == 1 and counted["scan z reclaim"] == 0, counted
    for pending in ("x", "z"):
        waiting = result.statuses[model.GroupId(pending)]
        assert waiting.reason is status.Reason.NO_GPU_FITS
        assert waiting.message.endswith(
            "not reclaimed: evicting every victim the queues allow would not make room for it"
        )


def test_the_precheck_changes_nothing_that_is_placed_evicted_or_nominated() -> None:
    snapshot = _cluster()
    with _counting(precheck=True):
        checked = engine.Engine().run(snapshot)
    with _counting(precheck=False) as counted:
        scanned = engine.Engine().run(snapshot)
    assert counted["scan z reclaim"] == 1, "without the precheck, z's reclaim scans"
    assert builders.decisions(checked) == builders.decisions(scanned)

"""The walk's first step found node by node (``earliest``, ``roommaking._Search._first_step``).

The property test in ``test_eviction_properties`` checks that every such first step ends where the walk's does, on
random clusters. This pins the window an attempt looks at: its bound counts the candidates of the action's queues
only, evicted ones included, as the walk draws them.
"""

from __future__ import annotations

import dataclasses

from scheduler.placement import earliest, model, victims
from tests.unit.placement import builders


def _unit(uid: str, queue: str, node: str) -> victims.Unit:
    pod = dataclasses.replace(
        builders.pod(uid, gpus=1), node=model.NodeName(node), phase=model.PodPhase.RUNNING, devices=(0,)
    )
    return victims.units(builders.group(uid, pod, queue=queue), ())[0]


def test_an_attempts_window_ends_after_as_many_units_of_its_queues_as_it_may_look_at() -> None:
    units = [_unit(f"u{index}", "a" if index % 3 else "b", f"n{index % 2}") for index in range(12)]
    positions = earliest.Positions(units)
    a, b = model.QueueName("a"), model.QueueName("b")
    # Queue b's units are at 0, 3, 6, 9: the third from position 1 on is at 9, so the window ends at 10.
    assert positions.window_end(1, [b], 3) == 10
    assert positions.window_end(0, [b], 4) == 10
    assert positions.window_end(0, [b], 5) == 12  # fewer units of b than that: the list's end
    assert positions.window_end(0, [a, b], 5) == 5
    assert positions.window_end(0, [model.QueueName("none")], 1) == 12
    assert positions.by_node[model.NodeName("n1")] == [1, 3, 5, 7, 9, 11]

"""Statuses of groups a cycle leaves pending: a backlog of groups alike but for their names shares the work of
explaining them (``pending.Explainer.alone``), and each still gets the status it would get alone."""

from __future__ import annotations

import dataclasses

from scheduler.placement import engine, model, plan, status
from tests.unit.placement import builders


def _snapshot(*names: str) -> model.Snapshot:
    """One 1-GPU node and a one-GPU pod per name, in that order: the first is placed, the others wait."""
    groups = [
        builders.group(name, builders.pod(name, gpus=1, created=index), created=index)
        for index, name in enumerate(names)
    ]
    return model.snapshot(nodes=[builders.node("n0", gpus=1)], queues=builders.open_queues(), groups=groups, now_ns=0)


def _statuses(*names: str) -> dict[model.GroupId, status.Status]:
    result: plan.Plan = engine.Engine().run(_snapshot(*names))
    return dict(result.statuses)


def test_groups_alike_but_for_their_names_each_get_the_status_they_get_alone() -> None:
    together = _statuses("first", "second", "third")
    alone = _statuses("first", "second")
    second, third = together[model.GroupId("second")], together[model.GroupId("third")]
    assert second == alone[model.GroupId("second")]
    assert "default/second" in second.message and "third" not in second.message
    assert third == dataclasses.replace(second, message=second.message.replace("default/second", "default/third"))

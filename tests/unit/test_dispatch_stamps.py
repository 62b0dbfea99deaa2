"""KAI's ``kai.scheduler/last-eviction-timestamp``: the dispatcher has the binder stamp a PodGroup once pods of it
were evicted to make room (issue 16), which re-arms the group's preemption delay; a stale gang is not stamped, as in
KAI; a gang's evictions write it once."""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from scheduler.kube import kubeapi
from scheduler.objects import podgroups, pods
from scheduler.placement import decisions, model, plan
from tests.unit.test_dispatch import World
from tests.unit.test_dispatch import world as world  # the fixture

WALL_S = 1_767_225_600.7  # 2026-01-01T00:00:00.7Z


async def _running_gang(world: World, name: str, *, size: int = 1) -> list[dict[str, Any]]:
    """``size`` running pods of one PodGroup ``pg-<name>``, in the API and the state."""
    group_body = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": f"pg-{name}", "namespace": "ml"},
        "spec": {"minMember": size, "queue": "team"},
    }
    group = podgroups.decode(await world.api.create(kubeapi.POD_GROUPS, group_body, namespace="ml"))
    assert group is not None
    world.state.put_podgroup(group)
    made = []
    for index in range(size):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}",
                "namespace": "ml",
                "annotations": {names.POD_GROUP_ANNOTATION: f"pg-{name}"},
            },
            "spec": {"schedulerName": "quotient", "nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        }
        created = await world.api.create(kubeapi.PODS, body, namespace="ml")
        record = pods.decode(created)
        assert record is not None
        world.state.put_pod(record)
        made.append(created)
    return made


def _evictions(pods: list[dict[str, Any]], group: str, reason: decisions.EvictionReason) -> plan.Plan:
    found = tuple(
        decisions.Eviction(
            pod=model.PodUid(pod["metadata"]["uid"]),
            group=model.GroupId(f"ml/{group}"),
            node=model.NodeName("n1"),
            reason=reason,
            beneficiary=None,
            message=f"{reason.value} for ml/other",
        )
        for pod in pods
    )
    return plan.Plan(placements=(), evictions=found, statuses={})


async def _annotations(world: World, group: str) -> dict[str, str]:
    stored = await world.api.get(kubeapi.POD_GROUPS, name=group, namespace="ml")
    assert stored is not None
    return dict(stored["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    "reason",
    [decisions.EvictionReason.RECLAIM, decisions.EvictionReason.PREEMPT, decisions.EvictionReason.CONSOLIDATE],
)
async def test_a_group_evicted_to_make_room_is_stamped_with_the_eviction_time_once(
    world: World, reason: decisions.EvictionReason
) -> None:
    world.dispatcher._wall_clock_s = lambda: WALL_S
    gang = await _running_gang(world, "victim", size=3)

    world.dispatch(_evictions(gang, "pg-victim", reason))
    await world.binder.drain()

    assert (await _annotations(world, "pg-victim"))[names.LAST_EVICTION_ANNOTATION] == "2026-01-01T00:00:00Z"
    patches = [call for call in world.api.calls if call[0] == "patch" and call[1] == "pg-victim"]
    assert len(patches) == 1, f"one write for the gang's three evictions: {patches}"


async def test_a_stale_gang_is_not_stamped_as_kai_stamps_only_its_statements_evictions(world: World) -> None:
    world.dispatcher._wall_clock_s = lambda: WALL_S
    gang = await _running_gang(world, "stale", size=2)

    world.dispatch(_evictions(gang, "pg-stale", decisions.EvictionReason.STALE_GANG))
    await world.binder.drain()

    assert names.LAST_EVICTION_ANNOTATION not in await _annotations(world, "pg-stale")


async def test_an_eviction_that_did_not_happen_stamps_nothing(world: World) -> None:
    world.dispatcher._wall_clock_s = lambda: WALL_S
    gang = await _running_gang(world, "safe")
    await world.api.delete(kubeapi.PODS, name="safe-0", namespace="ml")

    world.dispatch(_evictions(gang, "pg-safe", decisions.EvictionReason.PREEMPT))
    await world.binder.drain()

    assert names.LAST_EVICTION_ANNOTATION not in await _annotations(world, "pg-safe")

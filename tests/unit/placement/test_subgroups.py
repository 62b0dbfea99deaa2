"""KAI's subgroup trees, task order, minMember 0 and compute modes in the placement core (issue 16): the pieces the
scenario tables (``tests/scenarios/placement/{subgroups,taskorder,computemodes}.yaml``) do not show directly."""

from __future__ import annotations

import dataclasses

from scheduler.placement import applying, engine, gangs, model, subgroups, victims
from tests.unit.placement import builders


def _member(uid: str, subgroup: str | None, *, running: bool = False, task: int | None = None) -> model.Pod:
    pod = dataclasses.replace(builders.pod(uid, gpus=1), subgroup=subgroup, task_order=model.task_order(task))
    if running:
        pod = dataclasses.replace(pod, phase=model.PodPhase.RUNNING, node=model.NodeName("n1"), devices=(0,))
    return pod


def _tree_group(*members: model.Pod, min_subgroup: int | None = None, **leaves: int) -> model.Group:
    return dataclasses.replace(
        builders.group("job", *members, min_member=0),
        subgroups=tuple(model.SubGroup(name=name, min_member=minimum) for name, minimum in leaves.items()),
        min_subgroup=min_subgroup,
    )


def test_a_tree_holds_when_min_subgroup_of_its_children_do() -> None:
    shape = subgroups.tree(
        (model.SubGroup(name="a", min_member=2), model.SubGroup(name="b", min_member=1)), min_subgroup=1
    )

    assert subgroups.holds(shape, {"a": 2})
    assert subgroups.holds(shape, {"b": 1})
    assert not subgroups.holds(shape, {"a": 1})
    assert subgroups.shortfall(shape, {"a": 1}) == "0 satisfied of the 1 of its top-level subgroups"


def test_every_child_needed_names_the_one_that_falls_short() -> None:
    shape = subgroups.tree(
        (
            model.SubGroup(name="decode"),
            model.SubGroup(name="leaders", parent="decode", min_member=1),
            model.SubGroup(name="workers", parent="decode", min_member=2),
        ),
        min_subgroup=None,
    )

    assert shape.leaves[subgroups.ROOT] == ("leaders", "workers")
    assert subgroups.shortfall(shape, {"leaders": 1, "workers": 1}) == "1 of the 2 members subgroup workers needs"


def test_a_parent_that_does_not_exist_or_loops_hangs_the_subgroup_under_the_group() -> None:
    shape = subgroups.tree(
        (
            model.SubGroup(name="a", parent="b", min_member=1),
            model.SubGroup(name="b", parent="a", min_member=1),
            model.SubGroup(name="c", parent="nowhere", min_member=1),
            model.SubGroup(name="d", parent="c", min_member=1),
        ),
        min_subgroup=None,
    )

    assert shape.parents == {"a": subgroups.ROOT, "b": subgroups.ROOT, "c": subgroups.ROOT, "d": "c"}
    assert shape.nodes[subgroups.ROOT].children == ("a", "b", "c")


def test_the_minimum_brings_the_group_up_to_min_subgroup_and_the_rest_are_whole_replicas_after_it() -> None:
    group = _tree_group(
        *(_member(f"r{replica}-{index}", f"r{replica}") for replica in range(3) for index in range(2)),
        min_subgroup=2,
        r0=2,
        r1=2,
        r2=2,
    )

    needs = gangs.needs(group)

    assert [pod.uid for pod in needs.minimum] == ["r0-0", "r0-1", "r1-0", "r1-1"]
    assert [[pod.uid for pod in step] for step in needs.extras] == [["r2-0", "r2-1"]]
    assert needs.missing == 0


def test_the_elastic_steps_of_a_satisfied_tree_follow_kais_subgroup_order() -> None:
    # a: 1 of 1 running (ratio 1), b: 3 of 2 (ratio 1.5): a's pod first, then a is at 2 (ratio 2), so b's.
    group = _tree_group(
        _member("a-run", "a", running=True),
        *(_member(f"b-run{index}", "b", running=True) for index in range(3)),
        _member("a-new0", "a"),
        _member("a-new1", "a"),
        _member("b-new", "b"),
        a=1,
        b=2,
    )

    needs = gangs.needs(group)

    assert needs.minimum == ()
    assert [[pod.uid for pod in step] for step in needs.extras] == [["a-new0"], ["b-new"], ["a-new1"]]


def test_pending_members_are_taken_in_kais_task_order() -> None:
    group = builders.group(
        "job",
        _member("unlabelled", None),
        _member("low", None, task=1),
        _member("high", None, task=9),
        dataclasses.replace(_member("garbled", None), task_order=model.task_order(None, unreadable=True)),
        min_member=2,
    )

    needs = gangs.needs(group)

    assert [pod.uid for pod in needs.minimum] == ["high", "low"]
    assert [step[0].uid for step in needs.extras] == ["garbled", "unlabelled"]


def test_min_member_zero_has_no_minimum_and_is_never_below_it() -> None:
    group = builders.group("job", _member("a", None), _member("b", None, running=True), min_member=0)

    assert gangs.needs(group).minimum == ()
    assert gangs.below_minimum(group, evicted={model.PodUid("b")}) is None


def test_a_replica_beyond_min_subgroup_is_one_victim_unit_and_a_replica_at_its_minimum_gives_no_single_pod() -> None:
    group = _tree_group(
        *(_member(f"r{replica}-{index}", f"r{replica}", running=True) for replica in range(3) for index in range(2)),
        min_subgroup=2,
        r0=2,
        r1=2,
        r2=2,
    )

    units = victims.units(group, ())

    assert [[pod.uid for pod in unit.pods] for unit in units if unit.extra] == [
        ["r0-0", "r0-1"],
        ["r1-0", "r1-1"],
        ["r2-0", "r2-1"],
    ]
    assert not units[-1].extra and len(units[-1].pods) == 6
    first = units[0]
    assert victims.can_take(first, ())
    # Once one replica is gone, the group is at its minimum: no other replica may go.
    assert not victims.can_take(units[1], {model.PodUid("r0-0"), model.PodUid("r0-1")})


def test_elastic_pods_are_evicted_in_reverse_task_order() -> None:
    group = builders.group(
        "job",
        _member("high", None, running=True, task=9),
        _member("low", None, running=True, task=1),
        _member("none", None, running=True),
        min_member=1,
    )

    ordered = sorted(victims.units(group, ()), key=lambda unit: unit.order_key)

    assert [unit.pods[0].uid for unit in ordered if len(unit.pods) == 1] == ["none", "low", "high"]


def test_an_applied_plan_keeps_the_group_mode_so_a_later_share_of_another_mode_goes_elsewhere() -> None:
    node = builders.node("n1", gpus=2)
    sm = builders.pod("sm", fraction=250)
    assert sm.share is not None
    sm = dataclasses.replace(sm, share=dataclasses.replace(sm.share, compute_mode=model.ComputeMode.SM_SHARING))
    snapshot = model.snapshot(
        nodes=[node], queues=builders.open_queues(), groups=[builders.group("sm", sm)], now_ns=10**9
    )
    first = engine.Engine().run(snapshot)
    after = applying.apply(snapshot, first)

    [device] = [device for device in after.nodes[model.NodeName("n1")].devices if device.gpu_group is not None]
    assert device.compute_mode is model.ComputeMode.SM_SHARING
    later = dict(after.groups)
    later[model.GroupId("ts")] = builders.group("ts", builders.pod("ts", fraction=250))
    second = engine.Engine().run(dataclasses.replace(after, groups=later))
    [placement] = second.placements
    assert placement.devices != (device.index,)

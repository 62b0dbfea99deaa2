"""The chaos run's invariants, over hand-made observations: each one holds on a healthy cluster and is violated by
the case it exists for (and only then)."""

from __future__ import annotations

import dataclasses

import pytest

from quotient.bench import chaos_invariants as inv
from quotient.bench.chaos_invariants import GroupSeen, Invariant, Observation, PodChange, PodSeen, Window


def pod(name: str, **fields: object) -> PodSeen:
    return PodSeen(uid=f"uid-{name}", namespace="chaos", name=name, **fields)  # type: ignore[arg-type]


def whole(name: str, node: str, *devices: int, real: tuple[int, ...] | None = None) -> PodSeen:
    return pod(
        name,
        node=node,
        phase="Running",
        whole_gpus=len(devices),
        scheduled_devices=devices,
        real_devices=devices if real is None else real,
    )


def share(name: str, node: str, device: int, milli: int, *, real: int | None = None) -> PodSeen:
    return pod(
        name,
        node=node,
        phase="Running",
        share_milli=milli,
        scheduled_devices=(device,),
        real_devices=(device if real is None else real,),
    )


def reservation(name: str, node: str, device: int) -> PodSeen:
    return PodSeen(
        uid=f"uid-{name}",
        namespace="quotient-reservation",
        name=name,
        node=node,
        phase="Running",
        ours=False,
        reservation=True,
        whole_gpus=1,
        real_devices=(device,),
    )


def invariants(violations: list[inv.Violation]) -> list[Invariant]:
    return [violation.invariant for violation in violations]


# --- no pod bound twice ----------------------------------------------------------------------------------------------


def change(at_s: float, before: str, after: str, uid: str = "uid-a") -> PodChange:
    return PodChange(at_s=at_s, uid=uid, namespace="chaos", name="a", node_before=before, node_after=after)


def test_a_pod_bound_once_and_then_deleted_violates_nothing() -> None:
    checker = inv.Checker()
    assert checker.on_change(change(1.0, "", "node-0")) == []
    assert checker.on_change(change(2.0, "node-0", "node-0")) == []


def test_a_pod_whose_node_changes_is_bound_twice() -> None:
    checker = inv.Checker()
    checker.on_change(change(1.0, "", "node-0"))
    [violation] = checker.on_change(change(2.0, "node-0", "node-1"))
    assert violation.invariant is Invariant.BOUND_TWICE
    assert "node-0 to node-1" in violation.detail and violation.obj == "pod chaos/a"


def test_a_pod_that_gets_a_node_a_second_time_is_bound_twice() -> None:
    checker = inv.Checker()
    checker.on_change(change(1.0, "", "node-0"))
    checker.on_change(change(2.0, "node-0", ""))
    [violation] = checker.on_change(change(3.0, "", "node-2"))
    assert violation.invariant is Invariant.BOUND_TWICE and "first to node-0" in violation.detail


def test_another_pod_of_the_same_name_is_a_new_pod() -> None:
    checker = inv.Checker()
    checker.on_change(change(1.0, "", "node-0", uid="first"))
    assert checker.on_change(change(5.0, "", "node-1", uid="second")) == []


# --- no device over-committed ----------------------------------------------------------------------------------------


def test_whole_gpus_shares_and_their_reservations_on_distinct_devices_are_fine() -> None:
    pods = [
        whole("w", "n", 0, 1),
        share("s1", "n", 2, 500),
        share("s2", "n", 2, 500),
        reservation("r", "n", 2),
        whole("other-node", "m", 0),
    ]
    assert inv.overcommitted(pods, at_s=1.0) == []


@pytest.mark.parametrize(
    ("pods", "what"),
    [
        ([whole("a", "n", 0), whole("b", "n", 0, real=(1,))], "scheduled to more than one whole-GPU pod"),
        ([whole("a", "n", 0, real=(3,)), share("s", "n", 0, 250, real=1)], "scheduled whole and shared at once"),
        ([share("a", "n", 1, 750), share("b", "n", 1, 500, real=2)], "shares scheduled beyond one device"),
        ([whole("a", "n", 0), whole("b", "n", 1, real=(0,))], "allocated to more than one pod by the device plugin"),
        ([whole("a", "n", 0), share("s", "n", 1, 500, real=0)], "shares run on a device given whole to a pod"),
        (
            [share("a", "n", 1, 750, real=3), share("b", "n", 2, 500, real=3), reservation("r", "n", 3)],
            "shares run beyond one device",
        ),
    ],
)
def test_a_device_given_beyond_what_it_holds_is_over_committed(pods: list[PodSeen], what: str) -> None:
    found = inv.overcommitted(pods, at_s=1.0)
    assert [violation.detail.split(":")[0] for violation in found] == [what]
    assert found[0].invariant is Invariant.DEVICE_OVERCOMMITTED and found[0].obj.startswith("node n gpu ")


def test_pods_that_finished_hold_nothing_but_pods_being_deleted_still_do() -> None:
    done = dataclasses.replace(whole("done", "n", 0), phase="Succeeded")
    assert inv.overcommitted([done, whole("next", "n", 0)], at_s=1.0) == []
    leaving = dataclasses.replace(whole("leaving", "n", 0), deleting=True)
    assert invariants(inv.overcommitted([leaving, whole("next", "n", 0, real=(1,))], at_s=1.0)) == [
        Invariant.DEVICE_OVERCOMMITTED
    ]


def test_a_pod_the_kubelet_refused_at_admission_means_its_node_was_over_committed() -> None:
    refused = pod("late", node="n", phase="Failed", reason="UnexpectedAdmissionError")
    failed_by_itself = pod("crashed", node="n", phase="Failed", reason="Error")
    [violation] = inv.refused_at_admission([refused, failed_by_itself], at_s=3.0)
    assert violation.obj == "pod chaos/late" and "UnexpectedAdmissionError" in violation.detail


# --- no gang half bound past its grace -------------------------------------------------------------------------------


GANG = GroupSeen(namespace="chaos", name="gang", min_member=3, conditions=("NotEnoughResources",))


def gang_members(bound: int) -> list[PodSeen]:
    return [
        pod(f"gang-{i}", pod_group="gang", node="n" if i < bound else "", phase="Running" if i < bound else "Pending")
        for i in range(3)
    ]


def test_a_gang_half_bound_for_longer_than_its_grace_is_reported_once_it_is() -> None:
    checker = inv.Checker(inv.Graces(gang_s=30.0))
    for at in (0.0, 15.0, 30.0):
        assert checker.on_observation(Observation(at_s=at, pods=gang_members(2), groups=[GANG]), []) == []
    [violation] = checker.on_observation(Observation(at_s=31.0, pods=gang_members(2), groups=[GANG]), [])
    assert violation.invariant is Invariant.GANG_HALF_BOUND and "2 of minMember 3" in violation.detail


def test_a_gang_whole_or_not_started_is_never_half_bound() -> None:
    checker = inv.Checker(inv.Graces(gang_s=1.0))
    for at, bound in ((0.0, 0), (10.0, 3), (20.0, 3), (30.0, 0)):
        assert checker.on_observation(Observation(at_s=at, pods=gang_members(bound), groups=[GANG]), []) == []


def test_a_gang_that_becomes_whole_again_starts_its_grace_afresh() -> None:
    checker = inv.Checker(inv.Graces(gang_s=30.0))
    checker.on_observation(Observation(at_s=0.0, pods=gang_members(1), groups=[GANG]), [])
    checker.on_observation(Observation(at_s=20.0, pods=gang_members(3), groups=[GANG]), [])
    assert checker.on_observation(Observation(at_s=40.0, pods=gang_members(2), groups=[GANG]), []) == []


def test_a_disruptive_fault_gives_a_half_bound_gang_its_grace_again_after_it_settled() -> None:
    checker = inv.Checker(inv.Graces(gang_s=30.0, settle_s=10.0))
    kill = Window(kind="scheduler_kill", start_s=5.0, end_s=20.0)
    checker.on_observation(Observation(at_s=0.0, pods=gang_members(2), groups=[GANG]), [kill])
    assert checker.on_observation(Observation(at_s=45.0, pods=gang_members(2), groups=[GANG]), [kill]) == []
    assert checker.on_observation(Observation(at_s=61.0, pods=gang_members(2), groups=[GANG]), [kill]) != []


# --- every pending pod has a reason ----------------------------------------------------------------------------------


def test_a_pod_waiting_without_a_reason_past_the_grace_is_reported() -> None:
    checker = inv.Checker(inv.Graces(pending_s=20.0))
    assert checker.on_observation(Observation(at_s=0.0, pods=[pod("silent")]), []) == []
    assert checker.on_observation(Observation(at_s=20.0, pods=[pod("silent")]), []) == []
    [violation] = checker.on_observation(Observation(at_s=21.0, pods=[pod("silent")]), [])
    assert violation.invariant is Invariant.PENDING_WITHOUT_REASON and violation.obj == "pod chaos/silent"


@pytest.mark.parametrize(
    ("waiting", "groups"),
    [
        (pod("told", has_reason=True), []),
        (pod("in-group", pod_group="g"), [GroupSeen(namespace="chaos", name="g", min_member=1, conditions=("x",))]),
        (pod("reservation", ours=False, reservation=True), []),
        (pod("other-scheduler", ours=False), []),
        (pod("leaving", deleting=True), []),
    ],
)
def test_a_pod_with_a_reason_or_not_ours_to_explain_is_never_reported(
    waiting: PodSeen, groups: list[GroupSeen]
) -> None:
    checker = inv.Checker(inv.Graces(pending_s=1.0))
    for at in (0.0, 100.0):
        assert checker.on_observation(Observation(at_s=at, pods=[waiting], groups=groups), []) == []


def test_the_schedulers_downtime_does_not_count_against_a_waiting_pod() -> None:
    checker = inv.Checker(inv.Graces(pending_s=20.0, settle_s=10.0))
    down = Window(kind="scheduler_kill", start_s=2.0, end_s=None)
    checker.on_observation(Observation(at_s=0.0, pods=[pod("p")]), [down])
    assert checker.on_observation(Observation(at_s=60.0, pods=[pod("p")]), [down]) == []
    up = dataclasses.replace(down, end_s=60.0)
    assert checker.on_observation(Observation(at_s=85.0, pods=[pod("p")]), [up]) == []
    assert checker.on_observation(Observation(at_s=91.0, pods=[pod("p")]), [up]) != []


def test_quiet_since_counts_from_the_last_settled_fault() -> None:
    windows = [Window(kind="a", start_s=10.0, end_s=12.0), Window(kind="b", start_s=30.0, end_s=35.0)]
    assert inv.quiet_since(0.0, now_s=100.0, windows=windows, settle_s=5.0) == 40.0
    assert inv.quiet_since(0.0, now_s=38.0, windows=windows, settle_s=5.0) is None
    assert inv.quiet_since(50.0, now_s=100.0, windows=windows, settle_s=5.0) == 50.0
    assert inv.quiet_since(0.0, now_s=20.0, windows=windows, settle_s=5.0) == 17.0

"""The over-consumption, ghost and stray detector: grace periods, tolerance edges, neighbours, the evict policy,
ghosts, unattributed memory and foreign claims, as tables of observations and expected transitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import wire
from scheduler.telemetry import detector, overuse
from tests.unit.telemetry.builders import GIB, NODE, SETTINGS, S, gpu, pod, proc, sample, view

OVER = overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION
GHOST = overuse.AlertName.GHOST_ALLOCATION
STRAY = overuse.AlertName.UNATTRIBUTED_GPU_MEMORY
FIRING = wire.AlertState.FIRING
RESOLVED = wire.AlertState.RESOLVED


def run_pod_a(
    watch: detector.OveruseDetector,
    steps: Sequence[tuple[float, float]],
    *,
    policy: overuse.OverusePolicy | None = None,
) -> list[tuple[float, overuse.Transition | overuse.Eviction]]:
    """Feed pod ``a`` (20 GiB on GPU 0) using ``gib`` at ``at_s`` for each step; collect what was decided when."""
    policies = {} if policy is None else {"team-a": policy}
    node_view = view(pod("a"), policies=policies)
    out: list[tuple[float, overuse.Transition | overuse.Eviction]] = []
    for at_s, gib in steps:
        result = watch.observe(sample(gpu(0, proc(10, gib, "a")), at_s=at_s), node_view, now_ns=int(at_s * S))
        out.extend((at_s, t) for t in result.transitions)
        out.extend((at_s, e) for e in result.evictions)
    return out


def events(decided: list[tuple[float, overuse.Transition | overuse.Eviction]]) -> list[tuple[float, str]]:
    return [(at_s, f"{d.name}:{d.state}" if isinstance(d, overuse.Transition) else "evict") for at_s, d in decided]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([(t, 30) for t in range(10)], [], id="over for just under the grace: nothing yet"),
        pytest.param([(t, 30) for t in range(11)], [(10, f"{OVER}:firing")], id="fires at exactly the grace period"),
        pytest.param(
            [*((t, 30) for t in range(12)), (12, 15)],
            [(10, f"{OVER}:firing"), (12, f"{OVER}:resolved")],
            id="clears when back under",
        ),
        pytest.param(
            [*((t, 30) for t in range(11)), (11, 15), *((t, 30) for t in range(12, 22))],
            [(10, f"{OVER}:firing"), (11, f"{OVER}:resolved")],
            id="flapping does not re-fire within grace",
        ),
        pytest.param(
            [*((t, 30) for t in range(11)), (11, 15), *((t, 30) for t in range(12, 23))],
            [(10, f"{OVER}:firing"), (11, f"{OVER}:resolved"), (22, f"{OVER}:firing")],
            id="re-fires after a full new grace",
        ),
        pytest.param(
            [(0, 30), (5, 15), (6, 30), (15, 30), (16, 30)],
            [(16, f"{OVER}:firing")],
            id="a dip before firing restarts the grace",
        ),
    ],
)
def test_overconsumption_fires_after_the_grace_and_clears_when_back_under(
    steps: list[tuple[float, float]], expected: list[tuple[float, str]]
) -> None:
    assert events(run_pod_a(detector.OveruseDetector(SETTINGS), steps)) == expected


@pytest.mark.parametrize(
    ("tolerance_bytes", "tolerance_percent", "used_bytes", "over"),
    [
        (0, 0, 20 * GIB, False),
        (0, 0, 20 * GIB + 1, True),
        (GIB, 0, 21 * GIB, False),
        (GIB, 0, 21 * GIB + 1, True),
        (0, 10, 22 * GIB, False),
        (0, 10, 22 * GIB + 1, True),
        (GIB, 10, 22 * GIB + 1, True),  # the larger of the two tolerances applies
        (3 * GIB, 10, 23 * GIB, False),
    ],
)
def test_tolerance_is_the_larger_of_bytes_and_percent_and_its_edge_is_not_over(
    tolerance_bytes: int, tolerance_percent: int, used_bytes: int, over: bool
) -> None:
    settings_ = overuse.Settings(
        tolerance_bytes=tolerance_bytes,
        tolerance_percent=tolerance_percent,
        grace_ns=0,
        evict_grace_ns=0,
        ghost_threshold_ns=S,
        unattributed_threshold_bytes=GIB,
    )
    watch = detector.OveruseDetector(settings_)
    process = wire.ProcessReport(pid=1, used_memory_bytes=used_bytes, pod_uid="a")
    result = watch.observe(sample(gpu(0, process)), view(pod("a")), now_ns=0)
    assert [t.name for t in result.transitions] == ([OVER] if over else [])


def test_the_alert_names_pod_node_device_amounts_and_the_neighbours_at_risk() -> None:
    watch = detector.OveruseDetector(SETTINGS)
    pods = (pod("a"), pod("b"), pod("c", devices=((0, 10), (1, 10))), pod("d", devices=((1, 40),)))
    telemetry = sample(
        gpu(0, proc(1, 30, "a"), proc(2, 10, "b"), proc(3, 5, "c")), gpu(1, proc(4, 5, "c"), proc(5, 30, "d"))
    )
    watch.observe(telemetry, view(*pods), now_ns=0)
    (alert,) = watch.observe(telemetry, view(*pods), now_ns=10 * S).transitions
    assert alert == overuse.Transition(
        name=OVER,
        state=FIRING,
        severity=wire.Severity.WARNING,
        at_ns=10 * S,
        since_ns=0,
        node=NODE,
        pod_uid="a",
        pod_namespace="ml",
        pod_name="pod-a",
        queue="team-a",
        gpu_uuid="GPU-0000",
        gpu_index=0,
        allotted_bytes=20 * GIB,
        used_bytes=30 * GIB,
        neighbours=("ml/pod-b", "ml/pod-c"),
        message=alert.message,
    )
    assert "30.0 GiB" in alert.message and "20.0 GiB" in alert.message and "ml/pod-b, ml/pod-c" in alert.message


def test_a_pod_on_two_devices_is_judged_per_device() -> None:
    watch = detector.OveruseDetector(dataclasses.replace(SETTINGS, grace_ns=0))
    two = pod("a", devices=((0, 10), (1, 10)))
    result = watch.observe(sample(gpu(0, proc(1, 5, "a")), gpu(1, proc(2, 15, "a"))), view(two), now_ns=0)
    assert [(t.name, t.gpu_index) for t in result.transitions] == [(OVER, 1)]
    assert result.pod_used_bytes == {("a", 0): 5 * GIB, ("a", 1): 15 * GIB}


def test_evict_policy_decides_eviction_once_after_the_further_grace() -> None:
    decided = run_pod_a(
        detector.OveruseDetector(SETTINGS), [(t, 30) for t in range(25)], policy=overuse.OverusePolicy.EVICT
    )
    assert events(decided) == [(10, f"{OVER}:firing"), (15, "evict")]
    firing, eviction = (d for _, d in decided)
    assert isinstance(firing, overuse.Transition) and firing.severity is wire.Severity.CRITICAL
    assert isinstance(eviction, overuse.Eviction)
    assert (eviction.pod_uid, eviction.node, eviction.gpu_index, eviction.used_bytes, eviction.allotted_bytes) == (
        "a",
        NODE,
        0,
        30 * GIB,
        20 * GIB,
    )


def test_evict_policy_does_not_evict_a_pod_back_under_before_the_further_grace() -> None:
    steps = [*((t, 30) for t in range(15)), (15, 10), (16, 10)]
    decided = run_pod_a(detector.OveruseDetector(SETTINGS), steps, policy=overuse.OverusePolicy.EVICT)
    assert events(decided) == [(10, f"{OVER}:firing"), (15, f"{OVER}:resolved")]


def test_alert_policy_never_evicts() -> None:
    decided = run_pod_a(detector.OveruseDetector(SETTINGS), [(t, 30) for t in range(60)])
    assert events(decided) == [(10, f"{OVER}:firing")]


@pytest.mark.parametrize(
    ("phase", "known"),
    [(None, False), (overuse.PodPhase.SUCCEEDED, True), (overuse.PodPhase.FAILED, True)],
    ids=["deleted pod", "succeeded pod", "failed pod"],
)
def test_a_device_still_allotted_to_a_gone_pod_is_a_ghost_after_the_threshold(
    phase: overuse.PodPhase | None, known: bool
) -> None:
    watch = detector.OveruseDetector(SETTINGS)
    others = [pod("gone", phase=phase)] if phase is not None else []
    node_view = view(others=others, holders={0: ["gone"]})
    quiet = sample(gpu(0))
    assert watch.observe(quiet, node_view, now_ns=0).transitions == ()
    assert watch.observe(quiet, node_view, now_ns=29 * S).transitions == ()
    (ghost,) = watch.observe(quiet, node_view, now_ns=30 * S).transitions
    assert (ghost.name, ghost.state, ghost.pod_uid, ghost.gpu_index, ghost.gpu_uuid) == (
        GHOST,
        FIRING,
        "gone",
        0,
        "GPU-0000",
    )
    assert (ghost.pod_name is not None) == known
    (cleared,) = watch.observe(quiet, view(others=others), now_ns=31 * S).transitions
    assert (cleared.name, cleared.state) == (GHOST, RESOLVED)


def test_a_running_pod_without_a_process_on_its_device_is_a_ghost_until_one_appears() -> None:
    watch = detector.OveruseDetector(SETTINGS)
    idle = view(pod("a"))
    assert watch.observe(sample(gpu(0)), idle, now_ns=0).transitions == ()
    assert watch.observe(sample(gpu(0)), idle, now_ns=29 * S).transitions == ()
    (ghost,) = watch.observe(sample(gpu(0)), idle, now_ns=30 * S).transitions
    assert (ghost.name, ghost.state, ghost.pod_uid, ghost.allotted_bytes) == (GHOST, FIRING, "a", 20 * GIB)
    (cleared,) = watch.observe(sample(gpu(0, proc(1, None, "a"))), idle, now_ns=31 * S).transitions
    assert (cleared.name, cleared.state) == (GHOST, RESOLVED)


def test_a_pending_pod_without_a_process_is_no_ghost() -> None:
    watch = detector.OveruseDetector(SETTINGS)
    pending = view(pod("a", phase=overuse.PodPhase.PENDING))
    assert [watch.observe(sample(gpu(0)), pending, now_ns=t * S).transitions for t in (0, 60)] == [(), ()]


def test_memory_of_no_pod_and_of_unknown_pods_is_unattributed_and_fires_above_the_threshold() -> None:
    watch = detector.OveruseDetector(SETTINGS)
    strays = sample(gpu(0, proc(1, 5), proc(2, 3, "stranger"), proc(3, 10, "a")), gpu(1, proc(4, 1)))
    first = watch.observe(strays, view(pod("a")), now_ns=0)
    assert first.unattributed_bytes == {0: 8 * GIB, 1: GIB}
    (alert,) = watch.observe(strays, view(pod("a")), now_ns=10 * S).transitions
    assert (alert.name, alert.gpu_index, alert.used_bytes, alert.pod_uid) == (STRAY, 0, 8 * GIB, None)
    assert "8.0 GiB" in alert.message
    (cleared,) = watch.observe(sample(gpu(0, proc(3, 10, "a")), gpu(1)), view(pod("a")), now_ns=11 * S).transitions
    assert (cleared.name, cleared.state, cleared.used_bytes) == (STRAY, RESOLVED, 0)


def test_claims_about_pods_of_other_nodes_are_dropped_and_counted_and_the_rest_kept() -> None:
    watch = detector.OveruseDetector(dataclasses.replace(SETTINGS, grace_ns=0))
    elsewhere = pod("b", node="gpu-node-2")
    unbound = pod("c", node=None, phase=overuse.PodPhase.PENDING)
    forged = sample(gpu(0, proc(1, 10, "a"), proc(2, 70, "b"), proc(3, 70, "c")))
    result = watch.observe(forged, view(pod("a"), others=[elsewhere, unbound]), now_ns=0)
    assert result.foreign_claims == 2
    assert result.pod_used_bytes == {("a", 0): 10 * GIB}
    assert result.unattributed_bytes == {0: 0}
    assert result.transitions == ()


def test_a_firing_alert_resolves_when_its_pod_leaves_or_its_node_is_forgotten() -> None:
    watch = detector.OveruseDetector(dataclasses.replace(SETTINGS, grace_ns=0))
    hungry = sample(gpu(0, proc(1, 30, "a")))
    assert [t.state for t in watch.observe(hungry, view(pod("a")), now_ns=0).transitions] == [FIRING]
    gone = watch.observe(hungry, view(), now_ns=S).transitions
    # The deleted pod's process now belongs to no pod the scheduler knows: its memory turns unattributed.
    assert [(t.name, t.state) for t in gone] == [(STRAY, FIRING), (OVER, RESOLVED)]
    assert gone[0].used_bytes == 30 * GIB
    watch.observe(hungry, view(pod("a")), now_ns=2 * S)
    (forgotten,) = watch.forget_node(NODE, now_ns=3 * S)
    assert (forgotten.name, forgotten.state) == (OVER, RESOLVED)
    assert watch.conditions() == 0


def test_a_transition_becomes_a_wire_alert_that_round_trips() -> None:
    decided = run_pod_a(detector.OveruseDetector(SETTINGS), [(t, 30) for t in range(11)])
    (_, firing) = decided[0]
    assert isinstance(firing, overuse.Transition)
    alert = overuse.to_alert(firing, emitter="quotient-scheduler", boot="b1", seq=3)
    assert wire.decode_alert(wire.encode(alert)) == alert
    assert (alert.name, alert.state, alert.pod_name, alert.gpu_index, alert.allotted_bytes, alert.used_bytes) == (
        "GpuMemoryOverconsumption",
        FIRING,
        "pod-a",
        0,
        20 * GIB,
        30 * GIB,
    )
    assert alert.labels["alertname"] == "GpuMemoryOverconsumption" and alert.labels["namespace"] == "ml"
    assert alert.since_ns == 0 and alert.ts_ns == 10 * S


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("alert", overuse.OverusePolicy.ALERT),
        ("evict", overuse.OverusePolicy.EVICT),
        ("Evict", None),
        (" evict", None),
        ("", None),
        ("kill", None),
    ],
)
def test_overuse_policy_annotation_is_parsed_strictly(value: str, expected: overuse.OverusePolicy | None) -> None:
    parsed = overuse.parse_policy(value)
    if expected is None:
        assert isinstance(parsed, overuse.PolicyProblem)
        assert parsed.annotation == "quotient.dev/overuse-policy" and repr(value) in parsed.message
    else:
        assert parsed is expected


def test_a_queue_without_the_annotation_takes_the_cluster_default() -> None:
    default = overuse.OverusePolicy.EVICT
    assert overuse.queue_policy({}, default=default) is default
    assert overuse.queue_policy({overuse.OVERUSE_POLICY_ANNOTATION: "alert"}, default=default) is (
        overuse.OverusePolicy.ALERT
    )


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(min_value=0, max_value=4 * S), st.booleans()), max_size=40))
def test_alerts_alternate_and_fire_only_after_a_full_grace_of_continuous_overuse(
    steps: list[tuple[int, bool]],
) -> None:
    watch = detector.OveruseDetector(SETTINGS)
    now_ns = 0
    over_since: int | None = None
    firing = False
    for step_ns, over in steps:
        now_ns += step_ns
        used = 30 if over else 15
        result = watch.observe(sample(gpu(0, proc(1, used, "a"))), view(pod("a")), now_ns=now_ns)
        if over and over_since is None:
            over_since = now_ns
        if not over:
            over_since = None
        states = [t.state for t in result.transitions]
        if over_since is not None and not firing and now_ns - over_since >= SETTINGS.grace_ns:
            assert states == [FIRING]
            assert result.transitions[0].since_ns == over_since
            firing = True
        elif not over and firing:
            assert states == [RESOLVED]
            firing = False
        else:
            assert states == []
        assert watch.conditions() == (1 if over else 0)


def _whole(uid: str, index: int) -> overuse.PodView:
    """A whole-GPU pod the scheduler accounts on ``index``; the device plugin's real choice is not in the API."""
    return dataclasses.replace(
        pod(uid, devices=()), devices=(overuse.PodDevice(index=index, allotted_bytes=80 * GIB, whole=True),)
    )


def test_a_whole_gpu_pod_running_on_another_device_than_accounted_is_judged_there_and_is_no_ghost() -> None:
    watch = detector.OveruseDetector(SETTINGS)
    node_view = view(_whole("w", 2))
    for at_s in (0, 30, 60):
        result = watch.observe(sample(gpu(0, proc(7, 60, "w")), gpu(2), at_s=at_s), node_view, now_ns=int(at_s * S))
        assert result.transitions == ()
    # Not even pending: no ghost on the accounted device, no over-use of a device it was never given.
    assert watch.conditions() == 0


def test_a_share_is_matched_to_its_device_by_the_uuid_of_its_reservation() -> None:
    watch = detector.OveruseDetector(dataclasses.replace(SETTINGS, grace_ns=0))
    share = dataclasses.replace(
        pod("s", devices=()), devices=(overuse.PodDevice(index=0, uuid="GPU-0003", allotted_bytes=20 * GIB),)
    )
    result = watch.observe(sample(gpu(0), gpu(3, proc(8, 30, "s"))), view(share), now_ns=0)
    [over] = result.transitions
    assert (over.name, over.gpu_index, over.used_bytes) == (OVER, 3, 30 * GIB)

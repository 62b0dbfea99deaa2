"""Live telemetry against the cluster state: allotments, policies, alerts, evictions, rows, headroom and staleness."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names, wire
from scheduler.objects import nodes, pods, queues
from scheduler.objects.records import PodRecord, QueueRecord
from scheduler.state import cache, snapshot
from scheduler.telemetry import live, overuse
from tests.unit.telemetry.builders import GIB, NODE, S, gpu, proc, sample

DETECTOR = overuse.Settings(
    tolerance_bytes=GIB // 2,
    grace_ns=2 * S,
    evict_grace_ns=1 * S,
    ghost_threshold_ns=600 * S,
    unattributed_threshold_bytes=GIB,
)
SETTINGS = live.LiveSettings(detector=DETECTOR, stale_floor_ns=5 * S, headroom_window_ns=10 * S)


def node_obj(name: str = NODE, gpus: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": str(80 * 1024)}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_obj(
    uid: str,
    *,
    node: str | None = NODE,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    gpus: int = 0,
    phase: str = "Running",
) -> dict[str, Any]:
    resources = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{uid}",
            "namespace": "ml",
            "uid": uid,
            "annotations": dict(annotations or {}),
            "labels": {"kai.scheduler/queue": "team-a", **(labels or {})},
        },
        "spec": {
            "schedulerName": "quotient",
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"requests": resources, "limits": resources}}],
        },
        "status": {"phase": phase},
    }


def share(uid: str, fraction: str, device: int, **kwargs: Any) -> dict[str, Any]:
    return pod_obj(uid, annotations={"gpu-fraction": fraction, "quotient.dev/gpu-devices": str(device)}, **kwargs)


def queue_obj(name: str, policy: str | None = None) -> dict[str, Any]:
    annotations = {} if policy is None else {overuse.OVERUSE_POLICY_ANNOTATION: policy}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"resources": {}},
    }


def pod_record(obj: Mapping[str, Any]) -> PodRecord:
    record = pods.decode(obj)
    assert record is not None
    return record


def queue_record(name: str, policy: str | None = None) -> QueueRecord:
    record = queues.decode(queue_obj(name, policy))
    assert record is not None
    return record


def cluster(*members: dict[str, Any], node_names: tuple[str, ...] = (NODE,)) -> cache.ClusterState:
    state = cache.ClusterState(scheduler_names=["quotient"])
    for name in node_names:
        record = nodes.decode(node_obj(name))
        assert record is not None
        state.put_node(record)
    for pod in members:
        state.put_pod(pod_record(pod))
    return state


def alerted(result: live.LiveResult) -> list[tuple[str, str, str | None]]:
    return [(t.name.value, t.state.value, t.pod_name) for t in result.transitions]


def test_a_share_over_its_fraction_of_the_device_fires_after_the_grace_and_resolves_when_back_under() -> None:
    state = cluster(share("a", "0.25", 0), share("b", "0.25", 0))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    over = gpu(0, proc(1, 30, "a"), proc(2, 5, "b")), gpu(1)
    first = telemetry.apply([sample(*over, at_s=0)], now_ns=0)
    assert first.transitions == ()
    fired = telemetry.apply([sample(*over, at_s=2)], now_ns=2 * S)
    assert alerted(fired) == [("GpuMemoryOverconsumption", "firing", "pod-a")]
    alert = fired.transitions[0]
    assert alert.allotted_bytes == 20 * GIB and alert.used_bytes == 30 * GIB
    assert alert.neighbours == ("ml/pod-b",) and alert.queue == "team-a"
    under = gpu(0, proc(1, 10, "a"), proc(2, 5, "b")), gpu(1)
    resolved = telemetry.apply([sample(*under, at_s=3)], now_ns=3 * S)
    assert alerted(resolved) == [("GpuMemoryOverconsumption", "resolved", "pod-a")]


def test_the_queue_annotation_evict_turns_a_lasting_overuse_into_an_eviction_of_that_pod_only() -> None:
    state = cluster(share("a", "0.25", 0), share("b", "0.25", 0))
    state.put_queue(queue_record("team-a", "evict"))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    over = gpu(0, proc(1, 30, "a"), proc(2, 5, "b"))
    evictions = [
        eviction
        for at_s in (0, 2, 3)
        for eviction in telemetry.apply([sample(over, at_s=at_s)], now_ns=at_s * S).evictions
    ]
    assert [(e.pod_uid, e.gpu_index, e.used_bytes, e.allotted_bytes) for e in evictions] == [
        ("a", 0, 30 * GIB, 20 * GIB)
    ]


def test_an_invalid_policy_annotation_gets_the_cluster_default_and_is_reported_once() -> None:
    state = cluster(share("a", "0.25", 0))
    state.put_queue(queue_record("team-a", "Evict"))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    over = gpu(0, proc(1, 30, "a"))
    results = [telemetry.apply([sample(over, at_s=t)], now_ns=t * S) for t in (0, 2, 3, 4)]
    assert [len(r.policy_problems) for r in results] == [1, 0, 0, 0]
    assert "'Evict' is not 'alert' or 'evict'" in results[0].policy_problems[0].message
    assert all(not r.evictions for r in results)


def test_gpu_memory_shares_and_whole_gpus_are_allotted_their_bytes_and_the_whole_device() -> None:
    memory = pod_obj("m", annotations={"gpu-memory": "10240", "quotient.dev/gpu-devices": "0"})
    whole = pod_obj("w", gpus=1, annotations={"quotient.dev/gpu-devices": "1"})
    reservation = pod_obj("r", labels={names.RESERVATION_GROUP_LABEL: "g0"})
    state = cluster(memory, whole, reservation)
    telemetry = live.LiveTelemetry(SETTINGS, state)
    result = telemetry.apply([sample(gpu(0, proc(1, 4, "m")), gpu(1, proc(2, 70, "w")))], now_ns=0)
    rows = result.rows[NODE]
    assert {(row.name, row.gpu_index, row.allotted_bytes, row.used_bytes) for row in rows.pods} == {
        ("pod-m", 0, 10 * GIB, 4 * GIB),
        ("pod-w", 1, 80 * GIB, 70 * GIB),
    }
    assert [(row.gpu_index, row.allotted_milli, row.used_bytes) for row in rows.devices] == [
        (0, 125, 4 * GIB),
        (1, 1000, 70 * GIB),
    ]


def test_a_claim_about_a_pod_bound_to_another_node_is_dropped_and_counted_and_the_rest_stands() -> None:
    state = cluster(share("a", "0.25", 0), share("elsewhere", "0.25", 0, node="other"), node_names=(NODE, "other"))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    result = telemetry.apply([sample(gpu(0, proc(1, 3, "a"), proc(2, 50, "elsewhere")))], now_ns=0)
    assert result.foreign_claims == 1
    assert {(row.name, row.used_bytes) for row in result.rows[NODE].pods} == {("pod-a", 3 * GIB)}
    assert result.rows[NODE].devices[0].unattributed_bytes == 0


def test_memory_of_no_pod_fires_unattributed_and_lowers_the_measured_headroom() -> None:
    state = cluster(share("a", "0.5", 0))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    busy = gpu(0, proc(1, 2, "a"), proc(9, 70))
    telemetry.apply([sample(busy, at_s=0)], now_ns=0)
    result = telemetry.apply([sample(busy, at_s=2)], now_ns=2 * S)
    assert alerted(result) == [("UnattributedGpuMemory", "firing", None)]
    views = telemetry.device_views(NODE)
    assert views is not None
    assert views[0].peak_used_bytes == 72 * GIB and views[0].unattributed_bytes == 70 * GIB and not views[0].stale


def test_headroom_changes_are_reported_once_and_an_unchanged_sample_reports_none() -> None:
    state = cluster()
    telemetry = live.LiveTelemetry(SETTINGS, state)
    first = telemetry.apply([sample(gpu(0, proc(1, 5)), at_s=0)], now_ns=0)
    assert first.headroom_changed == {NODE}
    assert telemetry.take_changed() == {NODE} and telemetry.take_changed() == frozenset()
    again = telemetry.apply([sample(gpu(0, proc(1, 5)), at_s=1)], now_ns=1 * S)
    assert again.headroom_changed == frozenset()


def test_a_silent_node_turns_stale_fires_telemetry_stale_and_recovers_with_its_next_sample() -> None:
    state = cluster()
    telemetry = live.LiveTelemetry(SETTINGS, state)
    telemetry.apply([sample(gpu(0, proc(1, 0.5)), at_s=0, interval_ms=200)], now_ns=0)
    telemetry.take_changed()
    assert telemetry.check(now_ns=4 * S).transitions == ()
    stale = telemetry.check(now_ns=6 * S)
    assert alerted(stale) == [("TelemetryStale", "firing", None)] and stale.headroom_changed == {NODE}
    views = telemetry.device_views(NODE)
    assert views is not None and views[0].stale
    assert telemetry.ages_s(now_ns=6 * S) == {NODE: 6.0}
    back = telemetry.apply([sample(gpu(0, proc(1, 0.5)), at_s=7, interval_ms=200)], now_ns=7 * S)
    assert alerted(back) == [("TelemetryStale", "resolved", None)]
    views = telemetry.device_views(NODE)
    assert views is not None and not views[0].stale


def test_a_forgotten_node_resolves_its_alerts_and_loses_its_rows_and_views() -> None:
    state = cluster(share("a", "0.25", 0))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    over = gpu(0, proc(1, 30, "a"))
    for at_s in (0, 2):
        telemetry.apply([sample(over, at_s=at_s)], now_ns=at_s * S)
    result = telemetry.apply([], now_ns=3 * S, forgotten=[NODE])
    assert alerted(result) == [("GpuMemoryOverconsumption", "resolved", "pod-a")]
    assert result.forgotten == {NODE} and telemetry.device_views(NODE) is None


def test_the_snapshot_rebuilds_only_nodes_whose_measured_view_changed() -> None:
    state = cluster(node_names=(NODE, "quiet"))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    builder = snapshot.SnapshotBuilder(state, measured=telemetry)
    before = builder.build(0).snapshot
    telemetry.apply([sample(gpu(0, proc(1, 60)), gpu(1), at_s=1)], now_ns=1 * S)
    after = builder.build(1 * S).snapshot
    assert after.nodes is not before.nodes
    assert after.nodes["quiet"] is before.nodes["quiet"]  # type: ignore[index]
    device = after.nodes[NODE].devices[0]  # type: ignore[index]
    assert device.peak_used_bytes == 60 * GIB and not device.telemetry_stale
    unchanged = builder.build(2 * S).snapshot
    assert unchanged.nodes is after.nodes


def test_alert_transitions_carry_everything_the_wire_alert_needs() -> None:
    state = cluster(share("a", "0.25", 0))
    telemetry = live.LiveTelemetry(SETTINGS, state)
    over = gpu(0, proc(1, 30, "a"))
    telemetry.apply([sample(over, at_s=0)], now_ns=0)
    (transition,) = telemetry.apply([sample(over, at_s=2)], now_ns=2 * S).transitions
    alert = wire.decode_alert(wire.encode(overuse.to_alert(transition, emitter="sched", boot="b", seq=1)))
    assert (alert.pod_namespace, alert.pod_name, alert.node_name, alert.gpu_index) == ("ml", "pod-a", NODE, 0)


def reservation(uid: str, group: str, index: int) -> dict[str, Any]:
    return pod_obj(
        uid,
        annotations={"quotient.dev/gpu-index": str(index), "quotient.dev/gpu-uuid": f"GPU-{index:04d}"},
        labels={names.RESERVATION_GROUP_LABEL: group},
        gpus=1,
    )


def test_a_reservation_still_holding_a_device_after_its_groups_pods_are_gone_is_a_ghost() -> None:
    held = reservation("r", "grp", 1)
    member = share("a", "0.5", 1, labels={"runai-gpu-group": "grp"})
    state = cluster(held, member)
    telemetry = live.LiveTelemetry(SETTINGS, state)
    for at_s in (0, 700):
        sampled = sample(gpu(0), gpu(1, proc(1, 5, "a")), at_s=at_s)
        assert telemetry.apply([sampled], now_ns=at_s * S).transitions == ()
    state.delete_pod("a")
    assert telemetry.apply([sample(gpu(0), gpu(1), at_s=800)], now_ns=800 * S).transitions == ()
    fired = telemetry.apply([sample(gpu(0), gpu(1), at_s=1400)], now_ns=1400 * S)
    [ghost] = fired.transitions
    assert (ghost.name, ghost.state, ghost.gpu_index) == (overuse.AlertName.GHOST_ALLOCATION, wire.AlertState.FIRING, 1)
    assert "GPU group grp, whose pods are all gone" in ghost.message

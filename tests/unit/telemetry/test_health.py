"""GPU health from the agents' reports: which devices leave placement, the GpuUnhealthy alert, the operator's clear."""

from __future__ import annotations

from common import wire
from scheduler.placement import model
from scheduler.state.snapshot import with_measured
from scheduler.telemetry import headroom, health, overuse

S = 1_000_000_000


def report(*problems: wire.HealthProblem, at_s: int = 10) -> wire.NodeHealth:
    status = wire.HealthStatus.DEGRADED if problems else wire.HealthStatus.HEALTHY
    return wire.NodeHealth(
        v=wire.SCHEMA_VERSION, node="n1", boot="b", seq=at_s, ts_ns=at_s * S, status=status, problems=problems
    )


def xid(index: int, code: int = 79) -> wire.HealthProblem:
    return wire.HealthProblem(
        kind=wire.ProblemKind.XID, gpu_index=index, gpu_uuid=f"GPU-{index}", code=code, message="x"
    )


UNREACHABLE = wire.HealthProblem(kind=wire.ProblemKind.NVML_UNREACHABLE, message="NVML_ERROR_DRIVER_NOT_LOADED")


def test_a_device_with_an_xid_is_out_and_fires_one_alert_that_resolves_when_the_agent_reports_it_healthy() -> None:
    watch = health.GpuHealthWatch()
    fired = watch.update("n1", report(xid(3)), cleared_ns=0, now_ns=11 * S)
    assert [(t.name, t.state, t.gpu_index, t.gpu_uuid) for t in fired] == [
        (overuse.AlertName.GPU_UNHEALTHY, wire.AlertState.FIRING, 3, "GPU-3")
    ]
    assert watch.verdict_of("n1").is_unhealthy(3) and not watch.verdict_of("n1").is_unhealthy(2)
    assert watch.update("n1", report(xid(3), at_s=20), cleared_ns=0, now_ns=21 * S) == (), "still firing: no repeat"
    resolved = watch.update("n1", report(at_s=30), cleared_ns=0, now_ns=31 * S)
    assert [(t.state, t.gpu_index) for t in resolved] == [(wire.AlertState.RESOLVED, 3)]
    assert not watch.verdict_of("n1").unhealthy


def test_an_unreachable_nvml_takes_every_device_of_the_node_out() -> None:
    verdict = health.verdict(report(UNREACHABLE))
    assert verdict.whole_node and all(verdict.is_unhealthy(index) for index in range(8))


def test_an_operator_clear_after_the_report_brings_the_device_back_and_a_new_problem_counts_again() -> None:
    watch = health.GpuHealthWatch()
    watch.update("n1", report(xid(1), at_s=10), cleared_ns=0, now_ns=10 * S)
    resolved = watch.update("n1", report(xid(1), at_s=10), cleared_ns=15 * S, now_ns=16 * S)
    assert [t.state for t in resolved] == [wire.AlertState.RESOLVED] and not watch.verdict_of("n1").unhealthy
    again = watch.update("n1", report(xid(1), xid(2), at_s=20), cleared_ns=15 * S, now_ns=20 * S)
    assert [t.gpu_index for t in again if t.state is wire.AlertState.FIRING] == [2], "GPU 1's Xid was cleared"


def test_a_forgotten_node_resolves_its_alerts() -> None:
    watch = health.GpuHealthWatch()
    watch.update("n1", report(UNREACHABLE), cleared_ns=0, now_ns=S)
    [resolved] = watch.forget("n1", now_ns=2 * S)
    assert (resolved.state, resolved.gpu_index) == (wire.AlertState.RESOLVED, None)


def _node(count: int) -> model.Node:
    devices = tuple(
        model.Device(index=i, uuid=model.GpuUuid(f"n1/gpu{i}"), model="A100", memory_bytes=80 * 2**30)
        for i in range(count)
    )
    return model.Node(name=model.NodeName("n1"), allocatable=model.ZERO, devices=devices)


def _views(count: int) -> dict[int, headroom.DeviceView]:
    return dict.fromkeys(range(count), headroom.UNMEASURED)


def test_the_snapshot_takes_broken_devices_out_of_placement() -> None:
    node = with_measured(_node(4), _views(4), health.verdict(report(xid(2))))
    assert [device.healthy for device in node.devices] == [True, True, False, True]
    assert not node.devices[2].is_free


def test_a_device_the_device_plugin_already_dropped_is_not_taken_out_twice() -> None:
    # The agent sees 4 devices, one of them broken; the node offers 3: the plugin already took the broken one out.
    node = with_measured(_node(3), _views(4), health.verdict(report(xid(3))))
    assert all(device.healthy for device in node.devices)


def test_a_healthy_report_leaves_the_node_object_unchanged() -> None:
    base = _node(2)
    assert with_measured(base, None, health.HEALTHY) is base


def test_a_cleared_problem_stays_cleared_when_the_agent_publishes_its_list_again_on_reconnect() -> None:
    watch = health.GpuHealthWatch()
    watch.update("n1", report(xid(1), at_s=10), cleared_ns=0, now_ns=10 * S)
    watch.update("n1", report(xid(1), at_s=10), cleared_ns=15 * S, now_ns=16 * S)
    assert watch.update("n1", report(xid(1), at_s=40), cleared_ns=15 * S, now_ns=40 * S) == ()
    assert not watch.verdict_of("n1").unhealthy
    watch.update("n1", report(at_s=50), cleared_ns=15 * S, now_ns=50 * S)
    [again] = watch.update("n1", report(xid(1), at_s=60), cleared_ns=15 * S, now_ns=60 * S)
    assert (again.state, again.gpu_index, again.since_ns) == (wire.AlertState.FIRING, 1, 60 * S)

"""agent.sampling: what a probe sample becomes on the wire, and how the node's GPU health follows probe outcomes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from agent import sampling
from agent.gpus import probe
from agent.gpus.probe import DeviceSample, HealthEvent, HealthKind, ProbeSample, ProcessSample
from agent.podmap import PodRef
from common import wire

GiB = 1024**3
SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
UID_A = "6f3c1a2e-9b4d-4e8a-a1f0-3c5d7e9b2a41"
UID_B = "c8bad552-5c99-4d4f-b71c-c426c0cde014"
CID_A = "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
CID_B = "d61328552873b5145655fa7918c7fbbce53dbe076d6c2b5fc95d660709af29c2"


def device(
    index: int,
    processes: tuple[ProcessSample, ...] | None = (),
    *,
    ecc_uncorrected: int | None = 0,
) -> DeviceSample:
    return DeviceSample(
        index=index,
        uuid=f"GPU-{index:04d}",
        model="NVIDIA A100-SXM4-80GB",
        memory_total_bytes=80 * GiB,
        memory_reserved_bytes=GiB // 2,
        memory_used_bytes=10 * GiB,
        memory_free_bytes=80 * GiB - GiB // 2 - 10 * GiB,
        gpu_util_pct=55,
        memory_util_pct=20,
        temperature_c=61,
        power_mw=250_000,
        ecc_corrected=3,
        ecc_uncorrected=ecc_uncorrected,
        mig_mode=False,
        processes=processes,
    )


def sample(*devices: DeviceSample, ts_ns: int = T0, driver: str | None = "550.54.15") -> ProbeSample:
    return ProbeSample(ts_ns=ts_ns, driver_version=driver, devices=devices)


def proc(pid: int, used: int | None = GiB) -> ProcessSample:
    return ProcessSample(pid=pid, used_memory_bytes=used)


def telemetry(s: ProbeSample, pods: Mapping[int, PodRef | None]) -> wire.NodeTelemetry:
    return sampling.build_telemetry(sample=s, pods=pods, node="gpu-1", boot="b00t", seq=7, interval_ms=1000)


# --- build_telemetry ---


def test_the_envelope_carries_node_boot_seq_interval_and_the_probe_time() -> None:
    message = telemetry(sample(device(0)), {})
    assert (message.v, message.node, message.boot, message.seq, message.ts_ns, message.interval_ms) == (
        1,
        "gpu-1",
        "b00t",
        7,
        T0,
        1000,
    )
    assert message.driver_version == "550.54.15"


def test_every_device_field_is_copied_to_its_report() -> None:
    source = device(3)
    (report,) = telemetry(sample(source), {}).gpus
    copied = [field.name for field in dataclasses.fields(DeviceSample) if field.name != "processes"]
    assert {name: getattr(report, name) for name in copied} == {name: getattr(source, name) for name in copied}


def test_pids_are_attributed_to_their_pods_and_containers() -> None:
    s = sample(device(0, (proc(100, 2 * GiB), proc(200, 3 * GiB))))
    pods = {
        100: PodRef(pod_uid=UID_A, container_id=CID_A, qos="burstable"),
        200: PodRef(pod_uid=UID_B, container_id=CID_B, qos="guaranteed"),
    }
    (gpu,) = telemetry(s, pods).gpus
    assert gpu.processes == (
        wire.ProcessReport(pid=100, used_memory_bytes=2 * GiB, pod_uid=UID_A, container_id=CID_A),
        wire.ProcessReport(pid=200, used_memory_bytes=3 * GiB, pod_uid=UID_B, container_id=CID_B),
    )


def test_a_process_of_no_pod_is_kept_with_pod_uid_none() -> None:
    s = sample(device(0, (proc(100), proc(300, None))))
    (gpu,) = telemetry(s, {100: None}).gpus
    assert gpu.processes == (
        wire.ProcessReport(pid=100, used_memory_bytes=GiB, pod_uid=None, container_id=None),
        wire.ProcessReport(pid=300, used_memory_bytes=None, pod_uid=None, container_id=None),
    )


def test_a_process_in_a_pod_but_in_no_container_keeps_its_pod() -> None:
    s = sample(device(0, (proc(100),)))
    (gpu,) = telemetry(s, {100: PodRef(pod_uid=UID_A, container_id=None, qos=None)}).gpus
    assert (gpu.processes[0].pod_uid, gpu.processes[0].container_id) == (UID_A, None)


def test_a_device_whose_processes_are_unknown_reports_an_empty_tuple() -> None:
    (gpu,) = telemetry(sample(device(0, None)), {}).gpus
    assert gpu.processes == ()


def test_a_process_on_two_devices_appears_on_both() -> None:
    ref = PodRef(pod_uid=UID_A, container_id=CID_A, qos="burstable")
    gpus = telemetry(sample(device(0, (proc(100),)), device(1, (proc(100),))), {100: ref}).gpus
    assert [[p.pod_uid for p in gpu.processes] for gpu in gpus] == [[UID_A], [UID_A]]


def test_a_sample_without_devices_or_driver_is_still_a_message() -> None:
    message = telemetry(sample(driver=None), {})
    assert (message.gpus, message.driver_version) == ((), None)


def test_the_built_message_survives_the_wire() -> None:
    s = sample(device(0, (proc(100), proc(101))), device(1, None))
    message = telemetry(s, {100: PodRef(pod_uid=UID_A, container_id=CID_A, qos="burstable"), 101: None})
    assert wire.decode_telemetry(wire.encode(message)) == message


def test_pids_of_lists_every_pid_once_in_order_of_appearance() -> None:
    s = sample(device(0, (proc(300), proc(100))), device(1, None), device(2, (proc(100), proc(200), proc(300))))
    assert sampling.pids_of(s) == [300, 100, 200]


def test_pids_of_an_idle_node_is_empty() -> None:
    assert sampling.pids_of(sample(device(0), device(1, None))) == []


# --- HealthTracker ---


def xid(index: int, code: int) -> HealthEvent:
    return probe.xid_event(gpu_index=index, gpu_uuid=f"GPU-{index:04d}", code=code)


def test_a_new_tracker_is_healthy_and_has_changed() -> None:
    tracker = sampling.HealthTracker()
    assert tracker.current(T0) == (wire.HealthStatus.HEALTHY, ())
    assert tracker.changed(T0)


def test_a_published_state_is_no_change_until_something_happens() -> None:
    tracker = sampling.HealthTracker()
    tracker.mark_published(T0)
    assert not tracker.changed(T0 + SECOND)
    tracker.library_unavailable("driver not loaded")
    assert tracker.changed(T0 + 2 * SECOND)
    tracker.mark_published(T0 + 2 * SECOND)
    assert not tracker.changed(T0 + 3 * SECOND)


def test_an_unreachable_library_makes_the_node_unavailable() -> None:
    tracker = sampling.HealthTracker()
    tracker.library_unavailable("NVML is unavailable (driver_not_loaded)")
    status, problems = tracker.current(T0)
    assert status == wire.HealthStatus.UNAVAILABLE
    assert problems == (
        wire.HealthProblem(kind=wire.ProblemKind.NVML_UNREACHABLE, message="NVML is unavailable (driver_not_loaded)"),
    )


def test_a_successful_sample_after_an_unreachable_library_is_a_recovery() -> None:
    tracker = sampling.HealthTracker()
    tracker.library_unavailable("gone")
    tracker.mark_published(T0)
    tracker.sample_ok(sample(device(0), ts_ns=T0 + SECOND))
    assert tracker.current(T0 + SECOND) == (wire.HealthStatus.HEALTHY, ())
    assert tracker.changed(T0 + SECOND)


def test_an_unreachable_event_counts_like_a_library_failure() -> None:
    tracker = sampling.HealthTracker()
    event = HealthEvent(
        kind=HealthKind.NVML_UNREACHABLE, gpu_index=None, gpu_uuid=None, code=None, message="x", critical=True
    )
    tracker.events([event], T0)
    assert tracker.current(T0)[0] == wire.HealthStatus.UNAVAILABLE


def test_a_long_message_is_cut_to_fit_the_wire() -> None:
    tracker = sampling.HealthTracker()
    tracker.library_unavailable("x" * 5000)
    tracker.gpu_lost(0, "y" * 5000)
    _, problems = tracker.current(T0)
    assert [len(problem.message) for problem in problems] == [1000, 1000]


def test_a_lost_gpu_degrades_the_node_until_a_sample_includes_it_again() -> None:
    tracker = sampling.HealthTracker()
    tracker.sample_ok(sample(device(0), device(1)))
    tracker.gpu_lost(1, "GPU 1 stopped answering")
    status, problems = tracker.current(T0)
    assert status == wire.HealthStatus.DEGRADED
    assert problems == (
        wire.HealthProblem(
            kind=wire.ProblemKind.GPU_LOST, gpu_index=1, gpu_uuid="GPU-0001", message="GPU 1 stopped answering"
        ),
    )
    tracker.sample_ok(sample(device(0), device(1)))
    assert tracker.current(T0) == (wire.HealthStatus.HEALTHY, ())


def test_every_gpu_lost_makes_the_node_unavailable() -> None:
    tracker = sampling.HealthTracker()
    tracker.sample_ok(sample(device(0), device(1)))
    tracker.events([probe.gpu_lost_event(gpu_index=1, gpu_uuid="GPU-0001", message="lost")], T0)
    tracker.gpu_lost(0, "lost")
    status, problems = tracker.current(T0)
    assert status == wire.HealthStatus.UNAVAILABLE
    assert [problem.gpu_index for problem in problems] == [0, 1]


def test_a_lost_gpu_names_its_uuid_from_the_probes_event_or_else_from_the_last_good_sample() -> None:
    tracker = sampling.HealthTracker()
    tracker.gpu_lost(0, "lost")  # nothing sampled yet: the index is all there is
    tracker.events([probe.gpu_lost_event(gpu_index=1, gpu_uuid="GPU-from-event", message="lost")], T0)
    assert [(p.gpu_index, p.gpu_uuid) for p in tracker.current(T0)[1]] == [(0, None), (1, "GPU-from-event")]
    tracker.sample_ok(sample(device(0), device(1)))
    tracker.gpu_lost(1, "GPU 1 is lost while sampling")  # a failed sample names only the index
    assert [(p.gpu_index, p.gpu_uuid) for p in tracker.current(T0)[1]] == [(1, "GPU-0001")]


def test_a_lost_gpu_before_any_sample_is_degraded_since_the_device_count_is_unknown() -> None:
    tracker = sampling.HealthTracker()
    tracker.gpu_lost(0, "lost")
    assert tracker.current(T0)[0] == wire.HealthStatus.DEGRADED


def test_a_critical_xid_is_held_for_hold_ns_after_it_was_last_seen() -> None:
    hold = 60 * SECOND
    tracker = sampling.HealthTracker(hold_ns=hold)
    tracker.sample_ok(sample(device(0)))
    tracker.events([xid(0, 79)], T0)
    status, problems = tracker.current(T0)
    assert status == wire.HealthStatus.DEGRADED
    assert problems == (
        wire.HealthProblem(
            kind=wire.ProblemKind.XID,
            gpu_index=0,
            gpu_uuid="GPU-0000",
            code=79,
            message="Xid 79: GPU has fallen off the bus",
        ),
    )
    assert tracker.current(T0 + hold)[0] == wire.HealthStatus.DEGRADED
    assert tracker.current(T0 + hold + 1) == (wire.HealthStatus.HEALTHY, ())


def test_a_critical_xid_seen_again_restarts_its_hold() -> None:
    hold = 60 * SECOND
    tracker = sampling.HealthTracker(hold_ns=hold)
    tracker.events([xid(0, 48)], T0)
    tracker.events([xid(0, 48)], T0 + 50 * SECOND)
    assert len(tracker.current(T0 + 100 * SECOND)[1]) == 1
    assert tracker.current(T0 + 111 * SECOND)[0] == wire.HealthStatus.HEALTHY


def test_different_critical_xids_on_one_device_are_separate_problems() -> None:
    tracker = sampling.HealthTracker()
    tracker.events([xid(0, 48), xid(0, 79), xid(1, 79)], T0)
    _, problems = tracker.current(T0)
    assert sorted((p.gpu_index, p.code) for p in problems) == [(0, 48), (0, 79), (1, 79)]


def test_the_default_hold_is_ten_minutes() -> None:
    tracker = sampling.HealthTracker()
    tracker.events([xid(0, 95)], T0)
    assert tracker.current(T0 + 600 * SECOND)[0] == wire.HealthStatus.DEGRADED
    assert tracker.current(T0 + 600 * SECOND + 1)[0] == wire.HealthStatus.HEALTHY


def test_a_non_critical_xid_is_not_a_problem_of_the_node() -> None:
    tracker = sampling.HealthTracker()
    tracker.mark_published(T0)
    tracker.events([xid(0, 13), xid(0, 31), xid(0, 43), xid(0, 94)], T0)
    assert tracker.current(T0) == (wire.HealthStatus.HEALTHY, ())
    assert not tracker.changed(T0)


def test_a_rise_in_uncorrectable_ecc_degrades_the_node_for_the_hold() -> None:
    hold = 30 * SECOND
    tracker = sampling.HealthTracker(hold_ns=hold)
    tracker.sample_ok(sample(device(0, ecc_uncorrected=2), ts_ns=T0))
    assert tracker.current(T0) == (wire.HealthStatus.HEALTHY, ())
    tracker.sample_ok(sample(device(0, ecc_uncorrected=5), ts_ns=T0 + SECOND))
    status, problems = tracker.current(T0 + SECOND)
    assert status == wire.HealthStatus.DEGRADED
    assert problems == (
        wire.HealthProblem(
            kind=wire.ProblemKind.ECC,
            gpu_index=0,
            gpu_uuid="GPU-0000",
            code=5,
            message="uncorrectable ECC errors on gpu 0 rose from 2 to 5",
        ),
    )
    # A steady count is no new error: the problem expires hold_ns after the rise was seen.
    tracker.sample_ok(sample(device(0, ecc_uncorrected=5), ts_ns=T0 + 2 * SECOND))
    assert tracker.current(T0 + SECOND + hold)[0] == wire.HealthStatus.DEGRADED
    assert tracker.current(T0 + SECOND + hold + 1) == (wire.HealthStatus.HEALTHY, ())


def test_the_first_ecc_count_seen_is_a_baseline_not_a_rise() -> None:
    tracker = sampling.HealthTracker()
    tracker.sample_ok(sample(device(0, ecc_uncorrected=1_000)))
    assert tracker.current(T0)[0] == wire.HealthStatus.HEALTHY


def test_a_device_without_ecc_counters_never_raises_an_ecc_problem() -> None:
    tracker = sampling.HealthTracker()
    tracker.sample_ok(sample(device(0, ecc_uncorrected=None)))
    tracker.sample_ok(sample(device(0, ecc_uncorrected=None)))
    assert tracker.current(T0)[0] == wire.HealthStatus.HEALTHY


def test_an_ecc_event_from_the_probe_is_held_like_a_critical_xid() -> None:
    tracker = sampling.HealthTracker(hold_ns=SECOND)
    tracker.events([probe.ecc_event(gpu_index=0, gpu_uuid="GPU-0000")], T0)
    _, problems = tracker.current(T0)
    assert [(p.kind, p.gpu_index) for p in problems] == [(wire.ProblemKind.ECC, 0)]
    assert tracker.current(T0 + 2 * SECOND)[0] == wire.HealthStatus.HEALTHY


def test_problems_are_listed_unreachable_first_then_lost_devices_then_held_problems() -> None:
    tracker = sampling.HealthTracker()
    tracker.sample_ok(sample(device(0), device(1), device(2)))
    tracker.events([xid(2, 79)], T0)
    tracker.gpu_lost(1, "lost")
    tracker.library_unavailable("gone")
    status, problems = tracker.current(T0)
    assert status == wire.HealthStatus.UNAVAILABLE
    assert [p.kind for p in problems] == [
        wire.ProblemKind.NVML_UNREACHABLE,
        wire.ProblemKind.GPU_LOST,
        wire.ProblemKind.XID,
    ]


def test_expiry_alone_is_a_change_to_publish() -> None:
    tracker = sampling.HealthTracker(hold_ns=SECOND)
    tracker.events([xid(0, 79)], T0)
    tracker.mark_published(T0)
    assert not tracker.changed(T0 + SECOND)
    assert tracker.changed(T0 + SECOND + 1)


def test_the_health_message_carries_the_current_status_and_problems() -> None:
    tracker = sampling.HealthTracker()
    tracker.events([xid(0, 79)], T0)
    message = tracker.message(node="gpu-1", boot="b00t", seq=3, now_ns=T0 + 5)
    assert (message.node, message.boot, message.seq, message.ts_ns, message.status) == (
        "gpu-1",
        "b00t",
        3,
        T0 + 5,
        wire.HealthStatus.DEGRADED,
    )
    assert [p.code for p in message.problems] == [79]
    assert wire.decode_health(wire.encode(message)) == message

"""Proof of issue 7: live telemetry in the real scheduler process, against emulated GPU nodes and a real nats-server.

One world for the module (starting it is most of the cost): four one-GPU A100-80GB nodes, each scenario pinned to its
own node. The order matters only for the last test, which stops NATS.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from agent.gpus.fake import FakeProcess, MemoryScript
from common import quantities, subjects, wire
from tests import polling
from tests.e2e import harness
from tests.e2e.telemetry_harness import GRACE_S, INTERVAL_S, TelemetryWorld, queue, share_pod, telemetry_world

pytestmark = pytest.mark.integration

GIB = quantities.GIB

SPEC = """
nodes:
  - {name: gpu-alert, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-evict, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-stray, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-free, gpus: {count: 1, model: A100-80GB}}
  - {name: cpu-only}
"""


@pytest.fixture(scope="module")
def world() -> Iterator[TelemetryWorld]:
    # Room above nats-server's default 1 MB payload, so an oversized message reaches the scheduler's own check.
    with telemetry_world(SPEC, nats_config="max_payload: 2MB") as started:
        yield started


def running(world: TelemetryWorld, name: str) -> bool:
    pod = world.pod(name)
    return pod is not None and harness.bound(pod) and (pod.get("status") or {}).get("phase") == "Running"


def alert_value(world: TelemetryWorld, alert: str, **labels: str) -> float | None:
    return world.value("quotient_alert", alert=alert, **labels)


def test_a_device_with_memory_of_no_pod_takes_no_new_share_says_why_in_numbers_and_alerts(
    world: TelemetryWorld,
) -> None:
    world.apply("half", share_pod("half", fraction="0.5", node="gpu-stray", memory="4Gi"))
    polling.until_sync(
        lambda: running(world, "half"), timeout_s=harness.STEP_TIMEOUT_S, what="the 0.5 pod running on gpu-stray"
    )
    # A process of no pod (another tenant, a zombie) takes 66 GiB: the device now shows 70 of 80 GiB used.
    world.nodes.fakes["gpu-stray"].probe.add_process(
        FakeProcess(pid=90_000, gpu_index=0, memory=MemoryScript(steps=((0, 66 * GIB),)))
    )
    polling.until_sync(
        lambda: alert_value(world, "UnattributedGpuMemory", node="gpu-stray", gpu="0") == 1.0,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="UnattributedGpuMemory on /metrics",
    )
    assert world.value("quotient_device_unattributed_gpu_memory_bytes", node="gpu-stray", gpu="0") == 66 * GIB
    assert world.value("quotient_device_gpu_allotted_milli", node="gpu-stray", gpu="0") == 500
    world.apply("late", share_pod("late", fraction="0.4", node="gpu-stray", memory="1Gi"))

    def says_why() -> bool:
        notes = [str(event.get("message")) for event in harness.events_about(world.kubectl, "default", "late")]
        return any("held by a process of no pod" in note and "measured free" in note for note in notes)

    polling.until_sync(says_why, timeout_s=harness.STEP_TIMEOUT_S, what="the pending reason of the 0.4 pod, in numbers")
    pod = world.pod("late")
    assert pod is not None and not harness.bound(pod)
    note = next(
        str(event.get("message"))
        for event in harness.events_about(world.kubectl, "default", "late")
        if "held by a process of no pod" in str(event.get("message"))
    )
    print("pending reason:", note)
    assert "0.4 GPU requested" in note and "66.0 GiB held by a process of no pod" in note
    received = [r.alert for r in world.listener.received() if r.alert.name == "UnattributedGpuMemory"]
    assert received and received[0].node_name == "gpu-stray" and received[0].used_bytes == 66 * GIB
    world.kubectl("delete", "pod", "late", "--wait=false")


def test_a_share_that_outgrows_its_allotment_alerts_three_ways_and_clears_when_it_shrinks(
    world: TelemetryWorld,
) -> None:
    world.apply("neighbour", share_pod("neighbour", fraction="0.25", node="gpu-alert", memory="4Gi"))
    polling.until_sync(
        lambda: running(world, "neighbour"), timeout_s=harness.STEP_TIMEOUT_S, what="the neighbour running"
    )
    world.apply("grower", share_pod("grower", fraction="0.25", node="gpu-alert", memory="2Gi@0s,30Gi@2s,6Gi@7s"))
    labels = {"namespace": "default", "pod": "grower", "node": "gpu-alert", "gpu": "0"}
    over_at: list[float] = []

    def fired() -> bool:
        used = world.value("quotient_pod_gpu_memory_used_bytes", **labels)
        if not over_at and used is not None and used > 20.5 * GIB:
            over_at.append(time.monotonic())
        return alert_value(world, "GpuMemoryOverconsumption", pod="grower") == 1.0

    polling.until_sync(fired, timeout_s=30, what="GpuMemoryOverconsumption on /metrics")
    fired_at = time.monotonic()
    if over_at:
        print(
            f"first scrape over the allotment to alert on /metrics: {fired_at - over_at[0]:.2f}s "
            f"(grace {GRACE_S}s, interval {INTERVAL_S}s, scrape every 0.1s)"
        )
    assert world.value("quotient_pod_gpu_memory_allotted_bytes", **labels) == 20 * GIB
    assert world.value("quotient_alerts_firing", alert="GpuMemoryOverconsumption") == 1.0
    assert alert_value(world, "GpuMemoryOverconsumption", pod="neighbour") is None

    def warned() -> bool:
        return any(
            event.get("reason") == "GpuMemoryOverconsumption" and event.get("type") == "Warning"
            for event in harness.events_about(world.kubectl, "default", "grower")
        )

    polling.until_sync(warned, timeout_s=harness.STEP_TIMEOUT_S, what="a Warning Event on the pod")
    polling.until_sync(
        lambda: any(r.alert.pod_name == "grower" for r in world.listener.received()),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the Alert on quotient.v1.alerts.GpuMemoryOverconsumption",
    )
    alert = next(r for r in world.listener.received() if r.alert.pod_name == "grower")
    assert alert.subject == subjects.alert("GpuMemoryOverconsumption")
    assert alert.alert.state is wire.AlertState.FIRING and alert.alert.allotted_bytes == 20 * GIB
    assert alert.alert.labels.get("neighbours") == "default/neighbour"
    polling.until_sync(
        lambda: alert_value(world, "GpuMemoryOverconsumption", pod="grower") is None,
        timeout_s=20,
        what="the alert clearing once the pod is back under",
    )
    polling.until_sync(
        lambda: any(
            r.alert.pod_name == "grower" and r.alert.state is wire.AlertState.RESOLVED
            for r in world.listener.received()
        ),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the resolved Alert on NATS",
    )
    assert running(world, "grower") and running(world, "neighbour")


def test_under_the_evict_policy_of_its_queue_the_pod_over_its_share_is_evicted_and_its_neighbour_is_not(
    world: TelemetryWorld,
) -> None:
    world.apply("evictors", queue("evictors", annotations={"quotient.dev/overuse-policy": "evict"}))
    world.apply("calm", share_pod("calm", fraction="0.25", node="gpu-evict", memory="4Gi", queue="evictors"))
    polling.until_sync(lambda: running(world, "calm"), timeout_s=harness.STEP_TIMEOUT_S, what="the calm pod running")
    calm_uid = (world.pod("calm") or {})["metadata"]["uid"]
    world.apply("hog", share_pod("hog", fraction="0.25", node="gpu-evict", memory="2Gi@0s,40Gi@1s", queue="evictors"))
    polling.until_sync(lambda: running(world, "hog"), timeout_s=harness.STEP_TIMEOUT_S, what="the hog running")
    hog_uid = (world.pod("hog") or {})["metadata"]["uid"]
    polling.until_sync(lambda: world.pod("hog") is None, timeout_s=30, what="the hog evicted")
    calm = world.pod("calm")
    assert calm is not None and calm["metadata"]["uid"] == calm_uid and running(world, "calm")
    polling.until_sync(
        lambda: any(d.pod_uid == hog_uid and d.action is wire.DecisionAction.EVICT for d in world.listener.decisions()),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the eviction's Decision",
    )
    decision = next(
        d for d in world.listener.decisions() if d.pod_uid == hog_uid and d.action is wire.DecisionAction.EVICT
    )
    assert decision.reason == "GpuMemoryOverconsumption" and "evicted under queue evictors" in decision.message
    assert not any(d.pod_uid == calm_uid and d.action is wire.DecisionAction.EVICT for d in world.listener.decisions())
    assert (world.value("quotient_evictions_total", reason="GpuMemoryOverconsumption") or 0) >= 1


def telemetry_of(node: str, *, boot: str, seq: int, pod_uid: str) -> wire.NodeTelemetry:
    return wire.NodeTelemetry(
        v=1,
        node=node,
        boot=boot,
        seq=seq,
        ts_ns=time.time_ns(),
        interval_ms=250,
        gpus=(
            wire.GpuReport(
                index=0,
                uuid="GPU-forged",
                model="NVIDIA A100-SXM4-80GB",
                memory_total_bytes=80 * GIB,
                memory_reserved_bytes=0,
                memory_used_bytes=50 * GIB,
                memory_free_bytes=30 * GIB,
                processes=(wire.ProcessReport(pid=7, used_memory_bytes=50 * GIB, pod_uid=pod_uid),),
            ),
        ),
    )


def test_nats_down_means_stale_telemetry_and_scheduling_by_requests_and_garbage_is_counted_not_fatal(
    world: TelemetryWorld,
) -> None:
    world.nats.stop()
    try:
        polling.until_sync(
            lambda: alert_value(world, "TelemetryStale", node="gpu-free") == 1.0,
            timeout_s=harness.STEP_TIMEOUT_S,
            what="TelemetryStale on /metrics while NATS is down",
        )
        world.apply("during", share_pod("during", fraction="0.25", node="gpu-free", memory="1Gi"))
        polling.until_sync(
            lambda: running(world, "during"),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="a pod placed by requests while NATS is down",
        )
    finally:
        world.nats.start()
    polling.until_sync(
        lambda: (
            alert_value(world, "TelemetryStale", node="gpu-free") is None
            and (world.value("quotient_node_telemetry_age_seconds", node="gpu-free") or 99) < 2
        ),
        timeout_s=30,
        what="fresh telemetry after NATS came back",
    )
    neighbour_uid = (world.pod("calm") or {})["metadata"]["uid"]  # bound to gpu-evict
    rejected_before = world.value("quotient_telemetry_messages_total", outcome="rejected") or 0
    flood = [
        (subjects.telemetry("gpu-free"), b"\xc1 not msgpack at all"),
        (subjects.telemetry("gpu-free"), msgpack.packb({"v": 1, "node": 5})),
        (subjects.telemetry("gpu-free"), msgpack.packb({"v": 2, "node": "gpu-free"})),
        (subjects.telemetry("gpu-free"), b"\x91" * (1024 * 1024 + 16)),
        (subjects.telemetry("someone-else"), wire.encode(telemetry_of("gpu-free", boot="f", seq=1, pod_uid="x"))),
        (
            # A node of the cluster with no agent of its own (so no real sample replaces the forged one before it is
            # analysed) claims a pod bound to gpu-evict.
            subjects.telemetry("cpu-only"),
            wire.encode(telemetry_of("cpu-only", boot="g", seq=1, pod_uid=neighbour_uid)),
        ),
        (
            subjects.telemetry("ghost-node"),
            wire.encode(telemetry_of("ghost-node", boot="g", seq=1, pod_uid=neighbour_uid)),
        ),
    ]
    for _ in range(20):
        for subject, payload in flood:
            world.publish(subject, payload)
    expected = (
        "not_msgpack",
        "wrong_type",
        "unknown_version",
        "oversized",
        "subject_mismatch",
        "foreign_claim",
        "unknown_node",
    )

    def counted() -> dict[str, float]:
        return {reason: world.value("quotient_telemetry_rejected_total", reason=reason) or 0 for reason in expected}

    try:
        polling.until_sync(
            lambda: all(counted().values()),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="every kind of bad message counted on /metrics",
        )
    finally:
        print("rejected on /metrics:", counted())
    # 20 rounds of four kinds of malformed message at least (repeats of the forged one count as duplicates).
    polling.until_sync(
        lambda: (world.value("quotient_telemetry_messages_total", outcome="rejected") or 0) >= rejected_before + 80,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the rejected messages counted",
    )
    assert world.scheduler.process.poll() is None
    assert running(world, "calm") and alert_value(world, "GpuMemoryOverconsumption", pod="calm") is None
    # A node the cluster does not have is never analysed: no alert about it, stale or otherwise.
    assert world.value("quotient_node_telemetry_age_seconds", node="ghost-node") is None


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_flood_of_unknown_nodes_and_oversized_messages_leaves_the_scheduler_memory_bounded(
    world: TelemetryWorld,
) -> None:
    pid = world.scheduler.process.pid
    before = _rss_bytes(pid)

    def dropped() -> float:
        """Every message refused (the near-1 MiB ones decode as garbage) or dropped at the door when full."""
        return world.value("quotient_telemetry_messages_total", outcome="rejected") or 0

    counted_before = dropped()
    flood: list[tuple[str, bytes]] = []
    for i in range(3000):
        flood.append(
            (subjects.telemetry(f"flood-{i}"), wire.encode(telemetry_of(f"flood-{i}", boot="f", seq=1, pod_uid="x")))
        )
        if i % 3 == 0:
            flood.append((subjects.telemetry("gpu-free"), b"\x91" * (1024 * 1024 - 64)))
    world.publish_many(flood)
    polling.until_sync(
        lambda: dropped() >= counted_before + 900,
        timeout_s=60,
        what="the big garbage messages counted",
    )
    grown = _rss_bytes(pid) - before
    print(f"scheduler RSS grew by {grown / 2**20:.1f} MiB under the flood")
    assert grown < 128 * 2**20, f"the scheduler grew by {grown / 2**20:.1f} MiB"
    assert world.scheduler.process.poll() is None
    assert world.value("quotient_node_telemetry_age_seconds", node="flood-1") is None

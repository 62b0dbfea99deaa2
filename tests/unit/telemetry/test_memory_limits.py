"""KAI v0.18's per-container GPU memory limit in the over-consumption alert (issue 16): a pod is placed and accounted
by its request, may use up to its limit while the device's measured headroom (total minus the window's peak minus
the margin) lasts, and is over-consuming past its limit, or between the two once the headroom is gone, naming the
neighbours at risk as for any over-use. From the pod's annotations (``views``) to the decision (``detector``)."""

from __future__ import annotations

import dataclasses

from common import names, wire
from scheduler.objects import pods
from scheduler.state.cache import ClusterState
from scheduler.telemetry import detector, headroom, live, overuse, views
from tests.unit.telemetry.builders import GIB, NODE, SETTINGS, S, gpu, proc, sample, view

OVER = overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION
MARGIN = GIB
LIMITED = dataclasses.replace(SETTINGS, headroom_margin_bytes=MARGIN)


def _limited(uid: str, *, request_gib: int = 20, limit_gib: int = 40) -> overuse.PodView:
    """A pod of 20 GiB request and 40 GiB limit on GPU 0 (an 80 GiB device)."""
    device = overuse.PodDevice(index=0, uuid="GPU-0000", allotted_bytes=request_gib * GIB, limit_bytes=limit_gib * GIB)
    return overuse.PodView(
        uid=uid, namespace="ml", name=f"pod-{uid}", node=NODE, queue="team-a", phase=overuse.PodPhase.RUNNING,
        devices=(device,),
    )  # fmt: skip


def _neighbour() -> overuse.PodView:
    device = overuse.PodDevice(index=0, uuid="GPU-0000", allotted_bytes=20 * GIB)
    return overuse.PodView(
        uid="b", namespace="ml", name="pod-b", node=NODE, queue="team-b", phase=overuse.PodPhase.RUNNING,
        devices=(device,),
    )  # fmt: skip


def _fired(
    watch: detector.OveruseDetector,
    used_gib: float,
    *,
    neighbour_gib: float = 10,
    peak_gib: float | None = None,
    until_s: int = 11,
) -> list[overuse.Transition]:
    """Feed pod ``a`` using ``used_gib`` beside pod ``b`` for ``until_s`` seconds; the transitions decided."""
    node_view = view(_limited("a"), _neighbour())
    peaks = {} if peak_gib is None else {0: int(peak_gib * GIB)}
    fired: list[overuse.Transition] = []
    for at_s in range(until_s + 1):
        report = gpu(0, proc(10, used_gib, "a"), proc(11, neighbour_gib, "b"))
        result = watch.observe(sample(report, at_s=at_s), node_view, now_ns=at_s * S, peak_used_bytes=peaks)
        fired += result.transitions
    return fired


def test_use_between_request_and_limit_is_allowed_while_the_device_has_headroom() -> None:
    # 35 GiB + 10 GiB used of 80 GiB, peak 45 GiB, margin 1 GiB: 34 GiB of headroom.
    assert _fired(detector.OveruseDetector(LIMITED), 35) == []


def test_past_its_limit_a_pod_is_over_consuming_and_its_neighbours_are_named() -> None:
    [transition] = _fired(detector.OveruseDetector(LIMITED), 41)

    assert transition.name is OVER and transition.state is wire.AlertState.FIRING
    assert transition.allotted_bytes == 40 * GIB, "held to its limit"
    assert transition.neighbours == ("ml/pod-b",)
    assert "(its limit)" in transition.message and "neighbours at risk: ml/pod-b" in transition.message


def test_between_request_and_limit_it_is_over_consuming_once_the_headroom_is_gone() -> None:
    # The window's peak was 79.5 GiB: 80 - 79.5 - 1 (margin) leaves none, though the sample itself has room.
    [transition] = _fired(detector.OveruseDetector(LIMITED), 35, peak_gib=79.5)

    assert transition.allotted_bytes == 20 * GIB, "held to its request"
    assert "holds only while the device has headroom" in transition.message
    assert transition.neighbours == ("ml/pod-b",)


def test_the_margin_counts_against_the_headroom() -> None:
    # A 79.5 GiB peak: 0.5 GiB left without a margin, -0.5 GiB with the 1 GiB margin.
    assert _fired(detector.OveruseDetector(SETTINGS), 35, peak_gib=79.5) == []
    assert len(_fired(detector.OveruseDetector(LIMITED), 35, peak_gib=79.5)) == 1


def test_a_pod_without_a_limit_above_its_request_is_held_to_its_request_whatever_the_headroom() -> None:
    plain = view(dataclasses.replace(_limited("a"), devices=(overuse.PodDevice(index=0, allotted_bytes=20 * GIB),)))
    watch = detector.OveruseDetector(LIMITED)
    fired = [
        transition
        for at_s in range(12)
        for transition in watch.observe(
            sample(gpu(0, proc(10, 25, "a")), at_s=at_s), plain, now_ns=at_s * S
        ).transitions
    ]
    assert [transition.name for transition in fired] == [OVER]


def test_the_headroom_is_the_placement_engines_peak_over_the_window() -> None:
    tracker = headroom.HeadroomTracker(window_ns=10 * S, max_samples=64)
    for at_s, used in ((0, 70), (5, 30), (12, 20)):
        tracker.record(sample(gpu(0, used_gib=used), at_s=at_s), unattributed_bytes={})

    assert tracker.peaks(NODE, now_ns=12 * S) == {0: 30 * GIB}, "the 70 GiB of t=0 left the window"
    assert tracker.peaks("elsewhere", now_ns=12 * S) == {}


def _state_with_limited_pod() -> ClusterState:
    """A cluster state holding one running pod of 20 GiB request, 40 GiB limit on GPU 0 of ``NODE``."""
    state = ClusterState(scheduler_names=["quotient"])
    prefix = f"{names.CONTAINER_ANNOTATION_PREFIX}main"
    annotations = {
        f"{prefix}{names.GPU_MEMORY_REQUEST_SUFFIX}": "20Gi",
        f"{prefix}{names.GPU_MEMORY_LIMIT_SUFFIX}": "40Gi",
        names.GPU_DEVICES_ANNOTATION: "0",
        names.GPU_UUIDS_ANNOTATION: "GPU-0000",
    }
    record = pods.decode(
        {
            "metadata": {"name": "nv", "namespace": "ml", "uid": "nv", "annotations": annotations},
            "spec": {"schedulerName": "quotient", "nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        }
    )
    assert record is not None
    state.put_pod(record)
    return state


def test_the_node_view_carries_a_pods_per_container_limit_and_reserves_its_request() -> None:
    state = _state_with_limited_pod()
    node_views = views.NodeViews(state, queue_label=names.QUEUE_LABEL, default_policy=overuse.OverusePolicy.ALERT)

    built = node_views.on_node(NODE, sample(gpu(0)).telemetry, [])

    [pod] = built.view.pods
    [device] = pod.devices
    assert (device.allotted_bytes, device.limit_bytes) == (20 * GIB, 40 * GIB)


def test_live_telemetry_measures_the_headroom_over_the_window_the_engine_uses() -> None:
    settings = live.LiveSettings(detector=LIMITED, stale_floor_ns=60 * S, headroom_window_ns=30 * S)

    def alerts(spike_gib: float) -> list[str]:
        telemetry = live.LiveTelemetry(settings, _state_with_limited_pod())
        # Something else filled the device a moment ago; the pod then sits at 35 GiB, between request and limit.
        fired = list(telemetry.apply([sample(gpu(0, used_gib=spike_gib), at_s=0)], now_ns=0).transitions)
        for at_s in range(1, 13):
            result = telemetry.apply([sample(gpu(0, proc(10, 35, "nv")), at_s=at_s)], now_ns=at_s * S)
            fired += result.transitions
        return [transition.name.value for transition in fired]

    assert alerts(spike_gib=40) == []
    assert alerts(spike_gib=79.5) == [OVER.value], "the spike is still in the 30 s window: no headroom"

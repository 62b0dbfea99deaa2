"""Measured headroom: the peak of used memory per device over a window, in bounded memory, and the engine's view."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.placement import model
from scheduler.telemetry import headroom
from tests.unit.telemetry.builders import GIB, NODE, S, gpu, sample


def tracker(window_s: int = 10, max_samples: int = 64) -> headroom.HeadroomTracker:
    return headroom.HeadroomTracker(window_ns=window_s * S, max_samples=max_samples)


def test_the_peak_is_the_largest_used_memory_within_the_window() -> None:
    peaks = tracker()
    for at_s, used_gib in [(0, 10), (2, 50), (4, 20), (11, 30)]:
        peaks.record(sample(gpu(0, used_gib=used_gib), at_s=at_s), unattributed_bytes={})
    assert peaks.peak_used_bytes(NODE, 0, now_ns=11 * S) == 50 * GIB  # the 50 at 2 s is still within 10 s
    assert peaks.peak_used_bytes(NODE, 0, now_ns=12 * S) == 50 * GIB  # exactly 10 s old: still in
    assert peaks.peak_used_bytes(NODE, 0, now_ns=12 * S + 1) == 30 * GIB
    assert peaks.peak_used_bytes(NODE, 0, now_ns=30 * S) is None


def test_a_device_without_telemetry_is_unmeasured_and_stale() -> None:
    assert tracker().device_view(NODE, 0, now_ns=0, stale=True) == headroom.UNMEASURED


def test_the_view_carries_peak_staleness_and_unattributed_memory() -> None:
    peaks = tracker()
    peaks.record(sample(gpu(0, used_gib=70), gpu(1, used_gib=1)), unattributed_bytes={0: 60 * GIB})
    assert peaks.device_view(NODE, 0, now_ns=S, stale=False) == headroom.DeviceView(
        peak_used_bytes=70 * GIB, stale=False, unattributed_bytes=60 * GIB
    )
    assert peaks.device_view(NODE, 1, now_ns=S, stale=True) == headroom.DeviceView(
        peak_used_bytes=GIB, stale=True, unattributed_bytes=0
    )


def test_a_device_that_leaves_the_samples_and_a_forgotten_node_drop_their_rings() -> None:
    peaks = tracker()
    peaks.record(sample(gpu(0, used_gib=5), gpu(1, used_gib=5)), unattributed_bytes={})
    peaks.record(sample(gpu(0, used_gib=5), at_s=1), unattributed_bytes={})
    assert peaks.peak_used_bytes(NODE, 1, now_ns=S) is None
    assert peaks.samples_held() == 2
    peaks.forget(NODE)
    assert peaks.samples_held() == 0


@settings(max_examples=50, deadline=None)
@given(
    gaps_ms=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=300),
    max_samples=st.integers(min_value=1, max_value=16),
)
def test_memory_stays_bounded_however_fast_a_node_sends(gaps_ms: list[int], max_samples: int) -> None:
    peaks = headroom.HeadroomTracker(window_ns=5 * S, max_samples=max_samples)
    now_ns = 0
    for position, gap_ms in enumerate(gaps_ms):
        now_ns += gap_ms * 1_000_000
        telemetry = sample(gpu(0, used_gib=position % 7), gpu(1, used_gib=1))
        peaks.record(type(telemetry)(telemetry=telemetry.telemetry, received_ns=now_ns), unattributed_bytes={})
        assert peaks.samples_held() <= 2 * max_samples
    assert peaks.peak_used_bytes(NODE, 0, now_ns=now_ns) is not None


def test_measured_sets_the_model_device_fields_and_keeps_an_unchanged_device() -> None:
    device = model.Device(index=0, uuid=model.GpuUuid("GPU-0000"), model="H100", memory_bytes=80 * GIB)
    unmeasured = headroom.measured(device, headroom.DeviceView(peak_used_bytes=None, stale=False, unattributed_bytes=0))
    assert unmeasured is device
    seen = headroom.measured(device, headroom.DeviceView(peak_used_bytes=70 * GIB, stale=True, unattributed_bytes=GIB))
    assert (seen.peak_used_bytes, seen.telemetry_stale, seen.unattributed_bytes) == (70 * GIB, True, GIB)
    assert (seen.index, seen.memory_bytes) == (0, 80 * GIB)

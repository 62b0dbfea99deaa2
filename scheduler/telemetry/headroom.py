"""Measured headroom: the peak of each device's used memory over a short window, as the placement engine reads it.

A device's free share for placement is the smaller of request-based free and measured free, total minus the peak of
used memory over a short window minus a margin (DESIGN.md, "Telemetry in decisions"). The peak, not the last
value: training steps and inference batches swing memory up and down within seconds, and a placement made in a dip
would land on top of the next swing. The margin is the engine's; this module gives it the peak.

Memory is bounded: per device a ring of at most ``max_samples`` (receive time, used bytes) pairs, pruned to the
window at every record, so what one node can make the scheduler hold does not grow with its sending rate. Devices
that leave a node's samples and nodes that are forgotten drop their rings.

``device_view`` fills the three measured fields of ``scheduler.placement.model.Device``: ``peak_used_bytes`` (None
without a sample in the window), ``telemetry_stale`` (from ``staleness``) and ``unattributed_bytes`` (from
``detector.attribute``). ``peaks`` gives the same peaks to the over-consumption detector, which lets a pod use memory
between its request and its limit while that headroom lasts. Pure: the time is an argument.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from scheduler.placement import model
from scheduler.telemetry import overuse


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceView:
    """What the engine learns about one device from telemetry."""

    peak_used_bytes: int | None
    stale: bool
    unattributed_bytes: int


UNMEASURED = DeviceView(peak_used_bytes=None, stale=True, unattributed_bytes=0)
"""A device with no telemetry at all: the engine accounts for it by requests."""


@dataclasses.dataclass(slots=True)
class _Ring:
    samples: collections.deque[tuple[int, int]]
    unattributed_bytes: int = 0


class HeadroomTracker:
    """Per (node, device index), the recent used-memory samples of the device and its latest unattributed memory."""

    def __init__(self, *, window_ns: int, max_samples: int) -> None:
        if window_ns <= 0 or max_samples <= 0:
            raise ValueError(f"window_ns ({window_ns}) and max_samples ({max_samples}) must be positive")
        self._window_ns = window_ns
        self._max_samples = max_samples
        self._nodes: dict[str, dict[int, _Ring]] = {}

    def record(self, sample: overuse.NodeSample, *, unattributed_bytes: Mapping[int, int]) -> None:
        """Add a node's sample (at its receive time); ``unattributed_bytes`` per device index, from the detector."""
        telemetry = sample.telemetry
        now_ns = sample.received_ns
        previous = self._nodes.get(telemetry.node, {})
        rings: dict[int, _Ring] = {}
        for gpu in telemetry.gpus:
            ring = previous.get(gpu.index)
            if ring is None:
                ring = _Ring(samples=collections.deque(maxlen=self._max_samples))
            ring.samples.append((now_ns, gpu.memory_used_bytes))
            _prune(ring.samples, now_ns - self._window_ns)
            ring.unattributed_bytes = unattributed_bytes.get(gpu.index, 0)
            rings[gpu.index] = ring
        if rings:
            self._nodes[telemetry.node] = rings
        else:
            self._nodes.pop(telemetry.node, None)

    def peak_used_bytes(self, node: str, index: int, *, now_ns: int) -> int | None:
        """The largest used memory recorded within the window before ``now_ns``; None without such a sample."""
        ring = self._nodes.get(node, {}).get(index)
        if ring is None:
            return None
        oldest = now_ns - self._window_ns
        peaks = [used for received_ns, used in ring.samples if received_ns >= oldest]
        return max(peaks) if peaks else None

    def peaks(self, node: str, *, now_ns: int) -> dict[int, int]:
        """Per device index of ``node``, the peak used memory within the window before ``now_ns`` (devices without
        a sample there left out): what the over-consumption detector measures a device's headroom by."""
        found: dict[int, int] = {}
        for index in self._nodes.get(node, {}):
            peak = self.peak_used_bytes(node, index, now_ns=now_ns)
            if peak is not None:
                found[index] = peak
        return found

    def device_view(self, node: str, index: int, *, now_ns: int, stale: bool) -> DeviceView:
        ring = self._nodes.get(node, {}).get(index)
        if ring is None:
            return dataclasses.replace(UNMEASURED, stale=stale)
        return DeviceView(
            peak_used_bytes=self.peak_used_bytes(node, index, now_ns=now_ns),
            stale=stale,
            unattributed_bytes=ring.unattributed_bytes,
        )

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def samples_held(self) -> int:
        """How many samples are held in all (for tests and a memory gauge)."""
        return sum(len(ring.samples) for rings in self._nodes.values() for ring in rings.values())


def measured(device: model.Device, view: DeviceView) -> model.Device:
    """``device`` with its measured fields set from ``view``; the same object when nothing changes, so the engine's
    identity-keyed indexes see an unchanged device."""
    if (
        device.peak_used_bytes == view.peak_used_bytes
        and device.telemetry_stale == view.stale
        and device.unattributed_bytes == view.unattributed_bytes
    ):
        return device
    return dataclasses.replace(
        device,
        peak_used_bytes=view.peak_used_bytes,
        telemetry_stale=view.stale,
        unattributed_bytes=view.unattributed_bytes,
    )


def _prune(samples: collections.deque[tuple[int, int]], oldest_ns: int) -> None:
    while samples and samples[0][0] < oldest_ns:
        samples.popleft()

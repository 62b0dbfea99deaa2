"""The detector's side of ``quotient bench telemetry``: what the scheduler knows of the crossing nodes, the pure
``OveruseDetector`` fed with the consumer's changes as the scheduler feeds it, and when each alert fired.

It observes the nodes it has a view of, the crossing ones; a scheduler observing every node would pay the measured
price of one observation per message.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Final

from common import quantities, wire
from quotient.bench import telemetryload
from scheduler.telemetry import detector, overuse
from scheduler.telemetry.feed import consumer

# Slack above the allotment before a pod counts as over: the crossing pod (16 GiB of 10) is far beyond it.
_TOLERANCE_BYTES: Final = quantities.GIB // 2
# Longer than any run: only over-consumption alerts are measured, never evictions, ghosts or unattributed memory.
_NEVER_NS: Final = 3600 * quantities.NS_PER_S


def make_detector(*, grace_ns: int) -> detector.OveruseDetector:
    """The detector as the bench runs it: over-consumption with ``grace_ns``, the other alerts out of reach."""
    return detector.OveruseDetector(
        overuse.Settings(
            tolerance_bytes=_TOLERANCE_BYTES,
            grace_ns=grace_ns,
            evict_grace_ns=_NEVER_NS,
            ghost_threshold_ns=_NEVER_NS,
            unattributed_threshold_bytes=quantities.GIB,
        )
    )


def views(plan: telemetryload.PublisherPlan) -> dict[str, overuse.NodeView]:
    """What the scheduler knows of each crossing node: one running pod per process, each allotted 10 GiB on the
    device its process is on (the under-allotment samples use at most 9 GiB, so only the crossing pod goes over)."""
    views: dict[str, overuse.NodeView] = {}
    for i in plan.crossings:
        node = telemetryload.node_name(i)
        pods = [
            overuse.PodView(
                uid=telemetryload.pod_uid(i, p),
                namespace="bench",
                name=f"pod-{i}-{p}",
                node=node,
                queue="bench",
                phase=overuse.PodPhase.RUNNING,
                devices=(
                    overuse.PodDevice(
                        index=p % plan.devices,
                        uuid=telemetryload.gpu_uuid(i, p % plan.devices),
                        allotted_bytes=telemetryload.ALLOTTED_BYTES,
                    ),
                ),
            )
            for p in range(plan.processes)
        ]
        views[node] = overuse.NodeView(pods=pods, holders={}, known_pods={pod.uid: pod for pod in pods}, policies={})
    return views


@dataclasses.dataclass(slots=True)
class Alerts:
    """The detector's side of the run: when each crossing node's over-consumption alert fired, and its CPU."""

    fired_ns: dict[str, int] = dataclasses.field(default_factory=dict)
    observations: int = 0
    cpu_s: float = 0.0


async def feed_detector(
    telemetry: consumer.TelemetryConsumer,
    detector: detector.OveruseDetector,
    views: Mapping[str, overuse.NodeView],
    alerts: Alerts,
) -> None:
    """As the scheduler does: wake on the consumer's changes and observe each changed node it has a view of."""
    tracked = frozenset(views)
    while True:
        await telemetry.changed.wait()
        changes = telemetry.take_changes()
        nodes = changes.telemetry & tracked
        if not nodes:
            continue
        cpu0 = time.process_time()
        latest = telemetry.latest()
        for node in nodes:
            sample = latest[node]
            now_ns = time.time_ns()
            result = detector.observe(
                overuse.NodeSample(telemetry=sample.telemetry, received_ns=sample.received_ns),
                views[node],
                now_ns=now_ns,
            )
            alerts.observations += 1
            for transition in result.transitions:
                if (
                    transition.name is overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION
                    and transition.state is wire.AlertState.FIRING
                ):
                    alerts.fired_ns.setdefault(node, transition.at_ns)
        alerts.cpu_s += time.process_time() - cpu0

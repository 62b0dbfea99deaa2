"""Proof of issue 12's failed GPU: an Xid on a device takes it out of placement, says so everywhere, and an operator
brings it back.

The real agent of an emulated node sees a critical Xid (79, "GPU has fallen off the bus") on its fake NVML and
publishes its health; the real scheduler process fires ``GpuUnhealthy`` on ``/metrics``, as a NATS alert and as
Events on the node and on the pod using the device, and places no new share there. The operator's
``kubectl annotate node ... quotient.dev/gpu-health-cleared-at=<now>`` brings the device back: the waiting pod is
placed and the alert resolves.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest

from common import names, wire
from tests import polling
from tests.e2e import harness
from tests.e2e.telemetry_harness import TelemetryWorld, share_pod, telemetry_world

pytestmark = pytest.mark.integration

SPEC = """
nodes:
  - {name: gpu-xid, gpus: {count: 1, model: A100-80GB}}
"""


@pytest.fixture(scope="module")
def world() -> Iterator[TelemetryWorld]:
    with telemetry_world(SPEC) as started:
        yield started


def reasons(world: TelemetryWorld, name: str) -> list[str]:
    return [str(event.get("reason")) for event in harness.events_about(world.kubectl, "default", name)]


def gpu_unhealthy(world: TelemetryWorld) -> float | None:
    return world.value("quotient_alert", alert="GpuUnhealthy", node="gpu-xid", gpu="0")


def alerts(world: TelemetryWorld, state: wire.AlertState) -> list[wire.Alert]:
    return [
        received.alert
        for received in world.listener.received()
        if received.alert.name == "GpuUnhealthy" and received.alert.state is state
    ]


def test_an_xid_takes_the_device_out_says_so_everywhere_and_an_operator_clear_brings_it_back(
    world: TelemetryWorld,
) -> None:
    world.apply("resident", share_pod("resident", fraction="0.5", node="gpu-xid", memory="2Gi"))
    polling.until_sync(
        lambda: world.running("resident"), timeout_s=harness.STEP_TIMEOUT_S, what="the 0.5 pod running on gpu-xid"
    )

    async def fall_off_the_bus() -> None:
        world.nodes.fakes["gpu-xid"].probe.inject_xid(0, 79)

    world.loop.run(fall_off_the_bus())
    polling.until_sync(
        lambda: gpu_unhealthy(world) == 1.0, timeout_s=harness.STEP_TIMEOUT_S, what="GpuUnhealthy on /metrics"
    )
    polling.until_sync(
        lambda: alerts(world, wire.AlertState.FIRING), timeout_s=harness.STEP_TIMEOUT_S, what="the NATS alert"
    )
    [fired] = alerts(world, wire.AlertState.FIRING)
    assert (fired.node_name, fired.gpu_index, fired.severity) == ("gpu-xid", 0, wire.Severity.CRITICAL)
    assert "xid" in fired.message and "out of placement" in fired.message
    polling.until_sync(
        lambda: "GpuUnhealthy" in reasons(world, "gpu-xid") and "GpuUnhealthy" in reasons(world, "resident"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="GpuUnhealthy Events on the node and on the pod using the device",
    )

    # Room for a 0.4 share on paper, but the device is out: the pod waits and says why.
    world.apply("newcomer", share_pod("newcomer", fraction="0.4", node="gpu-xid", memory="1Gi"))
    polling.until_sync(
        lambda: "Unschedulable" in reasons(world, "newcomer") or "FailedScheduling" in reasons(world, "newcomer"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the newcomer's pending reason",
    )
    pod = world.pod("newcomer")
    assert pod is not None and not harness.bound(pod)
    assert world.running("resident"), "a device out of placement evicts nobody"

    # A clear that is not a time is refused in words, and the device stays out.
    world.kubectl("annotate", "node", "gpu-xid", f"{names.GPU_HEALTH_CLEARED_ANNOTATION}=yesterday")
    polling.until_sync(
        lambda: "InvalidAnnotation" in reasons(world, "gpu-xid"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the node's Event refusing the clear",
    )
    assert gpu_unhealthy(world) == 1.0 and not harness.bound(world.pod("newcomer") or {})

    cleared_at = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    world.kubectl("annotate", "node", "gpu-xid", "--overwrite", f"{names.GPU_HEALTH_CLEARED_ANNOTATION}={cleared_at}")
    polling.until_sync(
        lambda: world.running("newcomer"), timeout_s=harness.STEP_TIMEOUT_S, what="the newcomer placed after the clear"
    )
    polling.until_sync(
        lambda: gpu_unhealthy(world) in (None, 0.0), timeout_s=harness.STEP_TIMEOUT_S, what="the alert resolved"
    )
    polling.until_sync(
        lambda: alerts(world, wire.AlertState.RESOLVED), timeout_s=harness.STEP_TIMEOUT_S, what="the NATS resolve"
    )
    assert "GpuUnhealthyResolved" in reasons(world, "resident")

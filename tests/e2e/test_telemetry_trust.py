"""Proof of issue 13's consumer part: forged telemetry cannot capture a node, a clock that jumps is refused and says
so, and samples that cannot be true are counted by reason.

From the outside, as an attacker on the node network would: raw NATS clients publish forged bytes to the real
nats-server that the real agents of emulated nodes and the real scheduler process use (every agent shares one NATS
identity here, as without the auth callout, and the wire is clear, so the attacker reads a node's real boot and seq
off the wire first). The proofs read the scheduler's ``/metrics``, the Events on the nodes and the NATS alerts.

The real agent is "accepted again" when a change on its node (a process the test starts on the fake GPU after the
forgery) shows on ``/metrics``: only a sample the agent made after the forgery carries it. The bound on that is two
sampling intervals plus the pipeline (the agent's tick, the scheduler's debounce and sweep, the scrape).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from agent.gpus.fake import FakeProcess, MemoryScript
from common import quantities, subjects, wire
from common.natsconn import NatsBus
from tests import polling
from tests.e2e import harness
from tests.e2e.telemetry_harness import INTERVAL_S, TelemetryWorld, telemetry_world

pytestmark = pytest.mark.integration

GIB = quantities.GIB
MIB = quantities.MIB
S = quantities.NS_PER_S
# Two intervals, and what the pipeline adds to them on a shared 2-core machine: the agent's tick, the consumer's flush,
# the telemetry loop's debounce and sweep, the scrape.
ACCEPTED_AGAIN_WITHIN_S = 2 * INTERVAL_S + 1.5

SPEC = """
nodes:
  - {name: gpu-boot, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-seq, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-jump, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-twin, gpus: {count: 1, model: A100-80GB}}
  - {name: gpu-range, gpus: {count: 1, model: A100-80GB}}
  - {name: cpu-clock}
"""


@pytest.fixture(scope="module")
def world() -> Iterator[TelemetryWorld]:
    with telemetry_world(SPEC) as started:
        yield started


# --- what the attacker does ---


def sniff(world: TelemetryWorld, node: str) -> wire.NodeTelemetry:
    """The next telemetry message of ``node``'s real agent, read off the wire."""

    async def read() -> wire.NodeTelemetry:
        bus = NatsBus(servers=world.nats.url, name="test-sniffer")
        await bus.connect_once()
        seen: asyncio.Future[wire.NodeTelemetry] = asyncio.get_running_loop().create_future()

        async def on_message(_subject: str, data: bytes) -> None:
            if not seen.done():
                seen.set_result(wire.decode_telemetry(data))

        try:
            await bus.subscribe(subjects.telemetry(node), on_message)
            return await asyncio.wait_for(seen, 10)
        finally:
            await bus.close()

    return world.loop.run(read())


def forged(node: str, *, boot: str, seq: int, ts_ns: int, used_gib: int = 77) -> wire.NodeTelemetry:
    """A sample for ``node`` that its agent never made: a device 77 GiB full of a process of no pod."""
    return wire.NodeTelemetry(
        v=1,
        node=node,
        boot=boot,
        seq=seq,
        ts_ns=ts_ns,
        interval_ms=round(INTERVAL_S * 1000),
        gpus=(
            wire.GpuReport(
                index=0,
                uuid="GPU-forged",
                model="NVIDIA A100-SXM4-80GB",
                memory_total_bytes=80 * GIB,
                memory_reserved_bytes=0,
                memory_used_bytes=used_gib * GIB,
                memory_free_bytes=(80 - used_gib) * GIB,
                processes=(),
            ),
        ),
    )


def tampered(message: wire.NodeTelemetry, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``message`` re-encoded with plain msgpack after ``change`` edits its fields: what our encoder would refuse."""
    fields = msgpack.unpackb(wire.encode(message))
    change(fields)
    return bytes(msgpack.packb(fields))


# --- what the proofs read ---


def used_bytes(world: TelemetryWorld, node: str) -> float | None:
    return world.value("quotient_device_gpu_memory_used_bytes", node=node, gpu="0")


def rejected(world: TelemetryWorld, reason: str) -> float:
    return world.value("quotient_telemetry_rejected_total", reason=reason) or 0


def nats_alerts(world: TelemetryWorld, name: str, node: str, state: wire.AlertState) -> list[wire.Alert]:
    return [
        received.alert
        for received in world.listener.received()
        if received.alert.name == name and received.alert.node_name == node and received.alert.state is state
    ]


def event_reasons(world: TelemetryWorld, node: str) -> list[str]:
    return [str(event.get("reason")) for event in harness.events_about(world.kubectl, "default", node)]


def accepted_again(world: TelemetryWorld, node: str, *, pid: int, since: wire.NodeTelemetry) -> float:
    """Start a 512 MiB process on ``node``'s fake GPU (of no pod: below the unattributed threshold) and return how
    long the scheduler took to show it: only a sample the real agent made after now carries it."""
    expected = since.gpus[0].memory_used_bytes + 512 * MIB
    started = time.monotonic()
    world.nodes.fakes[node].probe.add_process(
        FakeProcess(pid=pid, gpu_index=0, memory=MemoryScript.constant(512 * MIB))
    )
    polling.until_sync(
        lambda: used_bytes(world, node) == expected,
        timeout_s=harness.STEP_TIMEOUT_S,
        interval_s=0.02,
        what=f"the real agent's new sample of {node} on /metrics",
    )
    return time.monotonic() - started


# --- the proofs ---

Forgery = Callable[[wire.NodeTelemetry], wire.NodeTelemetry]
FORGERIES: dict[str, tuple[str, Forgery]] = {
    "a fresh boot stamped as late as the skew allows": (
        "gpu-boot",
        lambda real: forged(real.node, boot="f0rged", seq=0, ts_ns=time.time_ns() + 29 * S),
    ),
    "a seq of 10^15 on the node's real boot": (
        "gpu-seq",
        lambda real: forged(real.node, boot=real.boot, seq=10**15, ts_ns=time.time_ns()),
    ),
    "a fresh boot with a seq of 10^15": (
        "gpu-jump",
        lambda real: forged(real.node, boot="f0rged", seq=10**15, ts_ns=time.time_ns()),
    ),
}


@pytest.mark.parametrize(("node", "forgery"), FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_boot_or_sequence_number_cannot_capture_a_node_and_is_flagged_as_a_conflict(
    world: TelemetryWorld, node: str, forgery: Forgery
) -> None:
    real = sniff(world, node)
    polling.until_sync(
        lambda: used_bytes(world, node) is not None, timeout_s=harness.STEP_TIMEOUT_S, what=f"{node} measured"
    )
    rejected_before = world.value("quotient_telemetry_messages_total", outcome="rejected") or 0
    world.publish(subjects.telemetry(node), wire.encode(forgery(real)))

    took_s = accepted_again(world, node, pid=91_000, since=real)
    print(f"{node}: the real agent's new sample on /metrics {took_s:.2f}s after it started the process")
    assert took_s < ACCEPTED_AGAIN_WITHIN_S
    # Nothing of the real agent's was refused, and the node never went stale.
    assert (world.value("quotient_telemetry_messages_total", outcome="rejected") or 0) == rejected_before
    assert world.value("quotient_alert", alert="TelemetryStale", node=node) is None
    # The consumer cannot tell the forger from the agent, so it says a second publisher spoke for the node; once
    # only the agent speaks (the forged stream is no longer live after the 1 s floor), it resolves.
    polling.until_sync(
        lambda: nats_alerts(world, "TelemetryConflict", node, wire.AlertState.FIRING),
        timeout_s=harness.STEP_TIMEOUT_S,
        what=f"TelemetryConflict for {node} on NATS",
    )
    polling.until_sync(
        lambda: nats_alerts(world, "TelemetryConflict", node, wire.AlertState.RESOLVED),
        timeout_s=harness.STEP_TIMEOUT_S,
        what=f"TelemetryConflict for {node} resolved",
    )
    assert world.value("quotient_alert", alert="TelemetryConflict", node=node) is None


def test_two_live_publishers_raise_a_conflict_everywhere_and_it_resolves_when_one_remains(
    world: TelemetryWorld,
) -> None:
    node = "gpu-twin"
    real = sniff(world, node)
    stop = asyncio.Event()

    async def forge() -> int:
        """A second publisher for the node, at the agent's rate, until told to stop."""
        bus = NatsBus(servers=world.nats.url, name="test-twin")
        await bus.connect_once()
        seq = 0
        try:
            while not stop.is_set():
                seq += 1
                await bus.publish(
                    subjects.telemetry(node), wire.encode(forged(node, boot="tw1n", seq=seq, ts_ns=time.time_ns()))
                )
                await asyncio.sleep(INTERVAL_S)
            await bus.flush()
        finally:
            await bus.close()
        return seq

    forger = world.loop.submit(forge())
    try:
        polling.until_sync(
            lambda: world.value("quotient_alert", alert="TelemetryConflict", node=node, severity="critical") == 1.0,
            timeout_s=harness.STEP_TIMEOUT_S,
            what="TelemetryConflict on /metrics",
        )
        polling.until_sync(
            lambda: nats_alerts(world, "TelemetryConflict", node, wire.AlertState.FIRING),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="TelemetryConflict on NATS",
        )
        [fired] = nats_alerts(world, "TelemetryConflict", node, wire.AlertState.FIRING)
        assert fired.severity is wire.Severity.CRITICAL
        assert "2 live publishers claim node gpu-twin" in fired.message and "boot tw1n" in fired.message
        polling.until_sync(
            lambda: "TelemetryConflict" in event_reasons(world, node),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="a TelemetryConflict Event on the node",
        )
        # Never muted: while both speak, the real agent's new samples still reach the scheduler.
        accepted_again(world, node, pid=92_000, since=real)
    finally:
        world.loop.loop.call_soon_threadsafe(stop.set)
    assert forger.result(10) > 0
    polling.until_sync(
        lambda: nats_alerts(world, "TelemetryConflict", node, wire.AlertState.RESOLVED),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="TelemetryConflict resolved on NATS",
    )
    assert world.value("quotient_alert", alert="TelemetryConflict", node=node) is None
    polling.until_sync(
        lambda: "TelemetryConflictResolved" in event_reasons(world, node),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="a TelemetryConflictResolved Event on the node",
    )
    assert world.value("quotient_alert", alert="TelemetryStale", node=node) is None


def test_an_agent_whose_clock_jumps_is_rejected_goes_stale_says_why_and_is_followed_again_when_it_is_back(
    world: TelemetryWorld,
) -> None:
    node = "cpu-clock"  # no real agent: the test is this node's agent, whose clock it moves
    offset_ns = [0]
    stop = asyncio.Event()

    async def agent() -> None:
        bus = NatsBus(servers=world.nats.url, name="test-clock-agent")
        await bus.connect_once()
        seq = 0
        try:
            while not stop.is_set():
                seq += 1
                message = wire.NodeTelemetry(
                    v=1,
                    node=node,
                    boot="c10ck",
                    seq=seq,
                    ts_ns=time.time_ns() + offset_ns[0],
                    interval_ms=round(INTERVAL_S * 1000),
                    gpus=(),
                )
                await bus.publish(subjects.telemetry(node), wire.encode(message))
                await asyncio.sleep(INTERVAL_S)
        finally:
            await bus.close()

    def age() -> float | None:
        return world.value("quotient_node_telemetry_age_seconds", node=node)

    running = world.loop.submit(agent())
    try:
        polling.until_sync(lambda: age() is not None, timeout_s=harness.STEP_TIMEOUT_S, what="the node followed")
        skewed_before = rejected(world, "clock_skew")
        offset_ns[0] = 3600 * S  # its clock jumps an hour ahead
        polling.until_sync(
            lambda: nats_alerts(world, "TelemetryStale", node, wire.AlertState.FIRING),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="TelemetryStale for the node whose clock jumped",
        )
        [stale] = nats_alerts(world, "TelemetryStale", node, wire.AlertState.FIRING)
        assert (
            "rejected, the newest as clock_skew" in stale.message and "ahead of the scheduler's clock" in stale.message
        )
        assert rejected(world, "clock_skew") > skewed_before
        polling.until_sync(
            lambda: any(
                event.get("reason") == "TelemetryStale" and "clock_skew" in str(event.get("message"))
                for event in harness.events_about(world.kubectl, "default", node)
            ),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="the TelemetryStale Event saying why",
        )
        offset_ns[0] = -3600 * S  # an hour behind: refused just the same
        polling.until_sync(
            lambda: rejected(world, "clock_skew") > skewed_before + 20,
            timeout_s=harness.STEP_TIMEOUT_S,
            what="stamps an hour behind counted as clock_skew",
        )
        offset_ns[0] = 0  # its clock is set right: followed again, nothing it sent while wrong holds it back
        polling.until_sync(
            lambda: nats_alerts(world, "TelemetryStale", node, wire.AlertState.RESOLVED),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="TelemetryStale resolved once the clock is back",
        )
        assert world.value("quotient_alert", alert="TelemetryStale", node=node) is None
        assert world.value("quotient_alert", alert="TelemetryConflict", node=node) is None
    finally:
        world.loop.loop.call_soon_threadsafe(stop.set)
        running.result(10)


def test_samples_that_cannot_be_true_are_rejected_and_counted_by_reason(world: TelemetryWorld) -> None:
    node = "gpu-range"
    polling.until_sync(
        lambda: used_bytes(world, node) is not None, timeout_s=harness.STEP_TIMEOUT_S, what=f"{node} measured"
    )
    real_used = used_bytes(world, node)
    template = forged(node, boot="r4nge", seq=1, ts_ns=time.time_ns(), used_gib=1)
    second_device = {**msgpack.unpackb(wire.encode(template))["gpus"][0], "uuid": "GPU-forged-2"}

    def gpu0(**changes: Any) -> Callable[[dict[str, Any]], None]:
        return lambda fields: fields["gpus"][0].update(changes)

    def with_process(used: int) -> Callable[[dict[str, Any]], None]:
        return lambda fields: fields["gpus"][0].update(processes=[{"pid": 7, "used_memory_bytes": used}])

    cases: dict[str, list[Callable[[dict[str, Any]], None]]] = {
        "memory_over_total": [gpu0(memory_used_bytes=81 * GIB), with_process(81 * GIB)],
        "out_of_range": [gpu0(memory_used_bytes=-1), gpu0(gpu_util_pct=101), gpu0(memory_util_pct=250)],
        "duplicate_device": [lambda fields: fields["gpus"].append(second_device)],  # one index twice
    }
    before = {reason: rejected(world, reason) for reason in cases}
    for changes in cases.values():
        for change in changes:
            world.publish(subjects.telemetry(node), tampered(template, change))
    polling.until_sync(
        lambda: all(rejected(world, reason) >= before[reason] + len(changes) for reason, changes in cases.items()),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="each impossible sample counted by its reason",
    )
    # Nothing of them reached the analysis: the device still shows what the real agent measures.
    assert used_bytes(world, node) == real_used

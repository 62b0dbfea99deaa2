"""The telemetry feed cannot be captured: stamps far from the scheduler's clock are refused before they move anything,
no forged (boot, seq) keeps the real agent out, two live publishers raise ``TelemetryConflict``, and a node quiet
because its messages are refused says why. Driven through the feed's synchronous core, on an injected clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from common import subjects, wire
from common.errors import WireError, WireReason
from scheduler.telemetry import overuse, staleness
from scheduler.telemetry.feed import readings

GIB = 1024**3
S = 1_000_000_000
T0 = 1_760_000_000 * S
NODE = "gpu-a"
INTERVAL_MS = 250
SKEW = 30 * S
FLOOR = 2 * S  # a publisher is live for max(3 x 250 ms, 2 s) after its last message


class Clock:
    def __init__(self) -> None:
        self.now_ns = T0

    def __call__(self) -> int:
        return self.now_ns

    def tick(self, seconds: float = INTERVAL_MS / 1000) -> int:
        self.now_ns += round(seconds * S)
        return self.now_ns


def feed(clock: Clock) -> readings.NodeReadings:
    return readings.NodeReadings(
        counters=readings.ConsumerCounters(),
        on_change=lambda: None,
        now_ns=clock,
        max_batch=512,
        max_nodes=100,
        forget_after_s=3600,
        max_skew_ns=SKEW,
        live_floor_ns=FLOOR,
    )


def sample(
    *, boot: str = "real", seq: int, ts_ns: int, node: str = NODE, used_gib: int = 10, gpus: int = 1
) -> wire.NodeTelemetry:
    return wire.NodeTelemetry(
        v=1,
        node=node,
        boot=boot,
        seq=seq,
        ts_ns=ts_ns,
        interval_ms=INTERVAL_MS,
        gpus=tuple(
            wire.GpuReport(
                index=index,
                uuid=f"GPU-{index}",
                model="A100",
                memory_total_bytes=80 * GIB,
                memory_reserved_bytes=0,
                memory_used_bytes=used_gib * GIB,
                memory_free_bytes=(80 - used_gib) * GIB,
                processes=(wire.ProcessReport(pid=100 + index, used_memory_bytes=used_gib * GIB, pod_uid="uid-1"),),
            )
            for index in range(gpus)
        ),
    )


def with_gpu0(message: wire.NodeTelemetry, **changes: int) -> wire.NodeTelemetry:
    gpu = message.gpus[0]
    fields = {name: getattr(gpu, name) for name in gpu.__struct_fields__} | changes
    return wire.NodeTelemetry(
        **{name: getattr(message, name) for name in message.__struct_fields__ if name != "gpus"},
        gpus=(wire.GpuReport(**fields),),
    )


def publish(core: readings.NodeReadings, *messages: wire.NodeTelemetry, replay: bool = False) -> None:
    core.ingest([(subjects.telemetry(message.node), wire.encode(message)) for message in messages], replay=replay)


class RealAgent:
    """The node's real agent: one boot, seq growing by one, stamped on the scheduler's clock."""

    def __init__(self, core: readings.NodeReadings, clock: Clock) -> None:
        self.core, self.clock, self.seq = core, clock, 0

    def publish(self, used_gib: int = 10) -> wire.NodeTelemetry:
        self.seq += 1
        message = sample(seq=self.seq, ts_ns=self.clock.now_ns, used_gib=used_gib)
        publish(self.core, message)
        return message

    def accepted(self, message: wire.NodeTelemetry) -> bool:
        return self.core.latest()[NODE].telemetry == message


def started() -> tuple[Clock, readings.NodeReadings, RealAgent]:
    clock = Clock()
    core = feed(clock)
    agent = RealAgent(core, clock)
    for _ in range(3):
        agent.publish()
        clock.tick()
    return clock, core, agent


# --- clock skew ---


@pytest.mark.parametrize("off_s", [31, -31, 3600, -3600])
def test_a_stamp_beyond_the_skew_either_way_is_rejected_before_it_moves_any_sequence_state(off_s: int) -> None:
    clock, core, agent = started()
    forged = sample(boot="forged", seq=10**15, ts_ns=clock.now_ns + off_s * S)
    publish(core, forged, sample(seq=10**15, ts_ns=clock.now_ns + off_s * S))
    assert core.counters.rejected[WireReason.CLOCK_SKEW] == 2
    clock.tick()
    assert agent.accepted(agent.publish())
    # Nothing was opened or extended by the skewed messages: no restart, no fork, no rival.
    assert (core.counters.agent_restarts, core.counters.forks) == (0, 0)
    assert core.check_conflicts(now_ns=clock.now_ns, known={NODE}) == ()


def test_a_stamp_within_the_skew_is_accepted() -> None:
    clock, core, agent = started()
    publish(core, sample(seq=agent.seq + 1, ts_ns=clock.now_ns + SKEW - 1))
    assert core.latest()[NODE].telemetry.seq == agent.seq + 1
    assert core.counters.rejected_total == 0


def test_an_agent_whose_clock_jumps_forward_is_rejected_says_why_and_is_followed_again_when_it_is_back() -> None:
    clock, core, agent = started()
    watch = staleness.StalenessWatch(floor_ns=FLOOR)
    watch.explain_with(core.why_rejected)
    watch.record(NODE, interval_ms=INTERVAL_MS, received_ns=core.latest()[NODE].received_ns)
    for _ in range(12):  # three seconds of samples an hour ahead
        agent.seq += 1
        publish(core, sample(seq=agent.seq, ts_ns=clock.now_ns + 3600 * S))
        clock.tick()
    assert core.counters.rejected[WireReason.CLOCK_SKEW] == 12
    [fired] = watch.check(now_ns=clock.now_ns)
    assert fired.name is overuse.AlertName.TELEMETRY_STALE
    assert "12 messages since its last accepted one were rejected, the newest as clock_skew" in fired.message
    assert "3600.0s ahead of the scheduler's clock" in fired.message
    # Its clock is back: the next sample is accepted (the stamps an hour ahead moved nothing), and the note is gone.
    back = agent.publish()
    assert agent.accepted(back) and core.why_rejected(NODE) is None


def test_health_is_held_to_the_same_clock() -> None:
    clock, core, _ = started()
    report = wire.NodeHealth(
        v=1,
        node=NODE,
        boot="real",
        seq=99,
        ts_ns=clock.now_ns - 3600 * S,
        status=wire.HealthStatus.HEALTHY,
        problems=(),
    )
    core.ingest([(subjects.health(NODE), wire.encode(report))])
    assert core.counters.rejected[WireReason.CLOCK_SKEW] == 1 and NODE not in core.health()


# --- forged (boot, seq) ---

Forgery = Callable[[int, int], wire.NodeTelemetry]
FORGERIES: dict[str, Forgery] = {
    "a fresh boot": lambda now_ns, seq: sample(boot="forged", seq=0, ts_ns=now_ns),
    "a fresh boot stamped as late as the skew allows": lambda now_ns, seq: sample(
        boot="forged", seq=0, ts_ns=now_ns + SKEW - 1
    ),
    "a seq of 10^15 on the real boot": lambda now_ns, seq: sample(seq=10**15, ts_ns=now_ns),
    "a seq of 10^15 on a fresh boot": lambda now_ns, seq: sample(boot="forged", seq=10**15, ts_ns=now_ns),
    "the real boot's next seq, early": lambda now_ns, seq: sample(seq=seq + 1, ts_ns=now_ns + SKEW - 1),
    "a replay of the real boot's last message": lambda now_ns, seq: sample(seq=seq - 1, ts_ns=now_ns),
}


@pytest.mark.parametrize("forgery", FORGERIES.values(), ids=FORGERIES.keys())
def test_whatever_was_forged_the_real_agents_next_sample_is_accepted(forgery: Forgery) -> None:
    clock, core, agent = started()
    publish(core, forgery(clock.now_ns, agent.seq))
    for _ in range(5):
        clock.tick()
        assert agent.accepted(agent.publish())
    assert core.counters.rejected_total == 0


def test_a_forger_opening_many_streams_still_cannot_keep_the_real_agent_out() -> None:
    clock, core, agent = started()
    for round_ in range(20):
        publish(core, *(sample(boot=f"forged-{round_}-{i}", seq=10**15, ts_ns=clock.now_ns) for i in range(10)))
        publish(core, sample(seq=agent.seq + 10**12, ts_ns=clock.now_ns))  # and jumps the real boot ahead
        clock.tick()
        assert agent.accepted(agent.publish())


# --- conflicts ---


def conflicts(core: readings.NodeReadings, clock: Clock) -> list[tuple[str, str]]:
    return [
        (transition.state.value, transition.severity.value)
        for transition in core.check_conflicts(now_ns=clock.now_ns, known={NODE})
        if transition.name is overuse.AlertName.TELEMETRY_CONFLICT and transition.node == NODE
    ]


def test_two_live_publishers_raise_a_critical_conflict_that_resolves_when_one_remains() -> None:
    clock, core, agent = started()
    for seq in range(1, 5):  # a forger publishing for the node alongside its agent
        publish(core, sample(boot="forged", seq=seq, ts_ns=clock.now_ns, used_gib=70))
        clock.tick(0.1)
        agent.publish()
        clock.tick(0.15)
    fired = core.check_conflicts(now_ns=clock.now_ns, known={NODE})
    assert [(t.name, t.state, t.severity) for t in fired] == [
        (overuse.AlertName.TELEMETRY_CONFLICT, wire.AlertState.FIRING, wire.Severity.CRITICAL)
    ]
    assert "2 live publishers claim node gpu-a" in fired[0].message and "boot forged" in fired[0].message
    assert conflicts(core, clock) == []  # fires once
    # The forger stops; the agent goes on. Once the forged stream is no longer live, one publisher remains.
    while clock.now_ns < fired[0].at_ns + FLOOR:
        clock.tick()
        agent.publish()
    clock.tick()
    agent.publish()
    assert conflicts(core, clock) == [("resolved", "critical")]


def test_a_fork_of_one_boot_raises_the_conflict_and_it_resolves() -> None:
    clock, core, agent = started()
    publish(core, sample(seq=10**15, ts_ns=clock.now_ns))
    clock.tick()
    agent.publish()
    assert conflicts(core, clock) == [("firing", "critical")]
    assert core.counters.forks == 1
    for _ in range(12):
        clock.tick()
        agent.publish()
    assert conflicts(core, clock) == [("resolved", "critical")]


def test_an_agent_restart_raises_no_conflict() -> None:
    clock, core, _ = started()
    clock.tick(1.0)
    for seq in range(1, 20):  # the new boot counts from scratch
        publish(core, sample(boot="restarted", seq=seq, ts_ns=clock.now_ns))
        assert conflicts(core, clock) == []
        clock.tick()
    assert core.counters.agent_restarts == 1


def test_a_node_the_cluster_does_not_have_raises_no_conflict_and_a_fired_one_resolves_when_it_leaves() -> None:
    clock, core, agent = started()
    publish(core, sample(boot="forged", seq=1, ts_ns=clock.now_ns))
    clock.tick()
    agent.publish()
    assert core.check_conflicts(now_ns=clock.now_ns, known=set()) == ()
    assert conflicts(core, clock) == [("firing", "critical")]
    [resolved] = core.check_conflicts(now_ns=clock.now_ns, known=set())
    assert resolved.state is wire.AlertState.RESOLVED


def test_a_replay_overlapping_the_live_feed_is_neither_a_fork_nor_a_rejection() -> None:
    clock, core, agent = started()
    first, second = agent.publish(), agent.publish()
    publish(core, first, replay=True)  # the stream's copy of an older message, read after a reconnect
    publish(core, second, replay=True)
    assert core.latest()[NODE].telemetry == second
    assert (core.counters.forks, core.counters.duplicates, core.counters.rejected_total) == (0, 2, 0)
    assert conflicts(core, clock) == []


# --- values that cannot be true ---


def raw(message: wire.NodeTelemetry, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``message`` re-encoded with plain msgpack after ``change`` edits its fields (as a hostile client would)."""
    fields = msgpack.unpackb(wire.encode(message))
    change(fields)
    return bytes(msgpack.packb(fields))


def gpu0(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda fields: fields["gpus"][0].update(changes)


def process0(**changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda fields: fields["gpus"][0]["processes"][0].update(changes)


def duplicate(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda fields: fields["gpus"][1].update({key: fields["gpus"][0][key]})


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], WireReason]] = {
    "used above total": (gpu0(memory_used_bytes=81 * GIB), WireReason.MEMORY_OVER_TOTAL),
    "reserved above total": (gpu0(memory_reserved_bytes=81 * GIB), WireReason.MEMORY_OVER_TOTAL),
    "free above total": (gpu0(memory_free_bytes=81 * GIB), WireReason.MEMORY_OVER_TOTAL),
    "a process above its device's total": (process0(used_memory_bytes=81 * GIB), WireReason.MEMORY_OVER_TOTAL),
    "two devices with one index": (duplicate("index"), WireReason.DUPLICATE_DEVICE),
    "negative used memory": (gpu0(memory_used_bytes=-1), WireReason.OUT_OF_RANGE),
    "negative process memory": (process0(used_memory_bytes=-5), WireReason.OUT_OF_RANGE),
    "utilisation over 100": (gpu0(gpu_util_pct=101), WireReason.OUT_OF_RANGE),
    "memory utilisation over 100": (gpu0(memory_util_pct=250), WireReason.OUT_OF_RANGE),
    "a negative temperature": (gpu0(temperature_c=-40), WireReason.OUT_OF_RANGE),
}


@pytest.mark.parametrize(("change", "reason"), CASES.values(), ids=CASES.keys())
def test_a_sample_that_cannot_be_true_is_rejected_and_counted_by_reason(
    change: Callable[[dict[str, Any]], None], reason: WireReason
) -> None:
    clock, core, agent = started()
    payload = raw(sample(seq=agent.seq + 1, ts_ns=clock.now_ns, gpus=2), change)
    core.ingest([(subjects.telemetry(NODE), payload)])
    assert core.counters.rejected[reason] == 1 and core.counters.rejected_total == 1
    assert core.latest()[NODE].telemetry.seq == agent.seq
    assert (core.why_rejected(NODE) or "").startswith(
        f"1 message since its last accepted one was rejected, the newest as {reason.value}"
    )
    # The one-message decoder refuses the same bytes for the same reason.
    with pytest.raises(WireError) as caught:
        wire.decode_telemetry(payload)
    assert caught.value.reason is reason


def test_a_publisher_cannot_encode_a_sample_that_cannot_be_true() -> None:
    message = sample(seq=1, ts_ns=T0)
    over = with_gpu0(message, memory_used_bytes=81 * GIB, memory_free_bytes=0)
    with pytest.raises(WireError) as caught:
        wire.encode(over)
    assert caught.value.reason is WireReason.MEMORY_OVER_TOTAL


def test_the_device_total_itself_is_a_plausible_amount() -> None:
    full = sample(seq=1, ts_ns=T0, used_gib=80, gpus=8)
    assert wire.implausible(full) is None
    assert wire.decode_telemetry(wire.encode(full)) == full


def test_a_replayed_message_may_be_old_but_not_ahead() -> None:
    clock = Clock()
    core = feed(clock)
    hour = 3600 * S
    # The stream's copy of a health report published on change an hour ago, and of a dead node's last sample.
    report = wire.NodeHealth(
        v=1, node=NODE, boot="real", seq=5, ts_ns=T0 - hour, status=wire.HealthStatus.DEGRADED, problems=()
    )
    core.ingest(
        [
            (subjects.health(NODE), wire.encode(report)),
            (subjects.telemetry("gpu-dead"), wire.encode(sample(node="gpu-dead", seq=9, ts_ns=T0 - hour))),
            (subjects.telemetry("gpu-ahead"), wire.encode(sample(node="gpu-ahead", seq=9, ts_ns=T0 + hour))),
        ],
        replay=True,
    )
    assert core.health()[NODE].health == report
    assert set(core.latest()) == {"gpu-dead"}
    assert core.counters.rejected[WireReason.CLOCK_SKEW] == 1
    # Live, the same stamps are refused.
    publish(core, sample(node="gpu-dead", seq=10, ts_ns=T0 - hour))
    assert core.counters.rejected[WireReason.CLOCK_SKEW] == 2

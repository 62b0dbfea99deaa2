"""FakeProbe: memory scripts against an injected clock, processes changed at run time, derived figures, faults."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

import pytest

from agent.gpus import fake, probe
from common import errors

GiB = 1024**3
MiB = 1024**2
SECOND = 1_000_000_000


class Clock:
    def __init__(self, now_ns: int = 1_000 * SECOND) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns


H100 = fake.FakeGpu(index=0, uuid="GPU-aaaa", model="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GiB)
A10 = fake.FakeGpu(
    index=1, uuid="GPU-bbbb", model="NVIDIA A10", memory_total_bytes=24 * GiB, memory_reserved_bytes=256 * MiB
)


def opened_probe(clock: Clock, processes: Sequence[fake.FakeProcess] = ()) -> fake.FakeProbe:
    fake_probe = fake.FakeProbe([A10, H100], clock=clock, processes=processes)
    fake_probe.open()
    return fake_probe


def process_bytes(sample: probe.ProbeSample, index: int) -> dict[int, int | None]:
    processes = sample.devices[index].processes
    assert processes is not None
    return {p.pid: p.used_memory_bytes for p in processes}


# --- scripts ---


def test_a_memory_script_is_a_step_function_that_starts_and_ends() -> None:
    script = fake.MemoryScript(steps=((5, 100), (10, 300), (20, 50)), end_ns=30)
    assert [script.bytes_at(t) for t in (0, 4, 5, 9, 10, 19, 20, 29, 30, 99)] == [
        None,
        None,
        100,
        100,
        300,
        300,
        50,
        50,
        None,
        None,
    ]


def test_a_script_without_end_runs_forever() -> None:
    assert fake.MemoryScript.constant(7).bytes_at(10**18) == 7


@pytest.mark.parametrize(
    ("steps", "end_ns"),
    [((), None), (((5, 1), (5, 2)), None), (((-1, 1),), None), (((0, -1),), None), (((10, 1),), 10)],
    ids=["empty", "offsets_not_increasing", "negative_offset", "negative_bytes", "ends_before_it_starts"],
)
def test_a_malformed_memory_script_is_refused(steps: tuple[tuple[int, int], ...], end_ns: int | None) -> None:
    with pytest.raises(ValueError, match="memory script"):
        fake.MemoryScript(steps=steps, end_ns=end_ns)


def test_process_memory_follows_its_script_from_when_the_probe_was_given_it() -> None:
    clock = Clock()
    script = fake.MemoryScript(steps=((0, GiB), (10 * SECOND, 4 * GiB)), end_ns=20 * SECOND)
    fake_probe = opened_probe(clock, [fake.FakeProcess(pid=7, gpu_index=0, memory=script)])
    assert process_bytes(fake_probe.sample(), 0) == {7: GiB}
    clock.advance(10 * SECOND)
    assert process_bytes(fake_probe.sample(), 0) == {7: 4 * GiB}
    clock.advance(10 * SECOND)
    assert process_bytes(fake_probe.sample(), 0) == {}


def test_an_explicit_start_time_anchors_the_script() -> None:
    clock = Clock(now_ns=100 * SECOND)
    script = fake.MemoryScript(steps=((5 * SECOND, GiB),))
    fake_probe = opened_probe(clock, [fake.FakeProcess(pid=7, gpu_index=0, memory=script, start_ns=97 * SECOND)])
    assert process_bytes(fake_probe.sample(), 0) == {}
    clock.advance(2 * SECOND)
    assert process_bytes(fake_probe.sample(), 0) == {7: GiB}


def test_the_sample_time_is_the_clock_reading() -> None:
    clock = Clock(now_ns=123)
    assert opened_probe(clock).sample().ts_ns == 123


# --- processes at run time ---


def test_processes_can_be_added_and_removed_at_run_time() -> None:
    clock = Clock()
    fake_probe = opened_probe(clock)
    clock.advance(50 * SECOND)
    script = fake.MemoryScript(steps=((0, GiB), (SECOND, 2 * GiB)))
    fake_probe.add_process(fake.FakeProcess(pid=1, gpu_index=0, memory=script))
    fake_probe.add_process(fake.FakeProcess(pid=1, gpu_index=1, memory=fake.MemoryScript.constant(3 * GiB)))
    fake_probe.add_process(fake.FakeProcess(pid=2, gpu_index=1, memory=fake.MemoryScript.constant(MiB)))
    sample = fake_probe.sample()
    assert process_bytes(sample, 0) == {1: GiB}  # the script starts when the process was added
    assert process_bytes(sample, 1) == {1: 3 * GiB, 2: MiB}
    fake_probe.remove_process(1)
    fake_probe.remove_process(1)
    assert process_bytes(fake_probe.sample(), 0) == {}
    assert process_bytes(fake_probe.sample(), 1) == {2: MiB}


def test_adding_a_process_twice_or_on_an_unknown_gpu_is_refused() -> None:
    fake_probe = opened_probe(Clock())
    process = fake.FakeProcess(pid=1, gpu_index=0, memory=fake.MemoryScript.constant(GiB))
    fake_probe.add_process(process)
    with pytest.raises(ValueError, match="already"):
        fake_probe.add_process(process)
    with pytest.raises(ValueError, match="no GPU with index 5"):
        fake_probe.add_process(fake.FakeProcess(pid=2, gpu_index=5, memory=fake.MemoryScript.constant(GiB)))


def test_set_processes_keeps_unchanged_processes_running_and_restarts_changed_ones() -> None:
    clock = Clock()
    growing = fake.MemoryScript(steps=((0, GiB), (10 * SECOND, 2 * GiB)))
    steady = fake.FakeProcess(pid=1, gpu_index=0, memory=growing)
    changing = fake.FakeProcess(pid=2, gpu_index=0, memory=growing)
    fake_probe = opened_probe(clock, [steady, changing])
    clock.advance(10 * SECOND)
    other_script = fake.MemoryScript(steps=((0, 5 * GiB), (10 * SECOND, 6 * GiB)))
    fake_probe.set_processes([steady, dataclasses.replace(changing, memory=other_script)])
    assert process_bytes(fake_probe.sample(), 0) == {1: 2 * GiB, 2: 5 * GiB}
    fake_probe.set_processes([])
    assert process_bytes(fake_probe.sample(), 0) == {}


# --- derived figures and units ---


def test_used_memory_is_the_processes_plus_the_driver_overhead_in_bytes() -> None:
    processes = [
        fake.FakeProcess(pid=1, gpu_index=0, memory=fake.MemoryScript.constant(10 * GiB)),
        fake.FakeProcess(pid=2, gpu_index=0, memory=fake.MemoryScript.constant(6 * GiB)),
    ]
    device = opened_probe(Clock(), processes).sample().devices[0]
    assert device.memory_total_bytes == 80 * GiB
    assert device.memory_reserved_bytes == fake.DEFAULT_RESERVED_BYTES
    assert device.memory_used_bytes == 16 * GiB + fake.DRIVER_OVERHEAD_BYTES
    assert device.memory_free_bytes == 80 * GiB - fake.DEFAULT_RESERVED_BYTES - 16 * GiB - fake.DRIVER_OVERHEAD_BYTES


def test_free_memory_never_goes_below_zero() -> None:
    processes = [fake.FakeProcess(pid=1, gpu_index=1, memory=fake.MemoryScript.constant(30 * GiB))]
    device = opened_probe(Clock(), processes).sample().devices[1]
    assert device.memory_used_bytes == 30 * GiB + fake.DRIVER_OVERHEAD_BYTES
    assert device.memory_free_bytes == 0


def test_an_idle_device_reads_idle() -> None:
    device = opened_probe(Clock()).sample().devices[0]
    assert (device.gpu_util_pct, device.memory_util_pct) == (0, 0)
    assert (device.temperature_c, device.power_mw) == (fake.IDLE_TEMPERATURE_C, fake.IDLE_POWER_MW)
    assert device.processes == ()
    assert (device.ecc_corrected, device.ecc_uncorrected, device.mig_mode) == (0, 0, False)


def test_utilisation_temperature_and_power_follow_memory_use_deterministically() -> None:
    usable = 80 * GiB - fake.DEFAULT_RESERVED_BYTES
    processes = [fake.FakeProcess(pid=1, gpu_index=0, memory=fake.MemoryScript.constant(usable // 2))]
    device = opened_probe(Clock(), processes).sample().devices[0]
    assert (device.gpu_util_pct, device.memory_util_pct) == (70, 25)
    assert device.temperature_c == 30 + 45 * 70 // 100
    assert device.power_mw == 60_000 + 290_000 * 70 // 100


def test_a_full_device_saturates_at_one_hundred_percent() -> None:
    processes = [fake.FakeProcess(pid=1, gpu_index=1, memory=fake.MemoryScript.constant(100 * GiB))]
    device = opened_probe(Clock(), processes).sample().devices[1]
    assert (device.gpu_util_pct, device.memory_util_pct) == (100, 50)
    assert (device.temperature_c, device.power_mw) == (fake.FULL_LOAD_TEMPERATURE_C, fake.FULL_LOAD_POWER_MW)


def test_a_mig_enabled_device_reports_no_utilisation_as_nvml_does() -> None:
    mig = fake.FakeGpu(
        index=0, uuid="GPU-mig", model="NVIDIA A100-SXM4-40GB", memory_total_bytes=40 * GiB, mig_mode=True
    )
    fake_probe = fake.FakeProbe([mig], clock=Clock())
    fake_probe.open()
    device = fake_probe.sample().devices[0]
    assert (device.gpu_util_pct, device.memory_util_pct, device.mig_mode) == (None, None, True)


def test_devices_come_in_index_order_whatever_order_they_were_given() -> None:
    assert [d.uuid for d in opened_probe(Clock()).sample().devices] == ["GPU-aaaa", "GPU-bbbb"]


@pytest.mark.parametrize(
    "gpus",
    [
        [H100, fake.FakeGpu(index=0, uuid="GPU-other", model="x", memory_total_bytes=GiB)],
        [H100, fake.FakeGpu(index=1, uuid="GPU-aaaa", model="x", memory_total_bytes=GiB)],
    ],
    ids=["duplicate_index", "duplicate_uuid"],
)
def test_gpus_must_be_unique(gpus: list[fake.FakeGpu]) -> None:
    with pytest.raises(ValueError, match="unique"):
        fake.FakeProbe(gpus, clock=Clock())


def test_reserved_memory_cannot_exceed_the_total() -> None:
    with pytest.raises(ValueError, match="memory_reserved_bytes"):
        fake.FakeGpu(index=0, uuid="u", model="m", memory_total_bytes=GiB, memory_reserved_bytes=2 * GiB)


# --- faults ---


@pytest.mark.parametrize("kind", list(probe.LibraryFailure))
def test_a_failed_library_fails_open_sample_and_wait_until_recovery(kind: probe.LibraryFailure) -> None:
    fake_probe = fake.FakeProbe([H100], clock=Clock())
    fake_probe.fail_library(kind)
    for call in (fake_probe.open, fake_probe.sample, lambda: fake_probe.wait_health_events(0)):
        with pytest.raises(errors.GpuLibraryUnavailable) as raised:
            call()
        assert raised.value.kind == kind
    fake_probe.recover()
    fake_probe.open()
    assert len(fake_probe.sample().devices) == 1


def test_a_lost_gpu_fails_samples_and_is_reported_once_until_recovery() -> None:
    fake_probe = opened_probe(Clock())
    fake_probe.lose_gpu(1)
    fake_probe.lose_gpu(1)
    with pytest.raises(errors.GpuLost) as raised:
        fake_probe.sample()
    assert raised.value.index == 1
    assert fake_probe.wait_health_events(0) == [
        probe.gpu_lost_event(gpu_index=1, gpu_uuid="GPU-bbbb", message="GPU 1 stopped answering")
    ]
    assert fake_probe.wait_health_events(0) == []
    fake_probe.recover()
    assert len(fake_probe.sample().devices) == 2


@pytest.mark.parametrize(("code", "critical"), [(79, True), (13, False)])
def test_an_injected_xid_is_classified_as_nvml_ones_are(code: int, critical: bool) -> None:
    fake_probe = opened_probe(Clock())
    fake_probe.inject_xid(0, code)
    assert fake_probe.wait_health_events(0) == [probe.xid_event(gpu_index=0, gpu_uuid="GPU-aaaa", code=code)]
    assert probe.xid_event(gpu_index=0, gpu_uuid=None, code=code).critical is critical


def test_an_injected_ecc_error_counts_and_is_reported() -> None:
    fake_probe = opened_probe(Clock())
    fake_probe.inject_ecc_error(1)
    assert fake_probe.sample().devices[1].ecc_uncorrected == 1
    [event] = fake_probe.wait_health_events(0)
    assert (event.kind, event.gpu_index, event.critical) == (probe.HealthKind.ECC, 1, True)


def test_faults_on_an_unknown_gpu_are_refused() -> None:
    fake_probe = opened_probe(Clock())
    with pytest.raises(ValueError, match="no GPU with index 9"):
        fake_probe.lose_gpu(9)
    with pytest.raises(ValueError, match="no GPU with index 9"):
        fake_probe.inject_xid(9, 79)


def test_sample_and_wait_before_open_are_library_unavailable_uninitialized() -> None:
    fake_probe = fake.FakeProbe([H100], clock=Clock())
    for call in (fake_probe.sample, lambda: fake_probe.wait_health_events(0)):
        with pytest.raises(errors.GpuLibraryUnavailable) as raised:
            call()
        assert raised.value.kind == "uninitialized"


# --- the wait ---


def test_queued_events_return_at_once_whatever_the_timeout() -> None:
    fake_probe = opened_probe(Clock())
    fake_probe.inject_xid(0, 79)
    started = time.monotonic()
    assert [e.code for e in fake_probe.wait_health_events(60_000)] == [79]
    assert time.monotonic() - started < 1


def test_a_waiting_thread_wakes_when_an_event_is_injected() -> None:
    fake_probe = opened_probe(Clock())
    got: list[Sequence[probe.HealthEvent]] = []
    waiter = threading.Thread(target=lambda: got.append(fake_probe.wait_health_events(60_000)))
    waiter.start()
    fake_probe.inject_xid(1, 48)
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert [[e.code for e in events] for events in got] == [[48]]


def test_closing_never_leaves_a_waiting_thread_blocked() -> None:
    fake_probe = opened_probe(Clock())
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(fake_probe.wait_health_events(60_000))
        except errors.GpuLibraryUnavailable as exc:  # the close came before the wait began
            outcome.append(exc.kind)

    waiter = threading.Thread(target=wait)
    waiter.start()
    fake_probe.close()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert outcome in ([[]], ["uninitialized"])
    fake_probe.close()

"""The real ``quotient agent``, as its own process with pynvml unpatched, against the mock NVML driver of each driver
profile: what it publishes on a real nats-server is what the mock's state says, through every fallback an older
driver forces; faults become the documented health reports, never a crash; Xid and ECC events from
``nvmlEventSetWait`` reach ``NodeHealth``. The GPU processes are real processes of this test, attributed to pods
through cgroup files laid out as containerd and CRI-O write them.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import re
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from common import subjects, wire
from common.natsconn import NatsBus
from common.natsserver import NatsServer, free_port
from quotient.nvmlmock import build, profiles, state
from tests import mockdriver
from tests.polling import until

pytestmark = pytest.mark.integration

GiB = 1024**3
MiB = 1024**2
NODE = "gpu-mock"
INTERVAL_S = 0.2
UID_A = "0b7c1f7e-3a55-4c57-9d8e-1f4e2b0c6a11"
UID_B = "5d2a9c3e-8f61-4b0e-a7d4-6c3b1e9f0a22"
UID_C = "a9e4b1d2-7c38-4f5a-8b6e-2d1c0f9e3b33"
CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []

    async def __call__(self, subject: str, data: bytes) -> None:
        self.messages.append((subject, data))

    def telemetry(self) -> list[wire.NodeTelemetry]:
        subject = subjects.telemetry(NODE)
        return [wire.decode_telemetry(data, subject_node=NODE) for s, data in self.messages if s == subject]

    def health(self) -> list[wire.NodeHealth]:
        subject = subjects.health(NODE)
        return [wire.decode_health(data, subject_node=NODE) for s, data in self.messages if s == subject]


@dataclasses.dataclass
class World:
    """A node: the mock's state file, a proc tree of real processes, the agent's log, and what NATS delivered."""

    mock: build.MockLibrary | None
    nats_url: str
    state_file: Path
    processes: mockdriver.PodProcesses
    log_file: Path
    collector: Collector

    def write(self, scene: state.MockState) -> None:
        state.write(self.state_file, scene)

    @contextlib.contextmanager
    def agent(
        self, *, metrics_port: int = 0, library_path: Sequence[Path] = (), extra: Sequence[str] = ()
    ) -> Iterator[subprocess.Popen[bytes]]:
        with mockdriver.agent(
            self.mock,
            node=NODE,
            nats_url=self.nats_url,
            state_file=self.state_file,
            proc_root=self.processes.proc_root,
            log_file=self.log_file,
            interval_s=INTERVAL_S,
            metrics_port=metrics_port,
            library_path=library_path,
            extra=extra,
        ) as process:
            yield process
        assert process.returncode == 0, self.log_file.read_text()[-3000:]  # it stopped cleanly on SIGTERM

    async def telemetry_after(self, seq: int = 0) -> wire.NodeTelemetry:
        found = await until(
            lambda: [t for t in self.collector.telemetry() if t.seq > seq],
            what=f"telemetry after seq {seq}",
            timeout_s=15,
        )
        return found[-1]

    async def health(self, status: wire.HealthStatus, *kinds: wire.ProblemKind) -> wire.NodeHealth:
        def matching() -> wire.NodeHealth | None:
            for message in reversed(self.collector.health()):
                if message.status == status and sorted(p.kind for p in message.problems) == sorted(kinds):
                    return message
            return None

        found = await until(matching, what=f"health {status} with {kinds}", timeout_s=15)
        assert found is not None
        return found


@contextlib.asynccontextmanager
async def world(nats_server: NatsServer, tmp_path: Path, profile: str | None) -> AsyncIterator[World]:
    mock = None if profile is None else mockdriver.library(profile)
    reader = NatsBus(servers=nats_server.url, name="test-reader")
    await reader.connect_once()
    collector = Collector()
    await reader.subscribe("quotient.v1.>", collector)
    try:
        with mockdriver.pod_processes(tmp_path / "proc") as processes:
            yield World(
                mock=mock,
                nats_url=nats_server.url,
                state_file=tmp_path / "nvml-state",
                processes=processes,
                log_file=tmp_path / "agent.log",
                collector=collector,
            )
    finally:
        await reader.close()


@dataclasses.dataclass(frozen=True)
class Expected:
    pid: int
    used: int | None
    pod_uid: str | None
    container_id: str | None


def a_busy_node(processes: mockdriver.PodProcesses) -> tuple[state.MockState, list[list[Expected]]]:
    """Two GPUs and the processes of three pods (containerd and CRI-O, systemd and cgroupfs), a node daemon and a
    process that has exited; and what the agent must report for each GPU's processes."""
    containerd = processes.start(mockdriver.containerd_systemd(UID_A, CID_A))
    crio = processes.start(mockdriver.crio_systemd(UID_B, CID_B))
    cgroupfs = processes.start(mockdriver.containerd_cgroupfs_v1(UID_C, CID_C))
    daemon = processes.start(mockdriver.host())
    gone = processes.start(mockdriver.containerd_systemd(UID_A, CID_A))
    processes.stop(gone)
    scene = state.MockState(
        devices=(
            state.MockDevice(
                index=0,
                uuid="GPU-8f2b6c1d-0a3e-4b5c-9d7e-1f2a3b4c5d6e",
                name="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * GiB,
                memory_reserved_bytes=512 * MiB,
                memory_used_bytes=13 * GiB + 4 * MiB,
                gpu_util_pct=37,
                memory_util_pct=12,
                temperature_c=41,
                power_mw=123_456,
                ecc_corrected=2,
                ecc_uncorrected=0,
                mig_mode=False,
                processes=(
                    state.MockProcess(pid=containerd, used_memory_bytes=10 * GiB),
                    state.MockProcess(pid=crio, used_memory_bytes=3 * GiB),
                    state.MockProcess(pid=crio, used_memory_bytes=3 * GiB, graphics=True),  # listed twice, one process
                ),
            ),
            state.MockDevice(
                index=1,
                uuid="GPU-1c9d8e7f-6a5b-4c3d-2e1f-0a9b8c7d6e5f",
                name="NVIDIA A10",
                memory_total_bytes=24 * GiB,
                memory_reserved_bytes=256 * MiB,
                memory_used_bytes=8 * GiB,
                gpu_util_pct=None,  # MIG on: no device utilisation
                memory_util_pct=None,
                temperature_c=35,
                power_mw=None,
                ecc_corrected=None,
                ecc_uncorrected=None,
                mig_mode=True,
                processes=(
                    state.MockProcess(pid=cgroupfs, used_memory_bytes=5 * GiB, gpu_instance=1, compute_instance=0),
                    state.MockProcess(pid=daemon, used_memory_bytes=2 * GiB),
                    state.MockProcess(pid=gone, used_memory_bytes=None),
                ),
            ),
        )
    )
    expected = [
        [Expected(containerd, 10 * GiB, UID_A, CID_A), Expected(crio, 3 * GiB, UID_B, CID_B)],
        [
            Expected(cgroupfs, 5 * GiB, UID_C, CID_C),
            Expected(daemon, 2 * GiB, None, None),
            Expected(gone, None, None, None),
        ],
    ]
    return scene, [sorted(listed, key=lambda e: e.pid) for listed in expected]


@pytest.mark.parametrize("profile", mockdriver.PROFILE_NAMES)
async def test_every_field_the_agent_publishes_is_what_the_driver_says_through_the_fallbacks_of_each_era(
    nats_server: NatsServer, tmp_path: Path, profile: str
) -> None:
    async with world(nats_server, tmp_path, profile) as node:
        scene, expected_processes = a_busy_node(node.processes)
        node.write(scene)
        with node.agent():
            received = await node.telemetry_after()
    driver = profiles.PROFILES[profile]
    assert (received.node, received.driver_version, received.interval_ms) == (NODE, driver.driver_version, 200)
    assert len(received.gpus) == len(scene.devices)
    for report, device, processes in zip(received.gpus, scene.devices, expected_processes, strict=True):
        # Without the v2 memory query (R470) the driver's reservation is part of "used" and none is reported apart.
        reserved = device.memory_reserved_bytes if driver.memory_info_v2 else 0
        used = device.memory_used_bytes + device.memory_reserved_bytes - reserved
        assert (report.index, report.uuid, report.model) == (device.index, device.uuid, device.name)
        assert (report.memory_total_bytes, report.memory_reserved_bytes, report.memory_used_bytes) == (
            device.memory_total_bytes,
            reserved,
            used,
        )
        assert report.memory_free_bytes == device.memory_total_bytes - reserved - used
        assert (report.gpu_util_pct, report.memory_util_pct) == (device.gpu_util_pct, device.memory_util_pct)
        assert (report.temperature_c, report.power_mw) == (device.temperature_c, device.power_mw)
        assert (report.ecc_corrected, report.ecc_uncorrected) == (device.ecc_corrected, device.ecc_uncorrected)
        assert report.mig_mode == device.mig_mode
        assert [Expected(p.pid, p.used_memory_bytes, p.pod_uid, p.container_id) for p in report.processes] == processes


@pytest.mark.parametrize("profile", mockdriver.PROFILE_NAMES)
async def test_xid_and_ecc_events_from_the_event_wait_reach_node_health(
    nats_server: NatsServer, tmp_path: Path, profile: str
) -> None:
    async with world(nats_server, tmp_path, profile) as node:
        scene, _ = a_busy_node(node.processes)
        node.write(scene)
        with node.agent() as agent:
            await node.health(wire.HealthStatus.HEALTHY)
            events = (
                state.MockEvent(id=1, device=0, kind=state.EventKind.XID, data=13),  # an application's fault
                state.MockEvent(id=2, device=1, kind=state.EventKind.XID, data=79),  # fallen off the bus
                state.MockEvent(id=3, device=0, kind=state.EventKind.ECC),
            )
            node.write(dataclasses.replace(scene, events=events))
            degraded = await node.health(wire.HealthStatus.DEGRADED, wire.ProblemKind.XID, wire.ProblemKind.ECC)
            assert agent.poll() is None
    by_kind = {problem.kind: problem for problem in degraded.problems}
    xid, ecc = by_kind[wire.ProblemKind.XID], by_kind[wire.ProblemKind.ECC]
    assert (xid.gpu_index, xid.gpu_uuid, xid.code) == (1, scene.devices[1].uuid, 79)
    assert (ecc.gpu_index, ecc.gpu_uuid) == (0, scene.devices[0].uuid)


async def test_a_critical_xid_is_held_for_the_problem_hold_and_then_reported_healthy_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with world(nats_server, tmp_path, profiles.CURRENT.name) as node:
        scene, _ = a_busy_node(node.processes)
        node.write(scene)
        with node.agent(extra=("--problem-hold", "2s")):
            await node.health(wire.HealthStatus.HEALTHY)
            xid = state.MockEvent(id=1, device=1, kind=state.EventKind.XID, data=79)
            node.write(dataclasses.replace(scene, events=(xid,)))
            degraded = await node.health(wire.HealthStatus.DEGRADED, wire.ProblemKind.XID)
            later = await until(
                lambda: [
                    h for h in node.collector.health() if h.seq > degraded.seq and h.status is wire.HealthStatus.HEALTHY
                ],
                what="healthy again after the hold",
                timeout_s=15,
            )
            healthy = later[0]
    held_s = (healthy.ts_ns - degraded.ts_ns) / 1e9
    assert 2.0 <= held_s < 6.0, f"the Xid was held {held_s:.1f} s with --problem-hold 2s"


async def test_a_gpu_that_falls_off_the_bus_is_a_gpu_lost_problem_until_it_answers_again(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with world(nats_server, tmp_path, profiles.CURRENT.name) as node:
        scene, _ = a_busy_node(node.processes)
        node.write(scene)
        with node.agent() as agent:
            await node.health(wire.HealthStatus.HEALTHY)
            node.write(
                dataclasses.replace(scene, devices=(scene.devices[0], dataclasses.replace(scene.devices[1], lost=True)))
            )
            lost = await node.health(wire.HealthStatus.DEGRADED, wire.ProblemKind.GPU_LOST)
            assert [(p.gpu_index, p.gpu_uuid) for p in lost.problems] == [(1, scene.devices[1].uuid)]
            before = node.collector.telemetry()[-1].seq
            node.write(scene)
            await node.health(wire.HealthStatus.HEALTHY)
            assert len((await node.telemetry_after(before)).gpus) == 2
            assert agent.poll() is None


async def test_queries_the_device_does_not_support_are_null_fields_not_errors(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with world(nats_server, tmp_path, profiles.CURRENT.name) as node:
        scene, _ = a_busy_node(node.processes)
        not_supported = state.NvmlReturn.NOT_SUPPORTED
        node.write(
            dataclasses.replace(
                scene,
                devices=(dataclasses.replace(scene.devices[0], processes=None), scene.devices[1]),
                errors=(
                    state.InjectedError(call="nvmlDeviceGetPowerUsage", code=not_supported, device=0),
                    state.InjectedError(call="nvmlDeviceGetTemperatureV", code=not_supported, device=0),
                    state.InjectedError(call="nvmlDeviceGetTotalEccErrors", code=not_supported, device=0),
                    state.InjectedError(call="nvmlDeviceGetMigMode", code=not_supported),
                ),
            )
        )
        with node.agent():
            received = await node.telemetry_after()
            await node.health(wire.HealthStatus.HEALTHY)
    gpu = received.gpus[0]
    assert (gpu.power_mw, gpu.temperature_c, gpu.ecc_corrected, gpu.ecc_uncorrected, gpu.mig_mode) == (None,) * 5
    assert gpu.processes == ()  # the driver lists none: nothing to attribute
    assert gpu.memory_used_bytes == 13 * GiB + 4 * MiB and gpu.gpu_util_pct == 37
    assert received.gpus[1].mig_mode is None and len(received.gpus[1].processes) == 3


def sample_errors(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(r'^quotient_agent_sample_errors_total\{kind="probe",node="gpu-mock"\} (\S+)$', text, re.M)
    return 0.0 if found is None else float(found.group(1))


async def test_an_unknown_error_while_sampling_is_counted_and_survived_and_sampling_resumes(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with world(nats_server, tmp_path, profiles.R535.name) as node:
        scene, _ = a_busy_node(node.processes)
        node.write(scene)
        port = free_port()
        with node.agent(metrics_port=port) as agent:
            first = await node.telemetry_after()
            node.write(
                dataclasses.replace(
                    scene,
                    errors=(
                        state.InjectedError(
                            call="nvmlDeviceGetUtilizationRates", code=state.NvmlReturn.UNKNOWN, device=1
                        ),
                    ),
                )
            )
            await until(lambda: sample_errors(port) >= 2, what="sample errors counted", timeout_s=15)
            assert agent.poll() is None
            failing_since = node.collector.telemetry()[-1].seq
            node.write(scene)
            resumed = await node.telemetry_after(failing_since)
    assert resumed.boot == first.boot  # the same agent, not a restarted one
    assert all(h.status == wire.HealthStatus.HEALTHY for h in node.collector.health())


async def test_an_nvml_that_fails_to_initialise_is_nvml_unreachable_until_it_initialises(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with world(nats_server, tmp_path, profiles.R470.name) as node:
        scene, _ = a_busy_node(node.processes)
        node.write(
            dataclasses.replace(scene, errors=(state.InjectedError(call="nvmlInit", code=state.NvmlReturn.UNKNOWN),))
        )
        with node.agent() as agent:
            unavailable = await node.health(wire.HealthStatus.UNAVAILABLE, wire.ProblemKind.NVML_UNREACHABLE)
            assert "unknown" in unavailable.problems[0].message
            assert node.collector.telemetry() == []
            node.write(scene)
            await node.health(wire.HealthStatus.HEALTHY)
            await node.telemetry_after()
            assert agent.poll() is None


async def test_an_nvml_that_cannot_be_loaded_at_all_is_nvml_unreachable_not_a_crash(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has a real NVIDIA driver library, which the loader would find")
    empty = tmp_path / "no-driver"
    empty.mkdir()
    async with world(nats_server, tmp_path, None) as node:
        with node.agent(library_path=[empty]) as agent:
            unavailable = await node.health(wire.HealthStatus.UNAVAILABLE, wire.ProblemKind.NVML_UNREACHABLE)
            assert agent.poll() is None
    assert "library_not_found" in unavailable.problems[0].message

"""Checks of the mock NVML driver itself, run in a process of their own (``tests.mockdriver.run_child``).

``python -m tests.mockdriver_child PROFILE LIBRARY STATE_FILE SCENARIO`` loads the mock at LIBRARY by absolute path
(before pynvml initialises, so pynvml's ``CDLL("libnvidia-ml.so.1")`` finds it by its soname), plays SCENARIO
through the agent's ``NvmlProbe`` or pynvml itself, and prints one JSON object of what it saw; the test asserts on it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from quotient.nvmlmock import build, profiles, state

GiB = 1024**3
MiB = 1024**2


def scene(*, used_bytes: int = GiB, events: tuple[state.MockEvent, ...] = ()) -> state.MockState:
    return state.MockState(
        devices=(
            state.MockDevice(
                index=0,
                uuid="GPU-00000000-1111-2222-3333-444444444444",
                name="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * GiB,
                memory_reserved_bytes=512 * MiB,
                memory_used_bytes=used_bytes,
                processes=(state.MockProcess(pid=4242, used_memory_bytes=used_bytes),),
            ),
            state.MockDevice(
                index=1,
                uuid="GPU-55555555-6666-7777-8888-999999999999",
                name="NVIDIA A10",
                memory_total_bytes=24 * GiB,
                memory_reserved_bytes=256 * MiB,
                memory_used_bytes=4 * MiB,
            ),
        ),
        events=events,
    )


def counter(name: str) -> Callable[[], int]:
    function = getattr(ctypes.CDLL("libnvidia-ml.so.1"), name)
    function.restype = ctypes.c_ulonglong

    def read() -> int:
        return int(function())

    return read


def reload(state_file: Path) -> dict[str, object]:
    from agent.gpus.nvml import NvmlProbe

    state.write(state_file, scene(used_bytes=GiB))
    probe = NvmlProbe()
    probe.open()
    reloads, checks = counter("quotient_mock_reloads"), counter("quotient_mock_checks")
    at_open = reloads()
    for _ in range(20):
        probe.sample()
    after_samples, checked = reloads(), checks()
    state.write(state_file, scene(used_bytes=5 * GiB))
    used = probe.sample().devices[0].memory_used_bytes
    after_change = reloads()
    for _ in range(20):
        probe.sample()
    probe.close()
    return {
        "at_open": at_open,
        "after_samples": after_samples,
        "checks": checked,
        "used_after_change": used,
        "after_change": after_change,
        "after_more_samples": reloads(),
    }


def wait(state_file: Path) -> dict[str, object]:
    from agent.gpus.nvml import NvmlProbe

    state.write(state_file, scene())
    probe = NvmlProbe()
    probe.open()
    cpu, wall = time.process_time(), time.perf_counter()
    idle = probe.wait_health_events(1000)
    idle_cpu_s, idle_wall_s = time.process_time() - cpu, time.perf_counter() - wall
    written_at: list[float] = []

    def write_an_xid_into_the_wait() -> None:
        time.sleep(0.3)  # the stimulus arrives while the wait below is blocked in the library
        written_at.append(time.perf_counter())
        state.write(state_file, scene(events=(state.MockEvent(id=1, device=1, kind=state.EventKind.XID, data=79),)))

    writer = threading.Thread(target=write_an_xid_into_the_wait)
    cpu = time.process_time()
    writer.start()
    events = probe.wait_health_events(5000)
    returned_at = time.perf_counter()
    event_cpu_s = time.process_time() - cpu
    writer.join()
    probe.close()
    return {
        "idle_events": len(idle),
        "idle_cpu_s": idle_cpu_s,
        "idle_wall_s": idle_wall_s,
        "events": [[e.kind.value, e.gpu_index, e.gpu_uuid, e.code, e.critical] for e in events],
        "latency_s": returned_at - written_at[0],
        "event_wait_cpu_s": event_cpu_s,
    }


def history(state_file: Path) -> dict[str, object]:
    from agent.gpus.nvml import NvmlProbe

    old = state.MockEvent(id=1, device=0, kind=state.EventKind.XID, data=79)
    state.write(state_file, scene(events=(old,)))
    probe = NvmlProbe()
    probe.open()
    before = probe.wait_health_events(0)
    new = state.MockEvent(id=2, device=0, kind=state.EventKind.ECC)
    state.write(state_file, scene(events=(old, new)))
    after = probe.wait_health_events(2000)
    probe.close()
    return {
        "before": [e.kind.value for e in before],
        "after": [[e.kind.value, e.gpu_index, e.critical] for e in after],
    }


def abi(state_file: Path) -> dict[str, object]:
    import pynvml

    state.write(state_file, scene())
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    count = ctypes.c_uint(0)
    before_init = int(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    small = ctypes.create_string_buffer(8)
    uuid_in_8_bytes = int(lib.nvmlDeviceGetUUID(handle, small, ctypes.c_uint(8)))
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)  # a version 1 tag on the v2 struct
        wrong_version: int | str = 0
    except pynvml.NVMLError as exc:
        wrong_version = int(exc.value)
    try:
        pynvml.nvmlDeviceGetHandleByIndex(2)
        beyond: int = 0
    except pynvml.NVMLError as exc:
        beyond = int(exc.value)
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    pynvml.nvmlShutdown()
    try:
        pynvml.nvmlDeviceGetCount()
        after_shutdown: int = 0
    except pynvml.NVMLError as exc:
        after_shutdown = int(exc.value)
    return {
        "before_init": before_init,
        "uuid_in_8_bytes": uuid_in_8_bytes,
        "wrong_version": wrong_version,
        "index_beyond_the_devices": beyond,
        "processes_v2": [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in processes],
        "after_shutdown": after_shutdown,
    }


def bad_state(state_file: Path) -> dict[str, object]:
    import pynvml

    state_file.write_text("not a state file\n")
    try:
        pynvml.nvmlInit()
        unreadable_at_init: int = 0
    except pynvml.NVMLError as exc:
        unreadable_at_init = int(exc.value)
    state.write(state_file, scene(used_bytes=3 * GiB))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    state.write(state_file, "quotient-nvml-mock\t1\ndevice\tzero\n")
    kept = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)  # v1, which every profile has: used + reserved
    pynvml.nvmlShutdown()
    os.environ[state.STATE_ENV] = str(state_file.with_name("absent"))
    try:
        pynvml.nvmlInit()
        absent: int = 0
    except pynvml.NVMLError as exc:
        absent = int(exc.value)
    return {"unreadable_at_init": unreadable_at_init, "kept_used_bytes": kept, "absent": absent}


SCENARIOS: dict[str, Callable[[Path], dict[str, object]]] = {
    "reload": reload,
    "wait": wait,
    "history": history,
    "abi": abi,
    "bad_state": bad_state,
}


def main(argv: list[str]) -> int:
    profile, library_path, state_file, scenario = profiles.PROFILES[argv[0]], Path(argv[1]), Path(argv[2]), argv[3]
    build.MockLibrary(profile=profile, path=library_path).preload(state_file=state_file)
    print(json.dumps(SCENARIOS[scenario](state_file)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

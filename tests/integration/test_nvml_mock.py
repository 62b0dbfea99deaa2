"""The mock NVML driver library itself: built per driver profile with the system's compiler, and each check run
through the unpatched pynvml in a process of its own (NVML is global to a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quotient.nvmlmock import build, profiles
from tests.conftest import REPO
from tests.mockdriver import PROFILE_NAMES, library, run_child

pytestmark = pytest.mark.integration

GiB = 1024**3
MiB = 1024**2
ALWAYS = (
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetMigMode",
    "nvmlEventSetWait_v2",
)


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_each_profile_exports_exactly_the_versioned_symbols_of_its_driver_era(name: str) -> None:
    profile = profiles.PROFILES[name]
    mock = library(profile)
    versioned = {
        "nvmlDeviceGetMemoryInfo_v2": profile.memory_info_v2,
        "nvmlDeviceGetComputeRunningProcesses_v3": profile.running_processes_v3,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": profile.running_processes_v3,
        "nvmlDeviceGetTemperatureV": profile.temperature_v,
    }
    probe = (
        "import ctypes, json, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "print(json.dumps([hasattr(lib, name) for name in sys.argv[2:]]))\n"
    )
    names = [*versioned, *ALWAYS]
    out = subprocess.run(
        [sys.executable, "-c", probe, str(mock.path), *names], capture_output=True, text=True, check=True, timeout=30
    )
    assert dict(zip(names, json.loads(out.stdout), strict=True)) == {**versioned, **dict.fromkeys(ALWAYS, True)}


def test_a_build_is_cached_by_digest_in_the_cache_directory_and_never_compiled_twice(tmp_path: Path) -> None:
    library(profiles.R535)  # skips (or fails under CI) where nothing can be built
    environ = {"XDG_CACHE_HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    first = build.build(profiles.R535, environ=environ)
    assert isinstance(first, build.MockLibrary)
    compiled_ns = first.path.stat().st_mtime_ns
    again = build.build(profiles.R535, environ=environ)
    other = build.build(profiles.R470, environ=environ)
    assert isinstance(again, build.MockLibrary) and isinstance(other, build.MockLibrary)
    assert again.path == first.path and again.path.stat().st_mtime_ns == compiled_ns
    assert other.directory != first.directory
    assert first.path.is_relative_to(tmp_path / "quotient" / "nvml-mock") and not first.path.is_relative_to(REPO)
    assert sorted(p.name for p in first.directory.iterdir()) == [build.LIBRARY_NAME]


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_the_mock_rereads_its_state_only_when_the_file_changes(name: str, tmp_path: Path) -> None:
    mock = library(name)
    seen = run_child(mock, "reload", tmp_path / "state")
    assert seen["at_open"] == 1 and seen["after_samples"] == 1  # twenty samples, no re-read
    assert isinstance(seen["checks"], int) and seen["checks"] >= 20  # but a look at the file on every call
    # One write, one re-read, and the sample after it already sees the new value (v1 memory counts the reservation).
    expected_used = 5 * GiB if mock.profile.memory_info_v2 else 5 * GiB + 512 * MiB
    assert seen["used_after_change"] == expected_used
    assert seen["after_change"] == 2 and seen["after_more_samples"] == 2


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_an_event_wait_blocks_without_spinning_and_wakes_as_soon_as_an_xid_is_written(
    name: str, tmp_path: Path
) -> None:
    seen = run_child(library(name), "wait", tmp_path / "state")
    assert seen["idle_events"] == 0
    assert isinstance(seen["idle_wall_s"], float) and seen["idle_wall_s"] >= 0.95  # it honoured the timeout
    assert isinstance(seen["idle_cpu_s"], float) and seen["idle_cpu_s"] < 0.05  # asleep, not spinning
    assert seen["events"] == [["xid", 1, "GPU-55555555-6666-7777-8888-999999999999", 79, True]]
    assert isinstance(seen["latency_s"], float) and seen["latency_s"] < 0.5
    assert isinstance(seen["event_wait_cpu_s"], float) and seen["event_wait_cpu_s"] < 0.05


def test_an_event_set_sees_only_what_happens_after_it_was_made(tmp_path: Path) -> None:
    seen = run_child(library(profiles.CURRENT), "history", tmp_path / "state")
    assert seen == {"before": [], "after": [["ecc", 0, True]]}


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_the_mock_answers_with_nvmls_return_codes_and_checks_struct_versions(name: str, tmp_path: Path) -> None:
    mock = library(name)
    seen = run_child(mock, "abi", tmp_path / "state")
    assert seen["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert seen["uuid_in_8_bytes"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
    # A v2 memory struct tagged with the wrong version; an R470 driver has no v2 query at all.
    assert seen["wrong_version"] == (25 if mock.profile.memory_info_v2 else 13)
    assert seen["index_beyond_the_devices"] == 2  # NVML_ERROR_INVALID_ARGUMENT
    assert seen["processes_v2"] == [[4242, GiB, 0xFFFFFFFF, 0xFFFFFFFF]]
    assert seen["after_shutdown"] == 1


def test_a_state_file_the_mock_cannot_read_refuses_init_and_is_ignored_once_running(tmp_path: Path) -> None:
    seen = run_child(library(profiles.CURRENT), "bad_state", tmp_path / "state")
    assert seen["unreadable_at_init"] == 9  # NVML_ERROR_DRIVER_NOT_LOADED
    assert seen["kept_used_bytes"] == 3 * GiB + 512 * MiB  # the last good state stays
    assert seen["absent"] == 9

"""The mock NVML driver's Python side: the state file it reads, the mirror of an emulated node's fake GPUs into it,
and how a build is found, keyed and handed to a process (no compiling here; tests/integration/test_nvml_mock.py
builds)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agent.gpus import fake, probe
from quotient.nvmlmock import build, mirror, profiles, state
from tests.conftest import REPO

GiB = 1024**3
MiB = 1024**2


def device(index: int = 0, **changes: object) -> state.MockDevice:
    base = state.MockDevice(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GiB,
        memory_reserved_bytes=512 * MiB,
        memory_used_bytes=GiB,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# --- the state file ---


def test_a_state_renders_as_tab_separated_lines_with_a_dash_for_what_is_not_supported() -> None:
    text = state.render(
        state.MockState(
            devices=(
                device(0, processes=(state.MockProcess(pid=7, used_memory_bytes=None, graphics=True),)),
                device(1, gpu_util_pct=None, memory_util_pct=None, power_mw=None, mig_mode=True, processes=None),
            ),
            errors=(state.InjectedError(call="nvmlDeviceGetPowerUsage", code=state.NvmlReturn.UNKNOWN, device=1),),
            events=(state.MockEvent(id=3, device=1, kind=state.EventKind.XID, data=79),),
        )
    )
    assert text.splitlines() == [
        "quotient-nvml-mock\t1",
        f"device\t0\tGPU-0\tNVIDIA H100 80GB HBM3\t{80 * GiB}\t{512 * MiB}\t{GiB}\t0\t0\t30\t60000\t0\t0\t0\t0\t11\t1",
        f"device\t1\tGPU-1\tNVIDIA H100 80GB HBM3\t{80 * GiB}\t{512 * MiB}\t{GiB}\t-\t-\t30\t-\t0\t0\t1\t0\t11\t-",
        "process\t0\t7\t-\tgraphics\t-\t-",
        "error\tnvmlDeviceGetPowerUsage\t1\t999",
        "event\t3\t1\txid\t79",
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (state.MockState(devices=(device(1),)), "listed by index from 0"),
        (state.MockState(devices=(device(0, uuid="GPU\t0"),)), "without tabs"),
        (state.MockState(devices=(device(0, name="x" * 96),)), "1 to 95 bytes"),
        (state.MockState(devices=(device(0, memory_used_bytes=-1),)), "memory_used_bytes must be within"),
        (state.MockState(devices=(device(0, gpu_util_pct=101),)), "gpu_util_pct must be within 0..100"),
        (state.MockState(devices=(device(0, gpu_util_pct=None),)), "both utilisations or neither"),
        (state.MockState(devices=(device(0, ecc_corrected=None),)), "both ECC counts or neither"),
        (
            state.MockState(
                devices=(device(0),),
                events=(
                    state.MockEvent(id=2, device=0, kind=state.EventKind.ECC),
                    state.MockEvent(id=2, device=0, kind=state.EventKind.ECC),
                ),
            ),
            "event ids must increase",
        ),
        (
            state.MockState(devices=(device(0),), events=(state.MockEvent(id=1, device=1, kind=state.EventKind.XID),)),
            r"the device \(1\) must exist",
        ),
        (state.MockState(devices=(device(0),), errors=(state.InjectedError(call="*", code=0),)), "not an NVML error"),
    ],
)
def test_a_state_the_mock_would_refuse_is_refused_here_saying_what_and_where(
    bad: state.MockState, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        state.render(bad)


def test_a_write_replaces_the_file_whole_with_a_strictly_later_modification_time(tmp_path: Path) -> None:
    path = tmp_path / "state"
    scene = state.MockState(devices=(device(0),))
    stamps = []
    for _ in range(5):
        state.write(path, scene)  # the same text, written in the same instant: the mock must still see a change
        stamps.append((path.stat().st_mtime_ns, path.stat().st_ino))
    assert [ns for ns, _ in stamps] == sorted({ns for ns, _ in stamps})
    assert path.read_text() == state.render(scene)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # no temporary file left behind


# --- the mirror of an emulated node ---


class Clock:
    def __init__(self) -> None:
        self.now_ns = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now_ns


@pytest.fixture
def fake_probe() -> fake.FakeProbe:
    return fake.FakeProbe(
        [
            fake.FakeGpu(index=0, uuid="GPU-a", model="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GiB),
            fake.FakeGpu(index=1, uuid="GPU-b", model="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GiB),
        ],
        clock=Clock(),
        processes=[fake.FakeProcess(pid=4000, gpu_index=1, memory=fake.MemoryScript.constant(6 * GiB))],
    )


def read_lines(path: Path, kind: str) -> list[list[str]]:
    return [line.split("\t")[1:] for line in path.read_text().splitlines() if line.startswith(kind + "\t")]


def test_the_mirror_writes_what_the_fake_gpus_say_now_and_only_when_it_changed(
    tmp_path: Path, fake_probe: fake.FakeProbe
) -> None:
    path = tmp_path / "state"
    node_mirror = mirror.FakeProbeMirror(fake_probe, path)
    assert node_mirror.sync() is True
    expected = fake_probe.sample().devices[1]
    gpu1 = read_lines(path, "device")[1]
    reserved, used = str(expected.memory_reserved_bytes), str(expected.memory_used_bytes)
    assert gpu1[:6] == ["1", "GPU-b", "NVIDIA A100-SXM4-80GB", str(80 * GiB), reserved, used]
    assert read_lines(path, "process") == [["1", "4000", str(6 * GiB), "compute", "-", "-"]]
    assert node_mirror.sync() is False  # nothing changed: the file is not rewritten, so the mock does not re-read
    fake_probe.add_process(fake.FakeProcess(pid=4001, gpu_index=0, memory=fake.MemoryScript.constant(GiB)))
    assert node_mirror.sync() is True
    assert ["0", "4001", str(GiB), "compute", "-", "-"] in read_lines(path, "process")


def test_injected_xids_and_ecc_errors_become_events_with_ids_that_only_grow(
    tmp_path: Path, fake_probe: fake.FakeProbe
) -> None:
    path = tmp_path / "state"
    node_mirror = mirror.FakeProbeMirror(fake_probe, path)
    node_mirror.sync()
    fake_probe.inject_xid(1, 79)
    node_mirror.sync()
    fake_probe.inject_ecc_error(0)
    node_mirror.sync()
    assert read_lines(path, "event") == [["1", "1", "xid", "79"], ["2", "0", "ecc", "0"]]
    assert read_lines(path, "device")[0][11] == "1"  # the uncorrectable count rose with the ECC event


def test_a_lost_gpu_is_lost_in_the_file_until_the_fake_recovers(tmp_path: Path, fake_probe: fake.FakeProbe) -> None:
    path = tmp_path / "state"
    node_mirror = mirror.FakeProbeMirror(fake_probe, path)
    node_mirror.sync()
    fake_probe.lose_gpu(1)
    node_mirror.sync()
    assert [fields[13] for fields in read_lines(path, "device")] == ["0", "1"]
    assert read_lines(path, "process") == [["1", "4000", str(6 * GiB), "compute", "-", "-"]]  # last known values
    fake_probe.recover()
    node_mirror.sync()
    assert [fields[13] for fields in read_lines(path, "device")] == ["0", "0"]


def test_a_failed_library_fails_every_call_with_the_matching_nvml_code(
    tmp_path: Path, fake_probe: fake.FakeProbe
) -> None:
    path = tmp_path / "state"
    node_mirror = mirror.FakeProbeMirror(fake_probe, path)
    node_mirror.sync()
    fake_probe.fail_library(probe.LibraryFailure.DRIVER_NOT_LOADED)
    node_mirror.sync()
    assert read_lines(path, "error") == [["*", "*", "9"]]
    fake_probe.recover()
    node_mirror.sync()
    assert read_lines(path, "error") == []


# --- finding, keying and handing over a build ---


def test_the_header_is_found_through_the_installed_packages_metadata() -> None:
    header = build.find_header()
    if isinstance(header, build.Unavailable):
        pytest.fail(header.reason)  # a dev dependency: it must be installed wherever the tests run
    assert header.name == "nvml.h" and "nvmlDeviceGetMemoryInfo_v2" in header.read_text()
    assert not header.is_relative_to(REPO / "quotient")


def test_without_a_compiler_the_mock_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    outcome = build.build(profiles.R580, environ={"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)})
    assert isinstance(outcome, build.Unavailable)
    assert "no C compiler" in outcome.reason
    missing = build.find_compiler({"CC": "no-such-compiler", "PATH": str(tmp_path)})
    assert isinstance(missing, build.Unavailable) and "no-such-compiler" in missing.reason


def test_the_cache_key_covers_header_source_and_every_flag_of_the_profile() -> None:
    code = build.sources()
    assert sorted(code) == ["mock_nvml.c", "mock_state.c", "mock_state.h"]
    key = build.digest(header=b"h", sources=code, flags=profiles.R535.defines())
    assert build.digest(header=b"h", sources=dict(code), flags=profiles.R535.defines()) == key
    assert build.digest(header=b"h2", sources=code, flags=profiles.R535.defines()) != key
    for name in code:
        changed = {**code, name: code[name] + b"\n"}
        assert build.digest(header=b"h", sources=changed, flags=profiles.R535.defines()) != key
    assert build.digest(header=b"h", sources=code, flags=profiles.R580.defines()) != key
    assert len({p.defines() for p in profiles.PROFILES.values()}) == len(profiles.PROFILES)


def test_the_cache_lives_in_the_users_cache_directory_never_in_the_repository() -> None:
    assert build.cache_root({"XDG_CACHE_HOME": "/var/cache/x"}) == Path("/var/cache/x/quotient/nvml-mock")
    assert build.cache_root({"HOME": "/home/u"}) == Path("/home/u/.cache/quotient/nvml-mock")
    assert not build.cache_root().is_relative_to(REPO)


def test_a_process_gets_the_mocks_directory_first_on_its_library_path_and_the_state_file(tmp_path: Path) -> None:
    library = build.MockLibrary(profile=profiles.R470, path=tmp_path / "abc" / build.LIBRARY_NAME)
    env = library.environment(state_file=tmp_path / "state", base={"LD_LIBRARY_PATH": "/opt/lib", "HOME": "/h"})
    assert env["LD_LIBRARY_PATH"] == os.pathsep.join([str(tmp_path / "abc"), "/opt/lib"])
    assert env[state.STATE_ENV] == str(tmp_path / "state") and env["HOME"] == "/h"

"""The mock NVML driver for tests: a build per profile, real processes with the cgroup files of pods, a running agent.

- ``library(profile)`` builds (or finds cached) the mock of a driver profile; without a compiler the test skips, and
  under ``CI=true`` fails (``.ci/run`` installs gcc).
- ``PodProcesses`` starts real processes (``sleep``) and lays out a proc tree for the agent in which each pid's
  ``stat`` is the real ``/proc/<pid>/stat`` (so the agent's pid-reuse check reads the real start time, and a process
  that exits disappears) and its ``cgroup`` is written as containerd or CRI-O would write it.
- ``agent(...)`` runs the real ``quotient agent`` as its own process, with the mock's directory on
  ``LD_LIBRARY_PATH``, and stops it afterwards, whatever happened.
- ``run_child(...)`` runs ``tests/mockdriver_child.py`` in a process of its own over one profile's mock: NVML is
  global to a process, so each profile's checks of the library itself need their own process too.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from quotient import nodes_processes
from quotient.nvmlmock import build, profiles
from tests.conftest import REPO, skip_or_fail

PROFILE_NAMES = sorted(profiles.PROFILES)


def library(profile: profiles.DriverProfile | str) -> build.MockLibrary:
    chosen = profiles.PROFILES[profile] if isinstance(profile, str) else profile
    built = build.build(chosen)
    if isinstance(built, build.Unavailable):
        skip_or_fail(f"the mock NVML driver cannot be built here: {built.reason}")
        raise AssertionError("unreachable")
    return built


def containerd_systemd(pod_uid: str, container_id: str) -> str:
    """containerd under the kubelet's systemd cgroup driver, cgroup v2 (a burstable pod)."""
    uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


def crio_systemd(pod_uid: str, container_id: str) -> str:
    """CRI-O under the systemd cgroup driver, cgroup v2 (a best-effort pod)."""
    uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/crio-{container_id}.scope\n"
    )


def containerd_cgroupfs_v1(pod_uid: str, container_id: str) -> str:
    """containerd under the cgroupfs driver, cgroup v1: one line per controller hierarchy (a guaranteed pod)."""
    path = f"/kubepods/pod{pod_uid}/{container_id}"
    return (
        "".join(
            f"{number}:{controllers}:{path}\n"
            for number, controllers in ((12, "memory"), (11, "cpu,cpuacct"), (4, "devices"), (1, "name=systemd"))
        )
        + "0::/\n"
    )


def host(_pod_uid: str = "", _container_id: str = "") -> str:
    """A process of no pod (a node daemon)."""
    return "0::/system.slice/gpu-daemon.service\n"


class PodProcesses:
    """Real processes of this test, each with the cgroup file of a pod's container, under one proc root."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root
        proc_root.mkdir(parents=True, exist_ok=True)
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(self, cgroup: str) -> int:
        """A new real process whose cgroup file reads ``cgroup``; returns its pid."""
        process = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        self._processes.append(process)
        directory = self.proc_root / str(process.pid)
        directory.mkdir()
        (directory / "stat").symlink_to(f"/proc/{process.pid}/stat")
        (directory / "cgroup").write_text(cgroup)
        return process.pid

    def stop(self, pid: int) -> None:
        for process in self._processes:
            if process.pid == pid:
                process.kill()
                process.wait()

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@contextlib.contextmanager
def pod_processes(proc_root: Path) -> Iterator[PodProcesses]:
    processes = PodProcesses(proc_root)
    try:
        yield processes
    finally:
        processes.close()


@contextlib.contextmanager
def agent(
    mock: build.MockLibrary | None,
    *,
    node: str,
    nats_url: str,
    state_file: Path,
    proc_root: Path,
    log_file: Path,
    interval_s: float = 0.2,
    metrics_port: int = 0,
    library_path: Sequence[Path] = (),
    extra: Sequence[str] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """``quotient agent`` over ``mock`` (None: only ``library_path`` on the loader's path), with ``extra`` flags;
    stopped at the end."""
    arguments = nodes_processes.agent_arguments(
        node=node,
        nats_url=nats_url,
        nkey_seed=None,
        interval_s=interval_s,
        proc_root=proc_root,
        metrics_port=metrics_port,
    )
    env: dict[str, str] = dict(os.environ) if mock is None else mock.environment(state_file=state_file)
    if mock is None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(str(path) for path in library_path)
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "quotient.cli", "agent", *arguments, *extra],
            cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_child(mock: build.MockLibrary, scenario: str, state_file: Path) -> Mapping[str, object]:
    """Run one scenario of ``tests/mockdriver_child.py`` over ``mock`` in a fresh process; its JSON result."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.mockdriver_child", mock.profile.name, str(mock.path), str(state_file), scenario],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found: Mapping[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found

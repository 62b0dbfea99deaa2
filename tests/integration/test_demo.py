"""`quotient demo` end to end, shortened: everything starts, the scenario plays, everything stops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quotient.nvmlmock import build

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_plays_its_scenario_and_exits_zero_leaving_no_process_behind() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "quotient.cli", "demo", "--duration", "40", "--interval", "0.5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    out = result.stdout
    assert "demo finished" in out and "the 4-worker gang whole" in out and "0 undecodable" in out
    # Where pods landed and why the pending ones wait.
    assert "default/gpu-sharing" in out and "team-a/big-train-worker-3" in out
    assert "InvalidGpuRequest" in out and "gpu-fraction '1.7'" in out
    assert "not ours (schedulerName default-scheduler)" in out
    # What the agents published, as a third-party subscriber decoded it.
    assert "team-a/llm-train" in out and "(no pod)" in out and "Xid 79" in out
    # The injected Xid, three ways: the alert on NATS, Events on the node and the pod using the GPU, the metric.
    unhealthy = re.search(r"Xid 79 on (\S+) gpu (\d+), used by (\S+)", out)
    assert unhealthy is not None, out[-3000:]
    node, gpu, pod = unhealthy.groups()
    assert f"FIRING   GpuUnhealthy on {node} gpu {gpu}" in out
    events = re.search(r"Events:   (.*)", out)
    assert events is not None and f"Node {node}" in events.group(1) and f"Pod {pod}" in events.group(1)
    assert f'quotient_alert{{alert="GpuUnhealthy",node="{node}",gpu="{gpu}"}} 1' in out
    assert "nats-server tls://127.0.0.1:" in out, "the demo's NATS serves TLS only, as deploy's does"
    started = re.search(r"JetStream in (\S+)\), API emulator (\S+), scheduler pid (\d+)", out)
    assert started is not None
    workdir, emulator_url, scheduler_pid = started.groups()
    for pattern in (workdir, emulator_url):
        leftovers = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.strip()
        assert leftovers == "", f"a process of the demo outlived it: {pattern}"
    assert not Path(f"/proc/{scheduler_pid}").exists(), "the demo's scheduler outlived it"
    # Which probe the agents used: one agent process per node through pynvml over the mock NVML driver wherever the
    # mock can be built (under CI=true it must be), else FakeProbe in the demo's process, said once.
    mock = build.build()
    if isinstance(mock, build.MockLibrary):
        agents = re.search(r"agents: 3 agent processes \(pids ([\d,]+)\) through pynvml over the mock NVML driver", out)
        assert agents is not None, out[-2000:]
        assert f"driver {mock.profile.driver_version}" in out  # the telemetry's driver version, as a reader sees it
        for pid in agents.group(1).split(","):
            assert not Path(f"/proc/{pid}").exists(), f"the demo's agent process {pid} outlived it"
        # Each agent process as its own node, through the auth callout the scheduler serves (issue 13).
        identities = re.search(
            r"each agent connected as its own node through the NATS auth callout \((\d+) connections "
            r"granted, refused: none\)",
            out,
        )
        assert identities is not None and int(identities.group(1)) >= 3, out[-2000:]
    else:
        assert out.count("no mock NVML driver") == 1 and "agents in one process over FakeProbe" in out
        assert "agents shared the NATS agent nkey" in out
    assert not Path(workdir).exists(), "the demo left its temporary directory behind"

"""`quotient demo` end to end, shortened: everything starts, the scenario plays, everything stops."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quotient.nvmlmock import build

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _run_demo(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``quotient demo`` in a session of its own; past ``timeout_s`` the whole session is stopped (the demo's
    NATS and agents too, which a plain kill of the demo would leave running) and the test fails with its output."""
    with subprocess.Popen(
        [sys.executable, "-m", "quotient.cli", "demo", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                try:
                    out, err = process.communicate(timeout=grace_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                out, err = "", ""
            pytest.fail(f"the demo ran past {timeout_s:.0f} s:\n{out[-4000:]}\n{err[-3000:]}")
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# The demo's own timeout fires first, so what it started is stopped before pytest-timeout's would.
@pytest.mark.timeout(240)
def test_the_demo_plays_its_scenario_and_exits_zero_leaving_no_process_behind() -> None:
    result = _run_demo("--duration", "40", "--interval", "0.5", timeout_s=180)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    out = result.stdout
    assert "demo finished" in out and "0 undecodable" in out
    # Where pods landed and why the pending ones wait.
    assert "default/gpu-sharing" in out and "team-a/big-train-worker-2" in out
    assert "InvalidGpuRequest" in out and "gpu-fraction '1.7'" in out
    assert "not ours (schedulerName default-scheduler)" in out
    # What the agents published, as a third-party subscriber decoded it.
    assert "team-a/llm-train" in out and "(no pod)" in out and "Xid 79" in out
    the_story_s_facts_hold(out)
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


def the_story_s_facts_hold(out: str) -> None:
    """The summary's facts: each guide's pair on one GPU group of its own, the gang bound whole, team-b's reclaim
    with the queues' numbers, explain's reason for the waiting gang, the over-consumption alert; every step says
    what KAI shows instead; the plugin ran as installed."""
    pairs = dict(re.findall(r"the (talk's|vLLM) pair shares one GPU group: .* in group (\S+) \(", out))
    assert set(pairs) == {"talk's", "vLLM"} and pairs["talk's"] != pairs["vLLM"], out[-4000:]
    assert "default/gpu-sharing 0.5 + default/inference-api 0.25 in group" in out
    assert re.search(r"ai-workloads/vllm-test-07-\S+ 0\.7 \+ ai-workloads/vllm-test-02-\S+ 0\.2 in group", out)
    # The guide's own view of the vLLM pair, and the reservation pods in their namespace.
    view = re.search(
        r"custom-columns=NAME:\.metadata\.name,.*\n\s+NAME\s+STATUS\s+NODE\s+GPU-FRACTION\s+GPU-GROUP", out
    )
    assert view is not None, out[-4000:]
    assert out.count(f"   {pairs['vLLM']}") >= 2  # both vLLM pods' rows show the one group
    assert re.search(r"get pods -n quotient-reservation\n\s+NAME\s+READY\s+STATUS", out)
    assert "the gang team-a/big-train bound whole: 3 of 3 workers" in out
    reclaim = re.search(
        r"reclaim: team-b/finetune took its 2 GPUs from team-a \(evicted (.*)\); allocated GPUs team-a "
        r"([\d.]+) -> ([\d.]+), team-b ([\d.]+) -> ([\d.]+)",
        out,
    )
    assert reclaim is not None, out[-4000:]
    a_before, a_after, b_before, b_after = (float(value) for value in reclaim.groups()[1:])
    assert a_before == 5 and a_after == 3 and round(b_after - b_before, 3) == 2
    assert out.count("$ kubectl quotient queues") == 2 and "OVER QUOTA" in out
    assert "kubectl quotient explain team-a/big-train-worker-0: Reason: GangDoesNotFit" in out
    assert "over-consumption alert received on NATS: FIRING   GpuMemoryOverconsumption team-b/greedy" in out
    assert out.count("  instead, KAI: ") >= 10
    assert "kubectl quotient runs " in out

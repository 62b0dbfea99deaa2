"""`quotient demo` end to end, shortened: it starts everything, shows what a subscriber receives, and cleans up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_plays_its_scenario_and_exits_zero_leaving_no_process_behind() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "quotient.cli", "demo", "--duration", "10", "--interval", "0.25"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "demo finished" in out and "0 undecodable" in out
    for node in ("a100-0", "a100-1", "l4-0"):
        assert node in out
    assert "team-a/llm-train" in out and "(no pod)" in out
    assert "Xid 79" in out  # the health message of the injected fault reached the subscriber
    assert "reconnect" in out
    workdir = re.search(r"JetStream in (\S+)\)", out)
    assert workdir is not None
    leftovers = subprocess.run(["pgrep", "-f", workdir.group(1)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "the demo's nats-server outlived it"
    assert not Path(workdir.group(1)).exists(), "the demo left its temporary directory behind"

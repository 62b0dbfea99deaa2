"""Issue 12's chaos run, one minute of it, through the real command: ``quotient bench chaos --minutes 1 --seed 7``.

The command starts everything itself (nats-server, the emulator, the emulated nodes' agents, the scheduler process),
injects the seed's faults while its load comes and goes, checks the invariants all the time, and prints one JSON
object. One minute of seed 7 injects a GPU Xid (and the operator's clear), a queue deletion and an agent restart;
``quotient bench chaos --minutes 10`` has every kind of fault several times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


@pytest.mark.timeout(420)
def test_a_minute_of_chaos_breaks_no_invariant_and_no_scheduler() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quotient.cli", "bench", "chaos", "--minutes", "1", "--seed", "7"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["invariant_violations"] == 0, result["violations"]
    assert result["scheduler_exits"] == 0, result["scheduler_exit_details"]
    assert result["faults_injected"] >= 2 and sum(result["faults_by_kind"].values()) == result["faults_injected"]
    assert result["pods_placed"] > 20 and result["create_to_bound_p99_s"] is not None
    assert not result["interrupted"] and result["logs"] is None  # a clean run leaves nothing behind
    assert all(alert["fired_after_s"] is not None for alert in result["alerts"]), result["alerts"]

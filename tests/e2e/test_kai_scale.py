"""KAI's scale tests at a small scale, through the real command: ``quotient bench kai-scale --nodes 16 --samples 2``.

The command starts the emulator and the scheduler process itself, runs every scenario KAI publishes a figure for
(fill, unschedulable verdict, one large gang reclaiming, one-GPU reclaims, reclaim of every GPU) and prints one JSON
object. No timing is asserted: the figures are benchmarks. At 16 nodes KAI's large job is 8 pods of 8 GPUs, which
reclaims 64 single-GPU jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from quotient.bench import kai_scale_figures
from tests.conftest import REPO

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_every_kai_scale_scenario_completes_on_a_small_cluster() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "quotient.cli",
            "bench",
            "kai-scale",
            "--nodes",
            "16",
            "--samples",
            "2",
            "--timeout",
            "90",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(done.stderr[-6000:])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    keys = [figure.key for figure in kai_scale_figures.KAI_FIGURES]
    assert set(keys) == {
        "fill_4000_s",
        "reclaim_one_gpu_s",
        "reclaim_4000_s",
        "big_job_2000_gpus_s",
        "unschedulable_verdict_s",
    }
    for key in keys:
        scenario = result["scenarios"][key]
        assert scenario["completed"], (key, scenario)
        assert isinstance(result[key], float) and result[key] > 0
        assert result["kai"][key] == scenario["kai_s"] > 0
    assert result["completed"] is True and result["nodes"] == 16 and result["gpus"] == 128
    assert result["scenarios"]["unschedulable_verdict_s"]["reasons"]  # the PodGroup said why
    assert "real" in result["setup"]["kai"] and "emulator" in result["setup"]["ours"]
    assert "logs" not in result  # a completed run leaves nothing behind

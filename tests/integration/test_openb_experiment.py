"""The FGD paper's experiment on the default Alibaba trace lands where the paper's simulator did.

Two seeds of ten keep the test short; the seed-to-seed spread is 0.1 to 0.6 points, so the mean of two is held to
the published ten-seed figure within half a point, which is the bar the issue sets for the harness. The full bar
(ten seeds, four traces, every policy) is measured with ``quotient simulate openb``, not here.
"""

from __future__ import annotations

import statistics

import pytest

from scheduler.sim import experiment, openb, policies
from tests.conftest import shared_path

SEEDS = (42, 43)
TOLERANCE = 0.5


@pytest.fixture(scope="module")
def trace() -> tuple[tuple[openb.TraceNode, ...], tuple[openb.TracePod, ...]]:
    nodes = openb.load_nodes(shared_path("data", "openb", "openb_node_list_gpu_node.csv"))
    pods = openb.load_pods(shared_path("data", "openb", "openb_pod_list_default.csv"))
    return nodes, pods


@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_the_baseline_lands_near_its_published_allocation(
    trace: tuple[tuple[openb.TraceNode, ...], tuple[openb.TracePod, ...]], policy: str
) -> None:
    nodes, pods = trace
    results = [
        experiment.run_seed(nodes=nodes, pods=pods, policy=policies.POLICIES[policy], seed=seed) for seed in SEEDS
    ]
    mean = statistics.fmean(result.allocated_at(130) for result in results)
    assert mean == pytest.approx(openb.PUBLISHED_130["default"][policy], abs=TOLERANCE)
    for result in results:
        assert result.allocated_at(100) <= result.allocated_at(130)
        assert result.failed_by_kind["cpu_only"] == 0

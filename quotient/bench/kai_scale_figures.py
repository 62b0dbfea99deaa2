"""KAI's published scale-test figures, the scenario sizes KAI derives from its node count, and the result object.

KAI's end-to-end scale tests (KAI-Scheduler ``test/e2e/scale/``, figures from ``docs/scale-tests/
example-results.json``, run of 2026-07-03 at commit ab86e6c0) run on a real control plane (5 cluster nodes) with
500 simulated KWOK nodes of 8 GPUs, the scheduler given 3-5 CPUs and 7 GiB, consolidation off. Every size in them
follows from ``NODE_COUNT`` (``defaultNumberOfNodes`` 500, ``gpusPerNode`` 8): the fill is one single-GPU Job per GPU,
the large job has half as many 8-GPU pods as there are nodes, the distributed job 10 pods of 8 GPUs
(``defaultPodsPerDistributedJob``), and the repeated measurements take 10 samples (``statusMeasuringSamples``).
``Sizes.of(nodes)`` makes the same derivation, so ``--nodes 20`` is KAI's test at ``NODE_COUNT=20``.

Pure: no I/O, no clock. ``result`` turns the measured seconds (None where a scenario did not complete) into the
one JSON object ``quotient bench kai-scale`` prints, KAI's figure beside each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final

GPUS_PER_NODE: Final = 8
"""KAI's ``gpusPerNode``."""
KAI_NODES: Final = 500
"""KAI's ``defaultNumberOfNodes``: the node count its published figures were measured at."""
DISTRIBUTED_PODS: Final = 10
"""KAI's ``defaultPodsPerDistributedJob``: the pods of the job that is to be marked unschedulable."""
SAMPLES: Final = 10
"""KAI's ``statusMeasuringSamples``: one-GPU reclaims and unschedulable verdicts are averaged over this many."""

KAI_SOURCE: Final = (
    "KAI-Scheduler docs/scale-tests/example-results.json (run 2026-07-03, commit ab86e6c0), scenarios in "
    "test/e2e/scale/ (commit d5bc503a)"
)
KAI_SETUP: Final = (
    "KAI: a real Kubernetes control plane (5 cluster nodes) with 500 simulated KWOK nodes x 8 GPUs, the scheduler "
    "given 3-5 CPUs and 7 GiB, consolidation off"
)
OUR_SETUP: Final = (
    "Quotient: the real scheduler process against the local Kubernetes API emulator (its nodes emulated, no agents), "
    "both and this bench on this one machine"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KaiFigure:
    """One published figure: our result key, KAI's test name, its value, how both are timed, and issue 14's budget."""

    key: str
    kai_test: str
    kai_s: float
    timed: str
    budget_s: float | None = None


KAI_FIGURES: Final = (
    KaiFigure(
        key="fill_4000_s",
        kai_test="Fill Cluster with single GPU Jobs",
        kai_s=397.8,
        timed="one single-GPU Job per GPU created with the scheduler stopped, all pods existing; from the scheduler's "
        "start until the last pod is bound",
        budget_s=20.0,
    ),
    KaiFigure(
        key="reclaim_one_gpu_s",
        kai_test="Measuring reclaim time for single GPU",
        kai_s=13.9,
        timed="the cluster full of single-GPU Jobs of a queue with no quota; a single-GPU Job in a second queue, from "
        "its creation until its pod is bound; the mean of the samples",
        budget_s=1.0,
    ),
    KaiFigure(
        key="reclaim_4000_s",
        kai_test="Reclaim 4000 single GPU Jobs",
        kai_s=694.5,
        timed="the cluster full as above; one single-GPU Job per GPU created in the second queue with the scheduler "
        "stopped; from the scheduler's start until the last of them is bound",
    ),
    KaiFigure(
        key="big_job_2000_gpus_s",
        kai_test="Reclaim time for one very large job",
        kai_s=102.0,
        timed="the cluster full as above; one gang Job of nodes/2 pods of 8 GPUs in the second queue, from its "
        "creation until its last pod is bound",
    ),
    KaiFigure(
        key="unschedulable_verdict_s",
        kai_test="Average time to unschedulable for distributed job",
        kai_s=249.5,
        timed="the cluster full, the first queue's quota all GPUs but 79; a gang Job of 10 pods of 8 GPUs in the "
        "second queue, from its creation until its PodGroup has the UnschedulableOnNodePool condition; the mean of "
        "the samples",
        budget_s=2.0,
    ),
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    """KAI's scenario sizes for a node count (see the module docstring)."""

    nodes: int
    gpus: int
    fill_jobs: int
    big_job_pods: int
    distributed_pods: int
    unschedulable_quota: int
    """The first queue's GPU quota in the unschedulable scenario: all GPUs but 79, so 79 can be reclaimed for 80."""

    @classmethod
    def of(cls, nodes: int) -> Sizes:
        if nodes < DISTRIBUTED_PODS:
            raise ValueError(f"--nodes {nodes}: KAI's scenarios need at least {DISTRIBUTED_PODS} nodes")
        gpus = nodes * GPUS_PER_NODE
        return cls(
            nodes=nodes,
            gpus=gpus,
            fill_jobs=gpus,
            big_job_pods=nodes // 2,
            distributed_pods=DISTRIBUTED_PODS,
            unschedulable_quota=gpus - DISTRIBUTED_PODS * GPUS_PER_NODE + 1,
        )


def mean(samples: Sequence[float]) -> float | None:
    return sum(samples) / len(samples) if samples else None


def span_s(started: float, finished: Sequence[float], *, expected: int) -> float | None:
    """From ``started`` until the last of ``expected`` things finished; None while fewer than that finished."""
    if expected <= 0 or len(finished) < expected:
        return None
    return max(finished) - started


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One scenario's outcome: its seconds (None: it did not complete), why not, and what else was seen."""

    seconds: float | None
    problem: str | None = None
    detail: Mapping[str, object] = dataclasses.field(default_factory=dict)


def result(sizes: Sizes, outcomes: Mapping[str, Outcome], *, samples: int) -> dict[str, object]:
    """The JSON object of a run: every figure's seconds beside KAI's, the budgets, each scenario's detail."""
    figures: dict[str, object] = {}
    scenarios: dict[str, object] = {}
    for figure in KAI_FIGURES:
        outcome = outcomes.get(figure.key, Outcome(seconds=None, problem="not run"))
        seconds = None if outcome.seconds is None else round(outcome.seconds, 3)
        figures[figure.key] = seconds
        scenarios[figure.key] = {
            "completed": outcome.seconds is not None,
            "seconds": seconds,
            "kai_s": figure.kai_s,
            "kai_test": figure.kai_test,
            "timed": figure.timed,
            "budget_s": figure.budget_s,
            "within_budget": None if figure.budget_s is None or seconds is None else seconds <= figure.budget_s,
            "problem": outcome.problem,
            **dict(outcome.detail),
        }
    return {
        **figures,
        "kai": {figure.key: figure.kai_s for figure in KAI_FIGURES},
        "budget": {figure.key: figure.budget_s for figure in KAI_FIGURES if figure.budget_s is not None},
        "completed": all(figures[figure.key] is not None for figure in KAI_FIGURES),
        "scenarios": scenarios,
        "nodes": sizes.nodes,
        "gpus": sizes.gpus,
        "samples": samples,
        "comparable_to_kai": sizes.nodes == KAI_NODES and samples == SAMPLES,
        "setup": {"kai": KAI_SETUP, "ours": OUR_SETUP, "kai_source": KAI_SOURCE},
    }

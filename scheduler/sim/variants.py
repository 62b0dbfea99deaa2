"""Other members of the openb trace's families, drawn the way the published ones were, to test a policy beyond them.

The trace's repository publishes resamplings of the default pod list in four families; a policy that only does well
on the four files beside us could be tuned to them, so the simulator draws new members the same way (the rules as
the files show them, see the trace README):

- ``gpushareN``: the GPU pods are redrawn (as many as before, CPU-only pods kept) from the fractional pods with a
  probability chosen so that fractional pods make N% of the expected GPU demand, from the other GPU pods otherwise;
- ``multigpuN``: multi-GPU pods drawn from the trace's own are added until they make N% of the GPU demand;
- ``gpuspecN``: N% of the GPU pods, chosen at random, get a GPU model constraint: a model that some node of the
  cluster could hold the pod on (picked in proportion to such nodes' GPUs), and in one case out of five one or two
  more such models (the published gpuspec20 has about that mix);
- ``cpuN``: the CPU-only pods are redrawn, N% as many as the trace has (``cpu0``: none).

Every draw comes from ``random.Random(seed)``, so a variant is reproducible from its name and seed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence

from common.quantities import MILLI_GPU_PER_GPU
from scheduler.sim.openb import TraceNode, TracePod

_NAME = re.compile(r"^(gpushare|multigpu|gpuspec|cpu)(\d{1,3})$")
# In the published gpuspec20, about four constraints in five name a single model.
_SINGLE_MODEL_ODDS = 0.8


def parse(name: str) -> tuple[str, int]:
    """``gpushare60`` -> (``gpushare``, 60); raises ValueError for anything else."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a family member such as gpushare60, multigpu30, gpuspec25 or cpu200")
    family, percent = match.group(1), int(match.group(2))
    if family != "cpu" and not 0 <= percent <= 100:
        raise ValueError(f"{name!r}: {family} takes a percentage from 0 to 100")
    return family, percent


def derive(pods: Sequence[TracePod], nodes: Sequence[TraceNode], name: str, *, seed: int) -> tuple[TracePod, ...]:
    """The member ``name`` of a family, drawn from ``pods`` (the default trace) with ``seed``."""
    family, percent = parse(name)
    rng = random.Random(f"{name}-{seed}")
    if family == "gpushare":
        drawn = gpushare(pods, percent, rng)
    elif family == "multigpu":
        drawn = multigpu(pods, percent, rng)
    elif family == "gpuspec":
        drawn = gpuspec(pods, nodes, percent, rng)
    else:
        drawn = cpu(pods, percent, rng)
    return tuple(dataclasses.replace(pod, name=f"{name}-pod-{index:05d}") for index, pod in enumerate(drawn))


def gpushare(pods: Sequence[TracePod], percent: int, rng: random.Random) -> list[TracePod]:
    cpu_only = [pod for pod in pods if pod.gpu_count == 0]
    shares = [pod for pod in pods if pod.kind == "fractional"]
    others = [pod for pod in pods if pod.gpu_count and pod.kind != "fractional"]
    if not shares or not others:
        raise ValueError("gpushare needs both fractional and whole-GPU pods in the trace")
    share_mean = sum(pod.total_milli_gpu for pod in shares) / len(shares)
    other_mean = sum(pod.total_milli_gpu for pod in others) / len(others)
    wanted = percent / 100
    # p * share_mean / (p * share_mean + (1 - p) * other_mean) = wanted, solved for p.
    odds = 1.0 if wanted >= 1 else wanted * other_mean / (share_mean * (1 - wanted) + wanted * other_mean)
    gpu_pods = len(shares) + len(others)
    drawn = [rng.choice(shares) if rng.random() < odds else rng.choice(others) for _ in range(gpu_pods)]
    return cpu_only + drawn


def multigpu(pods: Sequence[TracePod], percent: int, rng: random.Random) -> list[TracePod]:
    multi = [pod for pod in pods if pod.gpu_count > 1]
    if not multi:
        raise ValueError("multigpu needs multi-GPU pods in the trace to draw from")
    drawn = list(pods)
    total = sum(pod.total_milli_gpu for pod in drawn)
    multi_total = sum(pod.total_milli_gpu for pod in multi)
    while percent < 100 and multi_total * 100 < percent * total:
        pod = rng.choice(multi)
        drawn.append(pod)
        total += pod.total_milli_gpu
        multi_total += pod.total_milli_gpu
    return drawn


def _could_hold(node: TraceNode, pod: TracePod) -> bool:
    return node.gpu_count >= pod.gpu_count and node.milli_cpu >= pod.milli_cpu and node.memory_bytes >= pod.memory_bytes


def gpuspec(pods: Sequence[TracePod], nodes: Sequence[TraceNode], percent: int, rng: random.Random) -> list[TracePod]:
    drawn = [dataclasses.replace(pod, gpu_models=frozenset()) for pod in pods]
    gpu_positions = [index for index, pod in enumerate(drawn) if pod.gpu_count]
    for index in rng.sample(gpu_positions, round(len(gpu_positions) * percent / 100)):
        pod = drawn[index]
        weight: dict[str, int] = {}
        for node in nodes:
            if _could_hold(node, pod):
                weight[node.gpu_model] = weight.get(node.gpu_model, 0) + node.gpu_count * MILLI_GPU_PER_GPU
        if not weight:
            continue
        models = sorted(weight)
        chosen = set(rng.choices(models, weights=[weight[model] for model in models]))
        if rng.random() >= _SINGLE_MODEL_ODDS and len(models) > 1:
            chosen.update(rng.sample(models, min(len(models), rng.randint(1, 2))))
        drawn[index] = dataclasses.replace(pod, gpu_models=frozenset(chosen))
    return drawn


def cpu(pods: Sequence[TracePod], percent: int, rng: random.Random) -> list[TracePod]:
    cpu_only = [pod for pod in pods if pod.gpu_count == 0]
    if not cpu_only and percent:
        raise ValueError("cpu needs CPU-only pods in the trace to draw from")
    count = round(len(cpu_only) * percent / 100)
    return [pod for pod in pods if pod.gpu_count] + [rng.choice(cpu_only) for _ in range(count)]

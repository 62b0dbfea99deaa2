"""``quotient simulate``: replay a trace or a workload through the placement engine, print what it achieved.

``quotient simulate openb --nodes FILE --pods FILE [--seeds 42-51] [--inflate 1.3] [--policy NAME]... [--json OUT]
[--plot OUT.png] [--consolidate-budget B]`` runs the FGD paper's experiment on the Alibaba trace for every seed and
policy and prints the GPU allocation at 100% and 130% of arrived demand (mean and standard deviation over the seeds)
beside the published figure. ``--policy production`` is the scheduler itself (its default configuration and code path,
learning the workload from the pods it has seen); ``--consolidate-budget B`` also runs it with consolidation allowed
to move running pods (at most B moves per placed pod) and reports that beside, never instead of, the experiment's
figures. ``--json`` writes the curves; ``--plot`` draws allocation against arrival, the policies side by side (it
needs matplotlib, the ``plot`` extra, imported only then). ``--variant gpushare60`` replays a member of the trace's
families drawn from ``--pods``. Pods are placed by the placement engine itself (the scheduler's own code, with the
policy as its scorer); ``--backend fast`` replays through the simulator's independent implementation of the
experiment's rules instead, a cross-check. ``--jobs N`` runs seeds in N processes.

``quotient simulate workload FILE`` replays a cluster spec whose pods arrive and leave over simulated time and reports
utilisation over time, waits per queue and each queue's allocation against its fair share.

Progress goes to stderr, results to stdout, so ``> results.txt`` keeps only the table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fractions
import importlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TypedDict

from common.errors import ClusterSpecError
from scheduler.sim import experiment, openb, policies, variants, workload, workloadreport

SEEDS_DEFAULT = "42-51"
_BAR_WIDTH = 30


class _FailedJson(TypedDict):
    cpu_only: int
    fractional: int
    whole: int
    multi_gpu: int


class _SeedJson(TypedDict):
    curve: list[list[float]]
    failed_by_type: _FailedJson


class _PolicyJson(TypedDict):
    alloc_100_mean: float
    alloc_100_std: float
    alloc_130_mean: float
    alloc_130_std: float
    seeds: dict[str, _SeedJson]


def parse_seeds(text: str) -> list[int]:
    """``42-51`` (inclusive) or ``42,44`` or a mix (``42-45,50``), in the order given, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            values = range(int(low), int(high) + 1) if dash else range(int(low), int(low) + 1)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: seeds are integers, as 42-51 or 42,44") from None
        if not values:
            raise argparse.ArgumentTypeError(f"{part!r}: an empty range")
        seeds.extend(seed for seed in values if seed not in seeds)
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def parse_inflate(text: str) -> int:
    """The inflation target as a whole percent of GPU capacity (1.3 -> 130)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a ratio such as 1.3") from None
    percent = round(value * 100)
    if not 1 <= percent <= 1000 or abs(value * 100 - percent) > 1e-6:
        raise argparse.ArgumentTypeError(f"{text!r}: a ratio from 0.01 to 10 in whole percents, such as 1.3")
    return percent


def parse_policies(values: Sequence[str] | None) -> list[str]:
    names: list[str] = []
    known = policies.NAMES
    for value in values or ["all"]:
        for name in value.split(","):
            name = name.strip()
            if name == "all":
                names.extend(policy for policy in known if policy not in names)
            elif name not in known:
                raise argparse.ArgumentTypeError(f"unknown policy {name!r}; known: {', '.join(known)}, all")
            elif name not in names:
                names.append(name)
    return names


def parse_budget(text: str) -> fractions.Fraction:
    """A consolidation budget: moves per placed pod, a non-negative number such as 0.05 or 1."""
    try:
        value = fractions.Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r}: expected moves per placed pod, such as 0.05") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a budget of moves cannot be negative")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quotient simulate", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{openb,workload}")
    trace = commands.add_parser("openb", help="the FGD experiment on the Alibaba GPU-sharing trace")
    trace.add_argument("--nodes", type=Path, required=True, help="the node list (openb_node_list_gpu_node.csv)")
    trace.add_argument("--pods", type=Path, required=True, help="a pod list (openb_pod_list_default.csv, ...)")
    trace.add_argument(
        "--variant",
        help="replay a member of the trace's families drawn from --pods instead (gpushare60, multigpu30, gpuspec25, "
        "cpu200, ...); see scheduler/sim/variants.py",
    )
    trace.add_argument("--variant-seed", type=int, default=1, help="the seed the variant is drawn with (default 1)")
    trace.add_argument("--seeds", default=SEEDS_DEFAULT, help=f"42-51, 42,44 or a mix (default {SEEDS_DEFAULT})")
    trace.add_argument("--inflate", default="1.3", help="arrived GPU demand to reach, as a ratio of capacity")
    trace.add_argument(
        "--policy",
        action="append",
        help=f"repeatable or a comma list; one of {', '.join(policies.NAMES)}, or all (the default); production is "
        "the scheduler's own default configuration",
    )
    trace.add_argument(
        "--consolidate-budget",
        type=parse_budget,
        metavar="B",
        help="also run production with consolidation moving running pods, at most B moves per placed pod, and "
        "report it beside the experiment's figures (beyond the experiment's rules)",
    )
    trace.add_argument(
        "--backend",
        choices=[backend.value for backend in experiment.Backend],
        default=experiment.Backend.ENGINE.value,
        help="engine: the placement engine itself (default); fast: the simulator's own replay, a cross-check",
    )
    trace.add_argument("--jobs", type=int, default=1, help="processes running seeds side by side (default 1)")
    trace.add_argument("--json", type=Path, dest="json_out", help="write every curve and summary to this file")
    trace.add_argument("--plot", type=Path, help="draw allocation against arrival to this PNG (needs matplotlib)")
    spec = commands.add_parser("workload", help="a cluster spec with arrivals and departures over simulated time")
    spec.add_argument("file", help="a cluster spec (YAML) whose pods have arrive, duration and queue")
    spec.add_argument("--step", default="10s", help="sampling interval of the utilisation series (default 10s)")
    spec.add_argument("--json", type=Path, dest="json_out", help="write the report as JSON to this file")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    if args.command == "workload":
        return _workload(args)
    try:
        seeds = parse_seeds(args.seeds)
        target = parse_inflate(args.inflate)
        names = parse_policies(args.policy)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.plot is not None and not _matplotlib_available():
        print(
            "quotient simulate: --plot needs matplotlib; install the plot extra: pip install 'quotient[plot]'",
            file=sys.stderr,
        )
        return 2
    try:
        nodes = openb.load_nodes(args.nodes)
        pods = openb.load_pods(args.pods)
    except ClusterSpecError as exc:
        print(f"quotient simulate: {exc}", file=sys.stderr)
        return 2
    trace_name = openb.trace_name(args.pods)
    if args.variant is not None:
        try:
            pods = variants.derive(pods, nodes, args.variant, seed=args.variant_seed)
        except ValueError as exc:
            parser.error(str(exc))
        trace_name = args.variant
    backend = experiment.Backend(args.backend)
    if backend is experiment.Backend.FAST and (policies.PRODUCTION in names or args.consolidate_budget is not None):
        parser.error("production is the scheduler's own engine: it runs with --backend engine only")
    runs = [(name, None) for name in names]
    if args.consolidate_budget is not None:
        runs.append((policies.PRODUCTION, args.consolidate_budget))
    results = _run_all(nodes=nodes, pods=pods, runs=runs, seeds=seeds, target=target, backend=backend, jobs=args.jobs)
    experiment_results = {name: results[(name, None)] for name in names}
    _print_table(experiment_results, target=target, published=openb.PUBLISHED_130.get(trace_name or ""), out=sys.stdout)
    document: dict[str, object] = {"policies": _to_json(experiment_results, target)}
    if args.consolidate_budget is not None:
        consolidated = results[(policies.PRODUCTION, args.consolidate_budget)]
        _print_consolidation(consolidated, budget=args.consolidate_budget, target=target, out=sys.stdout)
        document["consolidation"] = _consolidation_json(consolidated, args.consolidate_budget, target)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    if args.plot is not None:
        _plot(experiment_results, args.plot, title=f"openb {trace_name or args.pods.name}")
    return 0


# --- running ------------------------------------------------------------------------------------------------------


Run = tuple[str, fractions.Fraction | None]
"""A policy by name, and its consolidation budget (None: the experiment's rules)."""


def _label(run: Run) -> str:
    name, budget = run
    return name if budget is None else f"{name} (consolidate {budget})"


def _run_one(
    nodes: Sequence[openb.TraceNode],
    pods: Sequence[openb.TracePod],
    run: Run,
    seed: int,
    target: int,
    backend: experiment.Backend,
) -> tuple[experiment.SeedResult, float]:
    name, budget = run
    started = time.process_time()
    result = experiment.run_seed(
        nodes=nodes,
        pods=pods,
        policy=None if name == policies.PRODUCTION else policies.POLICIES[name],
        seed=seed,
        target_percent=target,
        backend=backend,
        consolidate_budget=budget,
    )
    return result, time.process_time() - started


def _run_all(
    *,
    nodes: Sequence[openb.TraceNode],
    pods: Sequence[openb.TracePod],
    runs: Sequence[Run],
    seeds: Sequence[int],
    target: int,
    backend: experiment.Backend,
    jobs: int,
) -> dict[Run, list[tuple[experiment.SeedResult, float]]]:
    work = [(run, seed) for run in runs for seed in seeds]
    done: dict[tuple[Run, int], tuple[experiment.SeedResult, float]] = {}
    progress = _Progress(total=len(work), out=sys.stderr)
    if jobs == 1:
        for run, seed in work:
            progress.show(f"{_label(run)} seed {seed}")
            done[(run, seed)] = _run_one(nodes, pods, run, seed, target, backend)
            progress.advance(f"{_label(run)} seed {seed}")
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {
                pool.submit(_run_one, nodes, pods, run, seed, target, backend): (run, seed) for run, seed in work
            }
            progress.show(f"{len(work)} runs on {jobs} processes")
            for future in concurrent.futures.as_completed(futures):
                run, seed = futures[future]
                done[(run, seed)] = future.result()
                progress.advance(f"{_label(run)} seed {seed}")
    progress.finish()
    return {run: [done[(run, seed)] for seed in seeds] for run in runs}


class _Progress:
    """A one-line progress bar on a terminal; one line per finished run otherwise (logs, CI)."""

    def __init__(self, *, total: int, out: IO[str]) -> None:
        self.total = total
        self.done = 0
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()

    def _line(self, label: str) -> str:
        filled = _BAR_WIDTH * self.done // max(1, self.total)
        elapsed = time.monotonic() - self.started
        return f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {self.done}/{self.total} {elapsed:5.0f}s {label}"

    def show(self, label: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K" + self._line(label))
            self.out.flush()

    def advance(self, label: str) -> None:
        self.done += 1
        if self.tty:
            self.show(f"{label} done")
        else:
            self.out.write(self._line(f"{label} done") + "\n")
            self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


# --- reporting ----------------------------------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _print_table(
    results: Mapping[str, Sequence[tuple[experiment.SeedResult, float]]],
    *,
    target: int,
    published: Mapping[str, float] | None,
    out: IO[str],
) -> None:
    last = f"alloc@{target}%"
    header = f"{'policy':<12} {'alloc@100%':>16} {last:>16} {'published@130%':>15} {'cpu s/seed':>11}"
    out.write(header + "\n" + "-" * len(header) + "\n")
    for name, runs in results.items():
        at_100 = _stats([result.allocated_at(experiment.FIRST_POINT_PERCENT) for result, _ in runs])
        at_end = _stats([result.allocated_at(target) for result, _ in runs])
        reference = published.get(name) if published and target == experiment.DEFAULT_INFLATE_PERCENT else None
        out.write(
            f"{name:<12} {at_100[0]:>8.2f} ± {at_100[1]:<5.2f} {at_end[0]:>8.2f} ± {at_end[1]:<5.2f} "
            f"{'' if reference is None else f'{reference:.2f}':>15} {statistics.fmean(t for _, t in runs):>11.1f}\n"
        )
    seeds = ", ".join(str(result.seed) for result, _ in next(iter(results.values()), []))
    out.write(f"\nGPU allocation in % of capacity, mean ± sample std over seeds {seeds}.\n")


def _moves_per_placed(runs: Sequence[tuple[experiment.SeedResult, float]]) -> float:
    placed = sum(result.placed for result, _ in runs)
    return sum(result.moves for result, _ in runs) / placed if placed else 0.0


def _print_consolidation(
    runs: Sequence[tuple[experiment.SeedResult, float]],
    *,
    budget: fractions.Fraction,
    target: int,
    out: IO[str],
) -> None:
    """The production policy with consolidation, beyond the experiment's rules: printed apart, after its table."""
    at_end = _stats([result.allocated_at(target) for result, _ in runs])
    out.write(
        "\nBeyond the experiment's rules: production with consolidation moving running pods, "
        f"at most {float(budget):g} moves per placed pod:\n  alloc@{target}% {at_end[0]:.2f} ± {at_end[1]:.2f}, "
        f"{_moves_per_placed(runs):.4f} moves per placed pod, "
        f"{statistics.fmean(t for _, t in runs):.1f} cpu s/seed\n"
    )


def _consolidation_json(
    runs: Sequence[tuple[experiment.SeedResult, float]], budget: fractions.Fraction, target: int
) -> dict[str, float]:
    at_end = _stats([result.allocated_at(target) for result, _ in runs])
    return {
        "budget": float(budget),
        "alloc_130_mean": round(at_end[0], 4),
        "alloc_130_std": round(at_end[1], 4),
        "moves_per_placed_pod": round(_moves_per_placed(runs), 6),
    }


def _to_json(
    results: Mapping[str, Sequence[tuple[experiment.SeedResult, float]]], target: int
) -> dict[str, _PolicyJson]:
    out: dict[str, _PolicyJson] = {}
    for name, runs in results.items():
        at_100 = _stats([result.allocated_at(experiment.FIRST_POINT_PERCENT) for result, _ in runs])
        at_end = _stats([result.allocated_at(experiment.DEFAULT_INFLATE_PERCENT) for result, _ in runs])
        seeds: dict[str, _SeedJson] = {}
        for result, _ in runs:
            failed = result.failed_by_kind
            seeds[str(result.seed)] = {
                "curve": [
                    [point.arrived_percent, round(point.allocated_percent, 4), round(point.fragmentation_percent, 4)]
                    for point in result.curve
                ],
                "failed_by_type": {
                    "cpu_only": failed["cpu_only"],
                    "fractional": failed["fractional"],
                    "whole": failed["whole"],
                    "multi_gpu": failed["multi_gpu"],
                },
            }
        out[name] = {
            "alloc_100_mean": round(at_100[0], 4),
            "alloc_100_std": round(at_100[1], 4),
            "alloc_130_mean": round(at_end[0], 4),
            "alloc_130_std": round(at_end[1], 4),
            "seeds": seeds,
        }
    return out


def _matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _plot(results: Mapping[str, Sequence[tuple[experiment.SeedResult, float]]], path: Path, *, title: str) -> None:
    """Mean allocation (and fragmentation, dashed) against arrived demand, one colour per policy."""
    # The optional plot extra, imported only here (its presence is checked before the runs start).
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")

    figure, axes = pyplot.subplots(figsize=(9, 5.5))
    for name, runs in results.items():
        curves = [result.curve for result, _ in runs]
        length = min(len(curve) for curve in curves)
        xs = [curves[0][i].arrived_percent for i in range(length)]
        allocated = [statistics.fmean(curve[i].allocated_percent for curve in curves) for i in range(length)]
        fragmented = [statistics.fmean(curve[i].fragmentation_percent for curve in curves) for i in range(length)]
        (line,) = axes.plot(xs, allocated, label=f"{name} ({allocated[-1]:.2f}%)")
        axes.plot(xs, fragmented, linestyle="--", color=line.get_color(), linewidth=0.8)
    axes.set_xlabel("arrived GPU demand (% of capacity)")
    axes.set_ylabel("GPU allocated (solid) and fragmented (dashed), % of capacity")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


# --- workloads ----------------------------------------------------------------------------------------------------


def _workload(args: argparse.Namespace) -> int:
    try:
        report = workload.run_file(args.file, step=args.step)
    except ClusterSpecError as exc:
        print(f"quotient simulate: {exc}", file=sys.stderr)
        return 2
    workloadreport.print_report(report, out=sys.stdout)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(workloadreport.report_json(report), indent=1) + "\n")
    return 0

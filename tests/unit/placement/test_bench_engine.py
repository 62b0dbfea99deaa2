"""The engine benchmark runs end to end on a small cluster and reports every figure issues 3 and 14 ask for."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path

import pytest

from quotient.bench import engine
from scheduler import gcpolicy, settings
from scheduler.placement import decisions, model, plan, status

ISSUE_14_KEYS = (
    "pods_per_second",
    "wall_s",
    "placed",
    "evictions",
    "moves",
    "pending_groups_max",
    "backlog_idle_cycle_ms",
    "cycle_ms_p50",
    "cycle_ms_p99",
)


def _number(figures: Mapping[str, object], key: str) -> float:
    value = figures[key]
    assert isinstance(value, int | float), (key, value)
    return value


def test_the_engine_benchmark_reports_its_figures_on_a_small_cluster(tmp_path: Path) -> None:
    figures = engine.run(["--nodes", "40", "--pods", "240", "--batch", "80", "--idle-cycles", "3"])
    for key in (*ISSUE_14_KEYS, "unplaced", "idle_cycle_ms", "rss_mb", "placements", "converged"):
        assert key in figures
    assert figures["placed"] == 240
    assert figures["unplaced"] == 0
    assert figures["converged"] is True
    wall_s = _number(figures, "wall_s")
    assert wall_s > 0 and figures["pods_per_second"] == pytest.approx(240 / wall_s, rel=0.05)


def test_the_benchmark_runs_with_the_schedulers_garbage_collector_thresholds_and_gives_the_process_its_own_back() -> (
    None
):
    before = gc.get_threshold()
    assert before != gcpolicy.THRESHOLDS
    figures = engine.run(["--nodes", "10", "--pods", "40", "--batch", "40", "--idle-cycles", "1"])
    assert figures["gc_thresholds"] == list(gcpolicy.THRESHOLDS)
    assert gc.get_threshold() == before


def test_a_backlog_beyond_the_cluster_is_counted_without_double_counting_re_placed_pods(tmp_path: Path) -> None:
    figures = engine.run(["--nodes", "20", "--pods", "300", "--batch", "100", "--idle-cycles", "1"])
    placed, unplaced = _number(figures, "placed"), _number(figures, "unplaced")
    assert _number(figures, "gpu_asked_percent") > 100
    assert unplaced > 0 and _number(figures, "pending_groups_max") > 0
    # Every pod was placed at least once or is still pending; a pod placed twice counts once.
    assert placed <= _number(figures, "placements") and placed <= 300 <= placed + unplaced


def test_the_benchmark_uses_the_schedulers_default_strategy_unless_told_otherwise() -> None:
    (default,) = (setting.default for setting in settings.SETTINGS if setting.name == "gpu_strategy")
    small = ["--nodes", "10", "--pods", "40", "--batch", "40", "--idle-cycles", "1"]
    assert engine.run(small)["gpu_strategy"] == default
    assert engine.scheduler_config("spread").gpu_strategy is model.Strategy.SPREAD
    figures = engine.run([*small, "--strategy", "spread"])
    assert figures["gpu_strategy"] == "spread" and figures["placed"] == 40


def test_a_strategy_the_scheduler_refuses_is_refused_with_the_schedulers_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        engine.run(["--nodes", "4", "--pods", "4", "--strategy", "tetris"])
    assert "--gpu-strategy: 'tetris'" in capsys.readouterr().err


def test_the_tally_counts_distinct_pods_moves_and_the_largest_backlog() -> None:
    def placed(pod: str) -> decisions.Placement:
        return decisions.Placement(pod=model.PodUid(pod), group=model.GroupId(pod), node=model.NodeName("n"))

    waiting = status.unschedulable(status.Reason.NO_GPU_FITS, "full")
    tally = engine.Tally()
    tally.add(
        plan.Plan(placements=(placed("a"), placed("b")), evictions=(), statuses={model.GroupId("c"): waiting}),
        elapsed_s=0.5,
    )
    evicted = decisions.Eviction(
        pod=model.PodUid("a"),
        group=model.GroupId("a"),
        node=model.NodeName("n"),
        reason=decisions.EvictionReason.CONSOLIDATE,
        beneficiary=model.GroupId("c"),
        message="moved",
        moved_to=model.NodeName("m"),
    )
    tally.add(
        plan.Plan(placements=(placed("a"), placed("c")), evictions=(evicted,), statuses={}, moves=(placed("a"),)),
        elapsed_s=1.5,
    )
    figures = tally.figures()
    assert figures["placed"] == 3 and figures["placements"] == 4
    assert figures["evictions"] == 1 and figures["moves"] == 1
    assert figures["pending_groups_max"] == 1
    assert figures["wall_s"] == 2.0 and figures["pods_per_second"] == 1.5
    assert figures["cycle_ms_p50"] == 1000.0 and figures["cycle_ms_p99"] == 1500.0


def test_without_the_trace_the_benchmark_uses_its_fallback_share_distribution(tmp_path: Path) -> None:
    assert engine._share_distribution(tmp_path / "absent.csv") == engine._FALLBACK_SHARES
    groups = engine.workload(pods=500, seed=3, shares=engine._FALLBACK_SHARES)
    assert sum(len(group.members) for group in groups) == 500
    assert engine.workload(pods=500, seed=3, shares=engine._FALLBACK_SHARES) == groups

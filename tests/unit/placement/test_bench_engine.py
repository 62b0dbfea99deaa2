"""The engine benchmark runs end to end on a small cluster and reports every figure issue 3 asks for."""

from __future__ import annotations

from pathlib import Path

from quotient.bench import engine


def test_the_engine_benchmark_reports_its_figures_on_a_small_cluster(tmp_path: Path) -> None:
    figures = engine.run(["--nodes", "40", "--pods", "240", "--batch", "80", "--idle-cycles", "3"])
    for key in ("pods_per_second", "placed", "unplaced", "cycle_ms_p50", "cycle_ms_p99", "idle_cycle_ms", "rss_mb"):
        assert key in figures
    assert figures["placed"] == 240
    assert figures["unplaced"] == 0


def test_without_the_trace_the_benchmark_uses_its_fallback_share_distribution(tmp_path: Path) -> None:
    assert engine._share_distribution(tmp_path / "absent.csv") == engine._FALLBACK_SHARES
    groups = engine.workload(pods=500, seed=3, shares=engine._FALLBACK_SHARES)
    assert sum(len(group.members) for group in groups) == 500
    assert engine.workload(pods=500, seed=3, shares=engine._FALLBACK_SHARES) == groups

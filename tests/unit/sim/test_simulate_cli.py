from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from quotient import simulate

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn-0,32000,65536,2,T4\nn-1,32000,65536,2,P100\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    "p-0,4000,4096,1,500\np-1,4000,4096,1,1000\np-2,4000,4096,2,1000\np-3,8000,4096,0,0\n"
)


@pytest.mark.parametrize(
    ("text", "seeds"), [("42-45", [42, 43, 44, 45]), ("42,44", [42, 44]), ("42-43,50,42", [42, 43, 50])]
)
def test_seeds_are_read_as_ranges_and_lists(text: str, seeds: list[int]) -> None:
    assert simulate.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a-b", "45-42"])
def test_bad_seeds_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        simulate.parse_seeds(text)


def test_inflation_is_a_ratio_in_whole_percents() -> None:
    assert simulate.parse_inflate("1.3") == 130
    assert simulate.parse_inflate("1") == 100
    with pytest.raises(argparse.ArgumentTypeError):
        simulate.parse_inflate("1.305")


def test_policies_are_repeatable_or_comma_lists_and_default_to_all() -> None:
    assert simulate.parse_policies(["fgd,bestfit", "fgd"]) == ["fgd", "bestfit"]
    assert simulate.parse_policies(None)[:2] == ["random", "dotprod"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown policy 'tetris'"):
        simulate.parse_policies(["tetris"])


def test_openb_prints_the_table_and_writes_the_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    out = tmp_path / "out.json"
    code = simulate.main(
        [
            "openb",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--seeds",
            "42,43",
            "--policy",
            "fgd,bestfit",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "fgd" in printed.out and "bestfit" in printed.out and "alloc@130%" in printed.out
    assert "2/4" in printed.err  # the progress goes to stderr
    document = json.loads(out.read_text())
    fgd = document["policies"]["fgd"]
    assert set(fgd) == {"alloc_100_mean", "alloc_100_std", "alloc_130_mean", "alloc_130_std", "seeds"}
    seed = fgd["seeds"]["42"]
    assert [point[0] for point in seed["curve"]] == list(range(131))
    assert set(seed["failed_by_type"]) == {"cpu_only", "fractional", "whole", "multi_gpu"}
    assert all(0 <= value <= 100 for point in seed["curve"] for value in point[1:])


def test_a_malformed_trace_is_reported_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS + "p-4,x,1,0,0\n")
    assert simulate.main(["openb", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) == 2
    assert f"{pods}:6: cpu_milli is 'x'" in capsys.readouterr().err


def test_plotting_without_matplotlib_says_how_to_get_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if simulate._matplotlib_available():
        pytest.skip("matplotlib is installed here")
    code = simulate.main(
        ["openb", "--nodes", str(tmp_path / "n"), "--pods", str(tmp_path / "p"), "--plot", str(tmp_path / "x.png")]
    )
    assert code == 2
    assert "quotient[plot]" in capsys.readouterr().err


def test_workload_reports_queues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "nodes:\n  - {name: gpu, gpus: {count: 2, model: A100-80GB}}\n"
        "pods:\n  - {name: a, queue: team-a, requests: {nvidia.com/gpu: 1}, duration: 30s}\n"
    )
    out = tmp_path / "report.json"
    assert simulate.main(["workload", str(spec), "--step", "10s", "--json", str(out)]) == 0
    assert "team-a" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["queues"]["team-a"]["started"] == 1
    assert document["utilisation"][0] == [0.0, 50.0, 0.0]


class _FakeAxes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def plot(self, xs: list[int], ys: list[float], **style: object) -> list[_FakeAxes]:
        assert len(xs) == len(ys) == 131
        self.lines.append(str(style.get("label", "")))
        return [self]

    def get_color(self) -> str:
        return "black"

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None  # set_xlabel, grid, legend...


def test_the_plot_draws_every_policy_when_matplotlib_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.machinery
    import sys
    import types

    axes = _FakeAxes()
    figure = types.SimpleNamespace(
        tight_layout=lambda: None, savefig=lambda path, dpi: Path(path).write_bytes(b"\x89PNG")
    )
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.__spec__ = importlib.machinery.ModuleSpec("matplotlib", None)
    matplotlib.use = lambda backend: None  # type: ignore[attr-defined]
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda figsize: (figure, axes)  # type: ignore[attr-defined]
    pyplot.close = lambda figure: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    png = tmp_path / "curves.png"
    code = simulate.main(
        [
            "openb",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--seeds",
            "1",
            "--policy",
            "fgd,bestfit",
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    assert png.read_bytes() == b"\x89PNG"
    assert [label.split(" ")[0] for label in axes.lines if label] == ["fgd", "bestfit"]

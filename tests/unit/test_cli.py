"""quotient.cli: usage and dispatch, and ``quotient agent``'s start-up contract (no Kubernetes client, clear errors)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from quotient import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No NODE_NAME and no QUOTIENT_* settings leak in from the shell running the tests."""
    for name in list(os.environ):
        if name == "NODE_NAME" or name.startswith("QUOTIENT_"):
            monkeypatch.delenv(name)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` after the interpreter, in a fresh one of the same virtual environment, from the repository root."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env={key: value for key, value in os.environ.items() if not key.startswith("QUOTIENT_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter of the same virtual environment, from the repository root."""
    return run(["-c", code])


# --- usage and dispatch ---


@pytest.mark.parametrize("argv", [[], ["-h"], ["--help"], ["help"]])
def test_no_command_or_a_help_flag_prints_the_usage_and_succeeds(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: quotient COMMAND [ARGS...]")
    for name, (_, text) in cli.SUBCOMMANDS.items():
        assert f"  {name}" in out
        assert text in out
    assert "Run 'quotient COMMAND --help'" in out


def test_the_usage_lines_up_the_command_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main([])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    columns = {line.index(text) for line, (_, text) in zip(lines, cli.SUBCOMMANDS.values(), strict=True)}
    assert len(columns) == 1


def test_an_unknown_command_exits_2_with_the_usage_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schedule"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("quotient: unknown command 'schedule'\n")
    assert "usage: quotient COMMAND" in captured.err


def test_an_option_in_place_of_a_command_is_an_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--node", "n1"]) == 2
    assert "unknown command '--node'" in capsys.readouterr().err


def test_the_agent_command_is_the_agent_app_module() -> None:
    assert cli.SUBCOMMANDS["agent"][0] == "agent.app"


# --- quotient agent ---


def test_quotient_agent_without_a_node_name_exits_2_with_a_clear_message(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["agent"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.err == "quotient agent: --node: no node name given and NODE_NAME is not set (the DaemonSet sets it)\n"
    )


def test_a_blank_node_name_variable_counts_as_unset(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "   ")
    assert cli.main(["agent"]) == 2
    assert "NODE_NAME is not set" in capsys.readouterr().err


def test_the_node_name_comes_from_node_name_when_not_given(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import app

    monkeypatch.setenv("NODE_NAME", " gpu-7 ")
    assert app.parse_args([])["node"] == "gpu-7"
    assert app.parse_args(["--node", "gpu-8"])["node"] == "gpu-8"


def test_a_bad_interval_exits_2_naming_the_flag(clean_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["agent", "--node", "n1", "--interval", "1x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quotient agent: --interval: '1x' is not a duration")


def test_a_bad_interval_in_the_environment_exits_2_naming_the_variable(
    clean_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUOTIENT_INTERVAL", "soon")
    assert cli.main(["agent", "--node", "n1"]) == 2
    assert capsys.readouterr().err.startswith("quotient agent: QUOTIENT_INTERVAL: 'soon' is not a duration")


def test_an_unknown_agent_flag_exits_2(clean_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["agent", "--nodes", "n1"])
    assert caught.value.code == 2
    assert "--nodes" in capsys.readouterr().err


def test_agent_defaults_resolve_without_any_configuration(clean_env: None) -> None:
    from agent import app

    values = app.parse_args(["--node", "n1"])
    assert values["interval"] == 1.0
    assert values["metrics_port"] == 9400
    assert values["dcgm_names"] is False
    assert values["nats"] == "nats://127.0.0.1:4222"
    assert values["fake_gpus"] is None
    assert (values["log_level"], values["log_format"]) == ("info", "logfmt")


def test_the_agent_never_imports_the_kubernetes_client() -> None:
    code = """
import json, sys
import agent.app
from quotient import cli
try:
    code = cli.main(["agent", "--help"])
except SystemExit as exc:
    code = exc.code
loaded = sorted(name for name in sys.modules if name == "kubernetes" or name.startswith("kubernetes."))
print(json.dumps({"code": code, "kubernetes": loaded}))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "kubernetes": []}
    assert "--node" in result.stdout
    assert "--dcgm-names" in result.stdout


# --- quotient emulator, nodes and reserve: the long-running commands' one preamble ---


def test_quotient_reserve_without_its_pod_exits_2_naming_what_is_missing(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["reserve", "--pod-name", "r"]) == 2
    assert capsys.readouterr().err == (
        "quotient reserve: --pod-name and --pod-namespace (or QUOTIENT_POD_NAME, QUOTIENT_POD_NAMESPACE) are needed\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["emulator", "--bookmark-interval", "soon"],
            "quotient emulator: --bookmark-interval: 'soon' is not a duration",
        ),
        (["nodes", "--interval", "1x"], "quotient nodes: --interval: '1x' is not a duration"),
    ],
)
def test_a_bad_flag_of_the_emulator_or_the_nodes_exits_2_naming_it(
    argv: list[str], message: str, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(message)


def test_the_emulator_exits_1_saying_why_when_its_port_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["-m", "quotient.cli", "emulator", "--port", str(port), "--nodes", "1x1xL4"])
    assert result.returncode == 1, result.stderr
    assert "event=emulator_failed" in result.stderr and "address already in use" in result.stderr
    assert result.stdout == ""

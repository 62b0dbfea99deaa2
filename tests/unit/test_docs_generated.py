"""The reference pages match the code: a new flag, series, label, alert, rule or wire field without docs fails.

``quotient docs --check`` is what CI would run by hand; these tests run the same comparison (``docsgen.app.refresh``)
and show, by adding a flag or removing a meaning, that the comparison catches what it is for. A source scan catches
metrics the generator is not told about: every metric name constructed anywhere in the packages must be on the page.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from agent import app as agent_app
from common import config
from common.config import Setting
from quotient import cli
from quotient.docsgen import alerts, app, blocks, commands, schema, series
from scheduler.telemetry.overuse import AlertName
from tests.conftest import REPO

PAGES = ("docs/configuration.md", "docs/metrics.md", "docs/nats.md")


def test_every_generated_page_matches_what_the_code_generates() -> None:
    stale = {page: names for page, names in app.refresh(REPO, write=False).items() if names}
    assert stale == {}, "run `quotient docs --write` (or `.venv/bin/quotient docs --write`) and commit the pages"


def test_quotient_docs_check_exits_zero_on_the_repository() -> None:
    assert cli.main(["docs", "--check", "--root", str(REPO)]) == 0


def _copy_pages(tmp_path: Path) -> Path:
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((REPO / page).read_text())
    rules = tmp_path / alerts.RULES
    rules.parent.mkdir(parents=True)
    rules.write_text((REPO / alerts.RULES).read_text())
    return tmp_path


def test_a_new_flag_makes_the_configuration_page_stale_until_it_is_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_pages(tmp_path)
    extra = Setting(name="brand_new_knob", parse=config.parse_str, default="x", help="a flag nobody documented")
    monkeypatch.setattr(agent_app, "SETTINGS", (*agent_app.SETTINGS, extra))

    assert cli.main(["docs", "--check", "--root", str(root)]) == 1
    assert "docs/configuration.md: stale: commands-index, commands" in capsys.readouterr().err

    assert cli.main(["docs", "--write", "--root", str(root)]) == 0
    page = (root / "docs" / "configuration.md").read_text()
    assert "| `--brand-new-knob` | `QUOTIENT_BRAND_NEW_KNOB` | text | `x` | a flag nobody documented |" in page
    assert app.refresh(root, write=False)["docs/configuration.md"] == ()


def test_writing_keeps_the_prose_around_the_blocks(tmp_path: Path) -> None:
    root = _copy_pages(tmp_path)
    page = root / "docs" / "metrics.md"
    emptied = page.read_text().replace(
        series.reference(series.scheduler_series()) + "\n", "a stale table that the code no longer agrees with\n"
    )
    page.write_text(emptied + "\nA closing remark of the author's.\n")

    assert app.refresh(root, write=True)["docs/metrics.md"] == ("scheduler-series",)
    text = page.read_text()
    assert text.endswith("\nA closing remark of the author's.\n")
    assert "a stale table" not in text
    assert text.startswith("# Metrics and alerts reference\n")


def test_a_label_without_a_meaning_stops_the_metrics_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series, "LABELS", {key: value for key, value in series.LABELS.items() if key != "queue"})
    with pytest.raises(series.UndocumentedLabel, match="queue"):
        series.reference(series.scheduler_series())


def test_an_alert_without_a_line_stops_the_alerts_table(monkeypatch: pytest.MonkeyPatch) -> None:
    reduced = {name: said for name, said in alerts.SCHEDULER_ALERTS.items() if name is not AlertName.GPU_UNHEALTHY}
    monkeypatch.setattr(alerts, "SCHEDULER_ALERTS", reduced)
    with pytest.raises(alerts.UndocumentedAlert, match="GpuUnhealthy"):
        alerts.reference(alerts.rules(REPO))


def test_a_rule_without_a_line_stops_the_alerts_table() -> None:
    found = alerts.rules(REPO)
    new = dataclasses.replace(found[-1], name="QuotientSomethingNew", forwards=None)
    with pytest.raises(alerts.UndocumentedAlert, match="QuotientSomethingNew"):
        alerts.reference((*found, new))


def test_every_alert_the_scheduler_raises_is_on_the_metrics_page() -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    assert [name.value for name in AlertName if f"| `{name.value}` |" not in page] == []
    assert [rule.name for rule in alerts.rules(REPO) if f"`{rule.name}`" not in page] == []


def test_a_wire_field_without_a_meaning_stops_the_nats_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "FIELDS", {key: value for key, value in schema.FIELDS.items() if key != "power_mw"})
    with pytest.raises(schema.UndocumentedField, match=r"GpuReport\.power_mw"):
        schema.reference(schema.NESTED[0])


def test_the_wire_tables_state_the_decoders_limits() -> None:
    rows = {name: (kind, limits, required) for name, kind, limits, required in schema.fields(schema.MESSAGES[0])}
    assert rows["v"] == ("int", "always 1", True)
    assert rows["interval_ms"] == ("int", "> 0; <= 3600000", True)
    assert rows["driver_version"] == ("str or nil", "1 to 80 characters", False)
    assert rows["gpus"] == ("list of `GpuReport` maps", "at most 64 items", True)


def _metric_names_in_source() -> set[str]:
    """The first argument of every metric or metric family constructed in the packages."""
    constructors = {"Gauge", "Counter", "Histogram", "Summary", "GaugeMetricFamily", "CounterMetricFamily"}
    found: set[str] = set()
    for package in ("common", "agent", "scheduler"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                first = node.args[0]
                if name in constructors and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return found


def test_every_metric_constructed_in_the_code_is_on_the_metrics_page() -> None:
    page = (REPO / "docs" / "metrics.md").read_text()
    names = _metric_names_in_source()
    assert "quotient_scheduling_cycle_duration_seconds" in names
    assert sorted(name for name in names if f"`{name}" not in page) == []


def test_every_command_of_quotient_has_a_table() -> None:
    found = {command.name for command in commands.commands(root=REPO)}
    for name in cli.SUBCOMMANDS:
        assert any(command == f"quotient {name}" or command.startswith(f"quotient {name} ") for command in found), name


def test_every_option_of_the_long_running_commands_says_what_it_does() -> None:
    unexplained = [
        f"{command.name} {option.flags[0]}"
        for command in commands.commands(root=REPO)
        if command.from_settings
        for option in command.options
        if not option.help.strip()
    ]
    assert unexplained == []


def test_an_entry_point_that_never_parses_cannot_be_documented() -> None:
    with pytest.raises(commands.CommandError, match="without parsing"):
        commands.parser_of("quotient nothing", lambda argv: 0)


def test_parsing_is_restored_after_a_parser_was_read() -> None:
    commands.parser_of("quotient agent", agent_app.main)
    parser = argparse.ArgumentParser()
    parser.add_argument("--x")
    assert parser.parse_args(["--x", "1"]).x == "1"


def test_a_block_missing_from_a_page_is_an_error_not_a_skip() -> None:
    with pytest.raises(blocks.BlockError, match="no block for table"):
        blocks.rewrite("# A page\n", {"table": "| a |"}, page="docs/x.md")


def test_a_block_nobody_generates_is_an_error() -> None:
    text = "<!-- BEGIN GENERATED: old -->\nx\n<!-- END GENERATED: old -->\n"
    with pytest.raises(blocks.BlockError, match="blocks nothing generates: old"):
        blocks.rewrite(text, {}, page="docs/x.md")


def test_a_pipe_in_a_cell_does_not_break_the_table() -> None:
    assert blocks.cell("a | b\n c") == "a \\| b c"

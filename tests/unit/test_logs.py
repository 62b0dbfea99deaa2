"""common.logs: one event per line on stderr, as logfmt or JSON, with values quoted where logfmt needs it."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest

from common import config, logs

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``logs.setup`` rewires the root logger; put it back so other tests keep pytest's own handlers."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in ("nats", "asyncio", "kubernetes", "urllib3")}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == "", "logs must never go to stdout, which is kept for command output"
    return captured.err.splitlines()


def logfmt_pairs(line: str) -> dict[str, str]:
    """A small logfmt reader: bare values, or JSON-quoted ones."""
    pairs: dict[str, str] = {}
    for match in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)', line):
        key, value = match.group(1), match.group(2)
        pairs[key] = json.loads(value) if value.startswith('"') else value
    return pairs


def test_an_event_is_one_logfmt_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(level="info", fmt="logfmt")
    logs.get("agent.publishing").info("sample_published", node="n1", seq=4)
    (line,) = lines(capsys)
    ts, rest = line.split(" ", 1)
    assert TS.match(ts.removeprefix("ts="))
    assert rest == "level=info logger=quotient.agent.publishing event=sample_published node=n1 seq=4"


def test_an_event_is_one_json_object_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(level="info", fmt="json")
    logs.get("scheduler").warning("gang_unschedulable", gang="team-a/train", pods=8, ratio=0.5, ok=True, none=None)
    (line,) = lines(capsys)
    record = json.loads(line)
    assert TS.match(record.pop("ts"))
    assert record == {
        "level": "warning",
        "logger": "quotient.scheduler",
        "event": "gang_unschedulable",
        "gang": "team-a/train",
        "pods": 8,
        "ratio": 0.5,
        "ok": True,
        "none": None,
    }


def test_json_renders_values_it_cannot_encode_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(fmt="json")
    logs.get("x").info("odd", value={1, 2} - {1}, obj=object)
    record = json.loads(lines(capsys)[0])
    assert record["value"] == "{2}"
    assert record["obj"] == "<class 'object'>"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain", "plain"),
        ("with space", '"with space"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("two\nlines", '"two\\nlines"'),
        ("tab\there", '"tab\\there"'),
        ("", '""'),
        (42, "42"),
        (None, "None"),
    ],
)
def test_logfmt_quotes_values_that_would_break_the_line(
    capsys: pytest.CaptureFixture[str], value: object, written: str
) -> None:
    logs.setup(fmt="logfmt")
    logs.get("x").info("e", field=value)
    (line,) = lines(capsys)
    assert line.endswith(f" event=e field={written}")


def test_logfmt_quoted_values_read_back_to_the_original(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(fmt="logfmt")
    message = 'pod "team-a/train-0" uses 30 GiB\tof 20 GiB = over'
    logs.get("x").info("overuse detected", message=message)
    pairs = logfmt_pairs(lines(capsys)[0])
    assert pairs["event"] == "overuse detected"
    assert pairs["message"] == message


def test_events_below_the_level_are_not_written(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(level="warning")
    log = logs.get("x")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [logfmt_pairs(line)["event"] for line in lines(capsys)] == ["w", "e"]


def test_debug_level_writes_debug_events(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(level="debug")
    logs.get("x").debug("d", k=1)
    assert logfmt_pairs(lines(capsys)[0])["level"] == "debug"


def test_an_exception_event_carries_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(fmt="json")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logs.get("x").exception("handler_failed", path="/metrics")
    record = json.loads(lines(capsys)[0])
    assert record["level"] == "error"
    assert record["path"] == "/metrics"
    assert "Traceback" in record["exception"]
    assert "RuntimeError: boom" in record["exception"]


def test_a_logfmt_traceback_stays_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(fmt="logfmt")
    try:
        raise ValueError("bad")
    except ValueError:
        logs.get("x").exception("failed")
    (line,) = lines(capsys)
    assert "ValueError: bad" in logfmt_pairs(line)["exception"]


def test_third_party_records_land_in_the_same_stream(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(fmt="logfmt")
    logging.getLogger("somelib").warning("retrying %s in %d s", "connect", 2)
    pairs = logfmt_pairs(lines(capsys)[0])
    assert (pairs["logger"], pairs["event"]) == ("somelib", "retrying connect in 2 s")


def test_chatty_libraries_keep_only_their_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup(level="debug")
    logging.getLogger("nats").info("connected")
    logging.getLogger("nats.aio").warning("reconnecting")
    assert [logfmt_pairs(line)["event"] for line in lines(capsys)] == ["reconnecting"]


def test_setup_twice_leaves_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup()
    logs.setup(fmt="json")
    logs.get("x").info("once")
    assert len(lines(capsys)) == 1
    assert len(logging.getLogger().handlers) == 1


@pytest.mark.parametrize("level", ["trace", "INFO", "", "critical"])
def test_an_invalid_level_is_refused_with_the_accepted_ones(level: str) -> None:
    with pytest.raises(ValueError, match=r"log level .* is not one of debug, info, warning, error"):
        logs.setup(level=level)


@pytest.mark.parametrize("fmt", ["text", "JSON", ""])
def test_an_invalid_format_is_refused_with_the_accepted_ones(fmt: str) -> None:
    with pytest.raises(ValueError, match=r"log format .* is not one of logfmt, json"):
        logs.setup(fmt=fmt)


def test_a_refused_setup_leaves_logging_as_it_was() -> None:
    before = list(logging.getLogger().handlers)
    with pytest.raises(ValueError):
        logs.setup(fmt="xml")
    assert logging.getLogger().handlers == before


def test_the_log_settings_offer_exactly_the_levels_and_formats_setup_accepts() -> None:
    level, fmt = config.LOG_SETTINGS
    assert [level.parse(name) for name in logs.LEVELS] == list(logs.LEVELS)
    assert [fmt.parse(name) for name in logs.FORMATS] == list(logs.FORMATS)

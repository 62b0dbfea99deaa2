"""Logging set-up: events, not prose.

``log = logs.get("agent.publishing")`` then ``log.info("sample_published", node=..., seq=...)`` writes one line per
event to stderr, as logfmt (``ts=... level=info logger=agent.publishing event=sample_published node=n1 seq=4``) or as
JSON (``--log-format json``) for log pipelines. It sits on the standard ``logging`` module so third-party libraries'
records (nats, kubernetes) land in the same stream.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping

_FORMAT_LOGFMT = "logfmt"
_FORMAT_JSON = "json"
FORMATS = (_FORMAT_LOGFMT, _FORMAT_JSON)
LEVELS = ("debug", "info", "warning", "error")


def _logfmt_value(value: object) -> str:
    text = str(value)
    # Quote anything that could split or forge a line: spaces, quotes, "=", and every control character.
    if text == "" or any(ch in ' "=' or not ch.isprintable() for ch in text):
        return json.dumps(text)
    return text


class _Formatter(logging.Formatter):
    def __init__(self, fmt_name: str) -> None:
        super().__init__()
        self._json = fmt_name == _FORMAT_JSON

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        extra = getattr(record, "quotient_fields", None)
        if isinstance(extra, Mapping):
            fields.update(extra)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if self._json:
            return json.dumps(fields, default=str)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


class EventLogger:
    """A thin wrapper over ``logging.Logger`` taking an event name and key-value fields."""

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, fields: Mapping[str, object], exc_info: bool = False) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"quotient_fields": dict(fields)}, exc_info=exc_info, stacklevel=3)

    def debug(self, event: str, **fields: object) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: object) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: object) -> None:
        self._log(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: object) -> None:
        self._log(logging.ERROR, event, fields, exc_info=True)


def get(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(f"quotient.{name}"))


def setup(*, level: str = "info", fmt: str = _FORMAT_LOGFMT) -> None:
    """Configure the root logger once per process: one handler on stderr (stdout is kept for command output)."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Libraries are chatty at info; keep their warnings.
    for noisy in ("nats", "asyncio", "kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))

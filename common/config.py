"""Configuration from flags, environment and a file, in that order of precedence, validated with clear errors.

Each command declares its settings once (name, parser, default, help). :func:`add_arguments` puts them on an
argparse parser with no argparse defaults, so an absent flag is distinguishable from a given one; :func:`resolve`
then takes, for every setting, the flag if given, else the environment variable ``QUOTIENT_<NAME>``, else the
config file's key ``<name>`` (YAML, ``--config FILE``), else the default. A bad value names the setting and where it
came from ("--interval: '1x' is not a duration ..." or "QUOTIENT_INTERVAL: ..."), so a user knows what to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

import yaml

from common import quantities
from common.errors import ConfigError, QuantityError

T = TypeVar("T")

_MISSING = object()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Setting(Generic[T]):
    """One configurable value. ``parse`` takes the raw value (a string from a flag or env, or a YAML scalar)."""

    name: str
    parse: Callable[[object], T]
    default: T | None
    help: str
    metavar: str | None = None
    flag_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "QUOTIENT_" + self.name.upper()


def add_arguments(parser: argparse.ArgumentParser, settings: Sequence[Setting[object]]) -> None:
    for setting in settings:
        if setting.parse is parse_bool:
            parser.add_argument(
                setting.flag, dest=setting.name, action=argparse.BooleanOptionalAction, default=None, help=setting.help
            )
        else:
            default_text = "" if setting.default is None else f" (default: {setting.default})"
            parser.add_argument(
                setting.flag, dest=setting.name, default=None, metavar=setting.metavar, help=setting.help + default_text
            )
    parser.add_argument("--config", dest="config", default=None, metavar="FILE", help="YAML file of settings")


def load_file(path: str | Path) -> Mapping[str, object]:
    """The settings in a YAML config file: a mapping of setting names (dashes or underscores) to values."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {file}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {file} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {file} must hold a mapping of settings, not {type(data).__name__}")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def resolve(
    settings: Sequence[Setting[object]],
    args: argparse.Namespace,
    *,
    environ: Mapping[str, str] | None = None,
    file_values: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Every setting's value, taken from flags > env > file > default; raises ConfigError naming the culprit."""
    env = os.environ if environ is None else environ
    if file_values is None:
        config_path = getattr(args, "config", None)
        file_values = load_file(config_path) if config_path else {}
    known = {setting.name for setting in settings}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise ConfigError(f"--config: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values: dict[str, object] = {}
    for setting in settings:
        raw: object = getattr(args, setting.name, None)
        source = setting.flag
        if raw is None and not setting.flag_only and setting.env in env:
            raw, source = env[setting.env], f"{setting.env}"
        if raw is None and setting.name in file_values:
            raw, source = file_values[setting.name], f"config file key {setting.name}"
            if raw is None:
                raise ConfigError(f"{source}: has no value; give one or remove the key")
        if raw is None:
            values[setting.name] = setting.default
            continue
        try:
            values[setting.name] = setting.parse(raw)
        except (QuantityError, ValueError, TypeError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc
    return values


# --- parsers: each takes a raw value and raises ValueError/QuantityError with a message that says what is accepted ---


def parse_str(raw: object) -> str:
    text = str(raw).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{raw!r} is not a boolean (true/false, yes/no, 1/0, on/off)")


def parse_port(raw: object) -> int:
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{raw!r} is not a port number")
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{port} is not a port number (0-65535; 0 disables)")
    return port


def parse_positive_duration_s(raw: object) -> float:
    seconds = quantities.parse_duration_s(raw if isinstance(raw, int | float) else str(raw))
    if seconds <= 0:
        raise ValueError(f"{raw!r} must be a positive duration")
    return seconds


def parse_nats_url(raw: object) -> str:
    text = parse_str(raw)
    for part in text.split(","):
        if not part.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ValueError(f"{part!r} is not a NATS URL (nats://host:port, tls://..., comma-separated for several)")
    return text


def parse_existing_file(raw: object) -> Path:
    path = Path(str(raw))
    if not path.is_file():
        raise ValueError(f"{path} does not exist or is not a file")
    return path


def parse_existing_dir(raw: object) -> Path:
    path = Path(str(raw))
    if not path.is_dir():
        raise ValueError(f"{path} does not exist or is not a directory")
    return path


def choice(*options: str) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        text = str(raw).strip()
        if text not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return text

    return parse


LOG_SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="log_level", parse=choice("debug", "info", "warning", "error"), default="info", help="log level"),
    Setting(name="log_format", parse=choice("logfmt", "json"), default="logfmt", help="log line format"),
)

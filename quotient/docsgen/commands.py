"""Every option of every ``quotient`` command, read from the parser the command really builds.

The long-running commands declare their settings in ``Setting`` tables (``common.config``: a flag, the environment
variable ``QUOTIENT_<NAME>`` and the config-file key ``<name>``); the others (``demo``, ``simulate``, ``nats-keys``,
the benchmarks) build an argparse parser inside their entry point. Rather than ask every command to expose its
parser, the entry point is called with no arguments while ``ArgumentParser.parse_args`` is replaced by a function
that raises with the parser: nothing runs past the parsing, and the parser documented is the very one users meet.
``common.config.add_arguments`` is wrapped at the same time, so a parser built from a ``Setting`` table is known by
its table (environment variable, config key, the parsed default). An entry point that returns without parsing is an
error here, not a command left out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from unittest import mock

from common import config, quantities
from common.config import Setting
from common.errors import QuotientError
from quotient import cli
from quotient.docsgen import blocks

_BENCH_MODULE = "quotient.bench.runner"


class CommandError(QuotientError):
    """A command whose options cannot be read."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    flags: tuple[str, ...]
    """``--interval``; both spellings of a boolean (``--webhook``, ``--no-webhook``); a positional's name."""
    kind: str
    default: str
    help: str
    env: str | None = None
    """The environment variable, for a command built from a ``Setting`` table (its config-file key is the flag
    without the dashes in front)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    words: tuple[str, ...]
    """``("scheduler",)``, ``("bench", "engine")``, ``("simulate", "openb")``."""
    summary: str
    options: tuple[Option, ...]
    from_settings: bool
    """Built from a ``Setting`` table: every option is also an environment variable and a config-file key."""

    @property
    def name(self) -> str:
        return "quotient " + " ".join(self.words)


class _Captured(BaseException):
    """Raised in place of parsing; a BaseException, so that no ``except Exception`` in an entry point swallows it."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextlib.contextmanager
def _capturing() -> Iterator[dict[int, tuple[Setting[object], ...]]]:
    """While inside: parsing raises ``_Captured``; the ``Setting`` table of each parser built is recorded."""
    tables: dict[int, tuple[Setting[object], ...]] = {}
    add_arguments = config.add_arguments

    def capture(parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> typing.NoReturn:
        raise _Captured(parser)

    def record(parser: argparse.ArgumentParser, settings: Sequence[Setting[object]]) -> None:
        tables[id(parser)] = tuple(settings)
        add_arguments(parser, settings)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(argparse.ArgumentParser, "parse_args", capture))
        stack.enter_context(mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture))
        stack.enter_context(mock.patch.object(config, "add_arguments", record))
        yield tables


def parser_of(
    name: str, entry: Callable[[list[str]], object]
) -> tuple[argparse.ArgumentParser, tuple[Setting[object], ...] | None]:
    """The parser ``entry`` builds, and its ``Setting`` table if it was built from one."""
    with _capturing() as tables:
        try:
            entry([])
        except _Captured as captured:
            return captured.parser, tables.get(id(captured.parser))
    raise CommandError(f"{name}: the entry point returned without parsing its arguments; its options cannot be read")


def _entries() -> Iterator[tuple[tuple[str, ...], str, Callable[[list[str]], object]]]:
    for name, (module_name, summary) in cli.SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        if module_name == _BENCH_MODULE:
            benchmarks: Mapping[str, str] = module.BENCHMARKS
            for bench, bench_module in benchmarks.items():
                runner = importlib.import_module(bench_module)
                yield (name, bench), _first_line(runner.__doc__), runner.run
        else:
            yield (name,), summary, module.main


def _first_line(doc: str | None) -> str:
    """A module docstring's first sentence, without the ````quotient bench x``: ```` it may open with."""
    line = (doc or "").strip().split("\n\n")[0].replace("\n", " ")
    if line.startswith("``") and "``: " in line:
        line = line.split("``: ", 1)[1]
    return line.replace("``", "`")


def commands(*, root: Path) -> tuple[Command, ...]:
    """Every command and sub-command, in the order of ``quotient --help``; ``root`` is the repository, to which
    default paths are written relative."""
    found: list[Command] = []
    for words, summary, entry in _entries():
        parser, table = parser_of("quotient " + " ".join(words), entry)
        found.extend(_describe(words, summary or parser.description or "", parser, table, root=root))
    return tuple(found)


def _describe(
    words: tuple[str, ...],
    summary: str,
    parser: argparse.ArgumentParser,
    table: tuple[Setting[object], ...] | None,
    *,
    root: Path,
) -> Iterator[Command]:
    options: list[Option] = []
    settings = {setting.name: setting for setting in table or ()}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                yield from _describe((*words, sub), helps.get(sub, ""), subparser, None, root=root)
            continue
        setting = settings.get(action.dest)
        if setting is not None:
            options.append(_setting_option(action, setting, root=root))
        elif table is not None and action.dest == "config":
            options.append(Option(flags=("--config",), kind="file", default="", help=action.help or ""))
        else:
            options.append(_plain_option(action, root=root))
    if options:
        yield Command(words=words, summary=summary, options=tuple(options), from_settings=table is not None)


# --- Setting tables ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Kind:
    text: str
    form: Callable[[object], str] = str


def _duration(value: object) -> str:
    """Seconds as the shortest duration a flag accepts: ``20ms``, ``30s``, ``5m``, ``8760h``."""
    ns = round(float(str(value)) * quantities.NS_PER_S)
    for unit, size in (("h", 3600 * quantities.NS_PER_S), ("m", 60 * quantities.NS_PER_S), ("s", quantities.NS_PER_S)):
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns // 1_000_000}ms" if ns % 1_000_000 == 0 else f"{ns / quantities.NS_PER_S}s"


def _bytes(value: object) -> str:
    return quantities.format_bytes_quantity(int(str(value)))


def _listed(value: object) -> str:
    return ",".join(str(item) for item in value) if isinstance(value, tuple | list) else str(value)


def _boolean(value: object) -> str:
    return "true" if value else "false"


_DURATION = _Kind("duration", _duration)
_KINDS: Mapping[object, _Kind] = {
    config.parse_str: _Kind("text"),
    config.parse_bool: _Kind("boolean", _boolean),
    config.parse_port: _Kind("port"),
    config.parse_positive_duration_s: _DURATION,
    config.parse_nats_url: _Kind("NATS URLs"),
    config.parse_existing_file: _Kind("file"),
    config.parse_existing_dir: _Kind("directory"),
}
# Parsers a command keeps to itself, by qualified name (a renamed one falls back to its return annotation).
_PRIVATE_KINDS: Mapping[str, _Kind] = {
    "scheduler.settings._bytes": _Kind("bytes", _bytes),
    "scheduler.settings._percent": _Kind("percent (0-100)"),
    "scheduler.settings._names": _Kind("names", lambda value: _listed(value)),
    "scheduler.settings._stream_replicas": _Kind("integer (1-5)"),
    "quotient.emulator.app._parse_non_negative_s": _Kind("duration", _duration),
}
_ANNOTATED_KINDS: Mapping[str, _Kind] = {
    "int": _Kind("integer"),
    "float": _Kind("number"),
    "str": _Kind("text"),
    "bool": _Kind("boolean", _boolean),
    "Path": _Kind("path"),
}


def _setting_kind(setting: Setting[object]) -> _Kind:
    parse = setting.parse
    known = _KINDS.get(parse)
    if known is not None:
        return known
    options = inspect.getclosurevars(parse).nonlocals.get("options") if inspect.isfunction(parse) else None
    if isinstance(options, tuple) and getattr(parse, "__qualname__", "") == "choice.<locals>.parse":
        return _Kind("one of " + ", ".join(f"`{option}`" for option in options))
    private = _PRIVATE_KINDS.get(f"{getattr(parse, '__module__', '')}.{getattr(parse, '__qualname__', '')}")
    if private is not None:
        return private
    annotation = getattr(parse, "__annotations__", {}).get("return")
    if annotation is None and setting.metavar is not None:
        return _Kind(setting.metavar.lower())
    if annotation is None and setting.default is not None:
        annotation = type(setting.default).__name__
    kind = _ANNOTATED_KINDS.get(str(annotation).removeprefix("pathlib."))
    if kind is None:
        raise CommandError(f"{setting.flag}: cannot tell what kind of value {parse!r} takes; name it in docsgen")
    return kind


def _setting_option(action: argparse.Action, setting: Setting[object], *, root: Path) -> Option:
    kind = _setting_kind(setting)
    if setting.default is None:
        default = ""
    elif isinstance(setting.default, Path):
        default = _path(setting.default, root=root)
    else:
        default = kind.form(setting.default)
    return Option(
        flags=tuple(action.option_strings),
        kind=kind.text,
        default=default,
        help=setting.help,
        env=None if setting.flag_only else setting.env,
    )


# --- plain argparse -------------------------------------------------------------------------------------------------

_TYPES: Mapping[object, str] = {int: "integer", float: "number", Path: "path", str: "text", None: "text"}


def _plain_option(action: argparse.Action, *, root: Path) -> Option:
    flags = tuple(action.option_strings) or (action.metavar if isinstance(action.metavar, str) else action.dest,)
    if action.option_strings and isinstance(action.metavar, str) and action.nargs != 0:
        flags = (*flags[:-1], f"{flags[-1]} {action.metavar}")  # the name the help text may use
    if isinstance(action, argparse.BooleanOptionalAction):
        kind = "boolean"
    elif action.nargs == 0:
        kind = "switch"
    elif action.choices is not None:
        kind = "one of " + ", ".join(f"`{choice}`" for choice in action.choices)
    else:
        # A parser of the command's own (``parse_budget``) is named by what it reads.
        kind = _TYPES.get(action.type) or str(getattr(action.type, "__name__", "value")).removeprefix("parse_")
    if action.nargs == "?" and action.option_strings:
        kind += f" (optional: alone, `{action.const}`)"
    if isinstance(action, argparse._AppendAction):
        kind += ", repeatable"
    if action.required:
        kind += ", required"
    return Option(flags=flags, kind=kind, default=_plain_default(action, root=root), help=action.help or "")


def _plain_default(action: argparse.Action, *, root: Path) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or (action.nargs == 0 and value is False):
        return ""
    if isinstance(value, bool):
        return _boolean(value)
    if isinstance(value, Path):
        return _path(value, root=root)
    return str(value)


def _path(path: Path, *, root: Path) -> str:
    """A default path as the reader's checkout would have it: relative to the repository, or to the folder that
    holds it (``../shared/...``), where it lies there; as it is otherwise (``/proc``)."""
    if not path.is_absolute():
        return str(path)
    for base, prefix in ((root, ""), (root.parent, "../")):
        if base.parent != base and path.is_relative_to(base):
            return prefix + str(path.relative_to(base))
    return str(path)


# --- the page -------------------------------------------------------------------------------------------------------


def reference(found: Sequence[Command]) -> str:
    """The configuration reference: per command, a table of its options."""
    parts: list[str] = []
    for command in found:
        parts.append(f"### `{command.name}`")
        parts.append("")
        if command.summary:
            sentence = command.summary[0].upper() + command.summary[1:].rstrip(".") + "."
            parts.append(textwrap.fill(sentence, width=120, break_long_words=False, break_on_hyphens=False))
            parts.append("")
        header = ["flag", "type", "default", "meaning"]
        if command.from_settings:
            header.insert(1, "environment")
        rows = []
        for option in command.options:
            row = [
                " ".join(f"`{flag}`" for flag in option.flags),
                option.kind,
                f"`{blocks.cell(option.default)}`" if option.default else "",
                blocks.cell(option.help),
            ]
            if command.from_settings:
                row.insert(1, f"`{option.env}`" if option.env else "")
            rows.append(row)
        parts.append(blocks.table(header, rows))
        parts.append("")
    return "\n".join(parts)


def index(found: Sequence[Command]) -> str:
    """One line per command: its name (a link to its table) and how it is configured."""
    lines = []
    for command in found:
        anchor = command.name.replace(" ", "-")
        how = "flags, environment, config file" if command.from_settings else "flags"
        lines.append(f"- [`{command.name}`](#{anchor}): {len(command.options)} options ({how})")
    return "\n".join(lines)

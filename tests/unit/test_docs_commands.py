"""Every ``quotient`` command the docs show in a code block is one the command line accepts.

A page that says ``quotient simulate openb --seeds 42-51`` must not name a flag that was renamed or removed. Each
such line (continuations joined, the shell's comments, pipes and redirections cut off) is parsed by the parser the
command really builds (``docsgen.commands.parser_of``); synopses with ``[optional]`` parts are not commands and are
left out, and in a shell session (lines with a ``$`` prompt) only the prompted lines are commands. Only the parsing
is checked: files named in a command need not exist here.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from quotient import cli
from quotient.bench import runner
from quotient.docsgen import commands
from tests.conftest import REPO

_FENCE = re.compile(r"^ *```[a-z]*\n(.*?)^ *```", re.MULTILINE | re.DOTALL)
_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}


def _pages() -> list[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "deploy").rglob("README.md")),
        REPO / "docker" / "README.md",
    ]


def _commands(page: Path) -> list[list[str]]:
    found = []
    for block in _FENCE.findall(page.read_text()):
        lines = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
        if any(line.startswith("$ ") for line in lines):  # a session: the prompts are the commands, the rest output
            lines = [line.removeprefix("$ ") for line in lines if line.startswith("$ ")]
        for line in lines:
            if not line.startswith("quotient ") or "[" in line or "..." in line:
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words: list[str] = []
            for token in lexer:
                if token in _STOP:
                    break
                words.append(token)
            found.append(words[1:])
    return found


def _parse(words: list[str]) -> str:
    """'' when ``quotient WORDS`` parses, else what argparse said."""
    name, rest = words[0], words[1:]
    if name not in cli.SUBCOMMANDS:
        return f"no command {name!r}"
    module = importlib.import_module(cli.SUBCOMMANDS[name][0])
    entry = module.main
    if module.__name__ == runner.__name__:
        bench, rest = rest[0], rest[1:]
        name = f"bench {bench}"
        entry = importlib.import_module(runner.BENCHMARKS[bench]).run
    parser, _ = commands.parser_of(f"quotient {name}", entry)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.suppress(SystemExit):
        parser.parse_args(rest)
        return ""
    return errors.getvalue().strip().splitlines()[-1]


CASES = [
    pytest.param(words, id=f"{page.relative_to(REPO)}: ...{' '.join(words)[-80:]}")
    for page in _pages()
    for words in _commands(page)
]


def test_the_docs_show_commands_to_check() -> None:
    shown = {words[0] for words in (case.values[0] for case in CASES)}
    assert {"nats-keys", "simulate", "docs"} <= shown


@pytest.mark.parametrize("words", CASES)
def test_a_command_the_docs_show_parses(words: list[str]) -> None:
    assert _parse(words) == ""


def test_a_flag_that_does_not_exist_is_caught() -> None:
    assert "unrecognized arguments: --no-such-flag" in _parse(["nats-keys", "--no-such-flag"])

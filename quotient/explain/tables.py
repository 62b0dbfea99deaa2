"""Text for a terminal: colour only where it is one, columns that fit its width, plain when piped.

``Style`` wraps text in ANSI escapes when enabled (a terminal, ``NO_COLOR`` unset, no ``--no-color``) and returns
it unchanged otherwise, so piped output carries no escape codes. ``render`` lays out a table: every column as wide as
its widest cell, and when the table is wider than the terminal the widest columns are cut with ``…`` (piped: never
cut, a program reads every character).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
MIN_COLUMN = 6
GAP = "  "


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Style:
    color: bool = False
    width: int | None = None
    """The terminal's columns; None when not a terminal (nothing is cut)."""

    def paint(self, text: str, *names: str) -> str:
        if not self.color or not names or not text:
            return text
        codes = ";".join(_CODES[name] for name in names)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def bold(self, text: str) -> str:
        return self.paint(text, "bold")

    def dim(self, text: str) -> str:
        return self.paint(text, "dim")

    def red(self, text: str) -> str:
        return self.paint(text, "red")

    def yellow(self, text: str) -> str:
        return self.paint(text, "yellow")

    def green(self, text: str) -> str:
        return self.paint(text, "green")


def style_for(stream: TextIO = sys.stdout, *, color: bool | None = None) -> Style:
    """Colour and width when ``stream`` is a terminal; ``color`` forces colour on or off (``--color``)."""
    tty = stream.isatty()
    wanted = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb" if color is None else color
    return Style(color=wanted, width=shutil.get_terminal_size((120, 24)).columns if tty else None)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    text: str
    paint: tuple[str, ...] = ()
    right: bool = False
    """Numbers align right."""


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _widths(header: Sequence[str], rows: Sequence[Sequence[Cell]], limit: int | None) -> list[int]:
    widths = [max([len(title), *(len(row[index].text) for row in rows)]) for index, title in enumerate(header)]
    if limit is None:
        return widths
    # Narrow the widest column one character at a time until the table fits or every column is at its floor.
    total = sum(widths) + len(GAP) * (len(widths) - 1)
    while total > limit:
        widest = max(range(len(widths)), key=lambda index: widths[index])
        floor = max(MIN_COLUMN, min(len(header[widest]), 12))
        if widths[widest] <= floor:
            break
        widths[widest] -= 1
        total -= 1
    return widths


def render(header: Sequence[str], rows: Sequence[Sequence[Cell]], style: Style) -> str:
    """The table as lines of text (no trailing newline)."""
    widths = _widths(header, rows, style.width)

    def line(cells: Sequence[Cell], *, bold: bool = False) -> str:
        out = []
        for index, cell in enumerate(cells):
            width = widths[index]
            text = _cut(cell.text, width)
            padded = text.rjust(width) if cell.right else text.ljust(width)
            if index == len(cells) - 1 and not cell.right:
                padded = text  # no trailing spaces
            names = (*cell.paint, "bold") if bold else cell.paint
            out.append(style.paint(padded, *names) if names else padded)
        return GAP.join(out).rstrip()

    lines = [line([Cell(text=title) for title in header], bold=True)]
    lines += [line(row) for row in rows]
    return "\n".join(lines)

"""Generated blocks inside a hand-written Markdown page: find them, rewrite them, say which are stale.

A block is the text between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->`` (HTML
comments, invisible when the page is rendered). Everything outside the markers is the author's and is never
touched, so a page reads as one text while its tables come from the code. A page that lacks a block its generator
makes, or holds one nobody generates, is an error rather than a silent skip: either would let the page drift.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from common.errors import QuotientError

_BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)"
    r"(?P<end><!-- END GENERATED: (?P=name) -->)",
    re.DOTALL,
)
_MARKER = re.compile(r"<!-- (BEGIN|END) GENERATED: ([a-z0-9-]+) -->")


class BlockError(QuotientError):
    """A page whose markers do not match what its generators produce."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rewrite:
    text: str
    """The page with every block rewritten."""
    stale: tuple[str, ...]
    """The blocks whose text changed."""


def names(text: str) -> tuple[str, ...]:
    """The blocks a page holds, in order."""
    return tuple(match.group("name") for match in _BLOCK.finditer(text))


def rewrite(text: str, blocks: Mapping[str, str], *, page: str) -> Rewrite:
    """``text`` with each block's body replaced by ``blocks[name]`` (a trailing newline is added)."""
    found = names(text)
    markers = [match.group(2) for match in _MARKER.finditer(text)]
    unpaired = sorted({name for name in markers if markers.count(name) != 2 or name not in found})
    if unpaired:
        raise BlockError(f"{page}: unpaired or nested markers for {', '.join(unpaired)}")
    missing = sorted(set(blocks) - set(found))
    unknown = sorted(set(found) - set(blocks))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"no block for {', '.join(missing)} (add <!-- BEGIN GENERATED: name --> ... END markers)")
        if unknown:
            parts.append(f"blocks nothing generates: {', '.join(unknown)}")
        raise BlockError(f"{page}: " + "; ".join(parts))
    stale: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        body = blocks[name].rstrip("\n") + "\n"
        if body != match.group("body"):
            stale.append(name)
        return match.group("begin") + body + match.group("end")

    return Rewrite(text=_BLOCK.sub(replace, text), stale=tuple(stale))


def cell(text: str) -> str:
    """Text made safe for one Markdown table cell: pipes escaped, line breaks joined."""
    return " ".join(text.split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (cells already made safe)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)

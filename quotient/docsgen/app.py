"""``quotient docs [--check | --write]``: the generated blocks of the reference pages, checked or rewritten.

Which page holds which block, and what generates it, is the table :func:`pages`. ``--check`` (the default) exits 1
and names every stale block, so CI and ``tests/unit/test_docs_generated.py`` fail on a flag, series, alert or wire
field the page does not show; ``--write`` rewrites the blocks in place and leaves the prose around them alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from common.errors import QuotientError
from quotient.docsgen import alerts, blocks, commands, schema, series

Block = Callable[[], str]


def pages(root: Path) -> Mapping[str, Mapping[str, Block]]:
    """Page (relative to ``root``) -> block name -> the function that generates the block."""
    found: list[commands.Command] = []

    def listed() -> Sequence[commands.Command]:
        if not found:
            found.extend(commands.commands(root=root))
        return found

    return {
        "docs/configuration.md": {
            "commands-index": lambda: commands.index(listed()),
            "commands": lambda: commands.reference(listed()),
        },
        "docs/metrics.md": {
            "scheduler-series": lambda: series.reference(series.scheduler_series()),
            "agent-series": lambda: series.reference(series.agent_series()),
            "labels": lambda: series.labels_reference(series.scheduler_series() + series.agent_series()),
            "alerts": lambda: alerts.reference(alerts.rules(root)),
        },
        "docs/nats.md": {
            "subjects": schema.subject_table,
            "limits": schema.limits_text,
            "envelope": schema.envelope,
            **{
                _block_name(struct.__name__): (lambda struct=struct: schema.message(struct))  # type: ignore[misc]
                for struct in schema.MESSAGES
            },
            **{
                _block_name(struct.__name__): (lambda struct=struct: schema.reference(struct))  # type: ignore[misc]
                for struct in schema.NESTED
            },
        },
    }


def _block_name(struct: str) -> str:
    """``NodeTelemetry`` -> ``node-telemetry``."""
    return "".join("-" + char.lower() if char.isupper() else char for char in struct).lstrip("-")


def refresh(root: Path, *, write: bool) -> dict[str, tuple[str, ...]]:
    """Each page's stale blocks (empty when none); with ``write`` the pages are rewritten."""
    stale: dict[str, tuple[str, ...]] = {}
    for page, generators in pages(root).items():
        path = root / page
        text = path.read_text()
        result = blocks.rewrite(text, {name: generate() for name, generate in generators.items()}, page=page)
        stale[page] = result.stale
        if write and result.text != text:
            path.write_text(result.text)
    return stale


def _default_root() -> Path:
    """The checkout this module runs from, where it has the pages; else the working directory."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "docs").is_dir() else Path.cwd()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="quotient docs", description="check or rewrite the reference pages generated from the code"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 naming every stale block (the default)")
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks of the pages in place")
    parser.add_argument(
        "--root", type=Path, default=None, help="the repository (default: the checkout of this installation)"
    )
    args = parser.parse_args(list(argv))
    root = args.root or _default_root()
    try:
        stale = refresh(root, write=args.write)
    except (OSError, QuotientError) as exc:
        print(f"quotient docs: {exc}", file=sys.stderr)
        return 2
    changed = {page: names for page, names in stale.items() if names}
    if args.write:
        for page, names in changed.items():
            print(f"{page}: rewrote {', '.join(names)}")
        return 0
    for page, names in changed.items():
        print(f"{page}: stale: {', '.join(names)}", file=sys.stderr)
    if changed:
        print("quotient docs: run `quotient docs --write` and commit the pages", file=sys.stderr)
        return 1
    return 0

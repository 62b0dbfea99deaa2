"""The docs hold together: troubleshooting covers what the code can say, links lead somewhere, the README is a front
page to every page.

Every pending reason the engine can give (``status.Reason``), every alert the scheduler raises (``AlertName``) and
every Prometheus rule of ``deploy/monitoring/`` has a section of its own on ``docs/troubleshooting.md``, headed by its
name. Every relative link of the README and of ``docs/`` points at a file that exists and, with an anchor, at a
heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as dashes). The README links every
page of ``docs/`` and shows the architecture picture of ``docs/architecture.md`` as it is there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quotient.docsgen import alerts
from scheduler.placement import status
from scheduler.telemetry.overuse import AlertName
from tests.conftest import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _headings(path: Path) -> list[str]:
    return [match.group(1).strip() for match in _HEADING.finditer(_FENCE.sub("", path.read_text()))]


def _anchor(heading: str) -> str:
    text = heading.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in _headings(path):
        anchor = _anchor(heading)
        candidate, count = anchor, 0
        while candidate in found:
            count += 1
            candidate = f"{anchor}-{count}"
        found.add(candidate)
    return found


@pytest.mark.parametrize("reason", list(status.Reason), ids=str)
def test_every_pending_reason_has_its_section(reason: status.Reason) -> None:
    assert f"`{reason.value}`" in _headings(PAGE)


@pytest.mark.parametrize("alert", list(AlertName), ids=str)
def test_every_alert_of_the_scheduler_has_its_section(alert: AlertName) -> None:
    assert f"`{alert.value}`" in _headings(PAGE)


def test_every_prometheus_rule_is_explained() -> None:
    headings = _headings(PAGE)
    text = PAGE.read_text()
    for rule in alerts.rules(REPO):
        # A rule that forwards a scheduler alert is explained with the alert, where its name is given.
        assert f"`{rule.name}`" in headings or (rule.forwards and f"Rule: `{rule.name}`" in text), rule.name


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(REPO)}")
    assert broken == []


def test_the_readme_links_every_page_of_the_docs() -> None:
    linked = {target.partition("#")[0] for target in _LINK.findall((REPO / "README.md").read_text())}
    pages = {f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")}
    assert sorted(pages - linked) == []


def test_the_readme_shows_the_architecture_picture_of_the_architecture_page() -> None:
    picture = (REPO / "docs" / "architecture.md").read_text().split("```\n")[1]
    assert picture in (REPO / "README.md").read_text()

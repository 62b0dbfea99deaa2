"""docs/install.md names only objects the manifests make, and names every part of the base.

The page writes an object as ``Kind/name`` in backticks; each must be an object that ``kubectl kustomize`` renders
from ``deploy/base``, one of its overlays or ``deploy/monitoring``, or one that ``quotient nats-keys`` prints. Every
workload and webhook of the base must be on the page, so a new component cannot be left out of the install guide.
Every path the page gives (``deploy/...``, ``docker/...``), and every directory it applies, exists.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from quotient import cli
from tests.conftest import REPO, require_tool

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "install.md"
TARGETS = (
    "deploy/base",
    "deploy/overlays/kai-compat",
    "deploy/overlays/cert-manager",
    "deploy/overlays/static-nkeys",
    "deploy/monitoring",
)
_QUOTED = re.compile(r"`([A-Z][A-Za-z]+)/([a-z0-9][a-z0-9.-]*)`")
_PATH = re.compile(r"`((?:deploy|docker)/[^`\s]*)`")
_APPLIED = re.compile(r"kubectl (?:apply|delete) -[kf] ([\w./-]+)")
_PARTS = {"Deployment", "DaemonSet", "StatefulSet", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}


def _render(target: str) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(REPO / target)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"{target}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, set[tuple[str, str]]]:
    return {target: {(obj["kind"], obj["metadata"]["name"]) for obj in _render(target)} for target in TARGETS}


def _nats_keys_objects(capsys: pytest.CaptureFixture[str]) -> set[tuple[str, str]]:
    assert cli.main(["nats-keys", "--namespace", "quotient-system"]) == 0
    documents = [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]
    return {(doc["kind"], doc["metadata"]["name"]) for doc in documents}


def test_every_object_the_page_names_is_made_by_the_manifests_or_nats_keys(
    rendered: dict[str, set[tuple[str, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    known = set().union(*rendered.values()) | _nats_keys_objects(capsys)
    quoted = set(_QUOTED.findall(PAGE.read_text()))
    assert len(quoted) > 30, "the page names its objects as `Kind/name`"
    assert sorted(name for name in quoted if name not in known) == []


def test_every_workload_and_webhook_of_the_base_is_on_the_page(rendered: dict[str, set[tuple[str, str]]]) -> None:
    quoted = set(_QUOTED.findall(PAGE.read_text()))
    parts = {(kind, name) for kind, name in rendered["deploy/base"] if kind in _PARTS}
    assert len(parts) == 6
    assert sorted(parts - quoted) == []


def test_every_path_the_page_gives_exists() -> None:
    text = PAGE.read_text()
    applied = {path for path in _APPLIED.findall(text) if path != "-"}  # -f -: the standard input
    paths = {path.rstrip(".,:;)") for path in _PATH.findall(text)} | applied
    assert "deploy/overlays/kai-compat" in paths
    assert sorted(path for path in paths if not (REPO / path).exists()) == []

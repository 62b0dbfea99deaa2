"""Shared fixtures: a real nats-server on a free loopback port, and the rule for missing shared data or tools.

Tests may need ``../shared/`` (the trace, the seeds) or a tool (kubectl, promtool). Where it is missing they skip
with the reason, except under ``CI=true``, where such a skip is a failure: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.natsserver import NatsServer

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def skip_or_fail(reason: str) -> None:
    """Skip the test with ``reason``, or fail it when running in CI."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


def shared_path(*parts: str) -> Path:
    """A path below ../shared/, skipping (or failing in CI) when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        skip_or_fail(f"{path} is absent (the shared data sits beside every CI checkout)")
    return path


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        skip_or_fail(f"{name} is not on PATH")
        raise AssertionError("unreachable")
    return found


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream on a free loopback port, stopped after the test."""
    with NatsServer() as server:
        yield server

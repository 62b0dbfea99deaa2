"""Which probe the demo's agents use: the mock NVML driver where it can be built, else FakeProbe, said once; under
CI=true the mock is required (tests/integration/test_demo.py plays the demo itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import clusterspec
from common.errors import QuotientError
from quotient import demo
from quotient.nodes import EmulatedNodes


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)


@pytest.mark.usefixtures("no_compiler")
def test_without_a_compiler_the_demo_says_so_once_and_its_agents_run_over_fake_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "false")
    said: list[str] = []
    assert demo.nvml_mock(said.append) is None
    assert len(said) == 1 and "no C compiler" in said[0] and "FakeProbe" in said[0]
    nodes = EmulatedNodes(clusterspec.parse_inline("2x2xA100-80GB"), nats_url="nats://127.0.0.1:1", nvml_mock=None)
    try:
        assert nodes.probe_description == "2 agents in one process over FakeProbe"
        assert nodes.processes is None and sorted(nodes.agents) == sorted(nodes.fakes)
    finally:
        nodes.close()


@pytest.mark.usefixtures("no_compiler")
def test_under_ci_the_demo_refuses_to_start_without_the_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    said: list[str] = []
    with pytest.raises(QuotientError, match=r"required under CI=true.*no C compiler"):
        demo.nvml_mock(said.append)
    assert said == []

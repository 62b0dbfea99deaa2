"""How the demo runs what a user types: ``kubectl quotient`` and the guides' ``kubectl get`` views, through kubectl
when it is there, else in the demo's process; both ways print the same."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common import clusterspec
from quotient import demo_plugin, demo_scenario
from quotient.emulator.emulator import Emulator, EmulatorConfig

pytestmark = pytest.mark.integration

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: share
  labels: {kai.scheduler/queue: test, runai-gpu-group: group-1}
  annotations: {gpu-fraction: "0.5"}
spec:
  schedulerName: kai-scheduler
  containers: [{name: main, image: ubuntu}]
"""


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    started = Emulator(clusterspec.load(demo_scenario.DEFAULT_SPEC), config=EmulatorConfig(scripted_pods=False))
    await started.start()
    try:
        (queues,) = demo_scenario.workflow_texts()[1][:1]
        assert "kind: Queue" in queues
        for text in (queues, POD):
            assert all("refused" not in line for line in await demo_scenario.apply(started, text))
        yield started
    finally:
        await started.stop()


def cells(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


async def test_without_kubectl_the_plugin_runs_in_the_demo_s_process_and_answers(
    emulator: Emulator, tmp_path: Path
) -> None:
    inside = demo_plugin.Kubectl(emulator, tmp_path, kubectl="")
    assert inside.how.startswith("in this process")
    code, text = await inside.quotient("queues")
    assert code == 0, text
    rows = cells(text)
    assert rows[0][:3] == ["QUEUE", "DESERVED", "FAIR"] and rows[1][:1] == ["default"] and rows[2][0] == "test"
    code, text = await inside.quotient("explain", "default/no-such-pod")
    assert code == 1 and "pod default/no-such-pod not found" in text
    columns = demo_plugin.guide_columns()
    _, view = await inside.get_pods("default", columns=columns)
    assert cells(view) == [
        ["NAME", "STATUS", "NODE", "GPU-FRACTION", "GPU-GROUP"],
        ["share", "Pending", "<none>", "0.5", "group-1"],
    ]
    _, empty = await inside.get_pods("quotient-reservation")
    assert empty == "No resources found in quotient-reservation namespace."


@pytest.mark.skipif(shutil.which("kubectl") is None or not demo_plugin.PLUGIN.exists(), reason="needs kubectl")
async def test_through_kubectl_the_installed_plugin_and_the_views_print_what_the_in_process_ones_print(
    emulator: Emulator, tmp_path: Path
) -> None:
    (tmp_path / "kubectl").mkdir()
    (tmp_path / "inside").mkdir()
    outside = demo_plugin.Kubectl(emulator, tmp_path / "kubectl")
    inside = demo_plugin.Kubectl(emulator, tmp_path / "inside", kubectl="")
    assert outside.how.startswith("kubectl ")
    for args in (("queues",), ("explain", "default/share", "--no-metrics")):
        (code, through), (_, here) = await outside.quotient(*args), await inside.quotient(*args)
        assert code == 0, through
        assert cells(through) == cells(here)
    columns = demo_plugin.guide_columns()
    (_, through), (_, here) = (
        await outside.get_pods("default", columns=columns),
        await inside.get_pods("default", columns=columns),
    )
    assert cells(through) == cells(here)
    (_, through), (_, here) = await outside.get_pods("default"), await inside.get_pods("default")
    assert [row[:4] for row in cells(through)] == [row[:4] for row in cells(here)]

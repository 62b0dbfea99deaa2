"""NVML's process lists merged into one sample per pid: a scenario table, no pynvml."""

from __future__ import annotations

import pytest

from agent.gpus import probe, processlists
from agent.gpus.processlists import ProcessEntry

GIB = 1024**3


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        pytest.param([], (), id="no processes"),
        pytest.param(
            [ProcessEntry(pid=7, used_memory_bytes=2 * GIB), ProcessEntry(pid=3, used_memory_bytes=GIB)],
            ((3, GIB), (7, 2 * GIB)),
            id="sorted by pid",
        ),
        pytest.param(
            [ProcessEntry(pid=5, used_memory_bytes=GIB), ProcessEntry(pid=5, used_memory_bytes=GIB)],
            ((5, GIB),),
            id="compute and graphics work of one process counts once",
        ),
        pytest.param(
            [
                ProcessEntry(pid=5, gpu_instance=1, compute_instance=0, used_memory_bytes=GIB),
                ProcessEntry(pid=5, gpu_instance=2, compute_instance=0, used_memory_bytes=3 * GIB),
            ],
            ((5, 4 * GIB),),
            id="memory in several MIG instances adds up",
        ),
        pytest.param(
            [
                ProcessEntry(pid=5, gpu_instance=1, compute_instance=0, used_memory_bytes=None),
                ProcessEntry(pid=5, gpu_instance=2, compute_instance=0, used_memory_bytes=3 * GIB),
            ],
            ((5, 3 * GIB),),
            id="a withheld value leaves the sum of the known ones",
        ),
        pytest.param(
            [ProcessEntry(pid=5, used_memory_bytes=None), ProcessEntry(pid=5, used_memory_bytes=None)],
            ((5, None),),
            id="all values withheld is none",
        ),
    ],
)
def test_process_lists_merge_into_one_sample_per_pid(
    entries: list[ProcessEntry], expected: tuple[tuple[int, int | None], ...]
) -> None:
    merged = processlists.merge(entries)
    assert merged == tuple(probe.ProcessSample(pid=pid, used_memory_bytes=used) for pid, used in expected)

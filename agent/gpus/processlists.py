"""NVML's process lists of one device merged into one ``ProcessSample`` per pid: pure, no pynvml.

NVML answers two lists per device (compute and graphics) with one entry per process and MIG instance; the agent
reports one value per pid. ``agent.gpus.nvml`` reads the lists and hands over plain :class:`ProcessEntry` values, so
the rules below are plain functions over plain values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from agent.gpus import probe

# NVML's GPU and compute instance id for a process that is not inside a MIG instance.
NO_INSTANCE = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcessEntry:
    """One entry of a compute or graphics process list; ``used_memory_bytes`` None where the driver withholds it."""

    pid: int
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE
    used_memory_bytes: int | None


def merge(entries: Iterable[ProcessEntry]) -> tuple[probe.ProcessSample, ...]:
    """One sample per pid, sorted by pid.

    A process with both compute and graphics work appears in both lists with the same memory: keep one value per
    (pid, GPU instance, compute instance). A process in several MIG instances of the device holds memory in each:
    add them. Where the driver withholds some values the sum is of the known ones (a lower bound); None where it
    withholds them all.
    """
    per_context: dict[tuple[int, int, int], int | None] = {}
    for entry in entries:
        key = (entry.pid, entry.gpu_instance, entry.compute_instance)
        used = entry.used_memory_bytes
        per_context[key] = _combine(per_context[key], used, max) if key in per_context else used
    per_pid: dict[int, int | None] = {}
    for (pid, _gpu_instance, _compute_instance), used in per_context.items():
        per_pid[pid] = _combine(per_pid[pid], used, _add) if pid in per_pid else used
    return tuple(probe.ProcessSample(pid=pid, used_memory_bytes=per_pid[pid]) for pid in sorted(per_pid))


def _add(a: int, b: int) -> int:
    return a + b


def _combine(a: int | None, b: int | None, op: Callable[[int, int], int]) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return op(a, b)

"""Memory scripts: how much GPU memory a process holds over time, piecewise constant.

``2Gi@0s,30Gi@20s`` is nothing before 0s, 2Gi from 0s, 30Gi from 20s on; a point without ``@`` starts at 0s. The
same text is a pod's ``gpu_memory`` in a spec, an unowned process's ``memory``, and the pod annotation
``quotient.dev/sim-gpu-memory`` the fake GPUs read, so one parser and one canonical form (``MemoryScript.text``)
serve all three.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence

from common import quantities
from common.clusterspec import checking
from common.errors import ClusterSpecError

MEMORY_SCRIPT_FORM = (
    "MEMORY@OFFSET points joined by commas, such as 2Gi@0s,30Gi@20s (without @OFFSET a point starts at 0s)"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MemoryScript:
    """GPU memory over time, piecewise constant: ``points`` are (offset_ns, memory_bytes), offsets increasing."""

    points: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ClusterSpecError("a memory script needs at least one point")
        previous = -1
        for offset_ns, memory_bytes in self.points:
            if not 0 <= offset_ns <= checking.MAX_INT or not 0 <= memory_bytes <= checking.MAX_INT:
                raise ClusterSpecError(f"memory script point ({offset_ns}, {memory_bytes}) is out of range")
            if offset_ns <= previous:
                raise ClusterSpecError(f"memory script offsets must increase: {self.points}")
            previous = offset_ns

    @classmethod
    def constant(cls, memory_bytes: int) -> MemoryScript:
        """``memory_bytes`` from offset 0 on."""
        return cls(points=((0, memory_bytes),))

    @property
    def start_ns(self) -> int:
        return self.points[0][0]

    @property
    def peak_bytes(self) -> int:
        return max(memory_bytes for _, memory_bytes in self.points)

    def at(self, offset_ns: int) -> int | None:
        """The memory held at ``offset_ns`` after the start, or None before the first point (not started)."""
        position = bisect.bisect_right(self.points, offset_ns, key=lambda point: point[0])
        return None if position == 0 else self.points[position - 1][1]

    def text(self) -> str:
        """The canonical text form, which ``parse_memory_script`` reads back to an equal script."""
        return ",".join(
            f"{quantities.format_bytes_quantity(memory_bytes)}@{_format_duration(offset_ns)}"
            for offset_ns, memory_bytes in self.points
        )


def parse_memory_script(text: str) -> MemoryScript:
    """Read ``2Gi@0s,30Gi@20s`` (also the value of the ``quotient.dev/sim-gpu-memory`` annotation)."""
    try:
        return script_from_text(text)
    except checking.Invalid as exc:
        raise ClusterSpecError(f"memory script {checking.excerpt(text)}: {exc}") from exc


def script_from_text(text: str) -> MemoryScript:
    """``parse_memory_script`` for callers that say themselves where the text was."""
    if not text.strip():
        raise checking.Invalid(f"empty; expected {MEMORY_SCRIPT_FORM}")
    points: list[tuple[int, int]] = []
    for part in text.split(","):
        memory_text, at, offset_text = part.partition("@")
        memory_bytes = checking.parse(quantities.parse_bytes, memory_text.strip(), "memory")
        offset_ns = checking.parse(quantities.parse_duration_ns, offset_text.strip(), "offset") if at else 0
        points.append((offset_ns, memory_bytes))
    return script_from_points(points)


def script_from_points(points: Sequence[tuple[int, int]]) -> MemoryScript:
    """The script of (offset_ns, memory_bytes) points read from a spec; ``Invalid`` unless the offsets increase."""
    for (before, _), (after, _) in itertools.pairwise(points):
        if after <= before:
            raise checking.Invalid(
                f"offsets must increase, but {_format_duration(after)} follows {_format_duration(before)}; "
                f"expected {MEMORY_SCRIPT_FORM}"
            )
    return MemoryScript(points=tuple(points))


def _format_duration(ns: int) -> str:
    for unit, size in (("s", quantities.NS_PER_S), ("ms", 1_000_000), ("us", 1_000)):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"

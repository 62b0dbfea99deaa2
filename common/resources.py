"""Resource vectors: CPU in millicores, memory in bytes, GPU in milli-GPU, pod slots; integers only.

One small immutable value used everywhere capacity is added, subtracted or compared, so no module does its own
arithmetic on dictionaries of floats.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """An amount of schedulable resources. Negative components appear only as differences."""

    milli_cpu: int = 0
    memory_bytes: int = 0
    milli_gpu: int = 0
    pods: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            milli_cpu=self.milli_cpu + other.milli_cpu,
            memory_bytes=self.memory_bytes + other.memory_bytes,
            milli_gpu=self.milli_gpu + other.milli_gpu,
            pods=self.pods + other.pods,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            milli_cpu=self.milli_cpu - other.milli_cpu,
            memory_bytes=self.memory_bytes - other.memory_bytes,
            milli_gpu=self.milli_gpu - other.milli_gpu,
            pods=self.pods - other.pods,
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True when every component is at most the same component of ``capacity``."""
        return (
            self.milli_cpu <= capacity.milli_cpu
            and self.memory_bytes <= capacity.memory_bytes
            and self.milli_gpu <= capacity.milli_gpu
            and self.pods <= capacity.pods
        )

    def shortfall(self, capacity: Resources) -> Resources:
        """What is missing from ``capacity`` to hold this amount (zero where it suffices)."""
        return Resources(
            milli_cpu=max(0, self.milli_cpu - capacity.milli_cpu),
            memory_bytes=max(0, self.memory_bytes - capacity.memory_bytes),
            milli_gpu=max(0, self.milli_gpu - capacity.milli_gpu),
            pods=max(0, self.pods - capacity.pods),
        )

    def is_zero(self) -> bool:
        return self == ZERO


ZERO = Resources()

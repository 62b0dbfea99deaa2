"""Retry policy as a small pure function: capped exponential backoff with full jitter.

Used wherever a connection is retried (NATS, Kubernetes watches, bindings). The randomness is an argument so tests
are deterministic; "full jitter" (a uniform draw between 0 and the capped exponential) spreads a fleet of agents
that lost the same server, as the AWS architecture note on backoff recommends.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    delay_s: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GiveUp:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """``base_s * 2**attempt`` capped at ``cap_s``, scaled by a uniform draw in ``[min_fraction, 1]``."""

    base_s: float = 0.1
    cap_s: float = 10.0
    min_fraction: float = 0.5
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            raise ValueError(f"backoff needs 0 < base_s <= cap_s, got base_s={self.base_s} cap_s={self.cap_s}")
        if not 0 <= self.min_fraction <= 1:
            raise ValueError(f"min_fraction must be within [0, 1], got {self.min_fraction}")

    def decide(self, attempt: int, uniform: Callable[[], float] = random.random) -> Retry | GiveUp:
        """What to do after failed attempt number ``attempt`` (0 for the first failure)."""
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return GiveUp(reason=f"gave up after {attempt + 1} failed attempts")
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 62)))
        fraction = self.min_fraction + (1 - self.min_fraction) * uniform()
        return Retry(delay_s=ceiling * fraction)

    def delay_s(self, attempt: int, uniform: Callable[[], float] = random.random) -> float:
        """The delay for ``attempt`` ignoring ``max_attempts`` (for loops that retry forever)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** min(attempt, 62)))
        return float(ceiling * (self.min_fraction + (1 - self.min_fraction) * uniform()))

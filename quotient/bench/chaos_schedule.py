"""The chaos run's fault schedule: which fault, when, for how long, drawn from ``random.Random(seed)``. Pure.

Faults come in rounds: each round is every kind once, in a shuffled order, so a run long enough for two rounds has
every kind at least twice (a ten-minute run has four or five). Faults follow one another at random gaps, and two rules
space them so the system can recover: a kind does not come back before the previous fault of its kind has ended and
settled (``settle_s``), and the *exclusive* kinds (a scheduler kill, a NATS restart, a GPU Xid) never overlap each
other: each of them has an alert or a restart whose effect the run checks, and two at once would blur which fault
caused what. The others (API errors, an agent restart, a queue deleted) may overlap anything.

The schedule says "not before": the shell that injects a fault may start it later when the fault before it took
longer to recover than planned (a scheduler that restarts slowly on a loaded machine), never sooner.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Mapping
from typing import Final


class FaultKind(enum.StrEnum):
    SCHEDULER_KILL = "scheduler_kill"
    """SIGKILL the scheduler process; start it again after ``effect_s`` with the same flags and ports."""
    NATS_RESTART = "nats_restart"
    """Stop the nats-server; start it again on the same port after ``effect_s``."""
    API_500 = "api_500"
    """The API answers 500 to the requests of ``variant`` for ``effect_s``."""
    API_410 = "api_410"
    """Watches expire: the history is compacted and every watch dropped (``compact``), or every watch request is
    answered 410 for ``effect_s`` (``watch``)."""
    AGENT_RESTART = "agent_restart"
    """One node's agent stops; a new one (a new boot) starts after ``effect_s``."""
    GPU_XID = "gpu_xid"
    """A critical Xid (79) on one device of a node; the operator clears it through the node annotation after
    ``effect_s``."""
    QUEUE_DELETE = "queue_delete"
    """A leaf queue (one with running pods where there is one) is deleted; re-created with the same spec after
    ``effect_s``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    effect_s: tuple[float, float]
    """How long the fault lasts (drawn uniformly from this range): down time, error time, time until undone."""
    settle_s: float
    """After the fault is undone: the time the system is given to recover before a fault of the same kind (and, for
    an exclusive kind, any exclusive fault) may come."""
    exclusive: bool = False
    variants: tuple[str, ...] = ()


# The numbers are what a 2-core machine needs: a scheduler process takes a few seconds to start and sync; NATS down
# for 5 s makes every node's telemetry stale (the run's agents sample every second and the scheduler's stale floor is
# 2 s, so stale after 3 s); an Xid is cleared after long enough for the alert and the events to be seen.
TIMINGS: Final[Mapping[FaultKind, Timing]] = {
    FaultKind.SCHEDULER_KILL: Timing(effect_s=(1.0, 3.0), settle_s=20.0, exclusive=True),
    FaultKind.NATS_RESTART: Timing(effect_s=(5.0, 8.0), settle_s=15.0, exclusive=True),
    FaultKind.API_500: Timing(effect_s=(3.0, 6.0), settle_s=10.0, variants=("all", "writes", "bindings")),
    FaultKind.API_410: Timing(effect_s=(2.0, 5.0), settle_s=10.0, variants=("compact", "watch")),
    FaultKind.AGENT_RESTART: Timing(effect_s=(1.0, 4.0), settle_s=8.0),
    FaultKind.GPU_XID: Timing(effect_s=(6.0, 12.0), settle_s=15.0, exclusive=True),
    FaultKind.QUEUE_DELETE: Timing(effect_s=(8.0, 20.0), settle_s=10.0),
}

WARMUP_S: Final = 10.0
"""No fault before this: the load is under way and the scheduler has placed its first pods."""
GAP_S: Final = (10.0, 25.0)
"""Between the starts of two consecutive faults (drawn uniformly)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlannedFault:
    index: int
    kind: FaultKind
    at_s: float
    """Seconds after the run's start, not before which the fault starts."""
    effect_s: float
    variant: str = ""
    pick: int = 0
    """A number for the shell's choices at the time (which node, device, queue), so they follow the seed too."""


def plan(
    *,
    seed: int,
    duration_s: float,
    timings: Mapping[FaultKind, Timing] = TIMINGS,
    warmup_s: float = WARMUP_S,
    gap_s: tuple[float, float] = GAP_S,
) -> tuple[PlannedFault, ...]:
    """The faults of a run of ``duration_s``, each ending (undone) within the run."""
    rng = random.Random(seed)
    faults: list[PlannedFault] = []
    bag: list[FaultKind] = []
    kind_free: dict[FaultKind, float] = {}
    exclusive_free = 0.0
    cursor = warmup_s
    while True:
        if not bag:
            bag = list(timings)
            rng.shuffle(bag)
        kind = bag.pop(0)
        timing = timings[kind]
        effect_s = round(rng.uniform(*timing.effect_s), 1)
        variant = rng.choice(timing.variants) if timing.variants else ""
        pick = rng.randrange(2**31)
        start = max(cursor, kind_free.get(kind, 0.0))
        if timing.exclusive:
            start = max(start, exclusive_free)
        if start + effect_s > duration_s:
            break
        faults.append(
            PlannedFault(
                index=len(faults), kind=kind, at_s=round(start, 1), effect_s=effect_s, variant=variant, pick=pick
            )
        )
        kind_free[kind] = start + effect_s + timing.settle_s
        if timing.exclusive:
            exclusive_free = start + effect_s + timing.settle_s
        cursor = start + rng.uniform(*gap_s)
    return tuple(faults)


def by_kind(faults: tuple[PlannedFault, ...]) -> dict[str, int]:
    """How many faults of each kind (every kind named, zero included)."""
    counts = {kind.value: 0 for kind in FaultKind}
    for fault in faults:
        counts[fault.kind.value] += 1
    return counts

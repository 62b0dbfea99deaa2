"""When the engine fails on a snapshot: find the pod groups whose presence makes it fail, and keep them out.

The placement core is pure and tested hard, but a scheduler is infrastructure every team waits on: one group that
trips a bug in it must never stop the cycles of everyone else. When ``Engine.run`` raises, the cycle asks
:meth:`Quarantine.culprits` which groups it fails with: it bisects the snapshot's groups, running fresh engines on
halves (the engine is a pure function of the snapshot, so a retry is safe and says the same), down to the smallest
set of groups that still fails. Those groups get a strike and the cycle runs again without them, so the rest of the
cluster is placed in the same cycle. A group struck in three cycles in a row is quarantined: left out of every cycle
for a back-off period (one minute, doubling up to fifteen while it keeps failing), with the reason
``SchedulingError`` and the error on its PodGroup. A cycle that succeeds with a group present clears its strikes. A
failure that no group explains (the snapshot fails without any group) has no culprit: it is counted and the next
cycle tries again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from scheduler.placement import engine, model, plan, status

STRIKES = 3
"""Cycles in a row a group must fail before it is quarantined (issue "never down")."""
FIRST_QUARANTINE_S = 60.0
LONGEST_QUARANTINE_S = 900.0


class Planner(Protocol):
    """What a cycle plans with: ``placement.engine.Engine`` (a fresh one holds no state from a failed run)."""

    def run(self, snapshot: model.Snapshot) -> plan.Plan: ...


@dataclasses.dataclass(slots=True)
class _Record:
    strikes: int = 0
    error: str = ""
    until_s: float = 0.0
    period_s: float = 0.0
    times_quarantined: int = 0


def _fails(make: Callable[[], Planner], snapshot: model.Snapshot, groups: Sequence[model.GroupId]) -> bool:
    """Whether a fresh engine fails on ``snapshot`` holding only ``groups``."""
    subset = {group_id: snapshot.groups[group_id] for group_id in groups}
    try:
        make().run(dataclasses.replace(snapshot, groups=subset))
    except Exception:
        return True
    return False


def _bisect(make: Callable[[], Planner], snapshot: model.Snapshot, groups: list[model.GroupId]) -> list[model.GroupId]:
    """A small set of ``groups`` on which the engine fails (``groups`` itself fails)."""
    while len(groups) > 1:
        half = len(groups) // 2
        first, second = groups[:half], groups[half:]
        if _fails(make, snapshot, first):
            groups = first
        elif _fails(make, snapshot, second):
            groups = second
        else:
            break  # it takes groups from both halves to fail: keep them all
    return groups


class Quarantine:
    """Strikes and quarantines of the groups the engine fails with. One per leader term; ``now_s`` is monotonic."""

    def __init__(self, *, clock_s: Callable[[], float], make_engine: Callable[[], Planner] = engine.Engine) -> None:
        self._clock_s = clock_s
        self._make_engine = make_engine
        self._records: dict[model.GroupId, _Record] = {}
        self._filtered: tuple[Mapping[model.GroupId, model.Group], frozenset[model.GroupId], model.Snapshot] | None = (
            None
        )

    def quarantined(self) -> frozenset[model.GroupId]:
        now = self._clock_s()
        return frozenset(group for group, record in self._records.items() if record.until_s > now)

    def admit(self, snapshot: model.Snapshot) -> model.Snapshot:
        """``snapshot`` without the quarantined groups; the same mappings while nothing changed, so the engine's
        shortcut for an unchanged cluster still works."""
        out = self.quarantined()
        present = out & snapshot.groups.keys()
        if not present:
            return snapshot
        cached = self._filtered
        if cached is not None and cached[0] is snapshot.groups and cached[1] == present:
            return dataclasses.replace(cached[2], nodes=snapshot.nodes, queues=snapshot.queues, now_ns=snapshot.now_ns)
        groups = {group_id: group for group_id, group in snapshot.groups.items() if group_id not in present}
        admitted = dataclasses.replace(snapshot, groups=groups)
        self._filtered = (snapshot.groups, present, admitted)
        return admitted

    def culprits(self, snapshot: model.Snapshot) -> list[model.GroupId]:
        """The groups the engine fails with on ``snapshot`` (empty when it fails without any group)."""
        if _fails(self._make_engine, snapshot, []):
            return []
        return _bisect(self._make_engine, snapshot, sorted(snapshot.groups))

    def strike(self, culprits: Sequence[model.GroupId], error: BaseException) -> list[model.GroupId]:
        """Count a failed cycle against ``culprits``; the groups quarantined by this strike."""
        now = self._clock_s()
        newly = []
        for group_id in culprits:
            record = self._records.setdefault(group_id, _Record())
            record.strikes += 1
            record.error = f"{type(error).__name__}: {error}"
            if record.strikes >= STRIKES:
                period = min(LONGEST_QUARANTINE_S, FIRST_QUARANTINE_S * 2**record.times_quarantined)
                record.until_s = now + period
                record.period_s = period
                record.times_quarantined += 1
                record.strikes = 0
                newly.append(group_id)
        return newly

    def succeeded(self, snapshot: model.Snapshot, *, struck: Sequence[model.GroupId] = ()) -> None:
        """A cycle ran on ``snapshot``: its groups' strikes end (those just ``struck`` keep theirs); records of
        groups out of quarantine and without strikes are forgotten."""
        now = self._clock_s()
        for group_id in list(self._records):
            record = self._records[group_id]
            if group_id in snapshot.groups and group_id not in struck:
                record.strikes = 0
            if record.strikes == 0 and record.until_s <= now and group_id not in snapshot.groups:
                del self._records[group_id]

    def statuses(self) -> dict[model.GroupId, status.Status]:
        """The status of each group the engine failed with: ``SchedulingError`` with the error, for its PodGroup
        (quarantined, or struck and about to be retried)."""
        now = self._clock_s()
        found: dict[model.GroupId, status.Status] = {}
        for group_id, record in self._records.items():
            if record.until_s > now:
                message = (
                    f"left out of scheduling for {record.period_s:.0f} s: the scheduling cycle failed with this "
                    f"group {STRIKES} times in a row ({record.error}); please report it"
                )
            elif record.strikes:
                message = (
                    f"the scheduling cycle failed with this group ({record.error}); retrying "
                    f"({record.strikes} of {STRIKES} failures before it is left out)"
                )
            else:
                continue
            found[group_id] = status.unschedulable(status.Reason.SCHEDULING_ERROR, message)
        return found

    def next_release_s(self) -> float | None:
        """When the next quarantine ends (monotonic seconds), or None when no group is quarantined."""
        now = self._clock_s()
        ends = [record.until_s for record in self._records.values() if record.until_s > now]
        return min(ends) if ends else None

    def struck(self) -> bool:
        """Whether some group has strikes and is not quarantined: the cycle should be retried soon."""
        now = self._clock_s()
        return any(record.strikes and record.until_s <= now for record in self._records.values())

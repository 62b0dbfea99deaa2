"""Which GPUs are broken, from the agents' health reports, and the ``GpuUnhealthy`` alert that says so. Pure.

An agent publishes its node's whole current problem list (``wire.NodeHealth``) when it changes. The agent owns the
decision that a device is healthy again (``agent.sampling.HealthTracker``: NVML reachable again, a lost device seen
again, a critical Xid or an uncorrectable-ECC rise not seen again for its hold time); the scheduler follows its
reports:

- ``nvml_unreachable`` or ``runtime_not_ready``: every device of the node is out of placement;
- ``gpu_lost``, ``xid``, ``ecc`` naming a device: that device is out; one naming none: every device of the node.

An operator who knows better (the device was reset, the node drained and repaired) clears the reports with the node
annotation ``quotient.dev/gpu-health-cleared-at: <RFC 3339 time>``: a problem first reported before that time no
longer counts, even when the agent publishes its list again (it does on every reconnect); a problem first reported
after it (a new Xid, or the same one again after it had left the agent's list) counts as usual. Each unhealthy
device is one ``GpuUnhealthy`` alert, firing while it is out and resolved when it is back (or its node forgotten).
Times are arguments (ns), never read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from common import wire
from scheduler.telemetry import overuse

ALL_DEVICES = -1
"""In ``Verdict.unhealthy``: every device of the node (a node-level fault)."""

_NODE_LEVEL = frozenset({wire.ProblemKind.NVML_UNREACHABLE, wire.ProblemKind.RUNTIME_NOT_READY})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The devices of one node out of placement (``ALL_DEVICES`` for all), with the problem that put each out."""

    unhealthy: Mapping[int, wire.HealthProblem] = dataclasses.field(default_factory=dict)
    reported_ns: int = 0

    @property
    def whole_node(self) -> bool:
        return ALL_DEVICES in self.unhealthy

    def is_unhealthy(self, index: int) -> bool:
        return self.whole_node or index in self.unhealthy


HEALTHY = Verdict()


ProblemKey = tuple[wire.ProblemKind, int | None, int | None]
"""A problem's identity across reports: its kind, device and code (the message may carry changing numbers)."""


def problem_key(problem: wire.HealthProblem) -> ProblemKey:
    return (problem.kind, problem.gpu_index, problem.code)


def verdict(
    health: wire.NodeHealth, *, cleared_ns: int = 0, first_seen_ns: Mapping[ProblemKey, int] | None = None
) -> Verdict:
    """What a node's health report puts out of placement: its problems, less those an operator cleared.

    A problem counts when it was first reported (``first_seen_ns``, by default this report's time) after the clear.
    """
    unhealthy: dict[int, wire.HealthProblem] = {}
    for problem in health.problems:
        first_ns = (first_seen_ns or {}).get(problem_key(problem), health.ts_ns)
        if first_ns <= cleared_ns:
            continue
        if problem.kind in _NODE_LEVEL or problem.gpu_index is None:
            unhealthy.setdefault(ALL_DEVICES, problem)
        else:
            unhealthy.setdefault(problem.gpu_index, problem)
    return Verdict(unhealthy=unhealthy, reported_ns=health.ts_ns) if unhealthy else HEALTHY


@dataclasses.dataclass(frozen=True, slots=True)
class _Firing:
    since_ns: int
    problem: wire.HealthProblem


class GpuHealthWatch:
    """Per node, the current verdict and the ``GpuUnhealthy`` alerts firing (one per device, or one for the node)."""

    def __init__(self) -> None:
        self._verdicts: dict[str, Verdict] = {}
        self._firing: dict[str, dict[int, _Firing]] = {}
        self._first_seen: dict[str, dict[ProblemKey, int]] = {}

    def verdict_of(self, node: str) -> Verdict:
        return self._verdicts.get(node, HEALTHY)

    def update(
        self, node: str, health: wire.NodeHealth, *, cleared_ns: int, now_ns: int
    ) -> tuple[overuse.Transition, ...]:
        """Take a node's newest report (or a change of its clearing annotation); the alerts that fire or resolve."""
        known = self._first_seen.get(node, {})
        first_seen = {problem_key(p): known.get(problem_key(p), health.ts_ns) for p in health.problems}
        self._first_seen[node] = first_seen
        current = verdict(health, cleared_ns=cleared_ns, first_seen_ns=first_seen)
        self._verdicts[node] = current
        firing = self._firing.setdefault(node, {})
        transitions: list[overuse.Transition] = []
        for index in sorted(set(firing) - set(current.unhealthy)):
            ended = firing.pop(index)
            transitions.append(_transition(node, index, ended, wire.AlertState.RESOLVED, now_ns))
        for index, problem in sorted(current.unhealthy.items()):
            if index not in firing:
                since_ns = first_seen.get(problem_key(problem), current.reported_ns or now_ns)
                started = firing[index] = _Firing(since_ns=since_ns, problem=problem)
                transitions.append(_transition(node, index, started, wire.AlertState.FIRING, now_ns))
        if not firing:
            del self._firing[node]
        return tuple(transitions)

    def forget(self, node: str, *, now_ns: int) -> tuple[overuse.Transition, ...]:
        """The node left the cluster: its alerts resolve."""
        self._verdicts.pop(node, None)
        self._first_seen.pop(node, None)
        firing = self._firing.pop(node, {})
        return tuple(
            _transition(node, index, ended, wire.AlertState.RESOLVED, now_ns) for index, ended in sorted(firing.items())
        )


def _transition(node: str, index: int, firing: _Firing, state: wire.AlertState, now_ns: int) -> overuse.Transition:
    problem = firing.problem
    device = "every GPU" if index == ALL_DEVICES else f"GPU {index}"
    if state is wire.AlertState.FIRING:
        message = f"{device} of {node} is out of placement: {problem.kind.value}: {problem.message}"
    else:
        message = f"{device} of {node} is healthy again and back in placement"
    return overuse.Transition(
        name=overuse.AlertName.GPU_UNHEALTHY,
        state=state,
        severity=wire.Severity.CRITICAL,
        at_ns=now_ns,
        since_ns=firing.since_ns,
        node=node,
        gpu_index=None if index == ALL_DEVICES else index,
        gpu_uuid=problem.gpu_uuid,
        message=message,
    )

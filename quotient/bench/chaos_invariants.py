"""The chaos run's invariants, as pure functions over plain observations of the cluster. No I/O, no clock.

The shell (``chaos_observe``) turns the emulator's state into these records: every pod change as it happens
(``PodChange``), and, every second, every pod and PodGroup as they are (``Observation``). ``Checker`` holds what the
checks must remember (which pods were bound, since when a gang or a pod waits) and returns ``Violation`` values:

- ``bound-twice``: a pod's ``spec.nodeName`` never changes once set, and a pod (a uid) gets a node once.
- ``device-overcommitted``: on each node and device, as the scheduler wrote it on the pods
  (``quotient.dev/gpu-devices``, ``quotient.dev/gpu-share``): at most one whole-GPU pod, never a whole-GPU pod and a
  share together, shares summing to at most one device; and as the pods really run (the emulated device plugin's
  allocation, and for a share the device of its reservation pod, named by ``quotient.dev/gpu-uuids``): a share only
  on a device a reservation pod holds, shares summing to at most one device. A pod the emulated kubelet refused at
  admission (``UnexpectedAdmissionError``, ``OutOfcpu``, ...) is a node the scheduler over-committed too.
- ``gang-half-bound``: a PodGroup with ``minMember`` > 1 never has 0 < bound < minMember for longer than the grace,
  counted from the end of the last disruptive fault.
- ``pending-without-reason``: a pod of ours waiting longer than the grace (counted likewise) has a reason: a
  ``PodScheduled=False`` condition, an Event from the scheduler, or a condition on its PodGroup.

The alerts' invariant (every fault that has an alert fired it and resolved it) is ``chaos_alerts``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

FULL_DEVICE_MILLI: Final = 1000
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
KUBELET_REFUSALS: Final = frozenset(
    {"UnexpectedAdmissionError", "OutOfcpu", "OutOfmemory", "OutOfpods", "NodeAffinity", "Taint"}
)
"""The reasons the emulated kubelet fails a pod with at admission (``quotient.emulator.nodefit``, the device plugin):
each means the scheduler placed a pod where it did not fit."""


class Invariant(enum.StrEnum):
    BOUND_TWICE = "bound-twice"
    DEVICE_OVERCOMMITTED = "device-overcommitted"
    GANG_HALF_BOUND = "gang-half-bound"
    PENDING_WITHOUT_REASON = "pending-without-reason"
    ALERT_NOT_FIRED = "alert-not-fired"
    ALERT_NOT_RESOLVED = "alert-not-resolved"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    invariant: Invariant
    at_s: float
    """Seconds after the run's start."""
    obj: str
    """Which object, as ``kind namespace/name``."""
    detail: str
    key: str = ""
    """What makes two reports the same violation (the object and what is wrong); the shell counts each key once."""

    def as_json(self) -> dict[str, object]:
        return {"invariant": self.invariant.value, "at_s": round(self.at_s, 1), "object": self.obj, "what": self.detail}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodChange:
    """One write of a pod, as the store recorded it: its node before and after ("" when none)."""

    at_s: float
    uid: str
    namespace: str
    name: str
    node_before: str
    node_after: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodSeen:
    """A pod as it is, in the terms the checks need."""

    uid: str
    namespace: str
    name: str
    node: str = ""
    phase: str = "Pending"
    reason: str = ""
    """``status.reason`` (the kubelet's refusal, for a pod it failed at admission)."""
    deleting: bool = False
    ours: bool = True
    """Scheduled by the scheduler under test (its ``schedulerName``), and not a reservation pod."""
    reservation: bool = False
    whole_gpus: int = 0
    share_milli: int = 0
    """The milli-GPU per device the scheduler recorded on a share (``quotient.dev/gpu-share``); 0 for other pods."""
    scheduled_devices: tuple[int, ...] = ()
    """The device indexes the scheduler recorded (``quotient.dev/gpu-devices``)."""
    real_devices: tuple[int, ...] | None = None
    """The devices the pod really runs on: the device plugin's allocation (whole GPUs, reservation pods), the device
    of the share's reservation pod (by UUID); None when not known (not admitted yet)."""
    pod_group: str = ""
    has_reason: bool = False
    """A ``PodScheduled=False`` condition or an Event from the scheduler says why it waits."""

    @property
    def ref(self) -> str:
        return f"pod {self.namespace}/{self.name}"

    @property
    def holds(self) -> bool:
        """Bound and not finished: it holds what it was given (while it terminates too)."""
        return bool(self.node) and self.phase not in TERMINAL_PHASES

    @property
    def waiting(self) -> bool:
        return not self.node and not self.deleting and self.phase == "Pending"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupSeen:
    namespace: str
    name: str
    min_member: int
    conditions: tuple[str, ...] = ()
    """The reasons of its ``status.schedulingConditions``."""

    @property
    def ref(self) -> str:
        return f"podgroup {self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """A disruptive fault, from its start to its end (None: not over yet); the checks that wait give it
    ``settle_s`` more."""

    kind: str
    start_s: float
    end_s: float | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    at_s: float
    pods: Sequence[PodSeen]
    groups: Sequence[GroupSeen] = ()


# --- stateless checks -------------------------------------------------------------------------------------------------


def overcommitted(pods: Iterable[PodSeen], *, at_s: float) -> list[Violation]:
    """Every device given beyond what it holds, as the scheduler wrote it and as the pods really run."""
    found: list[Violation] = []
    whole: dict[tuple[str, int], list[PodSeen]] = {}
    shares: dict[tuple[str, int], list[PodSeen]] = {}
    plugin: dict[tuple[str, int], list[PodSeen]] = {}
    real_shares: dict[tuple[str, int], list[PodSeen]] = {}
    for pod in pods:
        if not pod.holds:
            continue
        if pod.ours and (pod.whole_gpus or pod.share_milli):
            target = whole if pod.whole_gpus else shares
            for index in pod.scheduled_devices:
                target.setdefault((pod.node, index), []).append(pod)
        if pod.real_devices is None:
            continue
        target = real_shares if pod.share_milli and not pod.reservation else plugin
        for index in pod.real_devices:
            target.setdefault((pod.node, index), []).append(pod)

    def add(node: str, index: int, what: str, holders: Sequence[PodSeen]) -> None:
        names = ", ".join(sorted(f"{pod.namespace}/{pod.name}" for pod in holders))
        found.append(
            Violation(
                invariant=Invariant.DEVICE_OVERCOMMITTED,
                at_s=at_s,
                obj=f"node {node} gpu {index}",
                detail=f"{what}: {names}",
                key=f"{node}/{index}/{what}/{names}",
            )
        )

    for (node, index), holders in sorted(whole.items()):
        if len(holders) > 1:
            add(node, index, "scheduled to more than one whole-GPU pod", holders)
        if (node, index) in shares:
            add(node, index, "scheduled whole and shared at once", [*holders, *shares[(node, index)]])
    for (node, index), holders in sorted(shares.items()):
        if sum(pod.share_milli for pod in holders) > FULL_DEVICE_MILLI:
            add(node, index, "shares scheduled beyond one device", holders)
    for (node, index), holders in sorted(plugin.items()):
        if len(holders) > 1:
            add(node, index, "allocated to more than one pod by the device plugin", holders)
    for (node, index), sharers in sorted(real_shares.items()):
        owners = plugin.get((node, index), [])
        if any(not owner.reservation for owner in owners):
            add(node, index, "shares run on a device given whole to a pod", [*owners, *sharers])
        if sum(pod.share_milli for pod in sharers) > FULL_DEVICE_MILLI:
            add(node, index, "shares run beyond one device", sharers)
    return found


def refused_at_admission(pods: Iterable[PodSeen], *, at_s: float) -> list[Violation]:
    """Pods the kubelet failed at admission: the scheduler put them where they did not fit."""
    return [
        Violation(
            invariant=Invariant.DEVICE_OVERCOMMITTED,
            at_s=at_s,
            obj=pod.ref,
            detail=f"the kubelet of {pod.node or 'its node'} refused it at admission: {pod.reason}",
            key=f"refused/{pod.uid}",
        )
        for pod in pods
        if pod.phase == "Failed" and pod.reason in KUBELET_REFUSALS
    ]


def bound_members(groups: Iterable[GroupSeen], pods: Iterable[PodSeen]) -> dict[tuple[str, str], int]:
    """For each gang (``minMember`` > 1): how many of its pods hold a node and are not being deleted."""
    counts = {(group.namespace, group.name): 0 for group in groups if group.min_member > 1}
    for pod in pods:
        key = (pod.namespace, pod.pod_group)
        if key in counts and pod.holds and not pod.deleting:
            counts[key] += 1
    return counts


def quiet_since(since_s: float, *, now_s: float, windows: Iterable[Window], settle_s: float) -> float | None:
    """When a condition that held since ``since_s`` started counting: after the last disruptive fault that ended
    (plus ``settle_s``) since then; None while one is under way or settling."""
    start = since_s
    for window in windows:
        if window.start_s > now_s:
            continue
        if window.end_s is None or window.end_s + settle_s > now_s:
            return None
        if window.end_s + settle_s > start:
            start = window.end_s + settle_s
    return start


# --- the checker ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Graces:
    gang_s: float = 30.0
    """How long a gang may stay half bound outside a fault (the scheduler's stale-gang grace is shorter)."""
    pending_s: float = 20.0
    """How long a pod of ours may wait without a reason outside a fault."""
    settle_s: float = 10.0
    """After a disruptive fault ends, before the graces start counting."""


class Checker:
    """The invariants over time: feed it every pod change and every observation; it returns what they violate."""

    def __init__(self, graces: Graces = Graces()) -> None:
        self.graces = graces
        self._nodes: dict[str, str] = {}
        """uid -> the node it got."""
        self._half_since: dict[tuple[str, str], float] = {}
        self._waiting_since: dict[str, float] = {}
        self.observations = 0
        self.changes = 0

    def on_change(self, change: PodChange) -> list[Violation]:
        self.changes += 1
        ref = f"pod {change.namespace}/{change.name}"
        if change.node_before and change.node_after != change.node_before and change.node_after:
            return [
                Violation(
                    invariant=Invariant.BOUND_TWICE,
                    at_s=change.at_s,
                    obj=ref,
                    detail=f"spec.nodeName changed from {change.node_before} to {change.node_after}",
                    key=f"moved/{change.uid}/{change.node_after}",
                )
            ]
        if change.node_before or not change.node_after:
            return []
        first = self._nodes.get(change.uid)
        if first is not None:
            return [
                Violation(
                    invariant=Invariant.BOUND_TWICE,
                    at_s=change.at_s,
                    obj=ref,
                    detail=f"bound again (to {change.node_after}; first to {first})",
                    key=f"again/{change.uid}/{change.at_s}",
                )
            ]
        self._nodes[change.uid] = change.node_after
        return []

    def on_observation(self, observation: Observation, windows: Sequence[Window]) -> list[Violation]:
        self.observations += 1
        now = observation.at_s
        found = overcommitted(observation.pods, at_s=now)
        found += refused_at_admission(observation.pods, at_s=now)
        found += self._gangs(observation, windows)
        found += self._pending(observation, windows)
        return found

    def _gangs(self, observation: Observation, windows: Sequence[Window]) -> list[Violation]:
        now = observation.at_s
        groups = {(group.namespace, group.name): group for group in observation.groups}
        found = []
        half = {
            key: bound
            for key, bound in bound_members(observation.groups, observation.pods).items()
            if 0 < bound < groups[key].min_member
        }
        self._half_since = {key: self._half_since.get(key, now) for key in half}
        for key, bound in sorted(half.items()):
            start = quiet_since(self._half_since[key], now_s=now, windows=windows, settle_s=self.graces.settle_s)
            if start is None or now - start <= self.graces.gang_s:
                continue
            group = groups[key]
            found.append(
                Violation(
                    invariant=Invariant.GANG_HALF_BOUND,
                    at_s=now,
                    obj=group.ref,
                    detail=f"{bound} of minMember {group.min_member} bound for {now - self._half_since[key]:.0f}s",
                    key=f"gang/{key[0]}/{key[1]}/{self._half_since[key]}",
                )
            )
        return found

    def _pending(self, observation: Observation, windows: Sequence[Window]) -> list[Violation]:
        now = observation.at_s
        conditions: Mapping[tuple[str, str], tuple[str, ...]] = {
            (group.namespace, group.name): group.conditions for group in observation.groups
        }
        waiting = [pod for pod in observation.pods if pod.ours and pod.waiting]
        self._waiting_since = {pod.uid: self._waiting_since.get(pod.uid, now) for pod in waiting}
        found = []
        for pod in waiting:
            if pod.has_reason or conditions.get((pod.namespace, pod.pod_group)):
                continue
            since = self._waiting_since[pod.uid]
            start = quiet_since(since, now_s=now, windows=windows, settle_s=self.graces.settle_s)
            if start is None or now - start <= self.graces.pending_s:
                continue
            found.append(
                Violation(
                    invariant=Invariant.PENDING_WITHOUT_REASON,
                    at_s=now,
                    obj=pod.ref,
                    detail=f"pending {now - since:.0f}s with no condition, Event or PodGroup condition saying why",
                    key=f"pending/{pod.uid}",
                )
            )
        return found

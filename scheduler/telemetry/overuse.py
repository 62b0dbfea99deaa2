"""Over-consumption, ghost and stray detection: a node's telemetry sample against what the scheduler allotted there.

Inputs are plain values the scheduler builds from its cluster state, per node, when a sample arrives:

- ``NodeSample``: the decoded ``wire.NodeTelemetry`` and when it was received (ns);
- ``NodeView``: the pods bound to that node (``PodView``: uid, namespace, name, queue, phase and, per device, the
  allotment in bytes: fraction x device memory, the ``gpu-memory`` bytes, or the whole device memory for a whole-GPU
  pod, and for KAI's per-container memory its limit), the holders of each device in the scheduler's accounting
  (``model.Device.holders``), every pod the scheduler knows (to tell a pod of another node from a pod it does not
  know), and the overuse policy per queue.

A pod with a limit above its allotment (KAI v0.18's ``nvidia.com/container.<c>.gpu-memory.limit``: dynamic
fractions) may use memory between the two while its device has measured headroom, the placement engine's measure:
total minus the peak of used memory over the headroom window, minus the headroom margin. Past its limit, or between
the two once the headroom is gone, it is over-consuming as any other pod.

``OveruseDetector.observe`` returns a ``NodeResult``: alert ``Transition`` values (firing or resolved, ready to become
a ``wire.Alert`` through ``to_alert``, a Kubernetes Event and a Prometheus series), ``Eviction`` decisions, the measured
memory per pod and device, the unattributed memory per device, and how many claims it dropped.

Why a state machine keyed per node: a sample describes one node, and the consumer evaluates each sample as it arrives
(20,000 a second at scale), so one observation touches only that node's conditions. A condition that a sample no
longer shows (the pod went back under, left the node, or was deleted) ends there, resolving its alert if it fired.
Conditions start at the ``now_ns`` of the first observation that shows them and fire at the first observation at least
the grace period later: timing is quantised to sample arrivals, which is what bounds ``sample_to_alert`` by the grace
period plus one interval. A pod that dips under and goes back over starts a new grace period, so flapping does not
re-fire within grace.

Attribution: a process counts for the pod its ``pod_uid`` names. A claim about a pod the scheduler knows but that is
not bound to the reporting node is dropped and counted (a node may only speak about its own pods; DESIGN.md, "NATS wire
protocol"); the rest of the sample stands. A process of no pod (``pod_uid`` None) or of a uid the scheduler does not
know is unattributed memory. ``used_memory_bytes`` None (the driver does not say) counts as 0 bytes but still shows the
process is there.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Final

from common import wire

OVERUSE_POLICY_ANNOTATION: Final = "quotient.dev/overuse-policy"
GROUP_HOLDER_PREFIX: Final = "gpu-group:"
"""A holder named ``gpu-group:<id>`` is a GPU group whose pods are all gone while its reservation pod still holds the
device (``NodeView.holders``)."""


class OverusePolicy(enum.StrEnum):
    """What the scheduler does about a pod over its allotment: alert only (the default), or evict after a grace."""

    ALERT = "alert"
    EVICT = "evict"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PolicyProblem:
    """Why a Queue's overuse-policy annotation is refused; the caller applies the cluster default and reports this."""

    annotation: str
    value: str
    message: str


def parse_policy(value: str) -> OverusePolicy | PolicyProblem:
    """The annotation's value, strictly: exactly ``alert`` or ``evict`` (no case folding, no blanks)."""
    for policy in OverusePolicy:
        if value == policy.value:
            return policy
    allowed = " or ".join(repr(policy.value) for policy in OverusePolicy)
    return PolicyProblem(
        annotation=OVERUSE_POLICY_ANNOTATION,
        value=value,
        message=f"{OVERUSE_POLICY_ANNOTATION} {value[:64]!r} is not {allowed}",
    )


def queue_policy(annotations: Mapping[str, str], *, default: OverusePolicy) -> OverusePolicy | PolicyProblem:
    """A Queue's policy from its annotations: its own when it sets one, else the cluster's ``default``."""
    value = annotations.get(OVERUSE_POLICY_ANNOTATION)
    return default if value is None else parse_policy(value)


class AlertName(enum.StrEnum):
    """The alerts of this package; each is the last token of its subject ``quotient.v1.alerts.<name>``."""

    GPU_MEMORY_OVERCONSUMPTION = "GpuMemoryOverconsumption"
    GHOST_ALLOCATION = "GhostAllocation"
    UNATTRIBUTED_GPU_MEMORY = "UnattributedGpuMemory"
    TELEMETRY_STALE = "TelemetryStale"
    GPU_UNHEALTHY = "GpuUnhealthy"
    TELEMETRY_CONFLICT = "TelemetryConflict"  # two live publishers claim one node (scheduler.telemetry.feed.conflicts)


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self is PodPhase.SUCCEEDED or self is PodPhase.FAILED


# --- inputs ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodDevice:
    """One device a pod holds on its node and the bytes it was allotted there. ``uuid`` identifies the device when
    given (and the sample lists it); ``index`` otherwise.

    ``whole``: the pod holds the whole device through the device plugin, whose choice of device the API does not
    show (the index is the scheduler's accounting). Where the pod's processes run on other devices than those, the
    devices they run on are the pod's."""

    index: int
    uuid: str | None = None
    allotted_bytes: int
    whole: bool = False
    limit_bytes: int = 0
    """The most the pod may use while the device has headroom (KAI's per-container memory limit); 0, or not above
    ``allotted_bytes``: held to its allotment."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """A pod as the scheduler knows it; ``node`` is None while it is not bound."""

    uid: str
    namespace: str
    name: str
    node: str | None
    queue: str
    phase: PodPhase
    devices: tuple[PodDevice, ...] = ()

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSample:
    """The latest accepted telemetry of a node and when the scheduler received it (its own clock, ns)."""

    telemetry: wire.NodeTelemetry
    received_ns: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """The scheduler's side of one node: ``pods`` bound to it; ``holders`` per device index (the pod uids its
    accounting says hold the device, ``model.Device.holders``); ``known_pods`` every pod it knows, by uid (a pod
    absent here is gone); ``policies`` per queue (absent: the detector's default)."""

    pods: Sequence[PodView]
    holders: Mapping[int, Sequence[str]]
    known_pods: Mapping[str, PodView]
    policies: Mapping[str, OverusePolicy]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Thresholds, all configurable so tests run them short.

    A pod is over when ``used > allotted + tolerance`` with ``tolerance = max(tolerance_bytes, allotted x
    tolerance_percent / 100)``: allocators round up and CUDA contexts take a few hundred MiB, so a small slack keeps a
    pod at its exact share quiet. ``grace_ns`` also applies to unattributed memory (short-lived tools such as
    ``nvidia-smi`` come and go); ``ghost_threshold_ns`` to both kinds of ghost. ``headroom_margin_bytes`` is the
    placement engine's margin (``--headroom-margin``): a device's headroom for use between a pod's allotment and its
    limit is its total minus the peak used over the headroom window minus this margin.
    """

    tolerance_bytes: int = 0
    tolerance_percent: int = 0
    grace_ns: int
    evict_grace_ns: int
    ghost_threshold_ns: int
    unattributed_threshold_bytes: int
    default_policy: OverusePolicy = OverusePolicy.ALERT
    headroom_margin_bytes: int = 0

    def tolerance_for(self, allotted_bytes: int) -> int:
        return max(self.tolerance_bytes, allotted_bytes * self.tolerance_percent // 100)


# --- outputs -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """An alert starting or ending. ``since_ns`` is when the condition began, ``at_ns`` when it was decided.
    ``neighbours`` are the other pods on the device (``namespace/name``, sorted), the ones at risk."""

    name: AlertName
    state: wire.AlertState
    severity: wire.Severity
    at_ns: int
    since_ns: int
    node: str
    pod_uid: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    queue: str | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    allotted_bytes: int | None = None
    used_bytes: int | None = None
    neighbours: tuple[str, ...] = ()
    message: str

    @property
    def series_key(self) -> tuple[str, str, str, int]:
        """What identifies the alert's Prometheus series and its firing/resolved pair."""
        return (self.name.value, self.node, self.pod_uid or "", -1 if self.gpu_index is None else self.gpu_index)

    def labels(self) -> dict[str, str]:
        """Alertmanager-style labels: the alert's name and every subject field that is set."""
        pairs = {
            "alertname": self.name.value,
            "severity": self.severity.value,
            "node": self.node,
            "namespace": self.pod_namespace,
            "pod": self.pod_name,
            "queue": self.queue,
            "gpu_uuid": self.gpu_uuid,
            "gpu_index": None if self.gpu_index is None else str(self.gpu_index),
        }
        return {key: value for key, value in pairs.items() if value is not None}


def to_alert(transition: Transition, *, emitter: str, boot: str, seq: int) -> wire.Alert:
    """The ``wire.Alert`` of a transition, stamped by the emitting scheduler (``emitter``, its ``boot`` and ``seq``)."""
    labels = transition.labels()
    if transition.neighbours:
        labels["neighbours"] = ",".join(transition.neighbours)[:1024]
    return wire.Alert(
        v=wire.SCHEMA_VERSION,
        node=emitter,
        boot=boot,
        seq=seq,
        ts_ns=transition.at_ns,
        name=transition.name.value,
        state=transition.state,
        severity=transition.severity,
        node_name=transition.node,
        pod_namespace=transition.pod_namespace,
        pod_name=transition.pod_name,
        pod_uid=transition.pod_uid,
        queue=transition.queue,
        gpu_uuid=transition.gpu_uuid,
        gpu_index=transition.gpu_index,
        allotted_bytes=transition.allotted_bytes,
        used_bytes=transition.used_bytes,
        since_ns=transition.since_ns,
        message=transition.message[:4096],
        labels=labels,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Eviction:
    """A decision to evict a pod that stayed over its allotment past the evict grace, under the ``evict`` policy."""

    pod_uid: str
    pod_namespace: str
    pod_name: str
    node: str
    queue: str
    gpu_uuid: str
    gpu_index: int
    allotted_bytes: int
    used_bytes: int
    at_ns: int
    reason: str = AlertName.GPU_MEMORY_OVERCONSUMPTION.value
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeResult:
    """What one observation decided. ``pod_used_bytes`` is keyed by (pod uid, device index); ``unattributed_bytes``
    by device index (every device of the sample, 0 included); ``foreign_claims`` counts the processes dropped."""

    transitions: tuple[Transition, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pod_used_bytes: Mapping[tuple[str, int], int]
    unattributed_bytes: Mapping[int, int]
    foreign_claims: int = 0

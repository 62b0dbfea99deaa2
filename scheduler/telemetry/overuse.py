"""Over-consumption, ghost and stray detection: a node's telemetry sample against what the scheduler allotted there.

Inputs are plain values the scheduler builds from its cluster state, per node, when a sample arrives:

- ``NodeSample``: the decoded ``wire.NodeTelemetry`` and when it was received (ns);
- ``NodeView``: the pods bound to that node (``PodView``: uid, namespace, name, queue, phase and, per device, the
  allotment in bytes: fraction x device memory, the ``gpu-memory`` bytes, or the whole device memory for a whole-GPU
  pod), the holders of each device in the scheduler's accounting (``model.Device.holders``), every pod the scheduler
  knows (to tell a pod of another node from a pod it does not know), and the overuse policy per queue.

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

from common import quantities, wire

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
    ``nvidia-smi`` come and go); ``ghost_threshold_ns`` to both kinds of ghost.
    """

    tolerance_bytes: int = 0
    tolerance_percent: int = 0
    grace_ns: int
    evict_grace_ns: int
    ghost_threshold_ns: int
    unattributed_threshold_bytes: int
    default_policy: OverusePolicy = OverusePolicy.ALERT

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


# --- attribution -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    """A sample's processes sorted out: bytes per (pod uid, device index), the set of (pod uid, device index) with a
    process, unattributed bytes per device index, and the number of dropped claims about other nodes' pods."""

    used: Mapping[tuple[str, int], int]
    present: frozenset[tuple[str, int]]
    unattributed: Mapping[int, int]
    foreign_claims: int


def attribute(telemetry: wire.NodeTelemetry, known_pods: Mapping[str, PodView]) -> Attribution:
    node = telemetry.node
    used: dict[tuple[str, int], int] = {}
    unattributed: dict[int, int] = {}
    foreign = 0
    for gpu in telemetry.gpus:
        stray = 0
        for process in gpu.processes:
            amount = process.used_memory_bytes or 0
            uid = process.pod_uid
            pod = None if uid is None else known_pods.get(uid)
            if uid is None or pod is None:
                stray += amount
            elif pod.node != node:
                foreign += 1
            else:
                key = (uid, gpu.index)
                used[key] = used.get(key, 0) + amount
        unattributed[gpu.index] = stray
    return Attribution(used=used, present=frozenset(used), unattributed=unattributed, foreign_claims=foreign)


# --- the detector ------------------------------------------------------------------------------------------------

_Key = tuple[AlertName, str, int]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Finding:
    """A condition the current sample shows, with everything its transitions need except state and times."""

    template: Transition
    grace_ns: int
    eviction: Eviction | None = None
    """Set under the ``evict`` policy: the decision to take once the alert has fired for the evict grace."""


@dataclasses.dataclass(slots=True)
class _Condition:
    since_ns: int
    finding: _Finding
    fired_ns: int | None = None
    evicted: bool = False


class OveruseDetector:
    """Per node, the conditions seen so far; ``observe`` advances them with a sample and returns what changed.

    Memory: one small record per condition that currently holds (at most a few per pod and device), dropped as soon
    as the condition ends; ``forget_node`` drops a deleted node's records and resolves its alerts.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conditions: dict[str, dict[_Key, _Condition]] = {}

    def observe(self, sample: NodeSample, view: NodeView, *, now_ns: int) -> NodeResult:
        telemetry = sample.telemetry
        node = telemetry.node
        attribution = attribute(telemetry, view.known_pods)
        findings = self._findings(telemetry, view, attribution)
        transitions: list[Transition] = []
        evictions: list[Eviction] = []
        previous = self._conditions.get(node, {})
        current: dict[_Key, _Condition] = {}
        for key, finding in findings.items():
            condition = previous.get(key)
            if condition is None:
                condition = _Condition(since_ns=now_ns, finding=finding)
            condition.finding = finding
            current[key] = condition
            self._advance(condition, now_ns, transitions, evictions)
        for key, condition in previous.items():
            if key not in current and condition.fired_ns is not None:
                transitions.append(_resolution(condition, now_ns, attribution))
        if current:
            self._conditions[node] = current
        else:
            self._conditions.pop(node, None)
        return NodeResult(
            transitions=tuple(transitions),
            evictions=tuple(evictions),
            pod_used_bytes=attribution.used,
            unattributed_bytes=attribution.unattributed,
            foreign_claims=attribution.foreign_claims,
        )

    def forget_node(self, node: str, *, now_ns: int) -> tuple[Transition, ...]:
        """Drop a node (deleted from the cluster); its firing alerts resolve."""
        conditions = self._conditions.pop(node, {})
        empty = Attribution(used={}, present=frozenset(), unattributed={}, foreign_claims=0)
        return tuple(_resolution(c, now_ns, empty) for c in conditions.values() if c.fired_ns is not None)

    def conditions(self) -> int:
        """How many conditions are held (for tests and a memory gauge)."""
        return sum(len(per_node) for per_node in self._conditions.values())

    def _advance(
        self, condition: _Condition, now_ns: int, transitions: list[Transition], evictions: list[Eviction]
    ) -> None:
        finding = condition.finding
        if condition.fired_ns is None:
            if now_ns - condition.since_ns < finding.grace_ns:
                return
            condition.fired_ns = now_ns
            transitions.append(
                dataclasses.replace(
                    finding.template, state=wire.AlertState.FIRING, at_ns=now_ns, since_ns=condition.since_ns
                )
            )
        if (
            finding.eviction is not None
            and not condition.evicted
            and now_ns - condition.fired_ns >= self._settings.evict_grace_ns
        ):
            condition.evicted = True
            evictions.append(_eviction(finding.eviction, now_ns=now_ns, since_ns=condition.since_ns))

    def _findings(
        self, telemetry: wire.NodeTelemetry, view: NodeView, attribution: Attribution
    ) -> dict[_Key, _Finding]:
        settings = self._settings
        node = telemetry.node
        by_uuid = {gpu.uuid: gpu for gpu in telemetry.gpus}
        by_index = {gpu.index: gpu for gpu in telemetry.gpus}
        on_device: dict[int, list[PodView]] = {}
        placed: list[tuple[PodView, PodDevice, wire.GpuReport]] = []
        running_on: dict[str, set[int]] = {}
        for uid, index in attribution.present:
            running_on.setdefault(uid, set()).add(index)
        for pod in view.pods:
            for device in _devices_in_use(pod, running_on.get(pod.uid), by_index):
                gpu = by_uuid.get(device.uuid) if device.uuid is not None else None
                gpu = gpu or by_index.get(device.index)
                if gpu is None:
                    continue
                placed.append((pod, device, gpu))
                on_device.setdefault(gpu.index, []).append(pod)
        findings: dict[_Key, _Finding] = {}
        for pod, device, gpu in placed:
            used = attribution.used.get((pod.uid, gpu.index), 0)
            allotted = device.allotted_bytes
            tolerance = settings.tolerance_for(allotted)
            ghost = pod.phase is PodPhase.RUNNING and (pod.uid, gpu.index) not in attribution.present
            if used <= allotted + tolerance and not ghost:
                continue  # the common case, kept cheap: nothing to name, no neighbours to list
            neighbours = tuple(sorted(other.display for other in on_device[gpu.index] if other.uid != pod.uid))
            if used > allotted + tolerance:
                policy = view.policies.get(pod.queue, settings.default_policy)
                findings[(AlertName.GPU_MEMORY_OVERCONSUMPTION, pod.uid, gpu.index)] = _Finding(
                    template=_pod_template(
                        AlertName.GPU_MEMORY_OVERCONSUMPTION,
                        pod,
                        gpu,
                        node=node,
                        severity=wire.Severity.CRITICAL if policy is OverusePolicy.EVICT else wire.Severity.WARNING,
                        allotted=allotted,
                        used=used,
                        neighbours=neighbours,
                        message=(
                            f"pod {pod.display} uses {quantities.format_bytes(used)} on GPU {gpu.index} ({gpu.uuid}) "
                            f"of node {node}, allotted {quantities.format_bytes(allotted)} (tolerance "
                            f"{quantities.format_bytes(tolerance)}); policy {policy.value}; neighbours at risk: "
                            f"{', '.join(neighbours) or 'none'}"
                        ),
                    ),
                    grace_ns=settings.grace_ns,
                    eviction=None
                    if policy is OverusePolicy.ALERT
                    else Eviction(
                        pod_uid=pod.uid,
                        pod_namespace=pod.namespace,
                        pod_name=pod.name,
                        node=node,
                        queue=pod.queue,
                        gpu_uuid=gpu.uuid,
                        gpu_index=gpu.index,
                        allotted_bytes=allotted,
                        used_bytes=used,
                        at_ns=0,
                        message="",
                    ),
                )
            if ghost:
                findings[(AlertName.GHOST_ALLOCATION, pod.uid, gpu.index)] = _Finding(
                    template=_pod_template(
                        AlertName.GHOST_ALLOCATION,
                        pod,
                        gpu,
                        node=node,
                        severity=wire.Severity.WARNING,
                        allotted=allotted,
                        used=0,
                        neighbours=neighbours,
                        message=(
                            f"running pod {pod.display} holds {quantities.format_bytes(allotted)} on GPU {gpu.index} "
                            f"({gpu.uuid}) of node {node} but has no process there"
                        ),
                    ),
                    grace_ns=settings.ghost_threshold_ns,
                )
        for index, holders in view.holders.items():
            gpu = by_index.get(index)
            for uid in holders:
                holder = view.known_pods.get(uid)
                if holder is not None and not holder.phase.terminal:
                    continue
                if uid.startswith(GROUP_HOLDER_PREFIX):
                    what = (
                        f"GPU group {uid.removeprefix(GROUP_HOLDER_PREFIX)}, whose pods are all gone while its "
                        "reservation pod still holds the device"
                    )
                elif holder is None:
                    what = "a pod that is gone"
                else:
                    what = f"pod {holder.display}, which has {holder.phase.value}"
                findings[(AlertName.GHOST_ALLOCATION, uid, index)] = _Finding(
                    template=Transition(
                        name=AlertName.GHOST_ALLOCATION,
                        state=wire.AlertState.FIRING,
                        severity=wire.Severity.WARNING,
                        at_ns=0,
                        since_ns=0,
                        node=node,
                        pod_uid=uid,
                        pod_namespace=None if holder is None else holder.namespace,
                        pod_name=None if holder is None else holder.name,
                        queue=None if holder is None else holder.queue,
                        gpu_uuid=None if gpu is None else gpu.uuid,
                        gpu_index=index,
                        message=f"GPU {index} of node {node} is still allotted to {what}"
                        + ("" if uid.startswith(GROUP_HOLDER_PREFIX) else f" (uid {uid})"),
                    ),
                    grace_ns=settings.ghost_threshold_ns,
                )
        for gpu in telemetry.gpus:
            stray = attribution.unattributed.get(gpu.index, 0)
            if stray > settings.unattributed_threshold_bytes:
                findings[(AlertName.UNATTRIBUTED_GPU_MEMORY, "", gpu.index)] = _Finding(
                    template=Transition(
                        name=AlertName.UNATTRIBUTED_GPU_MEMORY,
                        state=wire.AlertState.FIRING,
                        severity=wire.Severity.WARNING,
                        at_ns=0,
                        since_ns=0,
                        node=node,
                        gpu_uuid=gpu.uuid,
                        gpu_index=gpu.index,
                        used_bytes=stray,
                        message=(
                            f"{quantities.format_bytes(stray)} of GPU {gpu.index} ({gpu.uuid}) on node {node} is used "
                            f"by processes of no known pod (threshold "
                            f"{quantities.format_bytes(settings.unattributed_threshold_bytes)})"
                        ),
                    ),
                    grace_ns=settings.grace_ns,
                )
        return findings


def _devices_in_use(
    pod: PodView, running_on: set[int] | None, by_index: Mapping[int, wire.GpuReport]
) -> tuple[PodDevice, ...]:
    """The pod's devices; for a whole-GPU pod whose processes run elsewhere than the scheduler's accounting says, the
    devices they run on (each allotted whole)."""
    devices = pod.devices
    if not running_on or not devices or not devices[0].whole or not all(device.whole for device in devices):
        return pod.devices
    if running_on <= {device.index for device in pod.devices}:
        return pod.devices
    return tuple(
        PodDevice(index=index, allotted_bytes=by_index[index].memory_total_bytes, whole=True)
        for index in sorted(running_on)
        if index in by_index
    )


def _pod_template(
    name: AlertName,
    pod: PodView,
    gpu: wire.GpuReport,
    *,
    node: str,
    severity: wire.Severity,
    allotted: int,
    used: int,
    neighbours: tuple[str, ...],
    message: str,
) -> Transition:
    return Transition(
        name=name,
        state=wire.AlertState.FIRING,
        severity=severity,
        at_ns=0,
        since_ns=0,
        node=node,
        pod_uid=pod.uid,
        pod_namespace=pod.namespace,
        pod_name=pod.name,
        queue=pod.queue,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        allotted_bytes=allotted,
        used_bytes=used,
        neighbours=neighbours,
        message=message,
    )


def _resolution(condition: _Condition, now_ns: int, attribution: Attribution) -> Transition:
    template = condition.finding.template
    used = template.used_bytes
    if template.pod_uid is not None and template.gpu_index is not None and template.used_bytes is not None:
        used = attribution.used.get((template.pod_uid, template.gpu_index), 0)
    if template.name is AlertName.UNATTRIBUTED_GPU_MEMORY and template.gpu_index is not None:
        used = attribution.unattributed.get(template.gpu_index, 0)
    return dataclasses.replace(
        template,
        state=wire.AlertState.RESOLVED,
        at_ns=now_ns,
        since_ns=condition.since_ns,
        used_bytes=used,
        message=f"resolved: {template.message}" if used is None else _resolved_message(template, used),
    )


def _resolved_message(template: Transition, used: int) -> str:
    subject = f"pod {template.pod_namespace}/{template.pod_name}" if template.pod_name else f"node {template.node}"
    return (
        f"resolved: {subject} now at {quantities.format_bytes(used)} on GPU {template.gpu_index}"
        f" ({template.gpu_uuid}); was: {template.message}"
    )


def _eviction(finding: Eviction, *, now_ns: int, since_ns: int) -> Eviction:
    return dataclasses.replace(
        finding,
        at_ns=now_ns,
        message=(
            f"evicted under queue {finding.queue}'s overuse policy: {quantities.format_bytes(finding.used_bytes)} "
            f"used against {quantities.format_bytes(finding.allotted_bytes)} allotted on GPU {finding.gpu_index} "
            f"({finding.gpu_uuid}) of node {finding.node} for {(now_ns - since_ns) / quantities.NS_PER_S:.1f}s"
        ),
    )

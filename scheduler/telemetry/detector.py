"""The over-consumption detector: per node, the conditions its samples show, advanced into alerts and evictions.

``overuse`` defines what the detector reads (``NodeSample``, ``NodeView``) and what it decides (``Transition``,
``Eviction``, ``NodeResult``); this module is the machine. ``attribute`` sorts a sample's processes out by pod and
device (a claim about a pod the scheduler knows but that is not bound to the reporting node is dropped and counted);
``OveruseDetector.observe`` compares what each pod uses with what it was allotted, finds the conditions that hold
(over-consumption, a ghost allocation, unattributed memory), and advances each one: it fires once it has held for
its grace period, resolves when a sample no longer shows it, and, under the ``evict`` policy, becomes an eviction
once it has fired for the evict grace.

A pod with a memory limit above its allotment (``overuse.PodDevice.limit_bytes``) is over-consuming only past its
limit, or between the two once its device's measured headroom (total minus the window's peak, the current sample
included, minus ``Settings.headroom_margin_bytes``) is gone: then its neighbours are at risk as with any over-use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from common import quantities, wire
from scheduler.telemetry import overuse

# --- attribution -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    """A sample's processes sorted out: bytes per (pod uid, device index), the set of (pod uid, device index) with a
    process, unattributed bytes per device index, and the number of dropped claims about other nodes' pods."""

    used: Mapping[tuple[str, int], int]
    present: frozenset[tuple[str, int]]
    unattributed: Mapping[int, int]
    foreign_claims: int


def attribute(telemetry: wire.NodeTelemetry, known_pods: Mapping[str, overuse.PodView]) -> Attribution:
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

_Key = tuple[overuse.AlertName, str, int]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Finding:
    """A condition the current sample shows, with everything its transitions need except state and times."""

    template: overuse.Transition
    grace_ns: int
    eviction: overuse.Eviction | None = None
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

    def __init__(self, settings: overuse.Settings) -> None:
        self._settings = settings
        self._conditions: dict[str, dict[_Key, _Condition]] = {}

    def observe(
        self,
        sample: overuse.NodeSample,
        view: overuse.NodeView,
        *,
        now_ns: int,
        peak_used_bytes: Mapping[int, int] | None = None,
    ) -> overuse.NodeResult:
        """Advance the node's conditions with ``sample``. ``peak_used_bytes``: per device index, the peak of used
        memory over the headroom window before this sample (``headroom.HeadroomTracker.peaks``), for pods allowed
        above their allotment up to a limit; without it the sample alone is the peak."""
        telemetry = sample.telemetry
        node = telemetry.node
        attribution = attribute(telemetry, view.known_pods)
        findings = self._findings(telemetry, view, attribution, peak_used_bytes or {})
        transitions: list[overuse.Transition] = []
        evictions: list[overuse.Eviction] = []
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
        return overuse.NodeResult(
            transitions=tuple(transitions),
            evictions=tuple(evictions),
            pod_used_bytes=attribution.used,
            unattributed_bytes=attribution.unattributed,
            foreign_claims=attribution.foreign_claims,
        )

    def forget_node(self, node: str, *, now_ns: int) -> tuple[overuse.Transition, ...]:
        """Drop a node (deleted from the cluster); its firing alerts resolve."""
        conditions = self._conditions.pop(node, {})
        empty = Attribution(used={}, present=frozenset(), unattributed={}, foreign_claims=0)
        return tuple(_resolution(c, now_ns, empty) for c in conditions.values() if c.fired_ns is not None)

    def conditions(self) -> int:
        """How many conditions are held (for tests and a memory gauge)."""
        return sum(len(per_node) for per_node in self._conditions.values())

    def _advance(
        self,
        condition: _Condition,
        now_ns: int,
        transitions: list[overuse.Transition],
        evictions: list[overuse.Eviction],
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
        self,
        telemetry: wire.NodeTelemetry,
        view: overuse.NodeView,
        attribution: Attribution,
        peaks: Mapping[int, int],
    ) -> dict[_Key, _Finding]:
        settings = self._settings
        node = telemetry.node
        by_uuid = {gpu.uuid: gpu for gpu in telemetry.gpus}
        by_index = {gpu.index: gpu for gpu in telemetry.gpus}
        on_device: dict[int, list[overuse.PodView]] = {}
        placed: list[tuple[overuse.PodView, overuse.PodDevice, wire.GpuReport]] = []
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
            ghost = pod.phase is overuse.PodPhase.RUNNING and (pod.uid, gpu.index) not in attribution.present
            if used <= allotted + tolerance and not ghost:
                continue  # the common case, kept cheap: nothing to name, no neighbours to list
            neighbours = tuple(sorted(other.display for other in on_device[gpu.index] if other.uid != pod.uid))
            over = used > allotted + tolerance
            why = ""
            if over and device.limit_bytes > allotted:
                headroom = _headroom(gpu, peaks, settings.headroom_margin_bytes)
                if used > device.limit_bytes + settings.tolerance_for(device.limit_bytes):
                    allotted, tolerance = device.limit_bytes, settings.tolerance_for(device.limit_bytes)
                    why = " (its limit)"
                elif headroom > 0:
                    over = False  # between its request and its limit, while the device has room: allowed
                else:
                    why = (
                        f" (its request; its limit {quantities.format_bytes(device.limit_bytes)} holds only while "
                        f"the device has headroom, and it has {quantities.format_bytes(headroom)})"
                    )
            if over:
                policy = view.policies.get(pod.queue, settings.default_policy)
                findings[(overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION, pod.uid, gpu.index)] = _Finding(
                    template=_pod_template(
                        overuse.AlertName.GPU_MEMORY_OVERCONSUMPTION,
                        pod,
                        gpu,
                        node=node,
                        severity=wire.Severity.CRITICAL
                        if policy is overuse.OverusePolicy.EVICT
                        else wire.Severity.WARNING,
                        allotted=allotted,
                        used=used,
                        neighbours=neighbours,
                        message=(
                            f"pod {pod.display} uses {quantities.format_bytes(used)} on GPU {gpu.index} ({gpu.uuid}) "
                            f"of node {node}, allotted {quantities.format_bytes(allotted)}{why} (tolerance "
                            f"{quantities.format_bytes(tolerance)}); policy {policy.value}; neighbours at risk: "
                            f"{', '.join(neighbours) or 'none'}"
                        ),
                    ),
                    grace_ns=settings.grace_ns,
                    eviction=None
                    if policy is overuse.OverusePolicy.ALERT
                    else overuse.Eviction(
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
                findings[(overuse.AlertName.GHOST_ALLOCATION, pod.uid, gpu.index)] = _Finding(
                    template=_pod_template(
                        overuse.AlertName.GHOST_ALLOCATION,
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
                if uid.startswith(overuse.GROUP_HOLDER_PREFIX):
                    what = (
                        f"GPU group {uid.removeprefix(overuse.GROUP_HOLDER_PREFIX)}, whose pods are all gone while its "
                        "reservation pod still holds the device"
                    )
                elif holder is None:
                    what = "a pod that is gone"
                else:
                    what = f"pod {holder.display}, which has {holder.phase.value}"
                findings[(overuse.AlertName.GHOST_ALLOCATION, uid, index)] = _Finding(
                    template=overuse.Transition(
                        name=overuse.AlertName.GHOST_ALLOCATION,
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
                        + ("" if uid.startswith(overuse.GROUP_HOLDER_PREFIX) else f" (uid {uid})"),
                    ),
                    grace_ns=settings.ghost_threshold_ns,
                )
        for gpu in telemetry.gpus:
            stray = attribution.unattributed.get(gpu.index, 0)
            if stray > settings.unattributed_threshold_bytes:
                findings[(overuse.AlertName.UNATTRIBUTED_GPU_MEMORY, "", gpu.index)] = _Finding(
                    template=overuse.Transition(
                        name=overuse.AlertName.UNATTRIBUTED_GPU_MEMORY,
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


def _headroom(gpu: wire.GpuReport, peaks: Mapping[int, int], margin_bytes: int) -> int:
    """The device's measured headroom: total minus the peak of used memory over the window (this sample included)
    minus the margin, as placement measures it (``headroom``, ``placement.devices.measured_free_bytes``)."""
    peak = max(peaks.get(gpu.index, 0), gpu.memory_used_bytes)
    return gpu.memory_total_bytes - peak - margin_bytes


def _devices_in_use(
    pod: overuse.PodView, running_on: set[int] | None, by_index: Mapping[int, wire.GpuReport]
) -> tuple[overuse.PodDevice, ...]:
    """The pod's devices; for a whole-GPU pod whose processes run elsewhere than the scheduler's accounting says, the
    devices they run on (each allotted whole)."""
    devices = pod.devices
    if not running_on or not devices or not devices[0].whole or not all(device.whole for device in devices):
        return pod.devices
    if running_on <= {device.index for device in pod.devices}:
        return pod.devices
    return tuple(
        overuse.PodDevice(index=index, allotted_bytes=by_index[index].memory_total_bytes, whole=True)
        for index in sorted(running_on)
        if index in by_index
    )


def _pod_template(
    name: overuse.AlertName,
    pod: overuse.PodView,
    gpu: wire.GpuReport,
    *,
    node: str,
    severity: wire.Severity,
    allotted: int,
    used: int,
    neighbours: tuple[str, ...],
    message: str,
) -> overuse.Transition:
    return overuse.Transition(
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


def _resolution(condition: _Condition, now_ns: int, attribution: Attribution) -> overuse.Transition:
    template = condition.finding.template
    used = template.used_bytes
    if template.pod_uid is not None and template.gpu_index is not None and template.used_bytes is not None:
        used = attribution.used.get((template.pod_uid, template.gpu_index), 0)
    if template.name is overuse.AlertName.UNATTRIBUTED_GPU_MEMORY and template.gpu_index is not None:
        used = attribution.unattributed.get(template.gpu_index, 0)
    return dataclasses.replace(
        template,
        state=wire.AlertState.RESOLVED,
        at_ns=now_ns,
        since_ns=condition.since_ns,
        used_bytes=used,
        message=f"resolved: {template.message}" if used is None else _resolved_message(template, used),
    )


def _resolved_message(template: overuse.Transition, used: int) -> str:
    subject = f"pod {template.pod_namespace}/{template.pod_name}" if template.pod_name else f"node {template.node}"
    return (
        f"resolved: {subject} now at {quantities.format_bytes(used)} on GPU {template.gpu_index}"
        f" ({template.gpu_uuid}); was: {template.message}"
    )


def _eviction(finding: overuse.Eviction, *, now_ns: int, since_ns: int) -> overuse.Eviction:
    return dataclasses.replace(
        finding,
        at_ns=now_ns,
        message=(
            f"evicted under queue {finding.queue}'s overuse policy: {quantities.format_bytes(finding.used_bytes)} "
            f"used against {quantities.format_bytes(finding.allotted_bytes)} allotted on GPU {finding.gpu_index} "
            f"({finding.gpu_uuid}) of node {finding.node} for {(now_ns - since_ns) / quantities.NS_PER_S:.1f}s"
        ),
    )


def _severity(policy: overuse.OverusePolicy) -> wire.Severity:
    """Over-consumption is critical where it ends in an eviction, a warning where it only alerts."""
    return wire.Severity.CRITICAL if policy is overuse.OverusePolicy.EVICT else wire.Severity.WARNING

"""Kubernetes objects as the scheduler reads them: frozen, typed records, decoded once when the watch delivers them.

The API sends JSON; the scheduler reads a few dozen fields of it, many times (every snapshot that rebuilds a node
reads every pod on it, the telemetry reads the pods of every sampled node, status writing reads the pending ones).
So each object is decoded once, at the reflector, into one of these records, and nothing beyond the Kubernetes edge
(``scheduler.kube``) and the decoders of this package ever reads raw JSON. A record keeps the object's identity and
``resource_version`` (the reflector reuses a record while the version is unchanged) and, for the fields that may be
invalid (a bad quantity, a bad GPU annotation, a bad queue spec), either the value or a ``Problem`` that says what is
wrong, so a bad object is reported, never a crash.

Records are values: equal records mean nothing the scheduler reads has changed. Their mappings (labels,
annotations) are the decoded JSON's own and are never mutated.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from common.resources import Resources
from scheduler.objects import gpurequest
from scheduler.placement import model


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Why (part of) an object could not be read: ``field`` is the path inside the object."""

    field: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OwnerRef:
    """One entry of ``metadata.ownerReferences``."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False


class Phase(enum.StrEnum):
    """A pod's ``status.phase``; UNKNOWN also stands for an absent or unrecognised phase."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @property
    def terminated(self) -> bool:
        return self is Phase.SUCCEEDED or self is Phase.FAILED


class ReservationPhase(enum.StrEnum):
    """Where a reservation pod is in its life (DESIGN.md, "Fractional GPUs"), as far as its object shows it."""

    CREATING = "creating"
    WAITING_FOR_UUID = "waiting-for-uuid"
    READY = "ready"
    DRAINING = "draining"
    DELETED = "deleted"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """A reservation pod: the pod that holds one shared GPU for its GPU group. ``failed``: the pod ended (it never
    will report a device)."""

    group: str
    node: str
    namespace: str
    name: str
    uid: str
    phase: ReservationPhase
    uuid: str | None = None
    index: int | None = None
    failed: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Scheduling:
    """What a pod's spec asks of the node it runs on, beyond resources."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[model.AffinityTerm, ...] | Problem = ()
    tolerations: tuple[model.Toleration, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    """A pod: who it is, where it is, what it asks for and what the binder recorded on it."""

    api_version: ClassVar[str] = "v1"
    kind: ClassVar[str] = "Pod"

    namespace: str
    name: str
    uid: str
    resource_version: str = ""
    created_ns: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set: the pod is terminating."""
    scheduler_name: str = ""
    priority_class: str | None = None
    """``spec.priorityClassName``."""
    node: str | None = None
    """``spec.nodeName``: None while the pod is not bound."""
    phase: Phase = Phase.PENDING
    started_ns: int | None = None
    nominated_node: str | None = None
    requests: Resources | Problem = model.ONE_POD
    """CPU, memory and one pod slot as the kubelet counts them (GPUs are in ``gpu``)."""
    gpu: gpurequest.GpuRequest | gpurequest.AnnotationProblem = gpurequest.NO_GPU
    scheduling: Scheduling = dataclasses.field(default_factory=Scheduling)
    pod_group: str | None = None
    """The ``pod-group-name`` annotation: the PodGroup (in the pod's namespace) the pod belongs to."""
    subgroup: str | None = None
    task_priority: int | Problem | None = None
    """KAI's ``kai.scheduler/task-priority`` label: the pod's place among its group's pending pods (higher first,
    labelled before unlabelled); None without the label, a ``Problem`` when it is not an integer (KAI then orders
    the pod after every valid one)."""
    devices: tuple[int, ...] = ()
    """The device indexes the binder recorded (``quotient.dev/gpu-devices``)."""
    share_milli: int = 0
    """The milli-GPU per device the binder recorded for a share (``quotient.dev/gpu-share``); 0 when unrecorded."""
    gpu_groups: tuple[str, ...] = ()
    """The GPU groups of a share, one per device: ``quotient.dev/gpu-groups``, else KAI's ``runai-gpu-group``."""
    gpu_uuids: tuple[str, ...] = ()
    """The UUIDs of a share's devices (``quotient.dev/gpu-uuids``), in device order."""
    configmap: str | None = None
    """The ConfigMap the admission webhook wired the share's GPU environment to."""
    reservation: Reservation | None = None
    """Set when the pod is a reservation pod."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminated(self) -> bool:
        return self.phase.terminated

    @property
    def holds_room(self) -> bool:
        """Bound and not finished: the pod uses its node's resources."""
        return self.node is not None and not self.phase.terminated


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeRecord:
    """A node as placement reads it (its heartbeats and status details are left out, so they compare equal)."""

    api_version: ClassVar[str] = "v1"
    kind: ClassVar[str] = "Node"

    name: str
    uid: str = ""
    resource_version: str = dataclasses.field(default="", compare=False)
    namespace: str = ""
    capacity: Resources | Problem = model.ZERO
    """Allocatable CPU, memory, pod slots and ``milli_gpu`` (devices x 1000)."""
    gpu_count: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[model.Taint, ...] = ()
    ready: bool = False
    unschedulable: bool = False
    device_memory_bytes: int = 0
    health_cleared_ns: int | Problem = 0
    """When an operator cleared the node's GPU health reports (``quotient.dev/gpu-health-cleared-at``); 0: never; a
    ``Problem`` when the annotation is not a time."""
    """Per device, from the ``nvidia.com/gpu.memory`` label; 0 when unknown."""

    @property
    def key(self) -> tuple[str, str]:
        return ("", self.name)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueRecord:
    """A ``scheduling.run.ai/v2`` Queue: its spec as the model's ``Queue``, or why it cannot be read."""

    api_version: ClassVar[str] = "scheduling.run.ai/v2"
    kind: ClassVar[str] = "Queue"

    name: str
    uid: str = ""
    resource_version: str = dataclasses.field(default="", compare=False)
    namespace: str = ""
    queue: model.Queue | Problem
    overuse_policy: str | None = None
    """The raw ``quotient.dev/overuse-policy`` annotation (validated where it is used)."""

    @property
    def key(self) -> tuple[str, str]:
        return ("", self.name)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubGroupSpec:
    """One entry of a PodGroup's ``spec.subGroups`` as written: a node of KAI's subgroup tree (v0.13 and later).

    A leaf (no other entry names it as ``parent``) holds pods, which name it in ``kai.scheduler/subgroup-name``, and
    needs ``min_member`` of them; a mid-level subgroup needs ``min_subgroup`` of its direct children satisfied (all of
    them when unset). KAI's meaning of the unset and zero values: a leaf's ``minMember`` unset or 0 is no gang
    requirement for that leaf."""

    name: str
    parent: str | None = None
    min_member: int | None = None
    min_subgroup: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodGroupRecord:
    """A ``scheduling.run.ai/v2alpha2`` PodGroup: the gang and how it is scheduled."""

    api_version: ClassVar[str] = "scheduling.run.ai/v2alpha2"
    kind: ClassVar[str] = "PodGroup"

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = dataclasses.field(default="", compare=False)
    created_ns: int = 0
    min_member: int = 1
    queue: str = ""
    priority_class: str = ""
    preemptibility: str | None = None
    """``preemptible``, ``non-preemptible``, or None: decided by the priority."""
    min_member_declared: int | None = None
    """``spec.minMember`` as written (None: unset). 0 is KAI's "no gang requirement": every pod is elastic.
    ``min_member`` reads 0 and unset as 1; the snapshot reads this field for KAI's 0 (``state.snapshot``)."""
    min_subgroup: int | None = None
    """``spec.minSubGroup``: how many of the top-level subgroups must be satisfied (None: all of them)."""
    subgroup_tree: tuple[SubGroupSpec, ...] = ()
    """Every ``spec.subGroups`` entry, in the order written, with its parent and minimums."""
    preemption_delay_ns: int = 0
    """``spec.preemptionDelay``, else the PodGroup's ``kai.scheduler/preemption-delay`` annotation: how long the
    group must be pending, counted from ``max(created_ns, last_eviction_ns)``, before it may trigger evictions
    (preempt, reclaim, consolidate). 0: none."""
    last_eviction_ns: int = 0
    """``kai.scheduler/last-eviction-timestamp`` (RFC 3339): when the scheduler last evicted the group; 0: never."""
    staleness_grace_ns: int | None = None
    """``spec.stalenessGracePeriod``, else the ``kai.scheduler/staleness-grace-period`` annotation: how long the
    group may run below its minimum before it is evicted as stale. None: the scheduler's ``--stale-gang-grace``;
    negative: never evicted as stale."""
    problems: tuple[Problem, ...] = ()
    """What in the spec could not be read (a bad duration, a broken subgroup tree, ...): each field at fault with
    why. The rest of the record is still read; a field with a problem keeps its default."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClassRecord:
    """A ``scheduling.k8s.io/v1`` PriorityClass; ``value`` None when it is not an integer."""

    api_version: ClassVar[str] = "scheduling.k8s.io/v1"
    kind: ClassVar[str] = "PriorityClass"

    name: str
    uid: str = ""
    resource_version: str = dataclasses.field(default="", compare=False)
    namespace: str = ""
    value: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return ("", self.name)

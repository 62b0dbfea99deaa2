"""The snapshot the placement core reads: nodes and their GPUs, queues, groups of pods, the time and the config.

Everything here is an immutable value with integer accounting (millicores, bytes, milli-GPU where 1000 is one
device, nanoseconds), so a snapshot can be shared between the cycle, the simulator and tests without copies and
without anybody mutating it. KAI's user-facing units (GPU devices with fractions, memory in MB, durations) are
converted at the edge (the Kubernetes adapters, the simulator, the scenario loader); the model takes integers.

Who keeps what consistent: a node carries its own usage (``Node.used`` and each ``Device``'s allotment), which
includes the pods of other schedulers and the reservation pods of shared GPUs, and every running pod of a group
names its node and devices. The engine trusts the node's figures for capacity and the pods' figures for what an
eviction gives back, so a snapshot builder must keep the two in step (``plan.apply`` does, for the simulator).

The engine keeps indexes between cycles keyed by the identity of ``Node`` and ``Group`` objects: a builder that
reuses the unchanged objects from one snapshot to the next gets cycles that cost only what changed. A snapshot's
mappings must never be mutated once it is built (build a new mapping for the next snapshot): the engine recognises
an unchanged ``groups`` mapping by identity and then skips reading it at all.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import NewType

from common import names, quantities
from common.resources import Resources
from scheduler.placement import scoring

NodeName = NewType("NodeName", str)
PodUid = NewType("PodUid", str)
QueueName = NewType("QueueName", str)
GroupId = NewType("GroupId", str)
GpuGroupId = NewType("GpuGroupId", str)
"""One shared physical GPU: the id of the group of pods that share it (KAI's ``runai-gpu-group`` label)."""
GpuUuid = NewType("GpuUuid", str)

UNLIMITED = -1
"""KAI's ``-1``: for a quota, as much as requested; for a limit, no cap."""

MILLI_GPU_PER_DEVICE = quantities.MILLI_GPU_PER_GPU
ZERO = Resources()
ONE_POD = Resources(pods=1)
"""The request of a pod that asks for nothing but its slot."""


# --- Nodes and devices -------------------------------------------------------------------------------------------


class ComputeMode(enum.StrEnum):
    """How the shares of one GPU divide its compute (KAI v0.18's ``gpu-compute.mode``): shares of different modes
    never share a device, so a GPU group takes the mode of its first share."""

    TIME_SLICING = names.TIME_SLICING
    SM_SHARING = names.SM_SHARING


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One physical GPU of a node, as the scheduler accounts for it.

    ``allotted_milli_gpu`` is the sum of what is given out on this device: 1000 when a pod holds it whole (or a pod
    of another scheduler does), the sum of the shares of its GPU group when it is shared, 0 when free. ``holders``
    are the pods that hold it (sorted uids; empty for an unknown holder that still counts through the allotment).
    A shared device has ``gpu_group``; the group's reservation pod holds the whole device for the node.

    ``peak_used_bytes`` is the measured peak of used memory over the telemetry window, or None without telemetry;
    when ``telemetry_stale`` the engine ignores it and accounts by requests only. ``unattributed_bytes`` is memory
    used by processes that map to no pod (for messages). An unhealthy device takes no new work. ``compute_mode`` is
    the mode of its GPU group's shares (None on a shared device reads as time-slicing, KAI's default).
    """

    index: int
    uuid: GpuUuid
    model: str
    memory_bytes: int
    allotted_milli_gpu: int = 0
    holders: tuple[PodUid, ...] = ()
    whole: bool = False
    """True when one pod holds the device whole (a ``nvidia.com/gpu`` request), not as a share."""
    gpu_group: GpuGroupId | None = None
    peak_used_bytes: int | None = None
    telemetry_stale: bool = False
    unattributed_bytes: int = 0
    healthy: bool = True
    compute_mode: ComputeMode | None = None

    @property
    def is_free(self) -> bool:
        """Free for a whole-GPU pod or a new GPU group: nothing allotted, nobody holding it, healthy."""
        return self.allotted_milli_gpu == 0 and not self.holders and self.gpu_group is None and self.healthy


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A node: what it offers, what is already used on it, and its GPUs.

    ``allocatable.milli_gpu`` is the number of devices times 1000. ``used`` is the sum of the requests of every pod
    bound to the node (ours, other schedulers', reservation pods) in millicores, bytes and pod slots; its
    ``milli_gpu`` is informative only, the devices are the truth for GPUs.
    """

    name: NodeName
    allocatable: Resources
    used: Resources = ZERO
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    """Cordoned (``spec.unschedulable``): takes no new pods, keeps the ones it has."""
    devices: tuple[Device, ...] = ()


# --- Pods and groups ---------------------------------------------------------------------------------------------


class Operator(enum.StrEnum):
    """Node selector requirement operators of Kubernetes' required node affinity."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    """One match expression: ``key operator values`` (Gt/Lt take one integer value)."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AffinityTerm:
    """One ``nodeSelectorTerm``: its expressions are ANDed; the terms of a pod are ORed."""

    expressions: tuple[Requirement, ...]


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Toleration:
    """A toleration; an empty key with ``Exists`` tolerates everything, ``effect`` None matches every effect."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuShare:
    """A fractional GPU request on ``devices`` devices: either ``milli_gpu`` (0 < x < 1000) or ``memory_bytes``.

    A ``memory_bytes`` share becomes, on each device, the milli-GPU ``ceil(memory_bytes * 1000 / device memory)``,
    so the same pod takes a smaller share of a bigger GPU. It joins only a device whose GPU group has its
    ``compute_mode`` (or opens a group on a free one).
    """

    milli_gpu: int = 0
    memory_bytes: int = 0
    devices: int = 1
    compute_mode: ComputeMode = ComputeMode.TIME_SLICING


UNLABELLED_TASK = 1 << 40
"""``Pod.task_order`` of a pod without KAI's ``kai.scheduler/task-priority`` label: after every labelled pod."""
UNREADABLE_TASK = 1 << 39
"""``Pod.task_order`` of a pod whose label is not an integer: after the readable ones, before the unlabelled (KAI's
task order)."""


def task_order(priority: int | None, *, unreadable: bool = False) -> int:
    """A pod's place in KAI's task order (lower first): a higher ``kai.scheduler/task-priority`` first, a labelled
    pod before an unlabelled one, an unreadable label after every readable one."""
    if priority is not None:
        return -priority
    return UNREADABLE_TASK if unreadable else UNLABELLED_TASK


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    """Bound to a node (KAI counts bound and running pods alike against the queue)."""
    SUCCEEDED = "Succeeded"
    """Completed: holds nothing, counts as a satisfied member of its gang."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pod:
    """A member of a group.

    ``requests`` carries CPU, memory, pod slots (normally 1) and whole GPUs as ``milli_gpu`` (a multiple of 1000);
    a fractional pod has ``share`` instead and ``requests.milli_gpu == 0``. Constraints: ``node_selector`` (sorted
    pairs, all must match), ``affinity`` (required node affinity: terms ORed), ``tolerations``, and ``gpu_models``
    (allowed values of the device model; empty: any; the edge derives it from affinity on ``nvidia.com/gpu.product``
    or sets it directly). Priority and preemptibility belong to the group (KAI decides them per PodGroup).

    A running pod names its ``node`` and ``devices`` (indexes on the node); a running share also names its
    ``gpu_groups`` (one per device) and the ``allotted_milli_gpu`` it holds on each device. ``started_ns`` (when it
    was bound) drives the queues' min-runtimes; the creation time stands in where it is unknown.

    ``task_order`` is the pod's place among its group's pods (``task_order()``, lower first; KAI's task order):
    pending members are taken by it, then by creation time and uid, and elastic members are evicted in the reverse
    order.
    """

    uid: PodUid
    name: str
    namespace: str = "default"
    requests: Resources = ONE_POD
    share: GpuShare | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[AffinityTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    gpu_models: tuple[str, ...] = ()
    created_ns: int = 0
    phase: PodPhase = PodPhase.PENDING
    subgroup: str | None = None
    node: NodeName | None = None
    devices: tuple[int, ...] = ()
    gpu_groups: tuple[GpuGroupId, ...] = ()
    allotted_milli_gpu: int = 0
    started_ns: int | None = None
    nominated_node: NodeName | None = None
    """Where an earlier cycle made room for this pending pod by evicting others (Kubernetes'
    ``status.nominatedNodeName``): such groups are placed before any other, so nobody else takes that room."""
    task_order: int = UNLABELLED_TASK
    leaving: bool = False
    """A running pod whose deletion was asked (an eviction under way: KAI's *releasing* pod): it still holds its room
    until it is gone, but it is no victim (evicting it again frees nothing more), and a group nominated to its node
    waits for it instead of making room again."""

    @property
    def whole_gpus(self) -> int:
        return self.requests.milli_gpu // MILLI_GPU_PER_DEVICE

    @property
    def is_active(self) -> bool:
        """Bound to a node and holding resources."""
        return self.phase is PodPhase.RUNNING


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubGroup:
    """A node of a gang's subgroup tree (KAI ``spec.subGroups``).

    A *leaf* (no other subgroup names it as ``parent``) holds pods, which name it in ``Pod.subgroup``, and needs
    ``min_member`` of them (0: none, every pod of it elastic). A *mid-level* subgroup needs ``min_subgroup`` of its
    direct children satisfied, all of them when None; its ``min_member`` is not read. ``subgroups.Tree`` reads them.
    """

    name: str
    min_member: int = 0
    parent: str | None = None
    min_subgroup: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """A PodGroup: a gang of ``min_member`` pods that are placed all at once or not at all.

    With ``subgroups`` the gang is KAI's tree: each leaf needs its own minimum of pods, each mid-level subgroup
    ``min_subgroup`` of its children, and the group ``min_subgroup`` of its top-level subgroups (None: all of them);
    ``min_member`` then only adds a floor on the total (the snapshot passes 0: KAI reads no PodGroup ``minMember``
    beside subgroups). ``min_member`` 0 without subgroups is KAI's "no gang requirement": every pod is elastic.

    Members beyond the minimum are elastic extras, placed after every gang's minimum and evicted first. Members are
    ordered by the builder (the engine sorts pending ones by their task order, creation time then uid).
    ``below_min_since_ns`` is when a running gang fell below its minimum or its tree short (completed members
    counting as satisfied: ``gangs.below_minimum`` says so), or None; after the stale-gang grace the whole gang is
    evicted.
    ``stale_grace_ns`` is the group's own grace (KAI's ``stalenessGracePeriod``; negative: never evicted as stale),
    None for ``Config.stale_gang_grace_ns``. ``evictions_from_ns``: before this time the group may take free room
    only, never evict others (KAI's ``preemptionDelay``, counted from its creation or last eviction); None: at once.
    """

    id: GroupId
    queue: QueueName
    min_member: int = 1
    subgroups: tuple[SubGroup, ...] = ()
    min_subgroup: int | None = None
    priority: int = 50
    preemptible: bool = True
    created_ns: int = 0
    members: tuple[Pod, ...] = ()
    below_min_since_ns: int | None = None
    stale_grace_ns: int | None = None
    evictions_from_ns: int | None = None


# --- Queues ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueResource:
    """KAI's per-resource queue settings, in our units (milli-GPU, millicores, bytes).

    ``quota``: the deserved amount; -1 (``UNLIMITED``) as much as requested; 0 (also KAI's unset) none.
    ``limit``: a hard cap over the queue's subtree; -1 none; 0 (also unset) nothing at all of this resource.
    ``over_quota_weight``: the queue's share of spare capacity among siblings of the same priority; 0 none.
    The defaults are KAI's unset values, so a resource left out allows nothing: say ``UNLIMITED`` where meant.
    """

    quota: int = 0
    limit: int = 0
    over_quota_weight: int = 0


OPEN = QueueResource(quota=UNLIMITED, limit=UNLIMITED, over_quota_weight=1)
"""The seeds' queue settings: every value -1, weight 1."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Queue:
    """A node of the queue tree (only leaves take groups). Min-runtimes protect young pods from eviction."""

    name: QueueName
    parent: QueueName | None = None
    priority: int = 100
    created_ns: int = 0
    gpu: QueueResource = OPEN
    cpu: QueueResource = OPEN
    memory: QueueResource = OPEN
    preempt_min_runtime_ns: int = 0
    reclaim_min_runtime_ns: int = 0


# --- Config and snapshot -----------------------------------------------------------------------------------------


Strategy = scoring.Strategy


class Action(enum.StrEnum):
    ALLOCATE = "allocate"
    CONSOLIDATE = "consolidate"
    RECLAIM = "reclaim"
    PREEMPT = "preempt"
    STALE_GANG = "stale-gang"


DEFAULT_ACTIONS = (Action.ALLOCATE, Action.CONSOLIDATE, Action.RECLAIM, Action.PREEMPT, Action.STALE_GANG)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """How the engine places: strategies, margins, caps and the actions to run in order.

    ``gpu_strategy`` orders nodes for GPU pods, ``cpu_strategy`` for CPU-only pods, ``device_strategy`` orders the
    devices of a node for shares. ``scorer`` replaces the built-in node scorers for every pod (the simulator
    plugs in its baselines this way). ``headroom_margin_bytes`` is kept free on top of the measured peak.
    ``reclaim_eviction_multiple``: when positive, one reclaim for GPU work never evicts more GPU than this multiple
    of what the reclaimer gets from it (a protective budget); 0, the default as in KAI, sets no budget, so a queue
    below its deserved quota gets it even when the only victim is a 3-GPU job for 1 GPU. ``stale_gang_grace_ns``:
    KAI's 60 s.
    """

    gpu_strategy: Strategy = Strategy.BINPACK
    cpu_strategy: Strategy = Strategy.BINPACK
    device_strategy: Strategy = Strategy.BINPACK
    scorer: scoring.GpuPlacementScorer | None = None
    headroom_margin_bytes: int = 256 * 1024**2
    reclaim_eviction_multiple: int = 0
    stale_gang_grace_ns: int = 60_000_000_000
    actions: tuple[Action, ...] = DEFAULT_ACTIONS
    consolidation_max_moves: int = 8
    """Consolidation moves at most this many victim units for one group (KAI bounds its consolidation the same
    way); the simulator lowers it to keep within a budget of moves."""


DEFAULT_CONFIG = Config()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Everything one cycle reads. Mappings are keyed by the value's own name or id.

    Capacity is the nodes' allocatable (ready nodes only) minus what pods of other schedulers use, which the builder
    expresses through ``Node.used`` and device allotments.
    """

    nodes: Mapping[NodeName, Node]
    queues: Mapping[QueueName, Queue]
    groups: Mapping[GroupId, Group]
    now_ns: int
    config: Config = DEFAULT_CONFIG


def snapshot(
    *,
    nodes: tuple[Node, ...] | list[Node],
    queues: tuple[Queue, ...] | list[Queue],
    groups: tuple[Group, ...] | list[Group],
    now_ns: int,
    config: Config = DEFAULT_CONFIG,
) -> Snapshot:
    """Build a snapshot from sequences (keys taken from the values), the convenient form for tests and tools."""
    return Snapshot(
        nodes={node.name: node for node in nodes},
        queues={queue.name: queue for queue in queues},
        groups={group.id: group for group in groups},
        now_ns=now_ns,
        config=config,
    )


def share_milli_on(share: GpuShare, device_memory_bytes: int) -> int:
    """The milli-GPU a share takes on a device with that much memory (gpu-memory rounds up to a milli-GPU)."""
    if share.milli_gpu:
        return share.milli_gpu
    if device_memory_bytes <= 0:
        return MILLI_GPU_PER_DEVICE + 1  # unknown memory: the share cannot be converted, so it fits nowhere
    return -(-share.memory_bytes * MILLI_GPU_PER_DEVICE // device_memory_bytes)

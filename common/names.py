"""Every name Quotient shares with KAI Scheduler, NVIDIA's stack and Kubernetes, and every name it defines itself.

Labels, annotations, resource names, environment variables and condition types are an API: users write them in
their manifests and dashboards, and a restarted scheduler reads back what an earlier one wrote. Each is therefore
spelled exactly once, here, and every module (scheduler, agent, emulator, demo, benchmarks) imports it from here, so
no two places can drift. ``docs/kai-compatibility.md`` lists the same names with their meaning; the two must agree.

Nothing here may change its value: a renamed annotation would orphan every pod a previous version annotated.
"""

from __future__ import annotations

from typing import Final

# --- NVIDIA: the device plugin's resource, GPU Feature Discovery's node labels, the container runtime --------------

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""Whole GPUs, requested in a container's limits and advertised in a node's allocatable."""
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
"""Node label (GPU Feature Discovery): the GPU model, e.g. ``NVIDIA-A100-SXM4-80GB``; node affinity selects on it."""
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
"""Node label (GPU Feature Discovery): memory per device in MiB; device memory when no telemetry says."""
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
"""Node label (GPU Feature Discovery): devices on the node."""
VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
"""The NVIDIA container runtime's device selection: UUIDs, indexes, ``all`` or :data:`NO_DEVICES`."""
NO_DEVICES: Final = "void"
"""``NVIDIA_VISIBLE_DEVICES`` value that makes the NVIDIA runtime behave as runc: no GPU, no driver."""
GPU_PORTION_ENV: Final = "GPU_PORTION"
"""KAI's environment variable (and ConfigMap key) telling a share its fraction, e.g. ``0.5``."""
NVIDIA_RUNTIME_CLASS: Final = "nvidia"

# --- KAI Scheduler: workloads, queues, gangs (KAI-COMPAT.md) ----------------------------------------------------------

QUEUE_LABEL: Final = "kai.scheduler/queue"
"""On a pod or its top owner (owner wins): the leaf queue. Configurable with ``--queue-label``."""
DEFAULT_QUEUE: Final = "default-queue"
"""Where a pod without a queue label goes; KAI's install creates it under :data:`DEFAULT_PARENT_QUEUE`."""
DEFAULT_PARENT_QUEUE: Final = "default-parent-queue"
POD_GROUP_ANNOTATION: Final = "pod-group-name"
"""On a pod: the PodGroup it belongs to (written by the grouper, or by a user on an ownerless pod)."""
SUBGROUP_LABEL: Final = "kai.scheduler/subgroup-name"
"""On a pod: the subgroup of its PodGroup (``spec.subGroups[].name``) whose own minimum it counts towards."""
PRIORITY_CLASS_LABEL: Final = "priorityClassName"
"""On a pod or its top owner: the priority class, before ``spec.priorityClassName``."""
PREEMPTIBILITY_LABEL: Final = "kai.scheduler/preemptibility"
"""On a pod or its top owner: ``preemptible`` or ``non-preemptible``, overriding the priority's default."""
PREEMPTIBLE: Final = "preemptible"
NON_PREEMPTIBLE: Final = "non-preemptible"

KAI_PRIORITY_CLASSES: Final = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
"""The priority classes KAI ships, by name; used when the cluster has no PriorityClass of that name."""
DEFAULT_PRIORITY_CLASS: Final = "train"
DEPLOYMENT_PRIORITY_CLASS: Final = "inference"
"""KAI's default class for the pods of a Deployment (everything else defaults to :data:`DEFAULT_PRIORITY_CLASS`)."""
NON_PREEMPTIBLE_FROM: Final = 100
"""KAI: a priority of at least this is non-preemptible unless the preemptibility label says otherwise."""

TASK_PRIORITY_LABEL: Final = "kai.scheduler/task-priority"
"""On a pod: its place among its group's pending pods, an integer, higher first; labelled pods before the others."""
SKIP_PODGROUPER_ANNOTATION: Final = "kai.scheduler/skip-podgrouper"
"""On a pod or any owner: ``"true"`` leaves the pod to a PodGroup its user made (named in ``pod-group-name``)."""
BATCH_MIN_MEMBER_ANNOTATION: Final = "kai.scheduler/batch-min-member"
"""On a ``batch/v1`` Job: one gang for the whole Job, of this many pods (KAI v0.15)."""
PREEMPTION_DELAY_ANNOTATION: Final = "kai.scheduler/preemption-delay"
"""On a pod or its owners: how long (a Go duration) a new workload waits before it may evict others."""
LAST_EVICTION_ANNOTATION: Final = "kai.scheduler/last-eviction-timestamp"
"""On a PodGroup (written by the scheduler when it evicts the group): re-arms the preemption delay."""
STALENESS_GRACE_ANNOTATION: Final = "kai.scheduler/staleness-grace-period"
"""On a pod, its owners or a PodGroup: how long a gang below its minimum runs before it is evicted; negative: never."""

QUEUE_API_VERSION: Final = "scheduling.run.ai/v2"
POD_GROUP_API_VERSION: Final = "scheduling.run.ai/v2alpha2"

# --- KAI Scheduler: GPU sharing -------------------------------------------------------------------------------------

GPU_FRACTION_ANNOTATION: Final = "gpu-fraction"
"""On a pod: a share of one device, a decimal strictly between 0 and 1."""
GPU_MEMORY_ANNOTATION: Final = "gpu-memory"
"""On a pod: a share of one device by memory (MiB, or a quantity such as ``3Gi``)."""
GPU_FRACTION_NUM_DEVICES_ANNOTATION: Final = "gpu-fraction-num-devices"
"""On a pod: take the share on this many devices."""
GPU_FRACTION_CONTAINER_ANNOTATION: Final = "gpu-fraction-container-name"
"""On a pod: the container that gets the shared GPU (default: the first)."""
CONTAINER_ANNOTATION_PREFIX: Final = "nvidia.com/container."
"""KAI v0.18 (NvFractions): per-container keys are this prefix, the container's name, then one of the suffixes."""
GPU_MEMORY_REQUEST_SUFFIX: Final = ".gpu-memory.request"
"""``nvidia.com/container.<name>.gpu-memory.request``: the GPU memory the container is placed with (a quantity)."""
GPU_MEMORY_LIMIT_SUFFIX: Final = ".gpu-memory.limit"
"""``nvidia.com/container.<name>.gpu-memory.limit``: the most GPU memory it may use (a quantity, >= the request)."""
GPU_COMPUTE_MODE_SUFFIX: Final = ".gpu-compute.mode"
"""``nvidia.com/container.<name>.gpu-compute.mode``: ``time-slicing`` (default) or ``sm-sharing``."""
GPU_DEVICES_SUFFIX: Final = ".gpus.devices"
"""``nvidia.com/container.<name>.gpus.devices``: written by KAI's binder; a user may not set it."""
GPU_COMPUTE_SHARING_MODE_ANNOTATION: Final = "kai.scheduler/gpu-compute-sharing-mode"
"""On a pod (KAI's documented spelling): the share's compute mode, as the per-container key."""
TIME_SLICING: Final = "time-slicing"
SM_SHARING: Final = "sm-sharing"
GPU_GROUP_LABEL: Final = "runai-gpu-group"
"""On a sharing pod: its GPU group (one shared device); KAI users select and inspect it."""

# --- Kubernetes: conditions, reasons, namespaces ----------------------------------------------------------------------

DISRUPTION_TARGET_CONDITION: Final = "DisruptionTarget"
"""Pod condition written before an eviction, with a reason such as ``PreemptionByScheduler``."""
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"
TERMINATION_BY_SCHEDULER: Final = "TerminationByScheduler"
POD_SCHEDULED_CONDITION: Final = "PodScheduled"
UNSCHEDULABLE_CONDITION: Final = "UnschedulableOnNodePool"
"""KAI's PodGroup ``status.schedulingConditions[].type`` for a group that cannot be placed."""
ORPHAN_CONDITION: Final = "Orphan"
"""Queue condition: its parent queue does not exist (or the chain loops)."""
OVER_QUOTA_CONDITION: Final = "OverQuota"
"""Queue condition: allocated above quota for some resource."""
DEFAULT_SCHEDULER: Final = "default-scheduler"
"""The API server's default ``spec.schedulerName``."""
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
"""Node label: the node's name; a pod pre-bound to a node in a cluster spec selects it."""
OS_LABEL: Final = "kubernetes.io/os"
ARCH_LABEL: Final = "kubernetes.io/arch"
POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"
"""A TokenReview's ``status.user.extra`` key for a token bound to a pod: the pod (with :data:`POD_UID_EXTRA`)."""
POD_UID_EXTRA: Final = "authentication.kubernetes.io/pod-uid"
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""The same for the node the pod runs on (Kubernetes 1.30 and later): the node the NATS auth callout grants."""
NODE_UID_EXTRA: Final = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID_EXTRA: Final = "authentication.kubernetes.io/credential-id"
"""The same for the token's own id (``JTI=<uuid>``)."""

# --- Quotient: the NATS auth callout ----------------------------------------------------------------------------------

NATS_TOKEN_AUDIENCE: Final = "quotient-nats"
"""The audience of the agent's projected ServiceAccount token (the DaemonSet's volume) and what the NATS auth callout
asks the TokenReview for: a token for anything else (the API server's own) is refused, and this one is good for
nothing but NATS."""

NATS_READER_LABEL: Final = "quotient.dev/nats-reader"
"""On a pod, ``"true"``: deploy's NetworkPolicy lets it reach the NATS client port (a dashboard, a third-party reader;
it still needs the reader nkey)."""

# --- Quotient: what the binder records on a pod (read back after a restart) ---------------------------------------

GPU_DEVICES_ANNOTATION: Final = "quotient.dev/gpu-devices"
"""On a bound pod: the device indexes it holds, comma-separated (``0,3``)."""
GPU_SHARE_ANNOTATION: Final = "quotient.dev/gpu-share"
"""On a bound share: its milli-GPU on each device (``500``)."""
GPU_GROUPS_ANNOTATION: Final = "quotient.dev/gpu-groups"
"""On a bound share: every GPU group it is in, comma-separated, one per device (the label can name only one)."""
GPU_UUIDS_ANNOTATION: Final = "quotient.dev/gpu-uuids"
"""On a bound share: its reservation pods' device UUIDs, comma-separated in device order."""
GPU_CONFIGMAP_ANNOTATION: Final = "quotient.dev/gpu-configmap"
"""On a share (written by the admission webhook): the ConfigMap its GPU environment comes from."""
OVERUSE_POLICY_ANNOTATION: Final = "quotient.dev/overuse-policy"
"""On a Queue: ``alert`` or ``evict``, what a pod of the queue over its GPU memory allotment gets."""
GPU_HEALTH_CLEARED_ANNOTATION: Final = "quotient.dev/gpu-health-cleared-at"
"""On a Node (set by an operator): an RFC 3339 time; GPU problems its agent first reported before it no longer count."""

# --- Quotient: reservation pods ---------------------------------------------------------------------------------------

RESERVATION_NAMESPACE: Final = "quotient-reservation"
RESERVATION_GROUP_LABEL: Final = "quotient.dev/gpu-group-reservation"
"""On a reservation pod: the (label-safe) GPU group whose device it holds."""
RESERVATION_GROUP_ANNOTATION: Final = "quotient.dev/gpu-group"
"""On a reservation pod: the full GPU group id (the label holds its label-safe form)."""
RESERVATION_UUID_ANNOTATION: Final = "quotient.dev/gpu-uuid"
"""Written by the reservation pod itself (``quotient reserve``): the UUID of the device it holds."""
RESERVATION_INDEX_ANNOTATION: Final = "quotient.dev/gpu-index"
"""Written with the UUID: the device's NVML index on its node."""
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
RESERVATION_COMPONENT: Final = "gpu-reservation"
PRODUCT: Final = "quotient"

# --- Quotient: the local world (emulator, emulated nodes, demo, benchmarks) ------------------------------------------

SIM_GPU_MEMORY_ANNOTATION: Final = "quotient.dev/sim-gpu-memory"
"""On a pod of an emulated node: its GPU memory over time (``2Gi@0s,30Gi@20s``)."""
SIM_DURATION_ANNOTATION: Final = "quotient.dev/sim-duration"
"""On a pod of an emulated node: how long it runs before it ends."""
SIM_EXIT_CODE_ANNOTATION: Final = "quotient.dev/sim-exit-code"
"""On a pod of an emulated node: the exit code it ends with (0: Succeeded)."""
EMULATED_LABEL: Final = "quotient.dev/emulated"
"""On a node the emulator made."""
BENCH_CREATED_ANNOTATION: Final = "quotient.dev/bench-created-ns"
"""On a pod ``quotient bench e2e`` created: when, in ns, so create-to-bound latency is measured on the pod itself."""

# --- vCluster, LeaderWorkerSet and JobSet: what grouping reads of them ------------------------------------------

VCLUSTER_OWNER_KIND_ANNOTATION: Final = "vcluster.loft.sh/owner-set-kind"
VCLUSTER_OWNER_NAME_ANNOTATION: Final = "vcluster.loft.sh/owner-set-name"
VCLUSTER_NAMESPACE_ANNOTATION: Final = "vcluster.loft.sh/namespace"
VCLUSTER_MANAGED_BY_LABEL: Final = "vcluster.loft.sh/managed-by"
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
JOBSET_REPLICATED_JOB_LABEL: Final = "jobset.sigs.k8s.io/replicatedjob-name"
"""On a JobSet's pod (JobSet's controller writes it): the replicated job it runs for."""
JOBSET_JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"
"""On a JobSet's pod: which replica of its replicated job it belongs to (0, 1, ...)."""

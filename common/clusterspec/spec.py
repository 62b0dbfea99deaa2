"""The values a cluster spec describes: nodes with their devices, taints and unowned processes, and scripted pods.

Frozen, in integer units (millicores, bytes, nanoseconds), and already checked: whoever holds a ``ClusterSpec``
(the fake GPUs, the emulator, the simulator) never validates it again. Taints and tolerations are built here from
their text too, as both the YAML form and ``make_node`` take them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from common import quantities
from common.clusterspec import checking, memoryscripts
from common.resources import Resources


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Taint:
    key: str
    value: str
    effect: TaintEffect


class TolerationOperator(enum.StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Toleration:
    """Kubernetes' toleration: an empty key with Exists tolerates every taint; no effect means every effect."""

    key: str
    operator: TolerationOperator
    value: str
    effect: TaintEffect | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One device: ``model`` as the spec names it, ``product`` as NVML names it, memory as NVML reports it."""

    index: int
    uuid: str
    model: str
    product: str
    memory_bytes: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UnownedProcess:
    """A process on device ``gpu_index`` that belongs to no pod, holding memory as its script says."""

    gpu_index: int
    memory: memoryscripts.MemoryScript


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """A node as the kubelet would register it, with its devices and the processes of no pod on them."""

    name: str
    milli_cpu: int
    memory_bytes: int
    pods: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    gpus: tuple[GpuSpec, ...]
    unowned_processes: tuple[UnownedProcess, ...]

    @property
    def capacity(self) -> Resources:
        """What the node offers for scheduling: its CPU, memory, whole devices and pod slots."""
        return Resources(
            milli_cpu=self.milli_cpu,
            memory_bytes=self.memory_bytes,
            milli_gpu=len(self.gpus) * quantities.MILLI_GPU_PER_GPU,
            pods=self.pods,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodSpec:
    """A scripted pod. ``gpus`` counts whole devices (``nvidia.com/gpu``); shares are in the annotations."""

    name: str
    namespace: str
    milli_cpu: int
    memory_bytes: int
    gpus: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    scheduler_name: str
    queue: str | None
    node: str | None
    gpu_memory: memoryscripts.MemoryScript | None
    arrive_ns: int
    duration_ns: int | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Nodes in the order written (groups expanded in place), then the pods likewise."""

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]


def parse_taint(text: str) -> Taint:
    """kubectl's ``KEY[=VALUE]:EFFECT``."""
    head, colon, effect = text.rpartition(":")
    key, _, value = head.partition("=")
    if not colon or not key:
        raise checking.Invalid(f"taint {text!r} is not KEY[=VALUE]:EFFECT")
    return make_taint(key, value, effect)


def make_taint(key: str, value: str, effect: str) -> Taint:
    checking.check_label(key, value)
    return Taint(key=key, value=value, effect=checking.choice(TaintEffect, effect, "taint effect"))


def make_toleration(key: str, operator: str | None, value: str, effect: str | None) -> Toleration:
    """A toleration as Kubernetes validates it: operator Equal by default, Exists with no value, no key only with
    Exists."""
    chosen = (
        checking.choice(TolerationOperator, operator, "toleration operator") if operator else TolerationOperator.EQUAL
    )
    if chosen is TolerationOperator.EXISTS and value:
        raise checking.Invalid("a toleration with operator Exists takes no value")
    if not key and chosen is not TolerationOperator.EXISTS:
        raise checking.Invalid("a toleration without a key must have operator Exists")
    if key:
        checking.check_label(key, value)
    parsed = None if effect is None else checking.choice(TaintEffect, effect, "taint effect")
    return Toleration(key=key, operator=chosen, value=value, effect=parsed)

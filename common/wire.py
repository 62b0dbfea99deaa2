"""The NATS wire schema, version 1, and its strict decoder.

Agents publish ``NodeTelemetry`` and ``NodeHealth``; the scheduler publishes ``Alert`` and ``Decision``; third parties
may subscribe to all four (DESIGN.md, "NATS wire protocol"). Every message is a msgpack *map with string keys*, never a
positional array, because readers we do not control decode it with plain msgpack libraries and need the names.

Why msgspec: the scheduler's telemetry consumer must decode about 20,000 node messages per second on one core.
``msgspec`` decodes msgpack straight into typed, frozen structs in C, checking types, ranges and lengths on the way,
so the fast path is one C call per message and there is no second validation pass in Python. This is the only module
that imports msgspec; it translates msgspec's errors into ``WireError`` with a ``WireReason`` for the rejection
counters. It is pure: no asyncio, no I/O, no clock (timestamps are arguments and fields).

Compatibility inside version 1: unknown keys are ignored, and fields that may be ``None`` default to ``None`` when
absent, so a v1 writer may add keys and optional fields without breaking v1 readers. Anything else (a new enum value,
a removed or retyped field, a tighter range) is a new version: ``v`` > 1 is rejected as ``UNKNOWN_VERSION``.

Strings carry length caps (each cap says where its number comes from). Besides rejecting nonsense early, they bound
what one message can make the scheduler hold in memory per node, pod or alert, independently of the payload limit.

One responsibility, the v1 format as msgspec sees it: the structs (with their constraints) and the decoders built
from them are one thing, since msgspec checks a field's constraint while it decodes the field and its error texts
are what ``_rejection`` classifies. Keeping both here keeps msgspec behind one module.

Out-of-order delivery (a JetStream replay, a redelivery, two publishers claiming one node) is not a decoding
matter: ``common.sequencing``'s ``SequenceGate`` decides, per node, whether a decoded message is new. What the decoder
does check beyond each field's own range is what no device can report, one field against another (``implausible``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Annotated, Final, Literal, TypeVar

import msgspec

from common.errors import WireError, WireReason

SCHEMA_VERSION: Final = 1

# nats-server's default max_payload (server/const.go MAX_PAYLOAD_SIZE = 1 MiB): a larger message could not have been
# published through a default server, so a reader refuses it before spending any time decoding it.
MAX_MESSAGE_BYTES: Final = 1024 * 1024

# NVML numbers devices from 0; 64 is well above the largest GPU nodes built today (16 devices) and bounds the lists.
MAX_GPUS_PER_NODE: Final = 64
# Per device: well above what MPS or many small inference workers put on one GPU; bounds a node's process table.
MAX_PROCESSES_PER_GPU: Final = 1024
MAX_HEALTH_PROBLEMS: Final = 256
MAX_ALERT_LABELS: Final = 64

# The gate that orders decoded messages lives in common.sequencing; its names stay reachable here for their callers.

# --- constrained scalars (Meta checks run inside the C decoder) ---

_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS_PER_NODE - 1)]
_Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]
# pid_t is a signed 32-bit integer on Linux; 0 is never a process.
_Pid = Annotated[int, msgspec.Meta(gt=0, le=2**31 - 1)]
# NVML reports an unsigned number of degrees; no GPU survives anywhere near the cap.
_Celsius = Annotated[int, msgspec.Meta(ge=0, le=1000)]
# Staleness is max(3 x interval, floor): an absurd interval would keep a silent node fresh forever, so cap it at 1 h.
_IntervalMs = Annotated[int, msgspec.Meta(gt=0, le=3_600_000)]

# Kubernetes object names (nodes, pods, queues) are DNS subdomains: at most 253 characters (RFC 1123).
_ObjectName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
# Namespaces are DNS labels: at most 63 characters.
_Namespace = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
# Kubernetes sets a 36-character UUID; other producers (the emulator, tests) get some room.
_PodUid = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# Runtimes use 64 hex digits, sometimes written with a "containerd://" or "cri-o://" scheme in front.
_ContainerId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# The agent draws a short random id at start; 64 leaves room for any encoding of 256 random bits.
_BootId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
# NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE are 96 (MIG UUIDs are the longest).
_GpuUuid = Annotated[str, msgspec.Meta(min_length=1, max_length=96)]
_GpuModel = Annotated[str, msgspec.Meta(min_length=1, max_length=96)]
# NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE is 80.
_DriverVersion = Annotated[str, msgspec.Meta(min_length=1, max_length=80)]
# The group id becomes the value of the runai-gpu-group label: label values are at most 63 characters.
_GpuGroupId = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
# events.k8s.io/v1 caps an Event's reason at 128 characters; our reason codes are CamelCase words of that kind.
_ReasonCode = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# The alert name is the last token of its subject quotient.v1.alerts.<name>, so it must be one valid NATS token.
_AlertName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
# A human sentence with live numbers; Kubernetes keeps 1 kB of an Event note, our audit log keeps a little more.
_MessageText = Annotated[str, msgspec.Meta(max_length=4096)]
# Kubernetes label keys: a 253-character DNS prefix, "/", and a 63-character name.
_LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=317)]
# Prometheus and Alertmanager do not cap label values; 1 kB is plenty for anything we attach to an alert.
_LabelValue = Annotated[str, msgspec.Meta(max_length=1024)]


class HealthStatus(enum.StrEnum):
    """A node's overall GPU health, as its agent sees it."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"  # some devices or the runtime have problems; the rest still work
    UNAVAILABLE = "unavailable"  # no GPU on this node can be used (NVML unreachable, every device lost)


class ProblemKind(enum.StrEnum):
    """What kind of fault a ``HealthProblem`` reports."""

    NVML_UNREACHABLE = "nvml_unreachable"
    GPU_LOST = "gpu_lost"
    XID = "xid"
    ECC = "ecc"
    RUNTIME_NOT_READY = "runtime_not_ready"


class AlertState(enum.StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class DecisionAction(enum.StrEnum):
    """What the scheduler did; reserve and unreserve concern the reservation pods of shared GPU groups."""

    BIND = "bind"
    EVICT = "evict"
    RESERVE = "reserve"
    UNRESERVE = "unreserve"
    PREEMPT = "preempt"
    RECLAIM = "reclaim"


# frozen: decoded messages are shared between the consumer, the cluster state and snapshots, and must not change.
# gc=False: these structs never form reference cycles, so the cycle collector need not track the hundreds of objects
# one telemetry message decodes into (faster decoding, shorter collections in a scheduler holding 5,000 of them).
# Maps, not arrays (array_like=False), and unknown keys ignored: see the module docstring.
class Envelope(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields every message carries, first in every map.

    ``v``: the schema version, 1 (``SCHEMA_VERSION``). ``node``: for agents' messages, the Kubernetes node name; for
    ``Alert`` and ``Decision``, the identity of the emitting scheduler. ``boot``: a random id the publisher draws at
    each start. ``seq``: a counter, starting anywhere at or above 0, that grows by at least one per message within a
    boot. ``ts_ns``: when the message was made, in nanoseconds since the Unix epoch, on the publisher's clock.
    Messages of one publisher are ordered by (boot, seq) (``SequenceGate``); readers refuse a ``ts_ns`` far from
    their own clock (the scheduler: ``--telemetry-max-skew``), so a publisher's clock must be kept (NTP).
    """

    v: Literal[1]
    node: _ObjectName
    boot: _BootId
    seq: _NonNegativeInt
    ts_ns: _NonNegativeInt


class ProcessReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One process holding memory on a GPU, as NVML lists it, mapped to its pod by the agent.

    ``used_memory_bytes`` is ``None`` where the driver does not say (NVML's "not available", e.g. under some
    virtualisation). ``pod_uid`` and ``container_id`` are ``None`` when the process's cgroup maps to no pod (a
    process outside Kubernetes, or one that exited between the NVML query and the cgroup read).
    """

    pid: _Pid
    used_memory_bytes: _NonNegativeInt | None = None
    pod_uid: _PodUid | None = None
    container_id: _ContainerId | None = None


class GpuReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One device in a telemetry sample.

    Identity: ``index`` (NVML's index on this node), ``uuid``, ``model``. Memory in bytes, from NVML's v2 memory API
    where the driver has it: ``memory_reserved_bytes`` is what the driver keeps for itself, so ``memory_free_bytes``
    is what processes can still allocate. Gauges that a device may not support are ``None``: utilisation (percent
    over NVML's last sample period), ``temperature_c``, ``power_mw``, the volatile ECC error counts and ``mig_mode``.
    ``processes`` lists the compute processes on the device.
    """

    index: _GpuIndex
    uuid: _GpuUuid
    model: _GpuModel
    memory_total_bytes: _NonNegativeInt
    memory_reserved_bytes: _NonNegativeInt
    memory_used_bytes: _NonNegativeInt
    memory_free_bytes: _NonNegativeInt
    gpu_util_pct: _Percent | None = None
    memory_util_pct: _Percent | None = None
    temperature_c: _Celsius | None = None
    power_mw: _NonNegativeInt | None = None
    ecc_corrected: _NonNegativeInt | None = None
    ecc_uncorrected: _NonNegativeInt | None = None
    mig_mode: bool | None = None
    processes: Annotated[tuple[ProcessReport, ...], msgspec.Meta(max_length=MAX_PROCESSES_PER_GPU)]


class NodeTelemetry(Envelope, frozen=True, kw_only=True, gc=False):
    """One sample of a node's GPUs, published every ``interval_ms`` on ``quotient.v1.telemetry.<node>``.

    ``interval_ms`` is the agent's sampling interval (readers derive staleness from it); ``driver_version`` is
    ``None`` when NVML is unreachable. ``gpus`` is empty on a node without usable devices.
    """

    interval_ms: _IntervalMs
    driver_version: _DriverVersion | None = None
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]


class HealthProblem(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One fault an agent sees. ``gpu_index``/``gpu_uuid`` name the device when the fault has one; ``code`` is the Xid
    number for ``xid`` and NVML's return code for ``nvml_unreachable``/``gpu_lost``; ``message`` is for people."""

    kind: ProblemKind
    gpu_index: _GpuIndex | None = None
    gpu_uuid: _GpuUuid | None = None
    code: _NonNegativeInt | None = None
    message: _MessageText


class NodeHealth(Envelope, frozen=True, kw_only=True, gc=False):
    """A node's GPU health, published on ``quotient.v1.health.<node>`` when it changes (and at agent start).

    ``problems`` is the whole current list, not a delta: a reader replaces what it had.
    """

    status: HealthStatus
    problems: Annotated[tuple[HealthProblem, ...], msgspec.Meta(max_length=MAX_HEALTH_PROBLEMS)]


class Alert(Envelope, frozen=True, kw_only=True, gc=False):
    """An alert raised or resolved by the scheduler, on ``quotient.v1.alerts.<name>``.

    ``name`` is the alert's name verbatim (``GpuMemoryOverconsumption``, ``GhostAllocation``, ``TelemetryStale``,
    ``UnattributedGpuMemory``, ...). The subject fields (node, pod, queue, device) are ``None`` where the alert does not
    concern one. Amounts: ``allotted_bytes`` is what the pod was given, ``used_bytes`` what was measured; ``since_ns``
    is when the condition began. ``labels`` are extra key/value pairs for routing (Alertmanager-style).
    """

    name: _AlertName
    state: AlertState
    severity: Severity
    node_name: _ObjectName | None = None
    pod_namespace: _Namespace | None = None
    pod_name: _ObjectName | None = None
    pod_uid: _PodUid | None = None
    queue: _ObjectName | None = None
    gpu_uuid: _GpuUuid | None = None
    gpu_index: _GpuIndex | None = None
    allotted_bytes: _NonNegativeInt | None = None
    used_bytes: _NonNegativeInt | None = None
    since_ns: _NonNegativeInt | None = None
    message: _MessageText
    labels: Annotated[dict[_LabelKey, _LabelValue], msgspec.Meta(max_length=MAX_ALERT_LABELS)]


class Decision(Envelope, frozen=True, kw_only=True, gc=False):
    """One thing the scheduler did to a pod, on ``quotient.v1.decisions``: an audit log and a replayable trace.

    ``node_name`` and ``gpu_indices`` say where (``None`` and empty for actions without a place); ``gpu_group`` is the
    shared GPU group of a fractional pod; ``reason`` is a machine-readable code, ``message`` its sentence; ``cycle``
    is the scheduling cycle that decided it.
    """

    action: DecisionAction
    pod_namespace: _Namespace
    pod_name: _ObjectName
    pod_uid: _PodUid
    node_name: _ObjectName | None = None
    gpu_indices: Annotated[tuple[_GpuIndex, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]
    gpu_group: _GpuGroupId | None = None
    queue: _ObjectName | None = None
    reason: _ReasonCode
    message: _MessageText
    cycle: _NonNegativeInt


WireMessage = NodeTelemetry | NodeHealth | Alert | Decision
_M = TypeVar("_M", bound=Envelope)


class _Version(msgspec.Struct, gc=False):
    """Only the version, read on the error path to tell a message from the future from a malformed one."""

    v: int


_ENCODER: Final = msgspec.msgpack.Encoder()
_TELEMETRY: Final = msgspec.msgpack.Decoder(NodeTelemetry)
_HEALTH: Final = msgspec.msgpack.Decoder(NodeHealth)
_ALERT: Final = msgspec.msgpack.Decoder(Alert)
_DECISION: Final = msgspec.msgpack.Decoder(Decision)
_VERSION: Final = msgspec.msgpack.Decoder(_Version)

# What the decoder can raise on hostile input: malformed or truncated msgpack and schema violations (DecodeError and
# its subclass ValidationError), a str that is not UTF-8, and nesting deeper than the interpreter's recursion limit
# (msgspec guards its recursion with Python's limit, also when it skips an unknown key's value).
_DECODE_FAULTS: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def encode(message: WireMessage) -> bytes:
    """Serialise a message, refusing (``WireError``) one that readers would reject.

    Struct constructors do not check ranges and lengths, so a publisher's bug would only show as rejections at every
    reader; decoding our own output here (a few microseconds) makes it fail where it was made.
    """
    try:
        data = _ENCODER.encode(message)
    except OverflowError as exc:
        raise WireError(WireReason.OUT_OF_RANGE, f"{type(message).__name__}: {exc}") from exc
    except (TypeError, UnicodeEncodeError, msgspec.EncodeError) as exc:
        raise WireError(WireReason.WRONG_TYPE, f"{type(message).__name__}: {exc}") from exc
    match message:
        case NodeTelemetry():
            decode_telemetry(data)
        case NodeHealth():
            _decode(_HEALTH, data, None)
        case Alert():
            _decode(_ALERT, data, None)
        case Decision():
            _decode(_DECISION, data, None)
    return data


def decode_telemetry(data: bytes, *, subject_node: str | None = None) -> NodeTelemetry:
    """Decode a ``NodeTelemetry``; with ``subject_node`` (the node named by the subject), require that node. A
    sample that cannot be true (``implausible``) is rejected like a malformed one."""
    message = _decode(_TELEMETRY, data, subject_node)
    problem = implausible(message)
    if problem is not None:
        raise problem
    return message


def decode_health(data: bytes, *, subject_node: str | None = None) -> NodeHealth:
    """Decode a ``NodeHealth``; with ``subject_node`` (the node named by the subject), require that node."""
    return _decode(_HEALTH, data, subject_node)


def decode_alert(data: bytes) -> Alert:
    return _decode(_ALERT, data, None)


def decode_decision(data: bytes) -> Decision:
    return _decode(_DECISION, data, None)


def decode_telemetry_batch(
    datas: Sequence[bytes], *, subject_nodes: Sequence[str | None] | None = None
) -> list[NodeTelemetry | WireError]:
    """Decode many telemetry payloads; each result is the message or, as a value, why it was rejected.

    ``subject_nodes``, when given, pairs each payload with the node its subject named (as ``decode_telemetry``).
    """
    if subject_nodes is None:
        subject_nodes = [None] * len(datas)
    elif len(subject_nodes) != len(datas):
        raise ValueError(f"{len(datas)} payloads but {len(subject_nodes)} subject nodes")
    # The scheduler's hot loop (20,000 messages a second): locals only, one C call per message on the good path.
    decode = _TELEMETRY.decode
    results: list[NodeTelemetry | WireError] = []
    append = results.append
    for data, subject_node in zip(datas, subject_nodes, strict=True):
        if len(data) > MAX_MESSAGE_BYTES:
            append(_oversized(data))
            continue
        try:
            message = decode(data)
        except _DECODE_FAULTS as exc:
            append(_rejection(exc, data))
            continue
        if subject_node is not None and message.node != subject_node:
            append(_mismatch(message.node, subject_node))
        else:
            append(implausible(message) or message)
    return results


def implausible(message: NodeTelemetry) -> WireError | None:
    """Why a decoded sample cannot be true, or None: what msgspec cannot check, one field against another.

    A device's used, reserved or free memory above its total, a process holding more than its device has
    (``MEMORY_OVER_TOTAL``), or two devices with one index (``DUPLICATE_DEVICE``: readers key devices by index). The
    sum of used, reserved and free is not checked: drivers differ on whether used includes reserved.

    Runs for every message on the scheduler's hot path (issue 7's 20,000 a second), right after the C decoder while
    the message is in cache: plain loops and no allocation on the common path (devices listed by increasing index, as
    agents list them; any other order costs one set).
    """
    gpus = message.gpus
    previous = -1
    ordered = True
    for gpu in gpus:
        total = gpu.memory_total_bytes
        if gpu.memory_used_bytes > total or gpu.memory_reserved_bytes > total or gpu.memory_free_bytes > total:
            return WireError(
                WireReason.MEMORY_OVER_TOTAL,
                f"GPU {gpu.index}: used {gpu.memory_used_bytes}, reserved {gpu.memory_reserved_bytes} or free "
                f"{gpu.memory_free_bytes} bytes above its total of {total}",
            )
        for process in gpu.processes:
            used = process.used_memory_bytes
            if used is not None and used > total:
                return WireError(
                    WireReason.MEMORY_OVER_TOTAL,
                    f"GPU {gpu.index}: process {process.pid} holds {used} bytes, above the device's total of {total}",
                )
        if gpu.index <= previous:
            ordered = False
        previous = gpu.index
    if not ordered and len({gpu.index for gpu in gpus}) != len(gpus):
        return WireError(
            WireReason.DUPLICATE_DEVICE,
            "two devices share an index: " + ", ".join(f"{gpu.index}={gpu.uuid}" for gpu in gpus)[:512],
        )
    return None


def _decode(decoder: msgspec.msgpack.Decoder[_M], data: bytes, subject_node: str | None) -> _M:
    if len(data) > MAX_MESSAGE_BYTES:
        raise _oversized(data)
    try:
        message = decoder.decode(data)
    except _DECODE_FAULTS as exc:
        raise _rejection(exc, data) from exc
    if subject_node is not None and message.node != subject_node:
        raise _mismatch(message.node, subject_node)
    return message


def _oversized(data: bytes) -> WireError:
    return WireError(WireReason.OVERSIZED, f"{len(data)} bytes, more than the {MAX_MESSAGE_BYTES} allowed")


def _mismatch(node: str, subject_node: str) -> WireError:
    return WireError(WireReason.SUBJECT_MISMATCH, f"message from node {node!r} on the subject of {subject_node!r}")


def _rejection(exc: Exception, data: bytes) -> WireError:
    """Classify a decoding failure. Runs only on the error path, so it may afford a second (envelope-only) decode."""
    version = _version_of(data)
    if version is not None and version > SCHEMA_VERSION:
        return WireError(WireReason.UNKNOWN_VERSION, f"schema version {version}; this reader knows {SCHEMA_VERSION}")
    text = str(exc)
    if isinstance(exc, RecursionError):
        return WireError(WireReason.OVERSIZED, "nested deeper than the decoder allows")
    if isinstance(exc, UnicodeDecodeError):
        return WireError(WireReason.NOT_MSGPACK, f"a string is not UTF-8: {text}")
    if not isinstance(exc, msgspec.ValidationError):
        reason = WireReason.TRUNCATED if "truncated" in text else WireReason.NOT_MSGPACK
        return WireError(reason, text)
    # msgspec's ValidationError texts (stable within the pinned version; tests/unit/test_wire.py pins each one):
    # "Object missing required field `x`", "Expected `int`, got `str` - at `$.x`", and for values of the right type
    # that break a constraint "Expected `int` >= 0", "Expected `str` of length <= 253", "... matching regex ...",
    # "Invalid enum value 'x'".
    if text.startswith("Object missing required field"):
        return WireError(WireReason.MISSING_FIELD, text)
    if ", got `" in text:
        return WireError(WireReason.WRONG_TYPE, text)
    return WireError(WireReason.OUT_OF_RANGE, text)


def _version_of(data: bytes) -> int | None:
    try:
        return _VERSION.decode(data).v
    except _DECODE_FAULTS:
        return None

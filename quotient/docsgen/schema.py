"""The NATS subjects and the v1 message schema, read from ``common/subjects.py`` and ``common/wire.py``.

Field names, order, types, which may be absent, and every limit (ranges, lengths, patterns, list sizes) come from the
structs' type hints and their constraints, as the strict decoder enforces them; only the meaning of each field is
said here (:data:`FIELDS`), and a field without one stops the page from being generated. The structs are read
through ``typing`` and their class attributes (``__struct_fields__``, ``__struct_defaults__``), so this module does
not import msgspec (it enters through ``common.wire`` alone).
"""

from __future__ import annotations

import enum
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence

from common import subjects, wire
from common.errors import QuotientError
from quotient.docsgen import blocks

MESSAGES: tuple[type, ...] = (wire.NodeTelemetry, wire.NodeHealth, wire.Alert, wire.Decision)
NESTED: tuple[type, ...] = (wire.GpuReport, wire.ProcessReport, wire.HealthProblem)

FIELDS: Mapping[str, str] = {
    "v": "the schema version; a reader refuses a higher one (`unknown_version`)",
    "node": "the publishing node (agents), or the identity of the emitting scheduler replica (`Alert`, `Decision`)",
    "boot": "a random id the publisher draws at each start",
    "seq": "grows by at least one per message within a boot; order a publisher's messages by (`boot`, `seq`)",
    "ts_ns": "when the message was made, ns since the Unix epoch, on the publisher's clock (keep it with NTP)",
    "interval_ms": "the agent's sampling interval; a node is stale after max(3 x this, the scheduler's floor)",
    "driver_version": "the NVIDIA driver's version; nil when NVML is unreachable",
    "gpus": "the node's devices (empty on a node without usable devices)",
    "index": "the device's NVML index on the node",
    "uuid": "the device's UUID (`GPU-...`, or a MIG device's)",
    "model": "the device's model as NVML names it",
    "memory_total_bytes": "the device's memory",
    "memory_reserved_bytes": "memory the driver keeps for itself (NVML's v2 memory API; 0 where the driver lacks it)",
    "memory_used_bytes": "memory in use",
    "memory_free_bytes": "memory processes can still allocate",
    "gpu_util_pct": "GPU utilisation over NVML's last sample period, percent",
    "memory_util_pct": "memory controller utilisation, percent",
    "temperature_c": "temperature, degrees Celsius",
    "power_mw": "power draw, milliwatts",
    "ecc_corrected": "volatile corrected ECC error count",
    "ecc_uncorrected": "volatile uncorrected ECC error count",
    "mig_mode": "whether MIG is enabled",
    "processes": "the compute processes on the device",
    "pid": "the process id (on the node)",
    "used_memory_bytes": "GPU memory the process holds; nil where the driver does not say",
    "pod_uid": "the pod's UID",
    "ProcessReport.pod_uid": "the UID of the process's pod; nil for a process of no pod (the agent reads it from the "
    "process's cgroup)",
    "container_id": "the container's id; nil for a process of no pod",
    "status": "the node's overall GPU health",
    "problems": "every current problem (the whole list, not a change: a reader replaces what it had)",
    "kind": "what went wrong",
    "gpu_index": "the device concerned; nil where the problem or alert concerns no one device",
    "gpu_uuid": "the device's UUID, likewise",
    "code": "the Xid number (`xid`), or NVML's return code (`nvml_unreachable`, `gpu_lost`)",
    "message": "a sentence for people, with the numbers",
    "name": "the alert's name (the last token of its subject): [the alerts](metrics.md#alerts)",
    "state": "`firing`, or `resolved` when the condition ended",
    "severity": "how urgent",
    "node_name": "the node concerned; nil where none",
    "pod_namespace": "the pod's namespace",
    "pod_name": "the pod's name",
    "queue": "the pod's queue",
    "allotted_bytes": "the GPU memory the pod was given on the device",
    "used_bytes": "the GPU memory measured",
    "since_ns": "when the condition began, ns since the Unix epoch",
    "labels": "extra key/value pairs for routing (Alertmanager style)",
    "action": "what the scheduler did",
    "gpu_indices": "the devices of a placement (empty for actions without one)",
    "gpu_group": "the GPU group of a share (its `runai-gpu-group` label)",
    "reason": "a machine-readable code (a pending reason, an eviction's cause)",
    "cycle": "the scheduling cycle that decided it",
}
"""What each field means: ``Struct.field`` where a name means something else in one struct, else by name."""


class UndocumentedField(QuotientError):
    """A wire field :data:`FIELDS` does not explain."""


def _metas(annotation: object) -> tuple[object, list[object]]:
    """The type inside ``Annotated`` (if any) and its constraint objects."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *metas = typing.get_args(annotation)
        return base, metas
    return annotation, []


def _limits(metas: Sequence[object], *, noun: str) -> list[str]:
    said = []
    for meta in metas:
        low = [f">= {value}" for key in ("ge",) if (value := getattr(meta, key, None)) is not None]
        low += [f"> {value}" for key in ("gt",) if (value := getattr(meta, key, None)) is not None]
        high = [f"<= {value}" for key in ("le",) if (value := getattr(meta, key, None)) is not None]
        high += [f"< {value}" for key in ("lt",) if (value := getattr(meta, key, None)) is not None]
        said += low + high
        shortest, longest = getattr(meta, "min_length", None), getattr(meta, "max_length", None)
        if shortest is not None and longest is not None:
            said.append(f"{shortest} to {longest} {noun}")
        elif longest is not None:
            said.append(f"at most {longest} {noun}")
        elif shortest is not None:
            said.append(f"at least {shortest} {noun}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            said.append(f"matching `{pattern}`")
    return said


def describe(annotation: object) -> tuple[str, str]:
    """(type, limits) of one field's annotation, as a reader writing any msgpack library needs them."""
    nilable = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        (annotation,) = [arg for arg in args if arg is not type(None)]
        nilable = True
    base, metas = _metas(annotation)
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        text, limits = "int", [f"always {', '.join(map(str, typing.get_args(base)))}"]
    elif isinstance(base, type) and issubclass(base, enum.Enum):
        text, limits = "str", ["one of " + ", ".join(f"`{member.value}`" for member in base)]
    elif origin is tuple:
        item, item_limits = describe(typing.get_args(base)[0])
        element = f"`{item}` maps" if item in {cls.__name__ for cls in NESTED} else item
        text = f"list of {element}"
        limits = _limits(metas, noun="items") + [f"each {limit}" for limit in item_limits.split("; ") if limit]
    elif origin is dict:
        key, value = (describe(arg) for arg in typing.get_args(base))
        text = f"map of {key[0]} to {value[0]}"
        limits = _limits(metas, noun="entries")
        limits += [f"keys {key[1]}"] if key[1] else []
        limits += [f"values {value[1]}"] if value[1] else []
    elif isinstance(base, type):
        noun = "characters" if base is str else "items"
        text, limits = base.__name__, _limits(metas, noun=noun)
    else:
        raise UndocumentedField(f"cannot describe the wire type {base!r}")
    return (text + " or nil" if nilable else text), "; ".join(limits)


def fields(struct: type) -> list[tuple[str, str, str, bool]]:
    """(name, type, limits, required) of each field of ``struct``, in the order the struct declares them."""
    names: tuple[str, ...] = struct.__struct_fields__  # type: ignore[attr-defined]
    defaults: tuple[object, ...] = struct.__struct_defaults__  # type: ignore[attr-defined]
    first_default = len(names) - len(defaults)
    hints = typing.get_type_hints(struct, include_extras=True)
    found = []
    for position, name in enumerate(names):
        required = position < first_default or type(defaults[position - first_default]).__name__ == "NoDefaultType"
        text, limits = describe(hints[name])
        found.append((name, text, limits, required))
    return found


def reference(struct: type, *, skip: Sequence[str] = ()) -> str:
    """A table of ``struct``'s fields: key, type, limits, whether it may be left out, meaning."""
    rows = []
    for name, text, limits, required in fields(struct):
        if name in skip:
            continue
        meaning = FIELDS.get(f"{struct.__name__}.{name}") or FIELDS.get(name)
        if meaning is None:
            raise UndocumentedField(f"{struct.__name__}.{name} has no meaning in quotient/docsgen/schema.py FIELDS")
        rows.append((f"`{name}`", text, blocks.cell(limits), "" if required else "may be absent", blocks.cell(meaning)))
    return blocks.table(("key", "type", "limits", "absent", "meaning"), rows)


def envelope() -> str:
    return reference(wire.Envelope)


def message(struct: type) -> str:
    """A message's own fields (the envelope's are on their own table)."""
    return reference(struct, skip=wire.Envelope.__struct_fields__)


SUBJECTS: tuple[tuple[str, str, str, str], ...] = (
    (f"{subjects.TELEMETRY_PREFIX}.<node>", "agent", "NodeTelemetry", "every interval"),
    (f"{subjects.HEALTH_PREFIX}.<node>", "agent", "NodeHealth", "at start and on every change of the node's health"),
    (f"{subjects.ALERTS_PREFIX}.<AlertName>", "scheduler (leader)", "Alert", "when an alert fires or resolves"),
    (subjects.DECISIONS, "scheduler (leader)", "Decision", "every bind, eviction and reservation"),
)


def subject_table() -> str:
    rows = [(f"`{subject}`", who, f"[`{kind}`](#{kind.lower()})", when) for subject, who, kind, when in SUBJECTS]
    return blocks.table(("subject", "publisher", "message", "when"), rows)


def limits_text() -> str:
    """The constants a reader needs besides the fields."""
    lines = [
        f"- schema version: `{wire.SCHEMA_VERSION}`; all subjects start with `{subjects.PREFIX}.`, so "
        f"`{subjects.PREFIX}.>` is everything;",
        f"- largest message a reader accepts: {wire.MAX_MESSAGE_BYTES:,} bytes (nats-server's default `max_payload`);",
        f"- the JetStream stream `{subjects.TELEMETRY_STREAM}` keeps the last message of every "
        f"`{subjects.TELEMETRY_ALL}` and `{subjects.HEALTH_ALL}` subject.",
    ]
    return "\n".join(
        textwrap.fill(line, width=120, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        for line in lines
    )

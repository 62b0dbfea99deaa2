from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import sequencing, wire
from common.errors import WireError, WireReason

Decoder = Callable[[bytes], wire.WireMessage]
Path = tuple[str | int, ...]

DECODERS: dict[str, Decoder] = {
    "telemetry": wire.decode_telemetry,
    "health": wire.decode_health,
    "alert": wire.decode_alert,
    "decision": wire.decode_decision,
}

ENVELOPE: dict[str, Any] = {
    "v": 1,
    "node": "gpu-node-1",
    "boot": "3f9c2a7d",
    "seq": 7,
    "ts_ns": 1_760_000_000_123_456_789,
}
POD_UID = "0b6f1a52-8a44-4c1e-9d59-6f3c8a1e2d40"

# Messages as a third party writes them: plain dicts, every field present, every optional one set.
THIRD_PARTY: dict[str, dict[str, Any]] = {
    "telemetry": {
        **ENVELOPE,
        "interval_ms": 1000,
        "driver_version": "570.124.06",
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-5c2b7e0e-3d1f-4a4c-b1f2-8e7d6c5b4a39",
                "model": "NVIDIA H100 80GB HBM3",
                "memory_total_bytes": 85_520_809_984,
                "memory_reserved_bytes": 570_425_344,
                "memory_used_bytes": 42_949_672_960,
                "memory_free_bytes": 42_000_711_680,
                "gpu_util_pct": 87,
                "memory_util_pct": 41,
                "temperature_c": 61,
                "power_mw": 512_331,
                "ecc_corrected": 3,
                "ecc_uncorrected": 0,
                "mig_mode": False,
                "processes": [
                    {
                        "pid": 4242,
                        "used_memory_bytes": 42_949_672_960,
                        "pod_uid": POD_UID,
                        "container_id": "containerd://" + "a1" * 32,
                    }
                ],
            }
        ],
    },
    "health": {
        **ENVELOPE,
        "status": "degraded",
        "problems": [
            {"kind": "xid", "gpu_index": 3, "gpu_uuid": "GPU-1", "code": 79, "message": "GPU has fallen off the bus"}
        ],
    },
    "alert": {
        **ENVELOPE,
        "node": "quotient-scheduler-7d9f",
        "name": "GpuMemoryOverconsumption",
        "state": "firing",
        "severity": "warning",
        "node_name": "gpu-node-1",
        "pod_namespace": "team-a",
        "pod_name": "trainer-0",
        "pod_uid": POD_UID,
        "queue": "team-a",
        "gpu_uuid": "GPU-1",
        "gpu_index": 0,
        "allotted_bytes": 40 * 2**30,
        "used_bytes": 52 * 2**30,
        "since_ns": 1_760_000_000_000_000_000,
        "message": "trainer-0 uses 52 GiB of GPU memory, 12 GiB over its 40 GiB",
        "labels": {"team": "vision"},
    },
    "decision": {
        **ENVELOPE,
        "node": "quotient-scheduler-7d9f",
        "action": "bind",
        "pod_namespace": "team-a",
        "pod_name": "trainer-0",
        "pod_uid": POD_UID,
        "node_name": "gpu-node-1",
        "gpu_indices": [0, 1],
        "gpu_group": "4c1e9d59",
        "queue": "team-a",
        "reason": "Allocated",
        "message": "bound to gpu-node-1 with 2 GPUs",
        "cycle": 12,
    },
}

EXPECTED: dict[str, wire.WireMessage] = {
    "telemetry": wire.NodeTelemetry(
        **ENVELOPE,
        interval_ms=1000,
        driver_version="570.124.06",
        gpus=(
            wire.GpuReport(
                index=0,
                uuid="GPU-5c2b7e0e-3d1f-4a4c-b1f2-8e7d6c5b4a39",
                model="NVIDIA H100 80GB HBM3",
                memory_total_bytes=85_520_809_984,
                memory_reserved_bytes=570_425_344,
                memory_used_bytes=42_949_672_960,
                memory_free_bytes=42_000_711_680,
                gpu_util_pct=87,
                memory_util_pct=41,
                temperature_c=61,
                power_mw=512_331,
                ecc_corrected=3,
                ecc_uncorrected=0,
                mig_mode=False,
                processes=(
                    wire.ProcessReport(
                        pid=4242,
                        used_memory_bytes=42_949_672_960,
                        pod_uid=POD_UID,
                        container_id="containerd://" + "a1" * 32,
                    ),
                ),
            ),
        ),
    ),
    "health": wire.NodeHealth(
        **ENVELOPE,
        status=wire.HealthStatus.DEGRADED,
        problems=(
            wire.HealthProblem(
                kind=wire.ProblemKind.XID, gpu_index=3, gpu_uuid="GPU-1", code=79, message="GPU has fallen off the bus"
            ),
        ),
    ),
    "alert": wire.Alert(
        **{**ENVELOPE, "node": "quotient-scheduler-7d9f"},
        name="GpuMemoryOverconsumption",
        state=wire.AlertState.FIRING,
        severity=wire.Severity.WARNING,
        node_name="gpu-node-1",
        pod_namespace="team-a",
        pod_name="trainer-0",
        pod_uid=POD_UID,
        queue="team-a",
        gpu_uuid="GPU-1",
        gpu_index=0,
        allotted_bytes=40 * 2**30,
        used_bytes=52 * 2**30,
        since_ns=1_760_000_000_000_000_000,
        message="trainer-0 uses 52 GiB of GPU memory, 12 GiB over its 40 GiB",
        labels={"team": "vision"},
    ),
    "decision": wire.Decision(
        **{**ENVELOPE, "node": "quotient-scheduler-7d9f"},
        action=wire.DecisionAction.BIND,
        pod_namespace="team-a",
        pod_name="trainer-0",
        pod_uid=POD_UID,
        node_name="gpu-node-1",
        gpu_indices=(0, 1),
        gpu_group="4c1e9d59",
        queue="team-a",
        reason="Allocated",
        message="bound to gpu-node-1 with 2 GPUs",
        cycle=12,
    ),
}

KINDS = sorted(DECODERS)


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value)
    return data


def packed(kind: str, **changes: Any) -> bytes:
    return pack({**THIRD_PARTY[kind], **changes})


def changed(kind: str, path: Path, value: Any) -> bytes:
    message = copy.deepcopy(THIRD_PARTY[kind])
    target: Any = message
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return pack(message)


def without(kind: str, path: Path) -> bytes:
    message = copy.deepcopy(THIRD_PARTY[kind])
    target: Any = message
    for step in path[:-1]:
        target = target[step]
    del target[path[-1]]
    return pack(message)


def reason_of(decode: Callable[[bytes], object], data: bytes) -> WireReason:
    with pytest.raises(WireError) as caught:
        decode(data)
    return caught.value.reason


def leaf_paths(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every field and element of a third-party message, containers included."""
    if path:
        yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from leaf_paths(item, (*path, position))


def wrong_type_for(value: Any) -> Any:
    if isinstance(value, str):
        return 3.5
    if isinstance(value, bool | int):
        return "7"
    if value is None:
        return [1]
    return "text"


ALL_FIELDS = [(kind, path) for kind in KINDS for path, _ in leaf_paths(THIRD_PARTY[kind])]


# --- strategies for valid messages ---


def text(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    return st.text(min_size=min_size, max_size=max_size)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


u64 = st.integers(min_value=0, max_value=2**64 - 1)
gpu_index = st.integers(min_value=0, max_value=63)
envelope: dict[str, st.SearchStrategy[Any]] = {
    "v": st.just(1),
    "node": text(1, 253),
    "boot": text(1, 64),
    "seq": u64,
    "ts_ns": u64,
}
processes = st.builds(
    wire.ProcessReport,
    pid=st.integers(min_value=1, max_value=2**31 - 1),
    used_memory_bytes=maybe(u64),
    pod_uid=maybe(text(1, 128)),
    container_id=maybe(text(1, 128)),
)
gpus = st.builds(
    wire.GpuReport,
    index=gpu_index,
    uuid=text(1, 96),
    model=text(1, 96),
    memory_total_bytes=u64,
    memory_reserved_bytes=u64,
    memory_used_bytes=u64,
    memory_free_bytes=u64,
    gpu_util_pct=maybe(st.integers(0, 100)),
    memory_util_pct=maybe(st.integers(0, 100)),
    temperature_c=maybe(st.integers(0, 1000)),
    power_mw=maybe(u64),
    ecc_corrected=maybe(u64),
    ecc_uncorrected=maybe(u64),
    mig_mode=maybe(st.booleans()),
    processes=st.lists(processes, max_size=6).map(tuple),
)


def plausible(gpu: wire.GpuReport) -> wire.GpuReport:
    """No amount above the device's total (what ``wire.implausible`` refuses is tested on its own)."""
    total = gpu.memory_total_bytes
    return msgspec.structs.replace(
        gpu,
        memory_reserved_bytes=min(gpu.memory_reserved_bytes, total),
        memory_used_bytes=min(gpu.memory_used_bytes, total),
        memory_free_bytes=min(gpu.memory_free_bytes, total),
        processes=tuple(
            process
            if process.used_memory_bytes is None
            else msgspec.structs.replace(process, used_memory_bytes=min(process.used_memory_bytes, total))
            for process in gpu.processes
        ),
    )


telemetry = st.builds(
    wire.NodeTelemetry,
    **envelope,
    interval_ms=st.integers(1, 3_600_000),
    driver_version=maybe(text(1, 80)),
    gpus=st.lists(gpus.map(plausible), max_size=4, unique_by=(lambda gpu: gpu.index, lambda gpu: gpu.uuid)).map(tuple),
)
problems = st.builds(
    wire.HealthProblem,
    kind=st.sampled_from(wire.ProblemKind),
    gpu_index=maybe(gpu_index),
    gpu_uuid=maybe(text(1, 96)),
    code=maybe(u64),
    message=text(0, 4096),
)
health = st.builds(
    wire.NodeHealth,
    **envelope,
    status=st.sampled_from(wire.HealthStatus),
    problems=st.lists(problems, max_size=8).map(tuple),
)
alerts = st.builds(
    wire.Alert,
    **envelope,
    name=st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True),
    state=st.sampled_from(wire.AlertState),
    severity=st.sampled_from(wire.Severity),
    node_name=maybe(text(1, 253)),
    pod_namespace=maybe(text(1, 63)),
    pod_name=maybe(text(1, 253)),
    pod_uid=maybe(text(1, 128)),
    queue=maybe(text(1, 253)),
    gpu_uuid=maybe(text(1, 96)),
    gpu_index=maybe(gpu_index),
    allotted_bytes=maybe(u64),
    used_bytes=maybe(u64),
    since_ns=maybe(u64),
    message=text(0, 4096),
    labels=st.dictionaries(text(1, 317), text(0, 1024), max_size=64),
)
decisions = st.builds(
    wire.Decision,
    **envelope,
    action=st.sampled_from(wire.DecisionAction),
    pod_namespace=text(1, 63),
    pod_name=text(1, 253),
    pod_uid=text(1, 128),
    node_name=maybe(text(1, 253)),
    gpu_indices=st.lists(gpu_index, max_size=64).map(tuple),
    gpu_group=maybe(text(1, 63)),
    queue=maybe(text(1, 253)),
    reason=text(1, 128),
    message=text(0, 4096),
    cycle=u64,
)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text() | st.integers(min_value=-(2**63), max_value=2**64 - 1), children, max_size=4)
    ),
    max_leaves=20,
)
slow = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- round trips and third parties ---


VALID: dict[str, st.SearchStrategy[wire.WireMessage]] = {
    "telemetry": telemetry,
    "health": health,
    "alert": alerts,
    "decision": decisions,
}


@pytest.mark.parametrize("kind", KINDS)
@slow
@given(data=st.data())
def test_every_kind_of_message_round_trips(kind: str, data: st.DataObject) -> None:
    message = data.draw(VALID[kind])
    assert DECODERS[kind](wire.encode(message)) == message


@pytest.mark.parametrize("kind", KINDS)
def test_messages_written_by_plain_msgpack_decode(kind: str) -> None:
    assert DECODERS[kind](msgpack.packb(THIRD_PARTY[kind])) == EXPECTED[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_our_encoding_is_a_plain_map_that_third_parties_read(kind: str) -> None:
    assert msgpack.unpackb(wire.encode(EXPECTED[kind])) == THIRD_PARTY[kind]


def test_unknown_keys_are_ignored_at_every_level() -> None:
    message = copy.deepcopy(THIRD_PARTY["telemetry"])
    message["future_field"] = {"nested": [1, 2, {"deep": None}]}
    message["gpus"][0]["nvlink"] = [{"peer": 1}]
    message["gpus"][0]["processes"][0]["cmdline"] = "python train.py"
    assert wire.decode_telemetry(msgpack.packb(message)) == EXPECTED["telemetry"]


def test_absent_optional_fields_decode_as_none() -> None:
    message = copy.deepcopy(THIRD_PARTY["telemetry"])
    del message["driver_version"]
    for key in ("gpu_util_pct", "memory_util_pct", "temperature_c", "power_mw", "mig_mode", "ecc_corrected"):
        del message["gpus"][0][key]
    message["gpus"][0]["processes"] = [{"pid": 17}]
    decoded = wire.decode_telemetry(msgpack.packb(message))
    assert decoded.driver_version is None
    assert decoded.gpus[0].gpu_util_pct is None and decoded.gpus[0].mig_mode is None
    assert decoded.gpus[0].processes == (wire.ProcessReport(pid=17),)


def test_decoded_messages_are_frozen() -> None:
    decoded = wire.decode_telemetry(packed("telemetry"))
    with pytest.raises(AttributeError):
        decoded.seq = 8  # type: ignore[misc]


# --- the decoder raises nothing but WireError ---


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=300)
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_wire_error(kind: str, data: bytes) -> None:
    with contextlib.suppress(WireError):
        DECODERS[kind](data)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=200)
@given(value=msgpack_values)
def test_arbitrary_msgpack_values_raise_only_wire_error(kind: str, value: Any) -> None:
    with pytest.raises(WireError):
        DECODERS[kind](msgpack.packb(value))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_value_in_any_field_raises_only_wire_error(kind: str, data: st.DataObject) -> None:
    paths = [path for path, _ in leaf_paths(THIRD_PARTY[kind])]
    path = data.draw(st.sampled_from(paths))
    payload = changed(kind, path, data.draw(msgpack_values))
    with contextlib.suppress(WireError):
        DECODERS[kind](payload)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_corrupted_valid_messages_raise_only_wire_error(kind: str, data: st.DataObject) -> None:
    payload = bytearray(packed(kind))
    for _ in range(data.draw(st.integers(1, 8))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        DECODERS[kind](bytes(payload))


@pytest.mark.parametrize(("kind", "path"), ALL_FIELDS, ids=[f"{k}:{'.'.join(map(str, p))}" for k, p in ALL_FIELDS])
def test_a_wrong_type_in_any_field_is_wrong_type(kind: str, path: Path) -> None:
    message: Any = THIRD_PARTY[kind]
    for step in path:
        message = message[step]
    assert reason_of(DECODERS[kind], changed(kind, path, wrong_type_for(message))) is WireReason.WRONG_TYPE


@pytest.mark.parametrize("kind", KINDS)
def test_every_prefix_of_a_valid_message_is_truncated(kind: str) -> None:
    payload = packed(kind)
    for end in range(len(payload)):
        assert reason_of(DECODERS[kind], payload[:end]) is WireReason.TRUNCATED, end


ARRAY_LEVEL = b"\x91"  # a one-element array
MAP_LEVEL = b"\x81\xa1k"  # a one-entry map {"k": ...}


def with_unknown_key(kind: str, raw_value: bytes) -> bytes:
    """A valid message with one more key, "zz", whose value is the given raw msgpack bytes."""
    payload = packed(kind)
    assert 0x80 <= payload[0] <= 0x8E, "the fixtures are fixmaps of fewer than 15 keys"
    return bytes([payload[0] + 1]) + payload[1:] + b"\xa2zz" + raw_value


@pytest.mark.parametrize("depth", [10_000, 300_000])
@pytest.mark.parametrize("level", [ARRAY_LEVEL, MAP_LEVEL], ids=["arrays", "maps"])
def test_deep_nesting_under_an_unknown_key_is_refused_as_oversized(depth: int, level: bytes) -> None:
    payload = with_unknown_key("telemetry", level * depth + b"\xc0")
    assert len(payload) <= wire.MAX_MESSAGE_BYTES
    assert reason_of(wire.decode_telemetry, payload) is WireReason.OVERSIZED


def test_modest_nesting_under_an_unknown_key_is_ignored() -> None:
    assert wire.decode_telemetry(with_unknown_key("telemetry", ARRAY_LEVEL * 50 + b"\xc0")) == EXPECTED["telemetry"]


@pytest.mark.parametrize("kind", KINDS)
def test_deep_nesting_where_a_map_belongs_is_wrong_type(kind: str) -> None:
    assert reason_of(DECODERS[kind], ARRAY_LEVEL * 1_000_000 + b"\xc0") is WireReason.WRONG_TYPE


def with_raw_gpus(raw_value: bytes) -> bytes:
    """The telemetry fixture with the raw msgpack bytes as the value of "gpus", its last key."""
    payload = packed("telemetry", gpus=None)
    assert payload.endswith(b"\xa4gpus\xc0")
    return payload[:-1] + raw_value


def test_deep_nesting_in_a_known_field_is_wrong_type() -> None:
    assert reason_of(wire.decode_telemetry, with_raw_gpus(ARRAY_LEVEL * 10_000 + b"\xc0")) is WireReason.WRONG_TYPE


def test_a_huge_map_of_unknown_keys_is_skipped() -> None:
    message = {**THIRD_PARTY["telemetry"], **{f"extra{i}": i for i in range(50_000)}}
    assert wire.decode_telemetry(msgpack.packb(message)) == EXPECTED["telemetry"]


def test_too_many_labels_are_out_of_range() -> None:
    labels = {f"key{i}": "value" for i in range(65)}
    assert reason_of(wire.decode_alert, packed("alert", labels=labels)) is WireReason.OUT_OF_RANGE


@pytest.mark.parametrize(
    "header",
    [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"],
    ids=["array32", "map32", "str32", "bin32"],
)
def test_a_length_header_promising_four_billion_items_is_truncated_without_allocating(header: bytes) -> None:
    assert reason_of(wire.decode_telemetry, with_unknown_key("telemetry", header)) is WireReason.TRUNCATED


def test_a_list_or_map_header_promising_four_billion_items_where_one_belongs_is_truncated() -> None:
    assert reason_of(wire.decode_telemetry, b"\xdf\xff\xff\xff\xff") is WireReason.TRUNCATED
    assert reason_of(wire.decode_telemetry, with_raw_gpus(b"\xdd\x00\x00\x00\x10")) is WireReason.TRUNCATED
    assert reason_of(wire.decode_telemetry, with_raw_gpus(b"\xdd\xff\xff\xff\xff")) is WireReason.OUT_OF_RANGE


# --- one test per reason ---


def test_bytes_that_are_not_msgpack_are_not_msgpack() -> None:
    assert reason_of(wire.decode_telemetry, b"\xc1") is WireReason.NOT_MSGPACK
    assert reason_of(wire.decode_telemetry, packed("telemetry") + b"\x00") is WireReason.NOT_MSGPACK


def test_a_string_that_is_not_utf8_is_not_msgpack() -> None:
    payload = packed("telemetry").replace(b"gpu-node-1", b"gpu-node-\xff")
    assert reason_of(wire.decode_telemetry, payload) is WireReason.NOT_MSGPACK


def test_a_cut_message_is_truncated() -> None:
    assert reason_of(wire.decode_health, packed("health")[:-3]) is WireReason.TRUNCATED


def test_a_payload_over_the_limit_is_oversized_before_decoding() -> None:
    padding = b"\xc6" + (wire.MAX_MESSAGE_BYTES).to_bytes(4, "big") + bytes(wire.MAX_MESSAGE_BYTES)
    assert reason_of(wire.decode_telemetry, with_unknown_key("telemetry", padding)) is WireReason.OVERSIZED
    assert reason_of(wire.decode_alert, b"\xc1" * (wire.MAX_MESSAGE_BYTES + 1)) is WireReason.OVERSIZED


def test_a_payload_of_exactly_the_limit_decodes() -> None:
    base = with_unknown_key("telemetry", b"")
    filler = wire.MAX_MESSAGE_BYTES - len(base) - 5
    payload = base + b"\xc6" + filler.to_bytes(4, "big") + bytes(filler)
    assert len(payload) == wire.MAX_MESSAGE_BYTES
    assert wire.decode_telemetry(payload) == EXPECTED["telemetry"]


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("telemetry", ("seq",), "7"),
        ("telemetry", ("gpus",), {"index": 0}),
        ("telemetry", ("gpus", 0, "mig_mode"), 1),
        ("telemetry", ("gpus", 0, "memory_used_bytes"), 1.5),
        ("alert", ("labels",), {"team": 5}),
        ("alert", ("labels",), {5: "team"}),
    ],
)
def test_a_value_of_the_wrong_type_is_wrong_type(kind: str, path: Path, value: Any) -> None:
    assert reason_of(DECODERS[kind], changed(kind, path, value)) is WireReason.WRONG_TYPE


def test_a_message_that_is_not_a_map_is_wrong_type() -> None:
    assert reason_of(wire.decode_decision, msgpack.packb(list(THIRD_PARTY["decision"].values()))) is (
        WireReason.WRONG_TYPE
    )


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("telemetry", ("v",), 0),
        ("telemetry", ("seq",), -1),
        ("telemetry", ("ts_ns",), -1),
        ("telemetry", ("node",), ""),
        ("telemetry", ("node",), "n" * 254),
        ("telemetry", ("boot",), "b" * 65),
        ("telemetry", ("interval_ms",), 0),
        ("telemetry", ("gpus", 0, "index"), 64),
        ("telemetry", ("gpus", 0, "gpu_util_pct"), 101),
        ("telemetry", ("gpus", 0, "memory_free_bytes"), -1),
        ("telemetry", ("gpus", 0, "processes", 0, "pid"), 0),
        ("telemetry", ("gpus",), [THIRD_PARTY["telemetry"]["gpus"][0]] * 65),
        ("health", ("status",), "on_fire"),
        ("health", ("problems", 0, "kind"), "meteor"),
        ("alert", ("name",), "Gpu.Memory"),
        ("alert", ("name",), "Gpu Memory"),
        ("alert", ("state",), "pending"),
        ("alert", ("gpu_index",), -1),
        ("alert", ("message",), "m" * 4097),
        ("decision", ("action",), "delete"),
        ("decision", ("gpu_indices",), [64]),
        ("decision", ("reason",), ""),
        ("decision", ("pod_namespace",), "n" * 64),
    ],
)
def test_a_value_outside_its_range_is_out_of_range(kind: str, path: Path, value: Any) -> None:
    assert reason_of(DECODERS[kind], changed(kind, path, value)) is WireReason.OUT_OF_RANGE


def test_values_at_the_edges_of_their_ranges_decode() -> None:
    payload = packed("telemetry", node="n" * 253, boot="b" * 64, seq=2**64 - 1, ts_ns=0)
    decoded = wire.decode_telemetry(payload)
    assert (decoded.node, decoded.seq, decoded.ts_ns) == ("n" * 253, 2**64 - 1, 0)


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("telemetry", ("v",)),
        ("telemetry", ("boot",)),
        ("telemetry", ("gpus",)),
        ("telemetry", ("gpus", 0, "uuid")),
        ("telemetry", ("gpus", 0, "processes", 0, "pid")),
        ("health", ("problems", 0, "message")),
        ("alert", ("labels",)),
        ("decision", ("cycle",)),
    ],
)
def test_a_missing_required_field_is_missing_field(kind: str, path: Path) -> None:
    assert reason_of(DECODERS[kind], without(kind, path)) is WireReason.MISSING_FIELD


@pytest.mark.parametrize("kind", KINDS)
def test_a_message_from_a_later_schema_is_unknown_version(kind: str) -> None:
    assert reason_of(DECODERS[kind], packed(kind, v=2)) is WireReason.UNKNOWN_VERSION
    # A future schema may look nothing like this one: the version decides, not the first broken field.
    assert reason_of(DECODERS[kind], msgpack.packb({"node": 5, "v": 2, "body": [1]})) is WireReason.UNKNOWN_VERSION


def test_a_message_on_another_nodes_subject_is_subject_mismatch() -> None:
    payload = packed("telemetry")
    assert wire.decode_telemetry(payload, subject_node="gpu-node-1") == EXPECTED["telemetry"]
    assert reason_of(lambda data: wire.decode_telemetry(data, subject_node="gpu-node-2"), payload) is (
        WireReason.SUBJECT_MISMATCH
    )
    assert reason_of(lambda data: wire.decode_health(data, subject_node="gpu-node-2"), packed("health")) is (
        WireReason.SUBJECT_MISMATCH
    )


def test_a_message_out_of_sequence_is_a_verdict_not_an_exception() -> None:
    gate = sequencing.SequenceGate()
    assert gate.admit("n", boot="a", seq=5, ts_ns=10) is sequencing.Admission.ACCEPTED
    verdict = gate.admit("n", boot="a", seq=5, ts_ns=10)
    assert not verdict.accepted  # the very message again: the consumer counts it as a duplicate


# --- encoding ---


def test_encoding_refuses_a_message_readers_would_reject() -> None:
    bad_seq = wire.NodeHealth(**{**ENVELOPE, "seq": -1}, status=wire.HealthStatus.HEALTHY, problems=())
    with pytest.raises(WireError) as caught:
        wire.encode(bad_seq)
    assert caught.value.reason is WireReason.OUT_OF_RANGE
    too_big = wire.NodeHealth(**{**ENVELOPE, "seq": 2**64}, status=wire.HealthStatus.HEALTHY, problems=())
    with pytest.raises(WireError) as caught:
        wire.encode(too_big)
    assert caught.value.reason is WireReason.OUT_OF_RANGE


def test_encoding_refuses_a_message_over_the_payload_limit() -> None:
    process = wire.ProcessReport(pid=1, used_memory_bytes=1, pod_uid=POD_UID, container_id="c" * 128)
    gpu = {key: value for key, value in THIRD_PARTY["telemetry"]["gpus"][0].items() if key != "processes"}
    crowded = wire.GpuReport(**gpu, processes=(process,) * 1024)
    message = wire.NodeTelemetry(**ENVELOPE, interval_ms=1000, gpus=(crowded,) * 8)
    with pytest.raises(WireError) as caught:
        wire.encode(message)
    assert caught.value.reason is WireReason.OVERSIZED


# --- batches ---


def test_a_batch_decodes_each_payload_and_returns_rejections_as_values() -> None:
    good = packed("telemetry")
    other_node = packed("telemetry", node="gpu-node-2")
    results = wire.decode_telemetry_batch(
        [good, b"\xc1", good[:-1], other_node, good], subject_nodes=["gpu-node-1", None, None, "gpu-node-1", None]
    )
    assert results[0] == EXPECTED["telemetry"] and results[4] == EXPECTED["telemetry"]
    reasons = [result.reason for result in results[1:4] if isinstance(result, WireError)]
    assert reasons == [WireReason.NOT_MSGPACK, WireReason.TRUNCATED, WireReason.SUBJECT_MISMATCH]


def test_a_batch_refuses_oversized_payloads_and_needs_one_subject_per_payload() -> None:
    [result] = wire.decode_telemetry_batch([bytes(wire.MAX_MESSAGE_BYTES + 1)])
    assert isinstance(result, WireError) and result.reason is WireReason.OVERSIZED
    with pytest.raises(ValueError, match="subject"):
        wire.decode_telemetry_batch([b"", b""], subject_nodes=["n"])


# --- ordering (the gate itself is tested in test_sequencing.py) ---


def test_the_gate_reads_the_envelope_of_a_decoded_message() -> None:
    gate = sequencing.SequenceGate()
    message = wire.decode_telemetry(packed("telemetry"))
    assert gate.admit_message(message) is sequencing.Admission.ACCEPTED
    assert gate.admit_message(message) is sequencing.Admission.REPEATED_SEQ

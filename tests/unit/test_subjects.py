"""common.subjects: node names (dots included) become one NATS token and come back; node_of reads subjects back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import subjects

# Kubernetes node names are DNS subdomains: labels of lowercase letters, digits and '-' (not at either end), joined
# by dots.
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_LABEL = st.builds(
    lambda first, middle, last: first + middle + last,
    st.sampled_from(_ALNUM),
    st.text(alphabet=_ALNUM + "-", max_size=8),
    st.sampled_from(_ALNUM),
)
NODE_NAMES = st.lists(_LABEL, min_size=1, max_size=5).map(".".join)


def test_the_subjects_of_protocol_v1_are_spelled_as_documented() -> None:
    assert subjects.telemetry("gpu-1") == "quotient.v1.telemetry.gpu-1"
    assert subjects.health("gpu-1") == "quotient.v1.health.gpu-1"
    assert subjects.alert("GpuMemoryOverconsumption") == "quotient.v1.alerts.GpuMemoryOverconsumption"
    assert subjects.DECISIONS == "quotient.v1.decisions"
    assert subjects.TELEMETRY_ALL == "quotient.v1.telemetry.>"
    assert subjects.HEALTH_ALL == "quotient.v1.health.>"
    assert subjects.ALERTS_ALL == "quotient.v1.alerts.>"
    assert subjects.TELEMETRY_STREAM == "QUOTIENT_TELEMETRY"


def test_a_node_name_with_dots_becomes_a_single_token() -> None:
    assert subjects.node_token("ip-10-0-0-1.ec2.internal") == "ip-10-0-0-1~ec2~internal"
    assert subjects.telemetry("ip-10-0-0-1.ec2.internal") == "quotient.v1.telemetry.ip-10-0-0-1~ec2~internal"
    assert subjects.telemetry("ip-10-0-0-1.ec2.internal").count(".") == 3


def test_a_node_name_without_dots_is_its_own_token() -> None:
    assert subjects.node_token("gpu-node-7") == "gpu-node-7"


@settings(max_examples=50)
@given(NODE_NAMES)
def test_every_kubernetes_node_name_round_trips_through_its_token(node: str) -> None:
    token = subjects.node_token(node)
    assert "." not in token
    assert subjects.node_from_token(token) == node
    assert subjects.node_of(subjects.telemetry(node)) == node
    assert subjects.node_of(subjects.health(node)) == node


@pytest.mark.parametrize(
    "node",
    ["gpu 1", "gpu\t1", "gpu\n1", "gpu\r1", "gpu*", ">", "*", "a.b c", " "],
)
def test_a_node_name_that_cannot_be_a_token_is_refused(node: str) -> None:
    with pytest.raises(ValueError, match="cannot be a NATS subject token"):
        subjects.node_token(node)
    with pytest.raises(ValueError):
        subjects.telemetry(node)
    with pytest.raises(ValueError):
        subjects.health(node)


def test_an_empty_node_name_is_refused() -> None:
    with pytest.raises(ValueError, match="empty node name"):
        subjects.node_token("")


@pytest.mark.parametrize("name", ["", "Gpu.Memory", "a b", "x*", ">", "tab\there", "line\nbreak"])
def test_an_alert_name_that_cannot_be_a_token_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot be a NATS subject token"):
        subjects.alert(name)


@pytest.mark.parametrize(
    ("subject", "node"),
    [
        ("quotient.v1.telemetry.gpu-1", "gpu-1"),
        ("quotient.v1.health.gpu-1", "gpu-1"),
        ("quotient.v1.telemetry.ip-10-0-0-1~ec2~internal", "ip-10-0-0-1.ec2.internal"),
        ("quotient.v1.health.a~b", "a.b"),
    ],
)
def test_node_of_reads_the_node_from_telemetry_and_health_subjects(subject: str, node: str) -> None:
    assert subjects.node_of(subject) == node


@pytest.mark.parametrize(
    "subject",
    [
        "quotient.v1.alerts.TelemetryStale",
        "quotient.v1.decisions",
        "quotient.v1.telemetry",
        "quotient.v1.telemetry.",
        "quotient.v1.health.",
        "quotient.v1.telemetry.a.b",
        "quotient.v1.telemetryx.gpu-1",
        "quotient.v2.telemetry.gpu-1",
        "other.v1.telemetry.gpu-1",
        "xquotient.v1.telemetry.gpu-1",
        "_INBOX.abc",
        "$JS.API.STREAM.INFO.QUOTIENT_TELEMETRY",
        "",
    ],
)
def test_node_of_is_none_for_every_other_subject(subject: str) -> None:
    assert subjects.node_of(subject) is None


def test_subjects_built_here_never_name_a_node_through_node_of_when_they_are_not_node_subjects() -> None:
    assert subjects.node_of(subjects.alert("GhostAllocation")) is None
    assert subjects.node_of(subjects.DECISIONS) is None

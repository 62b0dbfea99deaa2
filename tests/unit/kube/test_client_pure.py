"""The pure parts of scheduler.kube.client: resource paths, the watch line splitter and the event decoder."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.kube import kubeapi, watchstream
from scheduler.kube.errors import KubeGone, KubeUnavailable


def test_core_and_grouped_resources_have_their_api_paths() -> None:
    assert kubeapi.PODS.path() == "/api/v1/pods"
    assert kubeapi.PODS.path(namespace="ml") == "/api/v1/namespaces/ml/pods"
    assert kubeapi.PODS.path(namespace="ml", name="p", subresource="binding") == "/api/v1/namespaces/ml/pods/p/binding"
    assert kubeapi.NODES.path(name="gpu-1") == "/api/v1/nodes/gpu-1"
    assert kubeapi.QUEUES.path(name="test", subresource="status") == "/apis/scheduling.run.ai/v2/queues/test/status"
    assert kubeapi.POD_GROUPS.path(namespace="ml") == "/apis/scheduling.run.ai/v2alpha2/namespaces/ml/podgroups"
    assert kubeapi.LEASES.api_version == "coordination.k8s.io/v1"
    assert kubeapi.PODS.api_version == "v1"


def test_a_namespace_on_a_cluster_scoped_resource_or_a_missing_one_on_a_namespaced_object_is_refused() -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        kubeapi.QUEUES.path(namespace="default")
    with pytest.raises(ValueError, match="needs a namespace"):
        kubeapi.PODS.path(name="p")


def test_names_are_quoted_into_the_path() -> None:
    assert kubeapi.CONFIG_MAPS.path(namespace="a b", name="x/y") == "/api/v1/namespaces/a%20b/configmaps/x%2Fy"


def test_the_known_kinds_cover_every_owner_the_grouper_follows() -> None:
    for api_version, kind in [
        ("apps/v1", "Deployment"),
        ("apps/v1", "ReplicaSet"),
        ("apps/v1", "StatefulSet"),
        ("batch/v1", "Job"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("kubeflow.org/v1", "MPIJob"),
        ("kubeflow.org/v1", "TFJob"),
        ("ray.io/v1", "RayCluster"),
        ("ray.io/v1", "RayJob"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ("v1", "Service"),
    ]:
        assert kubeapi.KNOWN_RESOURCES[(api_version, kind)].kind == kind


def test_lines_split_across_chunks_are_joined_and_blank_lines_skipped() -> None:
    buffer = watchstream.LineBuffer()

    assert buffer.feed(b'{"a":') == []
    assert buffer.feed(b'1}\n\n{"b"') == [b'{"a":1}']
    assert buffer.feed(b":2}\n") == [b'{"b":2}']
    assert buffer.rest() == b""


def test_a_last_line_without_its_newline_is_kept_for_the_end() -> None:
    buffer = watchstream.LineBuffer()
    buffer.feed(b'{"a":1}\n{"b":2}')

    assert buffer.rest() == b'{"b":2}'


def test_a_line_that_never_ends_is_a_broken_stream() -> None:
    buffer = watchstream.LineBuffer(limit=16)

    with pytest.raises(KubeUnavailable, match="exceeded 16 bytes"):
        buffer.feed(b"x" * 10)
        buffer.feed(b"x" * 10)


@given(
    st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b.strip()), max_size=8), st.data()
)
def test_any_chunking_yields_the_same_lines(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    buffer = watchstream.LineBuffer()
    found: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        found += buffer.feed(stream[start:end])

    assert found == lines
    assert buffer.rest() == b""


def test_watch_lines_decode_to_events() -> None:
    line = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "p"}}}).encode()

    event = watchstream.decode_watch_line(line)

    assert event == kubeapi.WatchEvent(type=kubeapi.WatchType.ADDED, object={"metadata": {"name": "p"}})


def test_an_error_event_with_code_410_decodes_to_gone() -> None:
    line = json.dumps(
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    ).encode()

    error = watchstream.decode_watch_line(line)

    assert isinstance(error, KubeGone)
    assert error.message == "too old"


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1,2]", b'{"type":"ADDED"}', b'{"type":"EXPLODED","object":{}}', b'{"type":[],"object":{}}'],
)
def test_lines_that_are_not_events_decode_to_nothing(line: bytes) -> None:
    assert watchstream.decode_watch_line(line) is None

"""agent.fakenode: fake GPUs from a cluster spec, and a proc tree the real PodMapper attributes to the right pods."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import fakenode, podmap
from agent.gpus import fake
from agent.gpus.probe import ProbeSample
from agent.podmap import PodMapper, PodRef
from common import clusterspec
from common.errors import ClusterSpecError

GiB = 1024**3
SECOND = 1_000_000_000
UID_A = "6f3c1a2e-9b4d-4e8a-a1f0-3c5d7e9b2a41"
UID_B = "c8bad552-5c99-4d4f-b71c-c426c0cde014"


class Clock:
    def __init__(self, now_ns: int = 1_000 * SECOND) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def node(tmp_path: Path, clock: Clock) -> Iterator[fakenode.FakeNode]:
    spec = clusterspec.parse_inline("1x2xA100-80GB")
    fake_node = fakenode.FakeNode(spec.nodes[0], proc_root=tmp_path / "proc", clock=clock)
    fake_node.probe.open()
    yield fake_node
    fake_node.close()


def memory_by_pid(sample: ProbeSample) -> dict[tuple[int, int], int | None]:
    found: dict[tuple[int, int], int | None] = {}
    for device in sample.devices:
        for process in device.processes or ():
            found[(device.index, process.pid)] = process.used_memory_bytes
    return found


def owner(uid: str, qos: podmap.Qos = "burstable") -> PodRef:
    return PodRef(pod_uid=uid, container_id=fakenode.container_id_for(uid), qos=qos)


# --- the proc tree ---


@pytest.mark.parametrize("qos", ["burstable", "besteffort", "guaranteed"])
def test_a_pods_processes_are_attributed_to_it_by_the_real_pod_mapper(node: fakenode.FakeNode, qos: podmap.Qos) -> None:
    pids = node.run_pod(pod_uid=UID_A, gpu_indices=[0, 1], memory=clusterspec.MemoryScript.constant(GiB), qos=qos)
    assert len(pids) == 2
    mapper = PodMapper(node.proc_root)
    assert mapper.lookup_many(pids) == {pid: owner(UID_A, qos) for pid in pids}


def test_two_pods_map_to_two_different_pods(node: fakenode.FakeNode) -> None:
    (a,) = node.run_pod(pod_uid=UID_A, gpu_indices=[0], memory=clusterspec.MemoryScript.constant(GiB))
    (b,) = node.run_pod(pod_uid=UID_B, gpu_indices=[0], memory=clusterspec.MemoryScript.constant(GiB))
    assert PodMapper(node.proc_root).lookup_many([a, b]) == {a: owner(UID_A), b: owner(UID_B)}


def test_the_stat_file_gives_each_process_a_start_time_of_its_own(node: fakenode.FakeNode) -> None:
    pids = node.run_pod(pod_uid=UID_A, gpu_indices=[0, 1], memory=clusterspec.MemoryScript.constant(GiB))
    starts = [podmap._start_time((node.proc_root / str(pid) / "stat").read_bytes()) for pid in pids]
    assert starts == pids


def test_the_container_id_is_stable_and_64_hex_digits() -> None:
    cid = fakenode.container_id_for(UID_A)
    assert cid == fakenode.container_id_for(UID_A)
    assert cid != fakenode.container_id_for(UID_A, "sidecar")
    assert len(cid) == 64
    assert int(cid, 16) >= 0


def test_pod_uids_for_spec_pods_are_stable_uuids_per_namespace_and_name() -> None:
    uid = fakenode.pod_uid_for("team-a", "train-0")
    assert uid == fakenode.pod_uid_for("team-a", "train-0")
    assert uid != fakenode.pod_uid_for("team-b", "train-0")
    assert len(uid) == 36


def test_running_a_pod_shows_its_processes_on_the_fake_gpus(node: fakenode.FakeNode) -> None:
    pids = node.run_pod(pod_uid=UID_A, gpu_indices=[1], memory=clusterspec.MemoryScript.constant(3 * GiB))
    assert memory_by_pid(node.probe.sample()) == {(1, pids[0]): 3 * GiB}
    assert node.pods() == {UID_A: pids}


def test_stopping_a_pod_removes_its_processes_and_their_proc_entries(node: fakenode.FakeNode) -> None:
    pids = node.run_pod(pod_uid=UID_A, gpu_indices=[0, 1], memory=clusterspec.MemoryScript.constant(GiB))
    (other,) = node.run_pod(pod_uid=UID_B, gpu_indices=[0], memory=clusterspec.MemoryScript.constant(GiB))
    mapper = PodMapper(node.proc_root)
    node.stop_pod(UID_A)
    assert not any((node.proc_root / str(pid)).exists() for pid in pids)
    assert mapper.lookup_many([*pids, other]) == {pids[0]: None, pids[1]: None, other: owner(UID_B)}
    assert set(memory_by_pid(node.probe.sample())) == {(0, other)}
    assert node.pods() == {UID_B: [other]}


def test_stopping_a_pod_that_does_not_run_is_harmless(node: fakenode.FakeNode) -> None:
    node.stop_pod(UID_A)
    assert node.pods() == {}


def test_running_a_pod_again_replaces_its_processes(node: fakenode.FakeNode) -> None:
    old = node.run_pod(pod_uid=UID_A, gpu_indices=[0, 1], memory=clusterspec.MemoryScript.constant(GiB))
    new = node.run_pod(pod_uid=UID_A, gpu_indices=[1], memory=clusterspec.MemoryScript.constant(2 * GiB))
    assert not set(old) & set(new)
    assert memory_by_pid(node.probe.sample()) == {(1, new[0]): 2 * GiB}
    assert not any((node.proc_root / str(pid)).exists() for pid in old)


def test_running_a_pod_on_a_gpu_the_node_lacks_is_an_error(node: fakenode.FakeNode) -> None:
    with pytest.raises(ClusterSpecError, match="node node-0 has no gpu 2"):
        node.run_pod(pod_uid=UID_A, gpu_indices=[0, 2], memory=clusterspec.MemoryScript.constant(GiB))
    assert node.pods() == {}


def test_unowned_processes_are_on_the_gpus_but_map_to_no_pod(tmp_path: Path, clock: Clock) -> None:
    spec = clusterspec.loads(
        "nodes:\n  - {name: n, gpus: {count: 2, model: T4}, unowned_processes: [{gpu: 1, memory: 6Gi}]}\n"
    )
    fake_node = fakenode.FakeNode(spec.nodes[0], proc_root=tmp_path, clock=clock)
    try:
        fake_node.probe.open()
        held = memory_by_pid(fake_node.probe.sample())
        assert list(held.values()) == [6 * GiB]
        ((index, pid),) = held
        assert index == 1
        assert PodMapper(tmp_path).lookup(pid) is None
        assert (tmp_path / str(pid) / "cgroup").read_text().startswith("0::/system.slice/")
        assert fake_node.pods() == {}
    finally:
        fake_node.close()


def test_a_node_without_a_proc_root_makes_its_own_and_removes_it_on_close(clock: Clock) -> None:
    fake_node = fakenode.FakeNode(clusterspec.parse_inline("1x1xT4").nodes[0], clock=clock)
    root = fake_node.proc_root
    assert root.is_dir()
    fake_node.close()
    assert not root.exists()
    fake_node.close()  # closing twice is harmless


def test_a_pods_memory_follows_its_script_against_the_injected_clock(node: fakenode.FakeNode, clock: Clock) -> None:
    script = clusterspec.parse_memory_script("2Gi@0s,30Gi@20s")
    (pid,) = node.run_pod(pod_uid=UID_A, gpu_indices=[0], memory=script, duration_ns=60 * SECOND)
    readings = []
    for _ in range(4):
        readings.append(memory_by_pid(node.probe.sample()).get((0, pid)))
        clock.advance(20 * SECOND)
    assert readings == [2 * GiB, 30 * GiB, 30 * GiB, None]


# --- assign_devices ---


def spec_pods(pods_yaml: str, gpus: int = 2) -> tuple[clusterspec.NodeSpec, tuple[clusterspec.PodSpec, ...]]:
    spec = clusterspec.loads(f"nodes:\n  - {{name: n, gpus: {{count: {gpus}, model: A100-80GB}}}}\npods:\n{pods_yaml}")
    return spec.nodes[0], spec.pods


def whole(name: str, gpus: int) -> str:
    return f"  - {{name: {name}, node: n, requests: {{nvidia.com/gpu: {gpus}}}}}\n"


def share(name: str, fraction: str) -> str:
    return f"  - {{name: {name}, node: n, annotations: {{gpu-fraction: '{fraction}'}}}}\n"


def test_whole_gpu_pods_take_free_devices_in_index_order() -> None:
    node, pods = spec_pods(whole("a", 1) + whole("b", 2), gpus=4)
    assert fakenode.assign_devices(node, pods) == {"default/a": [0], "default/b": [1, 2]}


def test_fractions_pack_onto_the_first_shared_device_with_room() -> None:
    node, pods = spec_pods(share("a", "0.5") + share("b", "0.3") + share("c", "0.3") + share("d", "0.2"))
    assert fakenode.assign_devices(node, pods) == {
        "default/a": [0],
        "default/b": [0],
        "default/c": [1],
        "default/d": [0],
    }


def test_a_whole_gpu_pod_does_not_take_a_device_that_holds_shares() -> None:
    node, pods = spec_pods(share("a", "0.25") + whole("b", 1) + share("c", "0.75"))
    assert fakenode.assign_devices(node, pods) == {"default/a": [0], "default/b": [1], "default/c": [0]}


def test_pods_without_gpus_get_no_devices() -> None:
    node, pods = spec_pods("  - {name: cpu-only, node: n, requests: {cpu: 2}}\n")
    assert fakenode.assign_devices(node, pods) == {}


def test_too_many_whole_gpus_is_a_clear_error() -> None:
    node, pods = spec_pods(whole("a", 1) + whole("b", 2))
    with pytest.raises(ClusterSpecError, match=r"^pod default/b asks for 2 GPUs; node n has 1 free$"):
        fakenode.assign_devices(node, pods)


def test_a_share_that_finds_no_device_is_a_clear_error() -> None:
    node, pods = spec_pods(whole("a", 1) + share("b", "0.6") + share("c", "0.6"))
    with pytest.raises(ClusterSpecError, match=r"^pod default/c does not fit on node n: no GPU left to share$"):
        fakenode.assign_devices(node, pods)


@pytest.mark.parametrize(
    ("fraction", "says"),
    [
        ("half", "is not a number"),
        ("", "is not a number"),
        ("0", r"must be within \(0, 1\)"),
        ("1", r"must be within \(0, 1\)"),
        ("1.5", r"must be within \(0, 1\)"),
        ("-0.5", r"must be within \(0, 1\)"),
        ("Infinity", r"must be within \(0, 1\)"),
        ("nan", r"must be within \(0, 1\)"),
    ],
)
def test_a_bad_gpu_fraction_is_a_clear_error_naming_the_pod(fraction: str, says: str) -> None:
    node, pods = spec_pods(share("a", fraction))
    with pytest.raises(ClusterSpecError, match=rf"^pod default/a: gpu-fraction '{fraction}' {says}"):
        fakenode.assign_devices(node, pods)


def memory_share(name: str, memory: str) -> str:
    return f"  - {{name: {name}, node: n, annotations: {{gpu-memory: '{memory}'}}}}\n"


def test_a_gpu_memory_share_in_mib_or_as_a_quantity_packs_like_a_fraction() -> None:
    # An A100-80GB has 81920 MiB: 40960 MiB and 40Gi are half of it each, so both fit on device 0; 1Mi more does not.
    node, pods = spec_pods(memory_share("a", "40960") + memory_share("b", "40Gi") + memory_share("c", "1Mi"))
    assert fakenode.assign_devices(node, pods) == {"default/a": [0], "default/b": [0], "default/c": [1]}


def test_a_gpu_memory_share_rounds_up_to_the_next_milli_gpu() -> None:
    # 1 MiB of a 3 MiB device is 333.3 milli-GPU, taken as 334: three such shares no longer fit on one device.
    spec = clusterspec.loads(
        "nodes:\n  - {name: n, gpus: {count: 2, model: A100-80GB, memory: 3Mi}}\npods:\n"
        + "".join(memory_share(f"p{i}", "1") for i in range(3))
    )
    assert fakenode.assign_devices(spec.nodes[0], spec.pods) == {
        "default/p0": [0],
        "default/p1": [0],
        "default/p2": [1],
    }


@pytest.mark.parametrize(
    ("memory", "says"),
    [("lots", "gpu-memory 'lots': "), ("0", "does not fit a device of 80.0 GiB"), ("81921", "does not fit")],
)
def test_a_bad_gpu_memory_share_is_a_clear_error_naming_the_pod(memory: str, says: str) -> None:
    node, pods = spec_pods(memory_share("a", memory))
    with pytest.raises(ClusterSpecError, match=rf"^pod default/a: .*{says}"):
        fakenode.assign_devices(node, pods)


# --- from_cluster_spec ---


def test_the_inline_form_gives_a_node_of_idle_fake_gpus(clock: Clock, tmp_path: Path) -> None:
    spec = clusterspec.resolve("1x2xA100-80GB")
    fake_node = fakenode.from_cluster_spec(spec, node="node-0", proc_root=tmp_path, clock=clock)
    try:
        fake_node.probe.open()
        sample = fake_node.probe.sample()
        assert [(d.index, d.uuid, d.model, d.memory_total_bytes) for d in sample.devices] == [
            (gpu.index, gpu.uuid, "NVIDIA A100-SXM4-80GB", 81920 * 1024**2) for gpu in spec.nodes[0].gpus
        ]
        assert all(device.processes == () for device in sample.devices)
        assert sample.ts_ns == clock.now_ns
        assert fake_node.pods() == {}
    finally:
        fake_node.close()


def test_an_unknown_node_is_an_error_naming_the_nodes_there_are(clock: Clock) -> None:
    spec = clusterspec.parse_inline("2x1xT4")
    with pytest.raises(ClusterSpecError, match=r"no node 'node-9' \(it has node-0, node-1\)"):
        fakenode.from_cluster_spec(spec, node="node-9", clock=clock)


def test_an_unknown_node_in_a_large_cluster_lists_only_the_first_names(clock: Clock) -> None:
    spec = clusterspec.parse_inline("12x0")
    with pytest.raises(ClusterSpecError, match=r"\(it has node-0, .*, node-9\.\.\.\)"):
        fakenode.from_cluster_spec(spec, node="gpu", clock=clock)


SPEC = """
nodes:
  - name: a100
    count: 2
    gpus: {count: 4, model: A100-80GB}
    unowned_processes:
      - {gpu: 1, memory: 1Gi}
pods:
  - name: train
    namespace: team-a
    node: a100-0
    requests: {nvidia.com/gpu: 1}
    gpu_memory: "2Gi@0s,30Gi@20s"
  - name: late
    namespace: team-a
    node: a100-0
    requests: {nvidia.com/gpu: 1}
    gpu_memory: 4Gi
    arrive: 10s
    duration: 30s
  - name: share
    namespace: team-b
    node: a100-0
    annotations: {gpu-fraction: "0.5"}
    gpu_memory: [{at: 0s, memory: 3Gi}]
  - name: unscripted
    namespace: team-b
    node: a100-0
    annotations: {gpu-fraction: "0.25"}
  - name: elsewhere
    node: a100-1
    requests: {nvidia.com/gpu: 1}
    gpu_memory: 5Gi
  - name: pending
    requests: {nvidia.com/gpu: 1}
    gpu_memory: 5Gi
"""


@pytest.fixture
def spec_node(tmp_path: Path, clock: Clock) -> Iterator[fakenode.FakeNode]:
    fake_node = fakenode.from_cluster_spec(
        clusterspec.loads(SPEC, "cluster.yaml"), node="a100-0", proc_root=tmp_path, clock=clock
    )
    fake_node.probe.open()
    yield fake_node
    fake_node.close()


def test_only_the_scripted_pods_pinned_to_the_node_run_there(spec_node: fakenode.FakeNode) -> None:
    assert set(spec_node.pods()) == {
        fakenode.pod_uid_for("team-a", "train"),
        fakenode.pod_uid_for("team-a", "late"),
        fakenode.pod_uid_for("team-b", "share"),
    }


def test_spec_pods_are_assigned_devices_as_the_device_plugin_would() -> None:
    spec = clusterspec.loads(SPEC)
    pinned = [pod for pod in spec.pods if pod.node == "a100-0"]
    assert fakenode.assign_devices(spec.nodes[0], pinned) == {
        "team-a/train": [0],
        "team-a/late": [1],
        "team-b/share": [2],
        "team-b/unscripted": [2],
    }


def test_spec_pods_run_on_their_assigned_devices(spec_node: fakenode.FakeNode, clock: Clock) -> None:
    pods = spec_node.pods()
    (train,) = pods[fakenode.pod_uid_for("team-a", "train")]
    (late,) = pods[fakenode.pod_uid_for("team-a", "late")]
    (shared,) = pods[fakenode.pod_uid_for("team-b", "share")]
    clock.advance(10 * SECOND)  # "late" has arrived
    held = memory_by_pid(spec_node.probe.sample())
    assert {(0, train), (1, late), (2, shared)} <= set(held)
    assert not any(index == 3 for index, _ in held)


def test_spec_pods_map_to_their_uids_through_the_proc_tree(spec_node: fakenode.FakeNode) -> None:
    mapper = PodMapper(spec_node.proc_root)
    for uid, pids in spec_node.pods().items():
        for pid in pids:
            ref = mapper.lookup(pid)
            assert ref is not None
            assert ref.pod_uid == uid


def test_spec_pods_memory_follows_their_scripts_as_the_clock_moves(spec_node: fakenode.FakeNode, clock: Clock) -> None:
    pods = spec_node.pods()
    (train,) = pods[fakenode.pod_uid_for("team-a", "train")]
    (late,) = pods[fakenode.pod_uid_for("team-a", "late")]
    (shared,) = pods[fakenode.pod_uid_for("team-b", "share")]

    def held() -> dict[int, int | None]:
        return {pid: memory for (_, pid), memory in memory_by_pid(spec_node.probe.sample()).items()}

    at_0 = held()
    clock.advance(10 * SECOND)
    at_10 = held()
    clock.advance(10 * SECOND)
    at_20 = held()
    clock.advance(20 * SECOND)
    at_40 = held()
    assert (at_0[train], at_0[shared], at_0.get(late)) == (2 * GiB, 3 * GiB, None)
    assert (at_10[train], at_10[late]) == (2 * GiB, 4 * GiB)
    assert (at_20[train], at_20[late]) == (30 * GiB, 4 * GiB)
    assert (at_40[train], at_40.get(late)) == (30 * GiB, None)  # "late" ran for its 30 s and exited


def test_unowned_processes_of_the_spec_run_beside_the_pods(spec_node: fakenode.FakeNode) -> None:
    owned = {pid for pids in spec_node.pods().values() for pid in pids}
    strays = {key: memory for key, memory in memory_by_pid(spec_node.probe.sample()).items() if key[1] not in owned}
    assert list(strays.values()) == [GiB]
    ((index, pid),) = strays
    assert index == 1
    assert PodMapper(spec_node.proc_root).lookup(pid) is None


def test_a_spec_that_overflows_the_node_is_refused(clock: Clock) -> None:
    spec = clusterspec.loads(
        "nodes:\n  - {name: n, gpus: {count: 1, model: T4}}\npods:\n"
        + whole("a", 1).replace("node: n", "node: n, gpu_memory: 1Gi")
        + whole("b", 1).replace("node: n", "node: n, gpu_memory: 1Gi")
    )
    with pytest.raises(ClusterSpecError, match="pod default/b asks for 1 GPUs; node n has 0 free"):
        fakenode.from_cluster_spec(spec, node="n", clock=clock)


def test_fake_probe_memory_scripts_are_built_from_the_spec_points() -> None:
    script = clusterspec.parse_memory_script("1Gi@0s,2Gi@5s")
    converted = fakenode._to_fake_script(script, end_ns=9 * SECOND)
    assert converted == fake.MemoryScript(steps=((0, GiB), (5 * SECOND, 2 * GiB)), end_ns=9 * SECOND)

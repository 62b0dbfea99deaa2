from __future__ import annotations

import itertools
import os
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import podmap
from agent.podmap import PodMapper, PodRef

UID = "6f3c1a2e-9b4d-4e8a-a1f0-3c5d7e9b2a41"
UID_ = UID.replace("-", "_")
OTHER_UID = "c8bad552-5c99-4d4f-b71c-c426c0cde014"
CID = "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
OTHER_CID = "d61328552873b5145655fa7918c7fbbce53dbe076d6c2b5fc95d660709af29c2"
NODE_CID = "611a8d133d2c636e777745e4dbb1d5866a068fe0f6cc87033e52fe139fca5ba1"
STATIC_POD_HASH = "3d1b8e1a5c7b4a8c9e8f0a1b2c3d4e5f"

BURSTABLE_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
BESTEFFORT_SLICE = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"


def v1_lines(path: str, *, systemd_path: str | None = None) -> str:
    """A cgroup v1 file as a cgroupfs or systemd node shows it: every controller in its own hierarchy."""
    controllers = ["cpuset", "cpu,cpuacct", "blkio", "memory", "devices", "freezer", "net_cls,net_prio", "perf_event"]
    controllers += ["hugetlb", "pids", "rdma"]
    lines = [f"{12 - n}:{controller}:{path}" for n, controller in enumerate(controllers)]
    lines.append(f"1:name=systemd:{systemd_path if systemd_path is not None else path}")
    return "\n".join(lines) + "\n"


def pod(uid: str = UID, container: str | None = CID, qos: podmap.Qos | None = "burstable") -> PodRef:
    return PodRef(pod_uid=uid, container_id=container, qos=qos)


SHAPES: list[tuple[str, str, PodRef | None]] = [
    # cgroup v2, systemd driver
    (
        "v2 systemd containerd burstable",
        f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n",
        pod(),
    ),
    (
        "v2 systemd containerd guaranteed sits directly under kubepods.slice",
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        pod(qos="guaranteed"),
    ),
    (
        "v2 systemd containerd besteffort",
        f"0::{BESTEFFORT_SLICE}/cri-containerd-{CID}.scope\n",
        pod(qos="besteffort"),
    ),
    ("v2 systemd CRI-O", f"0::{BURSTABLE_SLICE}/crio-{CID}.scope\n", pod()),
    ("v2 systemd CRI-O under crun's container subgroup", f"0::{BURSTABLE_SLICE}/crio-{CID}.scope/container\n", pod()),
    (
        "v2 systemd CRI-O conmon in the pod is the pod but no container",
        f"0::{BURSTABLE_SLICE}/crio-conmon-{CID}.scope\n",
        pod(container=None),
    ),
    ("CRI-O conmon in system.slice is no pod", f"0::/system.slice/crio-conmon-{CID}.scope\n", None),
    ("v2 systemd Docker through cri-dockerd", f"0::{BESTEFFORT_SLICE}/docker-{CID}.scope\n", pod(qos="besteffort")),
    ("v2 process in the pod cgroup itself", f"0::{BURSTABLE_SLICE}\n", pod(container=None)),
    (
        "v2 cgroup removed while a zombie lives on",
        f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope (deleted)\n",
        pod(),
    ),
    # cgroupfs driver
    ("cgroupfs containerd burstable", f"0::/kubepods/burstable/pod{UID}/{CID}\n", pod()),
    ("cgroupfs guaranteed", f"0::/kubepods/pod{UID}/{CID}\n", pod(qos="guaranteed")),
    ("cgroupfs besteffort", f"0::/kubepods/besteffort/pod{UID}/{CID}\n", pod(qos="besteffort")),
    ("cgroupfs CRI-O", f"0::/kubepods/burstable/pod{UID}/crio-{CID}\n", pod()),
    ("cgroupfs CRI-O conmon", f"0::/kubepods/burstable/pod{UID}/crio-conmon-{CID}\n", pod(container=None)),
    # cgroup v1: many controller lines
    ("v1 cgroupfs, every controller", v1_lines(f"/kubepods/burstable/pod{UID}/{CID}"), pod()),
    (
        "v1 systemd driver with Docker",
        v1_lines(f"{BESTEFFORT_SLICE}/docker-{CID}.scope"),
        pod(qos="besteffort"),
    ),
    (
        "v1 where only name=systemd names the pod",
        v1_lines("/", systemd_path=f"{BURSTABLE_SLICE}/crio-{CID}.scope"),
        pod(),
    ),
    (
        "v1 hybrid with an empty unified line",
        v1_lines(f"/kubepods/pod{UID}/{CID}") + "0::/\n",
        pod(qos="guaranteed"),
    ),
    (
        "v1 containerd writing systemd's slice:prefix:id form literally",
        "\n".join(
            [
                f"11:perf_event:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
                f"10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
                f"4:memory:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
                "1:name=systemd:/system.slice/containerd.service",
            ]
        ),
        pod(qos="besteffort"),
    ),
    # nested: kind, cgroup namespaces, pods in pods
    (
        "kind node seen from the host, cgroup v2",
        f"0::/system.slice/docker-{NODE_CID}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        pod(qos="besteffort"),
    ),
    (
        "kind node seen from inside, guaranteed",
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        pod(qos="guaranteed"),
    ),
    (
        "kind node seen from the host, cgroup v1",
        v1_lines(f"/docker/{NODE_CID}/kubepods/besteffort/pod{UID}/{CID}"),
        pod(qos="besteffort"),
    ),
    (
        "reader in its own cgroup namespace, systemd",
        f"0::/../../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        pod(),
    ),
    ("reader in its own cgroup namespace, cgroupfs", f"0::/../../../burstable/pod{UID}/{CID}\n", pod()),
    ("reader in the same QoS level cannot tell the class", f"0::/../../pod{UID}/{CID}\n", pod(qos=None)),
    (
        "kind cluster inside a pod maps to the outer pod",
        f"0::/kubepods/burstable/pod{UID}/{CID}/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-pod{OTHER_UID.replace('-', '_')}.slice/cri-containerd-{OTHER_CID}.scope\n",
        pod(),
    ),
    (
        "rootless containerd without QoS cgroups names no pod",
        f"0::/user.slice/user-1001.slice/user@1001.service/user.slice/cri-containerd-{CID}.scope\n",
        None,
    ),
    # host processes and plain containers
    ("host daemon", "0::/system.slice/nvidia-persistenced.service\n", None),
    ("user session", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("init", "0::/init.scope\n", None),
    ("root cgroup", "0::/\n", None),
    ("v1 host daemon", v1_lines("/system.slice/nvidia-persistenced.service"), None),
    ("Docker container under cgroupfs is no pod", v1_lines(f"/docker/{CID}"), None),
    ("Docker container under systemd is no pod", f"0::/system.slice/docker-{CID}.scope\n", None),
    # lookalikes the UID check must refuse
    ("static pod with a config hash for a UID", f"0::/kubepods/burstable/pod{STATIC_POD_HASH}/{CID}\n", None),
    ("upper-case UID", f"0::/kubepods/pod{UID.upper()}/{CID}\n", None),
    ("truncated UID", f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n", None),
    ("pod slice outside kubepods", f"0::/machine.slice/machine-pod{UID_}.slice/libpod-{CID}.scope\n", None),
    ("pod directory outside kubepods", f"0::/mypods/pod{UID}/{CID}\n", None),
    ("unknown QoS level", f"0::/kubepods.slice/kubepods-gold.slice/kubepods-gold-pod{UID_}.slice\n", None),
    # unknown container level: the pod is still known
    ("short container id", f"0::/kubepods/burstable/pod{UID}/abc123\n", pod(container=None)),
    ("unknown runtime scope", f"0::{BURSTABLE_SLICE}/kata-{CID}.scope\n", pod(container=None)),
    # garbage
    ("empty file", "", None),
    ("blank lines", "\n\n\n", None),
    ("colons only", "::::\n", None),
    ("no path", "12:memory\n", None),
    ("prose", "the quick brown pod jumps over the lazy kubepods\n", None),
    ("binary noise", bytes(range(256)).decode("utf-8", "replace") * 3, None),
]


@pytest.mark.parametrize(("text", "expected"), [case[1:] for case in SHAPES], ids=[case[0] for case in SHAPES])
def test_each_real_cgroup_shape_maps_to_its_pod_or_to_none(text: str, expected: PodRef | None) -> None:
    assert podmap.parse_cgroup(text) == expected


def test_a_line_that_names_the_container_is_preferred_over_one_that_names_only_the_pod() -> None:
    text = f"1:name=systemd:{BURSTABLE_SLICE}\n4:memory:{BURSTABLE_SLICE}/crio-{CID}.scope\n"
    assert podmap.parse_cgroup(text) == pod()


def test_the_choice_among_disagreeing_lines_does_not_depend_on_their_order() -> None:
    lines = [
        f"4:memory:/kubepods/burstable/pod{UID}/{CID}",
        f"6:devices:/kubepods/burstable/pod{OTHER_UID}/{OTHER_CID}",
        f"1:name=systemd:/kubepods/burstable/pod{OTHER_UID}/{CID}",
        f"0::/kubepods/burstable/pod{OTHER_UID}/{CID}",
    ]
    answers = {podmap.parse_cgroup("\n".join(order)) for order in itertools.permutations(lines)}
    assert answers == {pod(OTHER_UID)}


def test_a_controller_hierarchy_is_preferred_over_a_named_one_when_they_disagree() -> None:
    text = (
        f"1:name=systemd:/kubepods/burstable/pod{OTHER_UID}/{OTHER_CID}\n4:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    )
    assert podmap.parse_cgroup(text) == pod()


@given(st.text())
def test_parsing_arbitrary_text_never_raises(text: str) -> None:
    result = podmap.parse_cgroup(text)
    assert result is None or isinstance(result, PodRef)


CGROUP_FRAGMENTS = [":", "0::", "/", "..", "kubepods", ".slice", ".scope", "-", "_", "pod", f"pod{UID}", UID_, CID]
CGROUP_FRAGMENTS += ["burstable", "besteffort", "kubepods-", "crio-", "crio-conmon-", "cri-containerd-", "\n", " "]


@given(st.lists(st.sampled_from(CGROUP_FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join))
def test_parsing_near_miss_cgroup_text_never_raises(text: str) -> None:
    result = podmap.parse_cgroup(text)
    if result is not None:
        assert len(result.pod_uid) == 36
        assert result.container_id is None or len(result.container_id) == 64


@given(
    pod_uid=st.uuids().map(str),
    container=st.binary(min_size=32, max_size=32).map(bytes.hex),
    qos=st.sampled_from(typing.get_args(podmap.Qos)),
    driver=st.sampled_from(["systemd", "cgroupfs"]),
    runtime=st.sampled_from(["containerd", "crio", "docker"]),
)
def test_every_path_the_kubelet_and_runtimes_write_parses_back(
    pod_uid: str, container: str, qos: podmap.Qos, driver: str, runtime: str
) -> None:
    if driver == "systemd":
        parent = "kubepods" if qos == "guaranteed" else f"kubepods-{qos}"
        slices = "/kubepods.slice" + ("" if qos == "guaranteed" else f"/{parent}.slice")
        scope = {"containerd": "cri-containerd", "crio": "crio", "docker": "docker"}[runtime]
        path = f"{slices}/{parent}-pod{pod_uid.replace('-', '_')}.slice/{scope}-{container}.scope"
    else:
        level = "" if qos == "guaranteed" else f"/{qos}"
        leaf = f"crio-{container}" if runtime == "crio" else container
        path = f"/kubepods{level}/pod{pod_uid}/{leaf}"
    assert podmap.parse_cgroup(f"0::{path}\n") == pod(pod_uid, container, qos)


# --- PodMapper over a temporary proc tree ---


def write_process(root: Path, pid: int, *, cgroup: str, start_time: int, comm: str = "python3") -> None:
    """A /proc/<pid> with the two files the mapper reads; the stat line is shaped like the kernel's."""
    proc = root / str(pid)
    proc.mkdir(exist_ok=True)
    (proc / "cgroup").write_text(cgroup)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "2043", "0", "12", "0", "87", "31", "0", "0", "20"]
    fields += ["0", "24", "0", str(start_time), "1843200000", "112233"] + ["0"] * 30
    (proc / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


CONTAINER_CGROUP = f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n"
OTHER_CGROUP = f"0::/kubepods/besteffort/pod{OTHER_UID}/{OTHER_CID}\n"


def test_a_container_process_maps_to_its_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    assert PodMapper(tmp_path).lookup(4242) == pod()


def test_a_host_process_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 811, cgroup="0::/system.slice/nvidia-persistenced.service\n", start_time=50)
    assert PodMapper(tmp_path).lookup(811) is None


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_start_time(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 7, cgroup=CONTAINER_CGROUP, start_time=100, comm="py (worker) 3")
    assert mapper.lookup(7) == pod()
    write_process(tmp_path, 7, cgroup=OTHER_CGROUP, start_time=100, comm="py (worker) 3")
    assert mapper.lookup(7) == pod()  # same start time: answered from the cache


def test_answers_are_cached_while_the_pid_names_the_same_process(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    assert mapper.lookup(4242) == pod()
    (tmp_path / "4242" / "cgroup").write_text(OTHER_CGROUP)
    assert mapper.lookup(4242) == pod()


def test_a_reused_pid_is_recognised_by_its_new_start_time(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    assert mapper.lookup(4242) == pod()
    write_process(tmp_path, 4242, cgroup=OTHER_CGROUP, start_time=9731)
    assert mapper.lookup(4242) == pod(OTHER_UID, OTHER_CID, "besteffort")


def test_an_exited_process_maps_to_no_pod_and_leaves_no_entry(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    assert mapper.lookup(4242) == pod()
    for name in ("cgroup", "stat"):
        (tmp_path / "4242" / name).unlink()
    (tmp_path / "4242").rmdir()
    assert mapper.lookup(4242) is None
    assert mapper.cached_pids == frozenset()


def test_a_pid_that_never_existed_maps_to_no_pod(tmp_path: Path) -> None:
    assert PodMapper(tmp_path).lookup(31337) is None
    assert PodMapper(tmp_path / "no-such-root").lookup(1) is None


@pytest.mark.parametrize("pid", [0, -1])
def test_a_non_positive_pid_maps_to_no_pod(tmp_path: Path, pid: int) -> None:
    assert PodMapper(tmp_path).lookup(pid) is None


def test_a_vanished_cgroup_file_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    (tmp_path / "4242" / "cgroup").unlink()
    assert PodMapper(tmp_path).lookup(4242) is None


@pytest.mark.parametrize("stat", ["", "4242 (python3 S 1 2", "4242 (python3) S 1 2 3", "garbage", "\x00\xff"])
def test_a_malformed_stat_file_maps_to_no_pod(tmp_path: Path, stat: str) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    (tmp_path / "4242" / "stat").write_text(stat)
    assert PodMapper(tmp_path).lookup(4242) is None


def test_a_cgroup_file_that_is_a_directory_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    (tmp_path / "4242" / "cgroup").unlink()
    (tmp_path / "4242" / "cgroup").mkdir()
    assert PodMapper(tmp_path).lookup(4242) is None


def test_binary_noise_in_the_cgroup_file_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup="", start_time=9000)
    (tmp_path / "4242" / "cgroup").write_bytes(os.urandom(4096) + bytes(range(256)))
    assert PodMapper(tmp_path).lookup(4242) is None


def test_an_oversized_cgroup_file_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP * 100_000, start_time=9000)
    assert PodMapper(tmp_path).lookup(4242) is None


def test_a_permission_error_maps_to_no_pod_and_is_retried_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    denied = str(tmp_path / "4242" / "cgroup")
    real_open = os.open

    def deny_cgroup(path: str, flags: int, mode: int = 0o777) -> int:
        if path == denied:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, mode)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", deny_cgroup)
        assert mapper.lookup(4242) is None
    assert mapper.lookup(4242) == pod()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_cgroup_file_maps_to_no_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 4242, cgroup=CONTAINER_CGROUP, start_time=9000)
    (tmp_path / "4242" / "cgroup").chmod(0)
    assert PodMapper(tmp_path).lookup(4242) is None


def test_lookup_many_answers_every_pid_and_forgets_those_it_was_not_asked_about(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    write_process(tmp_path, 10, cgroup=CONTAINER_CGROUP, start_time=1)
    write_process(tmp_path, 11, cgroup=OTHER_CGROUP, start_time=2)
    write_process(tmp_path, 12, cgroup="0::/init.scope\n", start_time=3)
    assert mapper.lookup_many([10, 11, 12, 13]) == {
        10: pod(),
        11: pod(OTHER_UID, OTHER_CID, "besteffort"),
        12: None,
        13: None,
    }
    assert mapper.cached_pids == {10, 11, 12}
    assert mapper.lookup_many([11]) == {11: pod(OTHER_UID, OTHER_CID, "besteffort")}
    assert mapper.cached_pids == {11}


def test_prune_keeps_only_the_live_pids(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path)
    for pid in (10, 11, 12):
        write_process(tmp_path, pid, cgroup=CONTAINER_CGROUP, start_time=pid)
        mapper.lookup(pid)
    mapper.prune({11, 99})
    assert mapper.cached_pids == {11}


def test_the_cache_never_grows_past_its_bound_and_answers_stay_right(tmp_path: Path) -> None:
    mapper = PodMapper(tmp_path, max_entries=2)
    for pid in (10, 11, 12):
        write_process(tmp_path, pid, cgroup=CONTAINER_CGROUP, start_time=pid)
    assert mapper.lookup_many([10, 11, 12]) == dict.fromkeys([10, 11, 12], pod())
    assert len(mapper.cached_pids) == 2


def test_a_cache_bound_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_entries"):
        PodMapper(tmp_path, max_entries=0)


def test_the_real_proc_tree_answers_like_its_own_cgroup_file() -> None:
    proc = Path("/proc")
    if not (proc / "self" / "cgroup").exists():
        pytest.skip("no /proc on this platform")
    expected = podmap.parse_cgroup((proc / "self" / "cgroup").read_text())
    assert PodMapper(proc).lookup(os.getpid()) == expected

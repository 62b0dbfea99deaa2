"""Which pod, and which container, a GPU process belongs to, read from ``<proc_root>/<pid>/cgroup``.

NVML names GPU processes by pid only; the scheduler thinks in pod UIDs. The kubelet encodes the pod UID in the cgroup
it creates for every pod (``pkg/kubelet/cm``: ``[cgroupRoot..., "kubepods", qos?, "pod" + uid]``), and the container
runtime puts each container in a child cgroup named after the container id, so the cgroup path of a process names
both. The path takes one of two spellings, after the kubelet's cgroup driver:

- systemd: every level is a slice whose name repeats its ancestors, joined by dashes, so the dashes of the pod UID
  are escaped to underscores: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<u_u_i_d>.slice``,
  and the container is a scope: ``cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O),
  ``docker-<id>.scope`` (Docker through cri-dockerd);
- cgroupfs: ``/kubepods/burstable/pod<uid>/<id>`` (containerd and Docker), ``.../pod<uid>/crio-<id>`` (CRI-O).

Guaranteed pods sit directly under ``kubepods``; burstable and besteffort pods under a slice or directory of their
own class, so the QoS class comes from the same path.

The pod level is searched anywhere in the path rather than anchored at the root, because real nodes put things above
it: kind nodes (``/system.slice/docker-<node>.scope/kubelet.slice/kubelet-kubepods.slice/...``, the ``kubelet-``
prefix being kind's ``cgroupRoot``), older kind on cgroup v1 (``/docker/<node>/kubepods/...``), and readers in their
own cgroup namespace, to whom the path of a process outside it reads relative to their own root
(``0::/../../kubepods-besteffort-pod<u_u_i_d>.slice/...``). When a relative cgroupfs path hides the QoS level the
class is reported as unknown. Where a path holds two pod levels (a kind cluster run inside a pod), the outermost wins:
that is the pod the node's own kubelet knows.

Deliberate answers:
- ``crio-conmon-<id>.scope`` (CRI-O's monitor process, placed in the pod when ``conmon_cgroup = "pod"``) is charged to
  the pod, so the pod is returned, but the process runs in no container: ``container_id`` is None even though the
  name carries the id of the container conmon watches.
- Docker's own ``/docker/<id>`` and ``/system.slice/docker-<id>.scope`` are plain containers, not pods: None.
- Static pods carry their config hash (32 hex digits) where API pods carry a UUID; the scheduler knows their mirror
  pods under a different UID, so only UUID-shaped UIDs are accepted and static pods map to None.
- Several cgroup v1 lines may name a pod (one per controller hierarchy); the choice among them does not depend on
  their order: a line that also names a container first, then the unified line, then named controllers, then
  ``name=`` hierarchies, then the text itself.

``PodMapper`` reads the files and caches each answer under (pid, start time), the start time being field 22 of
``<proc_root>/<pid>/stat``, so a pid the kernel has handed to a new process is never answered from the old one's
entry. A process's cgroup is fixed once its container has started (the runtime moves the init process before it
execs the workload), so the cache needs no expiry beyond that. The proc root is a parameter so emulated nodes can
serve their own tree, which must then hold a ``stat`` file beside each ``cgroup`` file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Qos = Literal["guaranteed", "burstable", "besteffort"]

# An NVML process list per node is small: 8 GPUs x 48 MPS clients (the per-device client limit of Volta MPS) is 384.
# 1024 entries cover that with room, and bound the cache to a few hundred KiB.
DEFAULT_MAX_ENTRIES: Final = 1024

# A real /proc/<pid>/cgroup is under 2 KiB even with every v1 controller; anything this large is not one.
_MAX_FILE_BYTES: Final = 1 << 20
_READ_CHUNK: Final = 64 * 1024

# Field 22 of /proc/<pid>/stat (starttime, in clock ticks since boot) is index 19 of the fields after the ")" that
# closes field 2, the command name, which may itself hold spaces and parentheses.
_STAT_START_TIME_INDEX: Final = 19

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_QOS_LEVELS: Final[dict[str, Qos]] = {"burstable": "burstable", "besteffort": "besteffort"}
# Scope and directory prefixes of the CRI runtimes; cri-dockerd uses Docker's.
_RUNTIME_PREFIXES: Final = ("cri-containerd-", "crio-", "docker-")
_CONMON_PREFIX: Final = "crio-conmon-"
# A cgroup v2 path whose cgroup was removed while the process lived on (a zombie) ends with this.
_DELETED_SUFFIX: Final = " (deleted)"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """The pod a process runs in; ``container_id`` is None when the process is in the pod but in no container."""

    pod_uid: str
    container_id: str | None
    qos: Qos | None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod named by the content of a ``/proc/<pid>/cgroup`` file, or None for anything else; never raises."""
    best: tuple[tuple[bool, int, str], PodRef] | None = None
    # cgroup v1 repeats one path on a dozen controller lines: parse each distinct path once.
    parsed: dict[str, PodRef | None] = {}
    for line in text.splitlines():
        hierarchy, sep, rest = line.partition(":")
        if not sep:
            continue
        controllers, sep, path = rest.partition(":")
        if not sep or "pod" not in path:
            continue
        if path in parsed:
            ref = parsed[path]
        else:
            ref = parsed[path] = _parse_path(path)
        if ref is None:
            continue
        key = (ref.container_id is None, _hierarchy_rank(hierarchy, controllers), line)
        if best is None or key < best[0]:
            best = (key, ref)
    return None if best is None else best[1]


def _hierarchy_rank(hierarchy: str, controllers: str) -> int:
    if hierarchy == "0" and not controllers:
        return 0
    if controllers.startswith("name="):
        return 2
    return 1


def _parse_path(path: str) -> PodRef | None:
    if path.endswith(_DELETED_SUFFIX):
        path = path[: -len(_DELETED_SUFFIX)]
    segments = path.split("/")
    for index, segment in enumerate(segments):
        if "pod" not in segment:
            continue
        found = _systemd_pod(segment) or _cgroupfs_pod(segments, index)
        if found is None:
            continue
        pod_uid, qos, inline_container = found
        container_id: str | None
        if inline_container is not None:
            container_id = inline_container
        elif index + 1 < len(segments):
            container_id = _container_id(segments[index + 1])
        else:
            container_id = None
        return PodRef(pod_uid=pod_uid, container_id=container_id, qos=qos)
    return None


def _systemd_pod(segment: str) -> tuple[str, Qos, str | None] | None:
    """A pod slice such as ``kubepods-burstable-pod<u_u_i_d>.slice``: (uid, qos, container id named inline)."""
    inline_container: str | None = None
    if ":" in segment:
        # runc in cgroupfs mode given systemd's "slice:prefix:id" form writes it literally as one directory (seen with
        # containerd on cgroup v1 when only the kubelet uses the systemd driver).
        parts = segment.split(":")
        if len(parts) != 3:
            return None
        slice_name, runtime, container = parts
        inline_container = container if _CONTAINER_ID.fullmatch(container) and runtime != "crio-conmon" else None
    else:
        slice_name = segment
    if not slice_name.endswith(".slice"):
        return None
    name = slice_name[: -len(".slice")]
    cut = name.rfind("-pod")
    if cut < 0:
        return None
    pod_uid = name[cut + len("-pod") :].replace("_", "-")
    if not _UUID.fullmatch(pod_uid):
        return None
    levels = name[:cut].split("-")
    qos: Qos
    if levels[-1] == "kubepods":
        qos = "guaranteed"
    elif len(levels) >= 2 and levels[-2] == "kubepods" and levels[-1] in _QOS_LEVELS:
        qos = _QOS_LEVELS[levels[-1]]
    else:
        return None
    return pod_uid, qos, inline_container


def _cgroupfs_pod(segments: list[str], index: int) -> tuple[str, Qos | None, None] | None:
    """A pod directory ``pod<uid>`` under ``kubepods`` (guaranteed) or ``kubepods/<qos>``, or under ``..``."""
    segment = segments[index]
    if not segment.startswith("pod") or not _UUID.fullmatch(segment, 3):
        return None
    parent = segments[index - 1] if index >= 1 else ""
    grandparent = segments[index - 2] if index >= 2 else ""
    qos: Qos | None
    if parent == "kubepods":
        qos = "guaranteed"
    elif parent in _QOS_LEVELS and grandparent in ("kubepods", ".."):
        qos = _QOS_LEVELS[parent]
    elif parent == "..":
        # Seen from inside a cgroup namespace: the parent is one of the reader's own ancestors, either kubepods or
        # the reader's QoS level, and the path does not say which.
        qos = None
    else:
        return None
    return segment[3:], qos, None


def _container_id(segment: str) -> str | None:
    """The container id in the level below a pod; None for conmon, the pod level itself, or anything unknown."""
    name = segment.removesuffix(".scope")
    if name.startswith(_CONMON_PREFIX):
        return None
    for prefix in _RUNTIME_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name if _CONTAINER_ID.fullmatch(name) else None


def _read(path: str) -> bytes | None:
    """The whole file, or None when it is missing, unreadable, or too large to be a proc file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # A proc file arrives whole in one read when the buffer is large enough; a regular file (an emulated tree)
        # signals its end with a short read as well.
        data = os.read(fd, _READ_CHUNK)
        if len(data) < _READ_CHUNK:
            return data
        chunks = [data]
        total = len(data)
        while chunk := os.read(fd, _READ_CHUNK):
            total += len(chunk)
            if total > _MAX_FILE_BYTES:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _start_time(stat: bytes | None) -> int | None:
    """Field 22 of a ``/proc/<pid>/stat`` line, or None when the line is missing or malformed."""
    if stat is None:
        return None
    close = stat.rfind(b")")
    if close < 0:
        return None
    fields = stat[close + 1 :].split()
    if len(fields) <= _STAT_START_TIME_INDEX:
        return None
    try:
        return int(fields[_STAT_START_TIME_INDEX])
    except ValueError:
        return None


class PodMapper:
    """Maps pids to pods through a proc tree, caching each answer under (pid, start time).

    Not thread-safe: one sampler owns it. Every lookup reads the process's ``stat`` file (a few microseconds) to learn
    whether the pid still names the same process; only a miss reads and parses ``cgroup``. A process that is gone or
    whose files cannot be read maps to None and leaves nothing cached, so a transient failure is retried next time.
    """

    def __init__(self, proc_root: Path, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._root = os.fspath(proc_root)
        self._max_entries = max_entries
        self._cache: dict[int, tuple[int, PodRef | None]] = {}

    @property
    def cached_pids(self) -> frozenset[int]:
        """The pids that have an entry now (for tests and a cache-size gauge)."""
        return frozenset(self._cache)

    def lookup(self, pid: int) -> PodRef | None:
        """The pod of ``pid``; None for a host process, an exited process, or files that cannot be read."""
        if pid <= 0:
            return None
        base = f"{self._root}/{pid}"
        start = _start_time(_read(f"{base}/stat"))
        if start is None:
            self._cache.pop(pid, None)
            return None
        entry = self._cache.get(pid)
        if entry is not None and entry[0] == start:
            return entry[1]
        data = _read(f"{base}/cgroup")
        if data is None:
            self._cache.pop(pid, None)
            return None
        ref = parse_cgroup(data.decode("utf-8", "replace"))
        self._store(pid, start, ref)
        return ref

    def lookup_many(self, pids: Iterable[int]) -> dict[int, PodRef | None]:
        """The pod of each pid; entries for pids not in this call are dropped afterwards."""
        result = {pid: self.lookup(pid) for pid in pids}
        self.prune(result.keys())
        return result

    def prune(self, live_pids: Collection[int]) -> None:
        """Drops the entries of every pid not in ``live_pids``."""
        for pid in [pid for pid in self._cache if pid not in live_pids]:
            del self._cache[pid]

    def _store(self, pid: int, start: int, ref: PodRef | None) -> None:
        self._cache.pop(pid, None)
        while len(self._cache) >= self._max_entries:
            del self._cache[next(iter(self._cache))]
        self._cache[pid] = (start, ref)

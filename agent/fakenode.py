"""An emulated GPU node: fake GPUs from a cluster spec, and the proc tree that attributes their processes to pods.

The agent finds a process's pod through ``<proc>/<pid>/cgroup`` and checks pid reuse through ``<proc>/<pid>/stat``.
An emulated node therefore writes, for every process it runs, the same two files a real kubelet-managed container
would have (a cgroup v2 path of the systemd driver with containerd, and a stat line whose field 22 is the start
time), in a directory of its own that is handed to the agent as its proc root. The agent code that runs over it is
the production code, unchanged.

Device assignment for pods named in the spec (``node: X``) follows what the device plugin and the scheduler would
do on an otherwise empty node: whole-GPU pods take free devices in index order; a fractional pod (``gpu-fraction``,
or ``gpu-memory`` converted to a share of the device) goes on the first shared device with room, else the next free
one. A pod of the spec that is not pinned to a node runs nowhere until something places it: when the emulator runs
pods (later issues), it tells the node which devices each pod really got through :meth:`FakeNode.run_pod`.
"""

from __future__ import annotations

import decimal
import hashlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.gpus.fake import FakeGpu, FakeProbe, FakeProcess, MemoryScript
from common import clusterspec, names, quantities
from common.errors import ClusterSpecError, QuantityError
from common.quantities import MIB

_FIRST_PID = 4000
_HOST_CGROUP = "0::/system.slice/gpu-daemon.service\n"
_POD_UID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://quotient.dev/fake-pod")


def pod_uid_for(namespace: str, name: str) -> str:
    """A stable UID for a pod of a cluster spec (the emulator gives real ones to the pods it creates)."""
    return str(uuid.uuid5(_POD_UID_NAMESPACE, f"{namespace}/{name}"))


def container_id_for(pod_uid: str, container: str = "main") -> str:
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


def cgroup_line(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """The cgroup v2 line of a containerd container under the kubelet's systemd driver."""
    uid = pod_uid.replace("-", "_")
    if qos == "guaranteed":
        return f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{container_id}.scope\n"
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/cri-containerd-{container_id}.scope\n"
    )


def _to_fake_script(script: clusterspec.MemoryScript, *, end_ns: int | None = None) -> MemoryScript:
    try:
        return MemoryScript(steps=script.points, end_ns=end_ns)
    except ValueError as exc:  # e.g. a duration that ends before the script's first point
        raise ClusterSpecError(f"memory script {script.text()} with duration {end_ns} ns: {exc}") from exc


class FakeNode:
    """Fake GPUs plus a proc tree. Thread-safe: the emulator starts and stops pods while the agent samples."""

    def __init__(
        self,
        node: clusterspec.NodeSpec,
        *,
        proc_root: Path | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.spec = node
        self._clock = clock
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        if proc_root is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix=f"quotient-proc-{node.name}-")
            proc_root = Path(self._tempdir.name)
        proc_root.mkdir(parents=True, exist_ok=True)
        self.proc_root = proc_root
        self.probe = FakeProbe(
            [
                FakeGpu(index=gpu.index, uuid=gpu.uuid, model=gpu.product, memory_total_bytes=gpu.memory_bytes)
                for gpu in node.gpus
            ],
            clock=clock,
        )
        self._lock = threading.Lock()
        self._next_pid = _FIRST_PID
        self._pod_pids: dict[str, list[int]] = {}
        self.started_ns = clock()
        for unowned in node.unowned_processes:
            pid = self._new_pid()
            self._write_process(pid, _HOST_CGROUP)
            self.probe.add_process(
                FakeProcess(
                    pid=pid,
                    gpu_index=unowned.gpu_index,
                    memory=_to_fake_script(unowned.memory),
                    start_ns=self.started_ns,
                )
            )

    def _new_pid(self) -> int:
        pid = self._next_pid
        self._next_pid += 1
        return pid

    def _write_process(self, pid: int, cgroup: str) -> None:
        directory = self.proc_root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup").write_text(cgroup)
        # Field 22 of /proc/<pid>/stat is the start time (in clock ticks since boot); the pid number serves, since
        # emulated pids are never reused.
        fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(pid)] + ["0"] * 30
        (directory / "stat").write_text(f"{pid} (python3) {' '.join(fields)}\n")

    def run_pod(
        self,
        *,
        pod_uid: str,
        gpu_indices: Sequence[int],
        memory: clusterspec.MemoryScript,
        start_ns: int | None = None,
        duration_ns: int | None = None,
        qos: str = "burstable",
    ) -> list[int]:
        """Start one process per device for a pod (replacing any it had); returns their pids."""
        for index in gpu_indices:
            if index not in {gpu.index for gpu in self.spec.gpus}:
                raise ClusterSpecError(f"node {self.spec.name} has no gpu {index}")
        with self._lock:
            self._stop_locked(pod_uid)
            start = self._clock() if start_ns is None else start_ns
            container_id = container_id_for(pod_uid)
            pids = []
            for index in gpu_indices:
                pid = self._new_pid()
                self._write_process(pid, cgroup_line(pod_uid, container_id, qos))
                self.probe.add_process(
                    FakeProcess(
                        pid=pid, gpu_index=index, memory=_to_fake_script(memory, end_ns=duration_ns), start_ns=start
                    )
                )
                pids.append(pid)
            self._pod_pids[pod_uid] = pids
            return pids

    def stop_pod(self, pod_uid: str) -> None:
        """The pod's processes exit (and their /proc entries vanish)."""
        with self._lock:
            self._stop_locked(pod_uid)

    def _stop_locked(self, pod_uid: str) -> None:
        for pid in self._pod_pids.pop(pod_uid, []):
            self.probe.remove_process(pid)
            shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)

    def pods(self) -> dict[str, list[int]]:
        with self._lock:
            return {uid: list(pids) for uid, pids in self._pod_pids.items()}

    def close(self) -> None:
        self.probe.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None


def _fraction_milli(pod: clusterspec.PodSpec, device_memory_bytes: int) -> int | None:
    """The pod's share of one device in milli-GPU, from ``gpu-fraction`` or ``gpu-memory`` (MiB, or a quantity)."""
    fraction, memory = names.GPU_FRACTION_ANNOTATION, names.GPU_MEMORY_ANNOTATION
    where = f"pod {pod.namespace}/{pod.name}"
    memory_text = pod.annotations.get(memory)
    if memory_text is not None and pod.annotations.get(fraction) is not None:
        raise ClusterSpecError(f"{where}: {fraction} and {memory} are both set")
    if memory_text is not None:
        try:
            plain_mib = memory_text.strip().isascii() and memory_text.strip().isdigit()
            wanted = int(memory_text) * MIB if plain_mib else quantities.parse_bytes(memory_text)
        except QuantityError as exc:
            raise ClusterSpecError(f"{where}: {memory} {memory_text!r}: {exc}") from None
        if not 0 < wanted <= device_memory_bytes:
            raise ClusterSpecError(
                f"{where}: {memory} {memory_text!r} does not fit a device of "
                f"{quantities.format_bytes(device_memory_bytes)}"
            )
        return -(-wanted * 1000 // device_memory_bytes)
    text = pod.annotations.get(fraction)
    if text is None:
        return None
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ClusterSpecError(f"{where}: {fraction} {text!r} is not a number") from None
    if not (value.is_finite() and 0 < value < 1):  # NaN would raise InvalidOperation on comparison
        raise ClusterSpecError(f"{where}: {fraction} {text!r} must be within (0, 1)")
    milli = int(value * 1000)
    if milli == 0:
        raise ClusterSpecError(f"{where}: {fraction} {text!r} is below 0.001 of a GPU")
    return milli


def assign_devices(node: clusterspec.NodeSpec, pods: Sequence[clusterspec.PodSpec]) -> dict[str, list[int]]:
    """Device indices for the spec's pods pinned to ``node`` (see the module docstring); raises when they overflow."""
    free_whole = [gpu.index for gpu in node.gpus]
    shared: dict[int, int] = {}  # device -> milli-GPU taken by shares
    assignment: dict[str, list[int]] = {}
    device_memory = min((gpu.memory_bytes for gpu in node.gpus), default=0)
    for pod in pods:
        key = f"{pod.namespace}/{pod.name}"
        fraction = _fraction_milli(pod, device_memory) if node.gpus else None
        if fraction is not None:
            device = next((index for index, used in sorted(shared.items()) if used + fraction <= 1000), None)
            if device is None:
                if not free_whole:
                    raise ClusterSpecError(f"pod {key} does not fit on node {node.name}: no GPU left to share")
                device = free_whole.pop(0)
                shared[device] = 0
            shared[device] += fraction
            assignment[key] = [device]
        elif pod.gpus:
            if len(free_whole) < pod.gpus:
                raise ClusterSpecError(
                    f"pod {key} asks for {pod.gpus} GPUs; node {node.name} has {len(free_whole)} free"
                )
            assignment[key] = free_whole[: pod.gpus]
            del free_whole[: pod.gpus]
    return assignment


def from_cluster_spec(
    spec: clusterspec.ClusterSpec,
    *,
    node: str,
    proc_root: Path | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> FakeNode:
    """The fake node ``node`` of ``spec``, running the spec's pods pinned to it that have a GPU memory script."""
    matches = [candidate for candidate in spec.nodes if candidate.name == node]
    if not matches:
        names = ", ".join(candidate.name for candidate in spec.nodes[:10])
        raise ClusterSpecError(
            f"the cluster spec has no node {node!r} (it has {names}{'...' if len(spec.nodes) > 10 else ''})"
        )
    fake = FakeNode(matches[0], proc_root=proc_root, clock=clock)
    pods = [pod for pod in spec.pods if pod.node == node]
    assignment = assign_devices(matches[0], pods)
    start = fake.started_ns
    for pod in pods:
        devices = assignment.get(f"{pod.namespace}/{pod.name}")
        if not devices or pod.gpu_memory is None:
            continue
        fake.run_pod(
            pod_uid=pod_uid_for(pod.namespace, pod.name),
            gpu_indices=devices,
            memory=pod.gpu_memory,
            start_ns=start + pod.arrive_ns,
            duration_ns=pod.duration_ns,
        )
    return fake

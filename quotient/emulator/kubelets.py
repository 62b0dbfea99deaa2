"""Emulated kubelets and the NVIDIA device plugin: bound pods start, run, finish and stop as on real nodes.

Each Node object gets a kubelet. When a pod is bound to it, after a configurable start delay the kubelet admits it
as the real one does: the pod's requests plus those of the pods already running there must fit the node's
allocatable CPU, memory and pod slots (else the pod fails with ``OutOfcpu``, ``OutOfmemory``, ``OutOfpods``), its
node selector, required affinity and ``NoExecute`` taints must match (``NodeAffinity``, ``Taint``), and the device
plugin must find the GPUs it asks for (``nvidia.com/gpu``; else ``UnexpectedAdmissionError``). A scheduler that
over-commits a node therefore sees failed pods here, as it would in a cluster. The device plugin hands out the
lowest free device indices and keeps the map, readable through ``devices_of``; containers that got GPUs see
``NVIDIA_VISIBLE_DEVICES`` with the devices' UUIDs.

An admitted pod becomes Running (conditions, container statuses, pod IP, start time). With the annotation
``quotient.dev/sim-duration`` (a Go duration) its containers exit after that long, with the code in
``quotient.dev/sim-exit-code`` (default 0), and the restart policy decides what follows (Succeeded, Failed, or a
restart), so Jobs complete and gangs finish. Deletion with a grace period is finished by the kubelet once the pod
has stopped. Environment values from ConfigMaps, Secrets and the downward API are resolved when a pod starts (a
missing ConfigMap holds it in ``CreateContainerConfigError`` and is retried, as the kubelet does).

What runs a started pod is a ``ContainerRuntime`` (``runtime.py``): the emulated GPU nodes register one so that a
pod's processes appear on the devices it got, with its memory script. The admission predicates are in
``nodefit.py`` and the environment in ``podenv.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable, Mapping

from common import clusterspec, logs, quantities
from common.errors import QuantityError
from quotient.emulator import defaulting, nodefit, podenv
from quotient.emulator.api import TERMINAL_PHASES, Api
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, annotations_of, is_deleting, metadata, set_condition, status_copy
from quotient.emulator.runtime import ContainerRuntime, PodLaunch
from quotient.emulator.store import Change, EventType

log = logs.get("emulator.kubelets")

GPU = "nvidia.com/gpu"
SIM_DURATION_ANNOTATION = "quotient.dev/sim-duration"
SIM_EXIT_CODE_ANNOTATION = "quotient.dev/sim-exit-code"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KubeletConfig:
    start_delay_s: float = 0.1  # from binding to Running
    termination_delay_s: float = 0.05  # from a graceful delete to the pod's removal
    config_retry_s: float = 1.0  # retry of a pod whose ConfigMap or Secret is missing


@dataclasses.dataclass(slots=True)
class _Admitted:
    namespace: str
    name: str
    uid: str
    requests: dict[str, int]
    devices: tuple[int, ...]
    launch: PodLaunch | None = None
    restarts: int = 0


@dataclasses.dataclass(slots=True)
class _Node:
    name: str
    ip: str
    pod_prefix: str
    pods: dict[str, _Admitted] = dataclasses.field(default_factory=dict)
    devices: dict[int, str] = dataclasses.field(default_factory=dict)  # index -> pod uid
    next_ip: int = 0


class Kubelets:
    def __init__(
        self,
        api: Api,
        *,
        config: KubeletConfig = KubeletConfig(),
        gpu_uuids: Mapping[str, tuple[str, ...]] | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.api = api
        self.store = api.store
        self.config = config
        self._gpu_uuids = dict(gpu_uuids or {})
        self._clock_ns = clock_ns
        self._nodes: dict[str, _Node] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._terminating: set[str] = set()
        self._allocatable_cache: dict[str, tuple[Obj | None, dict[str, int]]] = {}
        self._runtimes: list[tuple[str | None, ContainerRuntime]] = []
        self.store.subscribe(self._on_change)

    @property
    def _pods(self) -> Kind:
        found = self.api.registry.by_storage("pods")
        assert found is not None
        return found

    def add_runtime(self, runtime: ContainerRuntime, *, node: str | None = None) -> None:
        """Run pods through ``runtime``, on one node or (``node=None``) on every node."""
        self._runtimes.append((node, runtime))

    def remove_runtime(self, runtime: ContainerRuntime) -> None:
        self._runtimes = [(node, found) for node, found in self._runtimes if found is not runtime]

    def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    # --- Queries ---

    def devices_of(self, namespace: str, name: str) -> tuple[int, ...] | None:
        """The device indices a running pod got from the device plugin; None when it is not admitted anywhere."""
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return None
        node = self._nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
        admitted = node.pods.get(str(metadata(pod).get("uid"))) if node is not None else None
        return admitted.devices if admitted is not None else None

    def devices_on(self, node: str) -> dict[int, tuple[str, str]]:
        """Allocated devices of a node: index -> (namespace, pod name)."""
        state = self._nodes.get(node)
        if state is None:
            return {}
        return {index: (state.pods[uid].namespace, state.pods[uid].name) for index, uid in state.devices.items()}

    def uuids_of(self, node: str) -> tuple[str, ...]:
        if node in self._gpu_uuids:
            return self._gpu_uuids[node]
        found = self.store.get("nodes", "", node)
        count = self._allocatable(node).get(GPU, 0) if found is not None else 0
        return tuple(clusterspec.gpu_uuid(node, index) for index in range(count))

    def _allocatable(self, node: str) -> dict[str, int]:
        """The node's allocatable resources as integers, parsed once per version of the Node object."""
        found = self.store.get("nodes", "", node)
        cached = self._allocatable_cache.get(node)
        if cached is not None and cached[0] is found:
            return cached[1]
        parsed = nodefit.allocatable(found)
        self._allocatable_cache[node] = (found, parsed)
        return parsed

    # --- Events ---

    def _node(self, name: str) -> _Node | None:
        state = self._nodes.get(name)
        if state is not None:
            return state
        node = self.store.get("nodes", "", name)
        if node is None:
            return None
        addresses = {a.get("type"): a.get("address") for a in (node.get("status") or {}).get("addresses") or []}
        cidr = str((node.get("spec") or {}).get("podCIDR") or "10.244.0.0/24")
        prefix = ".".join(cidr.split("/")[0].split(".")[:3])
        state = _Node(name=name, ip=str(addresses.get("InternalIP") or "10.0.0.1"), pod_prefix=prefix)
        self._nodes[name] = state
        return state

    def _on_change(self, change: Change) -> None:
        if change.storage == "nodes" and change.type is EventType.DELETED:
            self._nodes.pop(str(metadata(change.obj).get("name")), None)
            return
        if change.storage != "pods":
            return
        pod = change.obj
        uid = str(metadata(pod).get("uid"))
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        if change.type is EventType.DELETED:
            self._cancel(uid)
            self._terminating.discard(uid)
            self._release(node_name, uid, stop=True)
            return
        if not node_name:
            return
        node = self._node(node_name)
        phase = (pod.get("status") or {}).get("phase")
        if node is None:
            if is_deleting(pod) and uid not in self._terminating:
                # No kubelet will ever confirm: the pod garbage collector removes it.
                self._terminating.add(uid)
                self._schedule(uid, 0.0, lambda: self.api.finish_pod_deletion(pod))
            return
        if is_deleting(pod):
            if uid not in self._terminating:
                self._terminating.add(uid)
                self._schedule(uid, self.config.termination_delay_s, lambda: self._terminate(node_name, pod))
            return
        if phase in TERMINAL_PHASES:
            self._cancel(uid)
            self._release(node_name, uid, stop=True)
            return
        if uid in node.pods or uid in self._timers:
            return
        if phase == "Running":
            self._adopt(node, pod)
            return
        self._schedule(uid, self.config.start_delay_s, lambda: self._start(node_name, uid))

    def _schedule(self, uid: str, delay_s: float, action: Callable[[], None]) -> None:
        def run() -> None:
            self._timers.pop(uid, None)
            try:
                action()
            except Exception:
                log.exception("kubelet_action_failed", pod_uid=uid)

        self._cancel(uid)
        self._timers[uid] = asyncio.get_running_loop().call_later(max(0.0, delay_s), run)

    def _cancel(self, uid: str) -> None:
        handle = self._timers.pop(uid, None)
        if handle is not None:
            handle.cancel()

    def _current(self, node_name: str, uid: str) -> Obj | None:
        found = self.store.by_uid(uid)
        if found is None or found[0] != "pods" or (found[1].get("spec") or {}).get("nodeName") != node_name:
            return None
        return found[1]

    def _find(self, admitted: _Admitted) -> Obj | None:
        pod = self.store.get("pods", admitted.namespace, admitted.name)
        return pod if pod is not None and metadata(pod).get("uid") == admitted.uid else None

    # --- Admission ---

    def _admission_failure(self, node: _Node, pod: Obj, requests: Mapping[str, int]) -> tuple[str, str] | None:
        used: dict[str, int] = {"pods": len(node.pods)}
        for other in node.pods.values():
            for name, amount in other.requests.items():
                used[name] = used.get(name, 0) + amount
        node_obj = self.store.get("nodes", "", node.name)
        return nodefit.rejection(pod, node_obj, requests, used=used, allocatable=self._allocatable(node.name))

    def _allocate(self, node: _Node, uid: str, count: int) -> tuple[int, ...] | None:
        if count == 0:
            return ()
        total = self._allocatable(node.name).get(GPU, 0)
        free = [index for index in range(total) if index not in node.devices][:count]
        if len(free) < count:
            return None
        for index in free:
            node.devices[index] = uid
        return tuple(free)

    def _start(self, node_name: str, uid: str) -> None:
        node = self._nodes.get(node_name)
        pod = self._current(node_name, uid)
        if node is None or pod is None or is_deleting(pod) or uid in node.pods:
            return
        if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        requests = defaulting.pod_requests(pod)
        rejected = self._admission_failure(node, pod, requests)
        devices: tuple[int, ...] | None = ()
        if rejected is None:
            devices = self._allocate(node, uid, requests.get(GPU, 0))
            if devices is None:
                free = sum(1 for index in range(self._allocatable(node_name).get(GPU, 0)) if index not in node.devices)
                rejected = (
                    "UnexpectedAdmissionError",
                    f"Allocate failed due to requested number of devices unavailable for {GPU}. Requested: "
                    f"{requests.get(GPU, 0)}, Available: {free}, which is unexpected",
                )
        if rejected is not None or devices is None:
            reason, message = rejected or ("UnexpectedAdmissionError", "")
            new_status = status_copy(pod)
            new_status.update(phase="Failed", reason=reason, message=message, startTime=self.api.now())
            log.info("pod_rejected", node=node_name, pod=metadata(pod).get("name"), reason=reason)
            self.api.write_status(self._pods, _ns(pod), _name(pod), new_status, uid=uid)
            return
        admitted = _Admitted(namespace=_ns(pod), name=_name(pod), uid=uid, requests=requests, devices=devices)
        node.pods[uid] = admitted
        self._run(node, admitted, pod)

    def _adopt(self, node: _Node, pod: Obj) -> None:
        """A pod that arrived already Running (seeded): account for it without starting it anew."""
        uid = str(metadata(pod).get("uid"))
        requests = defaulting.pod_requests(pod)
        devices = self._allocate(node, uid, requests.get(GPU, 0)) or ()
        admitted = _Admitted(namespace=_ns(pod), name=_name(pod), uid=uid, requests=requests, devices=devices)
        node.pods[uid] = admitted
        self._launch(node, admitted, pod)
        self._schedule_exit(node, admitted, pod)

    # --- Running ---

    def _run(self, node: _Node, admitted: _Admitted, pod: Obj) -> None:
        env = self._resolve_env(node, admitted, pod)
        if isinstance(env, str):
            self._hold(admitted, pod, env)
            self._schedule(admitted.uid, self.config.config_retry_s, lambda: self._retry(node.name, admitted.uid))
            return
        ip = self._pod_ip(node, pod)
        now = self.api.now()
        new_status = status_copy(pod)
        new_status.pop("reason", None)
        new_status.pop("message", None)
        new_status.update(phase="Running", hostIP=node.ip, hostIPs=[{"ip": node.ip}], podIP=ip, podIPs=[{"ip": ip}])
        new_status.setdefault("startTime", now)
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
            set_condition(
                new_status, {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            )
        new_status["containerStatuses"] = [
            {
                "name": container.get("name", ""),
                "state": {"running": {"startedAt": now}},
                "lastState": _last_state(pod, str(container.get("name", ""))),
                "ready": True,
                "restartCount": admitted.restarts,
                "image": container.get("image", ""),
                "imageID": f"{container.get('image', '')}@sha256:{_digest(str(container.get('image', '')))}",
                "containerID": f"containerd://{_digest(admitted.uid + str(container.get('name')) + now)}",
                "started": True,
            }
            for container in (pod.get("spec") or {}).get("containers") or []
            if isinstance(container, dict)
        ]
        written = self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=admitted.uid)
        if written is None:
            return
        log.debug("pod_running", node=node.name, pod=admitted.name, devices=list(admitted.devices))
        self._launch(node, admitted, written, env=env)
        self._schedule_exit(node, admitted, written)

    def _retry(self, node_name: str, uid: str) -> None:
        node = self._nodes.get(node_name)
        admitted = node.pods.get(uid) if node is not None else None
        pod = self._find(admitted) if admitted is not None else None
        if node is not None and admitted is not None and pod is not None and not is_deleting(pod):
            self._run(node, admitted, pod)

    def _hold(self, admitted: _Admitted, pod: Obj, message: str) -> None:
        new_status = status_copy(pod)
        new_status["containerStatuses"] = [
            {
                "name": container.get("name", ""),
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}},
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "image": container.get("image", ""),
                "imageID": "",
                "started": False,
            }
            for container in (pod.get("spec") or {}).get("containers") or []
            if isinstance(container, dict)
        ]
        self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=admitted.uid)

    def _launch(
        self, node: _Node, admitted: _Admitted, pod: Obj, env: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        uuids = self.uuids_of(node.name)
        resolved = env if env is not None else self._resolve_env(node, admitted, pod)
        launch = PodLaunch(
            node=node.name,
            namespace=admitted.namespace,
            name=admitted.name,
            uid=admitted.uid,
            gpu_indices=admitted.devices,
            gpu_uuids=tuple(uuids[index] for index in admitted.devices if index < len(uuids)),
            env=resolved if not isinstance(resolved, str) else {},
            labels=dict(metadata(pod).get("labels") or {}),
            annotations=dict(annotations_of(pod)),
            started_ns=self._clock_ns(),
        )
        admitted.launch = launch
        for target, runtime in list(self._runtimes):
            if target is None or target == node.name:
                try:
                    runtime.start_pod(launch)
                except Exception:
                    log.exception("runtime_start_failed", node=node.name, pod=admitted.name)

    def _stop_runtime(self, admitted: _Admitted) -> None:
        launch, admitted.launch = admitted.launch, None
        if launch is None:
            return
        for target, runtime in list(self._runtimes):
            if target is None or target == launch.node:
                try:
                    runtime.stop_pod(launch)
                except Exception:
                    log.exception("runtime_stop_failed", node=launch.node, pod=launch.name)

    def _schedule_exit(self, node: _Node, admitted: _Admitted, pod: Obj) -> None:
        text = annotations_of(pod).get(SIM_DURATION_ANNOTATION)
        if not text:
            return
        try:
            duration_s = quantities.parse_duration_s(str(text))
        except QuantityError:
            log.warning("bad_sim_duration", pod=admitted.name, value=text)
            return
        self._schedule(admitted.uid, duration_s, lambda: self._exit(node.name, admitted.uid))

    def _exit(self, node_name: str, uid: str) -> None:
        """The pod's containers exited: restart them or end the pod, per its restart policy."""
        node = self._nodes.get(node_name)
        admitted = node.pods.get(uid) if node is not None else None
        pod = self._find(admitted) if admitted is not None else None
        if node is None or admitted is None or pod is None or is_deleting(pod):
            return
        try:
            code = int(annotations_of(pod).get(SIM_EXIT_CODE_ANNOTATION, "0"))
        except ValueError:
            code = 1
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        self._stop_runtime(admitted)
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            admitted.restarts += 1
            self._run(node, admitted, pod)
            return
        now = self.api.now()
        phase = "Succeeded" if code == 0 else "Failed"
        reason = "Completed" if code == 0 else "Error"
        new_status = status_copy(pod)
        new_status["containerStatuses"] = [dict(found) for found in new_status.get("containerStatuses") or []]
        new_status["phase"] = phase
        for kind in ("Ready", "ContainersReady"):
            set_condition(
                new_status,
                {
                    "type": kind,
                    "status": "False",
                    "reason": "PodCompleted",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                },
            )
        set_condition(
            new_status,
            {"type": "PodReadyToStartContainers", "status": "False", "lastProbeTime": None, "lastTransitionTime": now},
        )
        for container in new_status.get("containerStatuses") or []:
            started = ((container.get("state") or {}).get("running") or {}).get("startedAt", now)
            container["state"] = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": started,
                    "finishedAt": now,
                    "containerID": container.get("containerID", ""),
                }
            }
            container["ready"], container["started"] = False, False
        self._release(node_name, uid, stop=False)
        self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=uid)

    def _terminate(self, node_name: str, pod: Obj) -> None:
        uid = str(metadata(pod).get("uid"))
        self._release(node_name, uid, stop=True)
        self.api.finish_pod_deletion(pod)

    def _release(self, node_name: str, uid: str, *, stop: bool) -> None:
        node = self._nodes.get(node_name)
        admitted = node.pods.pop(uid, None) if node is not None else None
        if node is None or admitted is None:
            return
        for index in admitted.devices:
            if node.devices.get(index) == uid:
                del node.devices[index]
        if stop:
            self._stop_runtime(admitted)

    def _pod_ip(self, node: _Node, pod: Obj) -> str:
        if (pod.get("spec") or {}).get("hostNetwork"):
            return node.ip
        node.next_ip += 1
        return f"{node.pod_prefix}.{(node.next_ip - 1) % 253 + 2}"

    # --- Environment ---

    def _resolve_env(self, node: _Node, admitted: _Admitted, pod: Obj) -> dict[str, dict[str, str]] | str:
        """Each container's environment, or the message of why it cannot be built yet."""
        uuids = self.uuids_of(node.name)
        result: dict[str, dict[str, str]] = {}
        spare = list(admitted.devices)
        for container in (pod.get("spec") or {}).get("containers") or []:
            if not isinstance(container, dict):
                continue
            env = podenv.container_env(container, pod, self.store.get, node.ip)
            if isinstance(env, str):
                return env
            wanted = podenv.container_gpus(container)
            if wanted:
                mine, spare = spare[:wanted], spare[wanted:]
                env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(uuids[i] for i in mine if i < len(uuids)))
            result[str(container.get("name", ""))] = env
        return result


def _last_state(pod: Obj, container: str) -> Obj:
    for found in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(found, dict) and found.get("name") == container:
            terminated = (found.get("state") or {}).get("terminated")
            running = (found.get("state") or {}).get("running")
            if terminated:
                return {"terminated": terminated}
            if running:
                return {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": running.get("startedAt")}}
    return {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _ns(pod: Obj) -> str:
    return str(metadata(pod).get("namespace") or "")


def _name(pod: Obj) -> str:
    return str(metadata(pod).get("name") or "")

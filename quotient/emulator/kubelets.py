"""Emulated kubelets and the NVIDIA device plugin: bound pods start, run, finish and stop as on real nodes.

Each Node object gets a kubelet. When a pod is bound to it, after a configurable start delay the kubelet admits it
as the real one does: the pod's requests plus those of the pods already running there must fit the node's
allocatable CPU, memory and pod slots (else the pod fails with ``OutOfcpu``, ``OutOfmemory``, ``OutOfpods``), its
node selector, required affinity and ``NoExecute`` taints must match (``NodeAffinity``, ``Taint``), and the device
plugin (``deviceplugin.py``) must find the GPUs it asks for (``nvidia.com/gpu``; else
``UnexpectedAdmissionError``). A scheduler that over-commits a node therefore sees failed pods here, as it would in
a cluster. The allocation is readable through ``devices_of``; containers that got GPUs see
``NVIDIA_VISIBLE_DEVICES`` with the devices' UUIDs.

An admitted pod becomes Running (conditions, container statuses, pod IP, start time). With the annotation
``quotient.dev/sim-duration`` (a Go duration) its containers exit after that long, with the code in
``quotient.dev/sim-exit-code`` (default 0), and the restart policy decides what follows (Succeeded, Failed, or a
restart), so Jobs complete and gangs finish. Deletion with a grace period is finished by the kubelet once the pod
has stopped. Environment values from ConfigMaps, Secrets and the downward API are resolved when a pod starts (a
missing ConfigMap holds it in ``CreateContainerConfigError`` and is retried, as the kubelet does).

What runs a started pod is a ``ContainerRuntime`` (``runtime.py``): the emulated GPU nodes register one so that a
pod's processes appear on the devices it got, with its memory script, and print into its containers' logs
(``containerlogs``, for ``pods/log``). The kubelet's Events are in ``kubeletevents``, the admission predicates in
``nodefit.py``, the environment in ``podenv.py`` and the statuses written in ``podstatus.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping

from common import logs, names, quantities
from common.errors import QuantityError
from quotient.emulator import containerlogs, defaulting, kubeletevents, nodefit, podenv, podstatus
from quotient.emulator.api import Api
from quotient.emulator.deviceplugin import DevicePlugin
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import (
    TERMINAL_PHASES,
    Obj,
    annotations_of,
    is_deleting,
    metadata,
)
from quotient.emulator.projection import Projections
from quotient.emulator.runtime import ContainerRuntime, PodLaunch
from quotient.emulator.store import Change, EventType

log = logs.get("emulator.kubelets")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KubeletConfig:
    start_delay_s: float = 0.1  # from binding to Running
    termination_delay_s: float = 0.05  # from a graceful delete to the pod's removal
    config_retry_s: float = 1.0  # retry of a pod whose ConfigMap or Secret is missing
    events: bool = True  # write the kubelet's Events (Pulled, Created, Started, Killing, admission refusals)


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
        self._clock_ns = clock_ns
        self._nodes: dict[str, _Node] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._terminating: set[str] = set()
        self._allocatable_cache: dict[str, tuple[Obj | None, dict[str, int]]] = {}
        self._runtimes: list[tuple[str | None, ContainerRuntime]] = []
        self.device_plugin = DevicePlugin(
            gpus_of=lambda node: self._allocatable(node).get(names.GPU_RESOURCE, 0), gpu_uuids=gpu_uuids
        )
        self.projections: Projections | None = None
        """The projected ServiceAccount tokens of the pods that run (``projection``), when the emulator wires them."""
        self.logs = containerlogs.ContainerLogs()
        """What each container printed (``containerlogs``), for ``pods/log``."""
        self.store.subscribe(self._on_change)

    @property
    def _pods(self) -> Kind:
        found = self.api.registry.by_storage("pods")
        assert found is not None
        return found

    def add_runtime(self, runtime: ContainerRuntime, *, node: str | None = None) -> None:
        """Run pods through ``runtime``, on one node or (``node=None``) on every node."""
        self._runtimes.append((node, runtime))

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
            self.device_plugin.forget(str(metadata(change.obj).get("name")))
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
            self.logs.forget(uid)
            return
        if not node_name:
            return
        node = self._node(node_name)
        phase = (pod.get("status") or {}).get("phase")
        if node is None:
            if is_deleting(pod) and uid not in self._terminating:
                # No kubelet will ever confirm: the pod garbage collector removes it.
                self._terminating.add(uid)
                self._schedule(uid, 0.0, lambda: self.api.deletion.finish_pod_deletion(pod))
            return
        if is_deleting(pod):
            if uid not in self._terminating:
                self._terminating.add(uid)
                if uid in node.pods and phase == "Running":
                    self._record(kubeletevents.killing(pod, node=node_name, now_ns=self._clock_ns()))
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
            devices = self.device_plugin.allocate(node_name, uid, requests.get(names.GPU_RESOURCE, 0))
            if devices is None:
                rejected = self.device_plugin.shortage(node_name, requests.get(names.GPU_RESOURCE, 0))
        if rejected is not None or devices is None:
            reason, message = rejected or ("UnexpectedAdmissionError", "")
            new_status = podstatus.rejected(pod, reason=reason, message=message, now=self.api.now())
            log.info("pod_rejected", node=node_name, pod=metadata(pod).get("name"), reason=reason)
            self.api.write_status(self._pods, _ns(pod), _name(pod), new_status, uid=uid)
            self._record(
                [kubeletevents.rejected(pod, node=node_name, reason=reason, message=message, now_ns=self._clock_ns())]
            )
            return
        admitted = _Admitted(namespace=_ns(pod), name=_name(pod), uid=uid, requests=requests, devices=devices)
        node.pods[uid] = admitted
        self._run(node, admitted, pod)

    def _adopt(self, node: _Node, pod: Obj) -> None:
        """A pod that arrived already Running (seeded): account for it without starting it anew."""
        uid = str(metadata(pod).get("uid"))
        requests = defaulting.pod_requests(pod)
        devices = self.device_plugin.allocate(node.name, uid, requests.get(names.GPU_RESOURCE, 0)) or ()
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
        new_status = podstatus.running(
            pod,
            uid=admitted.uid,
            host_ip=node.ip,
            pod_ip=self._pod_ip(node, pod),
            restarts=admitted.restarts,
            now=self.api.now(),
        )
        written = self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=admitted.uid)
        if written is None:
            return
        log.debug("pod_running", node=node.name, pod=admitted.name, devices=list(admitted.devices))
        self._record(kubeletevents.started(written, node=node.name, now_ns=self._clock_ns()))
        self._launch(node, admitted, written, env=env)
        self._schedule_exit(node, admitted, written)

    def _retry(self, node_name: str, uid: str) -> None:
        node = self._nodes.get(node_name)
        admitted = node.pods.get(uid) if node is not None else None
        pod = self._find(admitted) if admitted is not None else None
        if node is not None and admitted is not None and pod is not None and not is_deleting(pod):
            self._run(node, admitted, pod)

    def _hold(self, admitted: _Admitted, pod: Obj, message: str) -> None:
        new_status = podstatus.waiting_for_config(pod, message)
        self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=admitted.uid)

    def _launch(
        self, node: _Node, admitted: _Admitted, pod: Obj, env: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        resolved = env if env is not None else self._resolve_env(node, admitted, pod)
        started_ns = self._clock_ns()
        output = containerlogs.PodOutput.begin(
            self.logs, pod, node=node.name, env=resolved if not isinstance(resolved, str) else {}, at_ns=started_ns
        )
        launch = PodLaunch(
            node=node.name,
            namespace=admitted.namespace,
            name=admitted.name,
            uid=admitted.uid,
            gpu_indices=admitted.devices,
            gpu_uuids=self.device_plugin.uuids_for(node.name, admitted.devices),
            env=resolved if not isinstance(resolved, str) else {},
            labels=dict(metadata(pod).get("labels") or {}),
            annotations=dict(annotations_of(pod)),
            started_ns=started_ns,
            containers=output.containers,
            output=output,
        )
        admitted.launch = launch
        if self.projections is not None:
            self.projections.start(pod, node=node.name)
        self._tell_runtimes(launch, start=True)

    def _stop_runtime(self, admitted: _Admitted) -> None:
        if self.projections is not None:
            self.projections.stop(admitted.uid)
        launch, admitted.launch = admitted.launch, None
        if launch is not None:
            self._tell_runtimes(launch, start=False)
        self.logs.stop(admitted.uid, at_ns=self._clock_ns())

    def _record(self, events: list[Obj]) -> None:
        if self.config.events:
            kubeletevents.write(self.store, events)

    def _tell_runtimes(self, launch: PodLaunch, *, start: bool) -> None:
        """Start or stop ``launch`` in every runtime of its node; a runtime's failure is logged, not raised."""
        for target, runtime in list(self._runtimes):
            if target is None or target == launch.node:
                try:
                    if start:
                        runtime.start_pod(launch)
                    else:
                        runtime.stop_pod(launch)
                except Exception:
                    event = "runtime_start_failed" if start else "runtime_stop_failed"
                    log.exception(event, node=launch.node, pod=launch.name)

    def _schedule_exit(self, node: _Node, admitted: _Admitted, pod: Obj) -> None:
        text = annotations_of(pod).get(names.SIM_DURATION_ANNOTATION)
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
            code = int(annotations_of(pod).get(names.SIM_EXIT_CODE_ANNOTATION, "0"))
        except ValueError:
            code = 1
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        self.logs.exited(admitted.uid, code=code, at_ns=self._clock_ns())
        self._stop_runtime(admitted)
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            admitted.restarts += 1
            self._run(node, admitted, pod)
            return
        new_status = podstatus.terminated(pod, code=code, now=self.api.now())
        self._release(node_name, uid, stop=False)
        self.api.write_status(self._pods, admitted.namespace, admitted.name, new_status, uid=uid)

    def _terminate(self, node_name: str, pod: Obj) -> None:
        uid = str(metadata(pod).get("uid"))
        self._release(node_name, uid, stop=True)
        self.api.deletion.finish_pod_deletion(pod)

    def _release(self, node_name: str, uid: str, *, stop: bool) -> None:
        node = self._nodes.get(node_name)
        admitted = node.pods.pop(uid, None) if node is not None else None
        if node is None or admitted is None:
            return
        self.device_plugin.release(node_name, uid, admitted.devices)
        if stop:
            self._stop_runtime(admitted)

    def _pod_ip(self, node: _Node, pod: Obj) -> str:
        if (pod.get("spec") or {}).get("hostNetwork"):
            return node.ip
        node.next_ip += 1
        return f"{node.pod_prefix}.{(node.next_ip - 1) % 253 + 2}"

    def _resolve_env(self, node: _Node, admitted: _Admitted, pod: Obj) -> dict[str, dict[str, str]] | str:
        return podenv.pod_env(
            pod,
            get=self.store.get,
            host_ip=node.ip,
            devices=admitted.devices,
            device_uuids=self.device_plugin.uuids_of(node.name),
        )


def _ns(pod: Obj) -> str:
    return str(metadata(pod).get("namespace") or "")


def _name(pod: Obj) -> str:
    return str(metadata(pod).get("name") or "")

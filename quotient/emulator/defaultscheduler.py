"""A stand-in for kube-scheduler, off unless asked: pods that name ``default-scheduler`` get a node, as on a cluster.

A real cluster runs kube-scheduler beside any other scheduler, so ``kubectl create deployment web --image=nginx``
(whose pods name no scheduler, hence ``default-scheduler``) runs there. The emulator is a cluster without it, and
most tests want exactly that (a ``default-scheduler`` pod is "not ours" and stays Pending), so this stand-in runs
only when asked (``EmulatorConfig.default_scheduler``, ``quotient emulator --default-scheduler``,
``Emulator.start_default_scheduler()``, which the demo calls once its scenario ended under ``--keep``).

It places each pending ``default-scheduler`` pod, oldest first, on a Ready, schedulable node whose ``NoSchedule``
and ``NoExecute`` taints it tolerates, whose labels its selector and required affinity match (``nodefit``), and
where its requests (pods, CPU, memory, GPUs and any extended resource) fit beside the pods bound there; among those,
the node with the most CPU left. It binds through ``pods/binding`` and says so as kube-scheduler does (``Scheduled``:
``Successfully assigned NS/POD to NODE``); a pod that fits nowhere gets ``FailedScheduling`` with kube-scheduler's
summary (``0/4 nodes are available: 2 Insufficient cpu, 2 node(s) had untolerated taint {...}.``), once per
distinct summary, and is tried again whenever a pod or a node changes. No preemption, no scoring plugins.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Mapping

from common import logs, names
from quotient.emulator import defaulting, kubeletevents, nodefit, selectors, status
from quotient.emulator.api import Api
from quotient.emulator.objects import TERMINAL_PHASES, Obj, condition, is_deleting, metadata
from quotient.emulator.store import Change

log = logs.get("emulator.defaultscheduler")

COMPONENT = names.DEFAULT_SCHEDULER
# kube-scheduler scores a pod that requests no CPU as if it asked for 100m (``schedutil.DefaultMilliCPURequest``),
# so such pods spread instead of piling onto one node; the sum per node is kept under this key.
_DEFAULT_MILLI_CPU = 100
_SCORED_CPU = "cpu (scored)"


def _pending(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return (
        spec.get("schedulerName", names.DEFAULT_SCHEDULER) == names.DEFAULT_SCHEDULER
        and not spec.get("nodeName")
        and not is_deleting(pod)
        and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


def _why_not(pod: Obj, node: Obj, requests: Mapping[str, int], used: Mapping[str, int]) -> str | None:
    """Why ``pod`` cannot go to ``node``, in kube-scheduler's words; None when it fits."""
    ready = condition(node, "Ready")
    if ready is None or ready.get("status") != "True":
        return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    taint = _untolerated(pod, node)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint}}}"
    if not selectors.pod_fits_node_labels(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    allocatable = nodefit.allocatable(node)
    for name, amount in sorted({**requests, "pods": 1}.items()):
        if amount and used.get(name, 0) + amount > allocatable.get(name, 0):
            return "Too many pods" if name == "pods" else f"Insufficient {name}"
    return None


def _untolerated(pod: Obj, node: Obj) -> str | None:
    tolerations = [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]
    for taint in (node.get("spec") or {}).get("taints") or []:
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(nodefit.tolerates(toleration, taint) for toleration in tolerations):
            return f"{taint.get('key')}: {taint.get('value') or ''}"
    return None


def choose(pod: Obj, nodes: list[Obj], used: Mapping[str, Mapping[str, int]]) -> str | tuple[str, ...]:
    """The node for ``pod`` (the one with the most CPU left among those it fits); else why not, one reason a node."""
    requests = defaulting.pod_requests(pod)
    fitting: list[tuple[int, str]] = []
    reasons: list[str] = []
    for node in nodes:
        name = str(metadata(node).get("name"))
        reason = _why_not(pod, node, requests, used.get(name, {}))
        if reason is None:
            left = nodefit.allocatable(node).get("cpu", 0) - used.get(name, {}).get(_SCORED_CPU, 0)
            fitting.append((-left, name))
        else:
            reasons.append(reason)
    return min(fitting)[1] if fitting else tuple(reasons)


def summary(reasons: tuple[str, ...], nodes: int) -> str:
    """kube-scheduler's ``FailedScheduling`` message for the reasons each node gave."""
    counted = collections.Counter(reasons)
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(counted.items()))
    return f"0/{nodes} nodes are available: {parts}." if parts else f"0/{nodes} nodes are available."


class DefaultScheduler:
    def __init__(self, api: Api, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.api = api
        self.store = api.store
        self._clock_ns = clock_ns
        self._running = False
        self._due = False
        self._said: dict[str, str] = {}
        """The last FailedScheduling summary written for each pod (by uid), so it is said once."""

    def start(self) -> None:
        """Begin placing pods (now, and on every change); call on the emulator's loop. Idempotent."""
        if self._running:
            return
        self._running = True
        self.store.subscribe(self._on_change)
        self._soon()

    def stop(self) -> None:
        if self._running:
            self._running = False
            self.store.unsubscribe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.storage in ("pods", "nodes"):
            self._soon()

    def _soon(self) -> None:
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._place_all)

    def _place_all(self) -> None:
        self._due = False
        if not self._running:
            return
        try:
            self._place()
        except Exception:
            log.exception("default_scheduler_failed")

    def _place(self) -> None:
        pods = self.store.objects("pods")
        pending = sorted(
            (pod for pod in pods if _pending(pod)),
            key=lambda pod: (str(metadata(pod).get("creationTimestamp")), str(metadata(pod).get("name"))),
        )
        waiting = {str(metadata(pod).get("uid")) for pod in pending}
        self._said = {uid: text for uid, text in self._said.items() if uid in waiting}
        if not pending:
            return
        nodes = self.store.objects("nodes")
        used: dict[str, dict[str, int]] = {}
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                _add(used.setdefault(node, {}), pod)
        for pod in pending:
            meta = metadata(pod)
            namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
            chosen = choose(pod, nodes, used)
            if isinstance(chosen, tuple):
                text = summary(chosen, len(nodes))
                if self._said.get(uid) != text:
                    self._said[uid] = text
                    self._event(pod, "FailedScheduling", text, warning=True)
                continue
            bound = self.api.bind(namespace, name, {"target": {"kind": "Node", "name": chosen}})
            if isinstance(bound, status.Failure):
                log.info("default_bind_failed", pod=f"{namespace}/{name}", message=bound.message)
                continue
            self._said.pop(uid, None)
            _add(used.setdefault(chosen, {}), pod)
            self._event(pod, "Scheduled", f"Successfully assigned {namespace}/{name} to {chosen}")

    def _event(self, pod: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        written = kubeletevents.event(
            pod, node="", reason=reason, message=message, now_ns=self._clock_ns(), warning=warning, component=COMPONENT
        )
        kubeletevents.write(self.store, [written])


def _add(totals: dict[str, int], pod: Obj) -> None:
    """Count ``pod`` on its node: its requests, a pod slot, and the CPU it is scored by."""
    requests = defaulting.pod_requests(pod)
    for name, amount in {**requests, "pods": 1}.items():
        totals[name] = totals.get(name, 0) + amount
    totals[_SCORED_CPU] = totals.get(_SCORED_CPU, 0) + (requests.get("cpu") or _DEFAULT_MILLI_CPU)

"""The Events a kubelet writes about the pods it runs, so ``kubectl get events`` and ``kubectl describe pod`` show
each pod's story past its ``Scheduled`` event (which the scheduler that bound it writes, not the emulator).

For each container that starts: ``Pulled`` (``Container image "IMAGE" already present on machine``: the emulated
nodes pull nothing), ``Created`` (``Created container: NAME``) and ``Started`` (``Started container NAME``), each
about the container (``involvedObject.fieldPath: spec.containers{NAME}``); ``Killing`` (``Stopping container NAME``)
when a running pod is deleted; and a ``Warning`` with the admission's reason (``OutOfcpu``, ``UnexpectedAdmission
Error``, ...) for a pod the kubelet refuses. The texts are the kubelet's (``kuberuntime_container.go``,
``image_manager.go``, ``lifecycle/predicate.go``); the source is ``kubelet`` on the node. Pure: the pod and what
happened in, the core ``v1`` Event out; ``write`` stores them for ``kubelets``.
"""

from __future__ import annotations

import itertools
import uuid

from quotient.emulator.objects import Obj, metadata, timestamp
from quotient.emulator.store import Store

COMPONENT = "kubelet"
_sequence = itertools.count()


def event(
    pod: Obj,
    *,
    node: str,
    reason: str,
    message: str,
    now_ns: int,
    container: str = "",
    warning: bool = False,
    init: bool = False,
    component: str = COMPONENT,
) -> Obj:
    """A core Event about ``pod`` (or one of its containers) from the kubelet of ``node`` (or from ``component``
    when another writes it: ``defaultscheduler``)."""
    meta = metadata(pod)
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    involved: Obj = {
        "kind": "Pod",
        "namespace": namespace,
        "name": name,
        "uid": str(meta.get("uid") or ""),
        "apiVersion": "v1",
        "resourceVersion": str(meta.get("resourceVersion") or ""),
    }
    if container:
        involved["fieldPath"] = f"spec.{'initContainers' if init else 'containers'}{{{container}}}"
    now = timestamp(now_ns / 1e9)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # client-go names an Event after its object and the time in hex; adding a growing sequence keeps the names
        # of events written at one instant apart (time and sequence both grow, so their sum never repeats).
        "metadata": {
            "name": f"{name}.{now_ns + next(_sequence):x}",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": now,
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": {"component": component, **({"host": node} if node else {})},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "type": "Warning" if warning else "Normal",
        "eventTime": None,
        "reportingComponent": component,
        "reportingInstance": node or component,
    }


def started(pod: Obj, *, node: str, now_ns: int) -> list[Obj]:
    """``Pulled``, ``Created`` and ``Started`` for each of the pod's containers, init containers first."""
    spec = pod.get("spec") or {}
    found: list[Obj] = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            name, image = str(container.get("name") or ""), str(container.get("image") or "")
            for reason, message in (
                ("Pulled", f'Container image "{image}" already present on machine'),
                ("Created", f"Created container: {name}"),
                ("Started", f"Started container {name}"),
            ):
                found.append(
                    event(pod, node=node, reason=reason, message=message, now_ns=now_ns, container=name, init=init)
                )
    return found


def killing(pod: Obj, *, node: str, now_ns: int) -> list[Obj]:
    """``Killing`` for each container of a running pod being deleted."""
    return [
        event(
            pod,
            node=node,
            reason="Killing",
            message=f"Stopping container {container.get('name')}",
            now_ns=now_ns,
            container=str(container.get("name") or ""),
        )
        for container in (pod.get("spec") or {}).get("containers") or []
        if isinstance(container, dict)
    ]


def rejected(pod: Obj, *, node: str, reason: str, message: str, now_ns: int) -> Obj:
    """The kubelet refused the pod at admission."""
    return event(pod, node=node, reason=reason, message=message, now_ns=now_ns, warning=True)


def write(store: Store, events: list[Obj]) -> None:
    """Store Events as the kubelet's API writes would; one for a pod whose namespace is gone is lost, as the API
    server would refuse it."""
    for found in events:
        if store.get("namespaces", "", str(metadata(found).get("namespace"))) is not None:
            store.create("events", found)

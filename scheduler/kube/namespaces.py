"""The namespaces the scheduler writes into (its Lease's, the reservation pods'): there, made, or said why not.

On a fresh cluster a namespace may not exist yet. A scheduler allowed to create namespaces makes it; one that is not
(the deployed ClusterRole has no namespace rights: ``deploy/`` creates its namespaces itself) cannot even read
namespaces, and then learns that one is missing only when a write into it answers ``404``. Either way the answer is a
value: nothing to do, or a :class:`Missing` that says which namespace, what it is for, and what fixes it, for one log
line and the ``/readyz`` answer.
"""

from __future__ import annotations

import dataclasses

from common import logs
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeError, KubeForbidden

log = logs.get("scheduler.kube.namespaces")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Missing:
    namespace: str
    message: str


async def ensure(api: kubeapi.KubeApi, namespace: str, *, purpose: str, fix: str) -> Missing | None:
    """None when ``namespace`` exists (or was made now, or cannot be read: then a write into it will tell), else
    what is missing and what fixes it (``fix``: the flag or manifest)."""
    try:
        if await api.get(kubeapi.NAMESPACES, name=namespace) is not None:
            return None
    except KubeForbidden:
        return None  # no rights to read namespaces: the deployed role; deploy/ made it, and a write will tell if not
    except KubeError as exc:
        return Missing(namespace=namespace, message=f"cannot check namespace {namespace!r} ({purpose}): {exc}")
    try:
        await api.create(kubeapi.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except KubeAlreadyExists:
        return None
    except KubeError as exc:
        return Missing(
            namespace=namespace,
            message=f"namespace {namespace!r} ({purpose}) does not exist and cannot be created ({exc.reason or exc}): "
            f"create it (kubectl create namespace {namespace}), {fix}",
        )
    log.info("namespace_created", namespace=namespace, purpose=purpose)
    return None

"""The pod status a kubelet writes: Running, waiting for its configuration, terminated, rejected at admission.

Each function returns a fresh status for a pod (copy-on-write: the stored pod is never touched) with the fields a
kubelet sets and clients read: the phase, the conditions (``Ready``, ``ContainersReady``, ...), the container
statuses with their states, restart counts, image and container IDs, and the pod and host IPs. ``kubelets.py``
decides when each applies.
"""

from __future__ import annotations

import hashlib

from common import names
from quotient.emulator.objects import Obj, set_condition, status_copy

_RUNNING_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    names.POD_SCHEDULED_CONDITION,
)


def running(pod: Obj, *, uid: str, host_ip: str, pod_ip: str, restarts: int, now: str) -> Obj:
    """Every container started and ready (``restarts``: how many times they were restarted so far)."""
    new_status = status_copy(pod)
    new_status.pop("reason", None)
    new_status.pop("message", None)
    new_status.update(phase="Running", hostIP=host_ip, hostIPs=[{"ip": host_ip}], podIP=pod_ip, podIPs=[{"ip": pod_ip}])
    new_status.setdefault("startTime", now)
    for kind in _RUNNING_CONDITIONS:
        set_condition(new_status, {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now})
    new_status["containerStatuses"] = [
        {
            "name": container.get("name", ""),
            "state": {"running": {"startedAt": now}},
            "lastState": _last_state(pod, str(container.get("name", ""))),
            "ready": True,
            "restartCount": restarts,
            "image": container.get("image", ""),
            "imageID": f"{container.get('image', '')}@sha256:{_digest(str(container.get('image', '')))}",
            "containerID": f"containerd://{_digest(uid + str(container.get('name')) + now)}",
            "started": True,
        }
        for container in _containers(pod)
    ]
    return new_status


def waiting_for_config(pod: Obj, message: str) -> Obj:
    """Held in ``CreateContainerConfigError``: a ConfigMap or Secret its environment needs is missing."""
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
        for container in _containers(pod)
    ]
    return new_status


def terminated(pod: Obj, *, code: int, now: str) -> Obj:
    """The containers exited with ``code`` and will not restart: Succeeded (0) or Failed."""
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
    return new_status


def rejected(pod: Obj, *, reason: str, message: str, now: str) -> Obj:
    """Failed at the kubelet's admission (``OutOfcpu``, ``NodeAffinity``, ``UnexpectedAdmissionError``, ...)."""
    new_status = status_copy(pod)
    new_status.update(phase="Failed", reason=reason, message=message, startTime=now)
    return new_status


def _containers(pod: Obj) -> list[Obj]:
    return [container for container in (pod.get("spec") or {}).get("containers") or [] if isinstance(container, dict)]


def _last_state(pod: Obj, container: str) -> Obj:
    for found in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(found, dict) and found.get("name") == container:
            ended = (found.get("state") or {}).get("terminated")
            live = (found.get("state") or {}).get("running")
            if ended:
                return {"terminated": ended}
            if live:
                return {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": live.get("startedAt")}}
    return {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

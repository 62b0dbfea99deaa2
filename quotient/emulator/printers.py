"""The API server's column printers for the built-in kinds (``pkg/printers/internalversion``), cell by cell.

kubectl prints the cells exactly as sent, so each printer computes what the API server computes: a pod's READY,
STATUS (from the container states, as ``kubectl get pods`` shows ``CrashLoopBackOff`` or ``Completed``), RESTARTS
and AGE; a node's roles and addresses; a job's completions and duration. Ages are ``HumanDuration`` strings
computed at rendering time. ``tables.py`` assembles them into a ``Table``; custom resources use their CRD's
columns there instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common import names
from quotient.emulator.objects import Obj, metadata, parse_timestamp

NONE = "<none>"
NAME_DESCRIPTION = "Name must be unique within a namespace."
AGE_DESCRIPTION = "CreationTimestamp is a timestamp representing the server time when this object was created."


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration`` of apimachinery: 45s, 3m20s, 17m, 5h10m, 3d4h, 2y10d."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def since(text: Any, now: float) -> str:
    """How long ago a timestamp was, as kubectl shows it (``<unknown>`` when absent or malformed)."""
    moment = parse_timestamp(text)
    return "<unknown>" if moment is None else human_duration(now - moment)


def age(obj: Obj, now: float) -> str:
    return since(metadata(obj).get("creationTimestamp"), now)


# --- Per-kind printers: (name, type, priority, description) columns and a cells function ---

Column = tuple[str, str, int, str]
Cells = Callable[[Obj, float], list[Any]]


def _pod_cells(pod: Obj, now: float) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cond in status.get("conditions") or []:
        if cond.get("type") == names.POD_SCHEDULED_CONDITION and cond.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    restarts, ready, running = 0, 0, False
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated:
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif container.get("ready") and state.get("running"):
            running = True
            ready += 1
    if reason == "Completed" and running:
        ready_condition: Obj = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        reason = "Running" if ready_condition.get("status") == "True" else "NotReady"
    if metadata(pod).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    gates = spec.get("readinessGates") or []
    return [
        metadata(pod).get("name", ""),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        str(restarts),
        age(pod, now),
        status.get("podIP") or NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        f"0/{len(gates)}" if gates else NONE,
    ]


_POD_COLUMNS: Sequence[Column] = (
    ("Name", "string", 0, NAME_DESCRIPTION),
    ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
    ("Status", "string", 0, "The aggregate status of the containers in this pod."),
    ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted."),
    ("Age", "string", 0, AGE_DESCRIPTION),
    ("IP", "string", 1, "IP address allocated to the pod. Routable at least within the cluster."),
    ("Node", "string", 1, "Name of the Node this pod is assigned to."),
    ("Nominated Node", "string", 1, "Name of the node the scheduler nominated for this pod."),
    ("Readiness Gates", "string", 1, "Pod readiness gates."),
)


def _node_cells(node: Obj, now: float) -> list[Any]:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.partition("/")[2]
        for key in (metadata(node).get("labels") or {})
        if key.startswith("node-role.kubernetes.io/")
    )
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return [
        metadata(node).get("name", ""),
        state,
        ",".join(roles) or NONE,
        age(node, now),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or NONE,
        addresses.get("ExternalIP") or NONE,
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


_NODE_COLUMNS: Sequence[Column] = (
    ("Name", "string", 0, NAME_DESCRIPTION),
    ("Status", "string", 0, "The status of the node"),
    ("Roles", "string", 0, "The roles of the node"),
    ("Age", "string", 0, AGE_DESCRIPTION),
    ("Version", "string", 0, "Kubelet Version reported by the node."),
    ("Internal-IP", "string", 1, "List of addresses reachable to the node."),
    ("External-IP", "string", 1, "List of addresses reachable to the node."),
    ("OS-Image", "string", 1, "OS Image reported by the node from /etc/os-release."),
    ("Kernel-Version", "string", 1, "Kernel Version reported by the node from 'uname -r'."),
    ("Container-Runtime", "string", 1, "Container Runtime Version reported by the node."),
)


def _replicas(obj: Obj, field: str) -> int:
    return int((obj.get("status") or {}).get(field) or 0)


def _desired(obj: Obj) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _job_status(job: Obj) -> str:
    conditions = {c.get("type"): c.get("status") for c in (job.get("status") or {}).get("conditions") or []}
    if conditions.get("Complete") == "True":
        return "Complete"
    if conditions.get("Failed") == "True":
        return "Failed"
    if conditions.get("FailureTarget") == "True":
        return "FailureTarget"
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended"
    return "Running"


def _job_cells(job: Obj, now: float) -> list[Any]:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    completions = spec.get("completions")
    shown = (
        f"{status.get('succeeded') or 0}/{completions}"
        if completions is not None
        else (f"{status.get('succeeded') or 0}/1 of {spec.get('parallelism') or 1}")
    )
    start, end = parse_timestamp(status.get("startTime")), parse_timestamp(status.get("completionTime"))
    duration = "" if start is None else human_duration((end if end is not None else now) - start)
    return [metadata(job).get("name", ""), _job_status(job), shown, duration, age(job, now)]


def _event_cells(event: Obj, now: float) -> list[Any]:
    involved = event.get("involvedObject") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or metadata(event).get("creationTimestamp")
    kind = str(involved.get("kind", "")).lower()
    return [
        since(last, now),
        event.get("type", ""),
        event.get("reason", ""),
        f"{kind}/{involved.get('name', '')}",
        str(event.get("message", "")).strip(),
    ]


def _service_cells(service: Obj, now: float) -> list[Any]:
    spec = service.get("spec") or {}
    ports = ",".join(
        f"{port.get('port')}/{port.get('protocol', 'TCP')}"
        for port in spec.get("ports") or []
        if isinstance(port, dict)
    )
    return [
        metadata(service).get("name", ""),
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP") or NONE,
        ",".join(spec.get("externalIPs") or []) or NONE,
        ports or NONE,
        age(service, now),
    ]


def simple(*fields: tuple[str, str, Callable[[Obj], Any]]) -> tuple[Sequence[Column], Cells]:
    """A printer of NAME, the given columns, then AGE."""
    columns = [("Name", "string", 0, NAME_DESCRIPTION)]
    columns += [(title, kind, 0, "") for title, kind, _ in fields]
    columns.append(("Age", "string", 0, AGE_DESCRIPTION))

    def cells(obj: Obj, now: float) -> list[Any]:
        return [metadata(obj).get("name", ""), *(read(obj) for _, _, read in fields), age(obj, now)]

    return columns, cells


BUILTIN: Mapping[str, tuple[Sequence[Column], Cells]] = {
    "pods": (_POD_COLUMNS, _pod_cells),
    "nodes": (_NODE_COLUMNS, _node_cells),
    "namespaces": simple(("Status", "string", lambda o: (o.get("status") or {}).get("phase", ""))),
    "configmaps": simple(("Data", "integer", lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}))),
    "secrets": simple(
        ("Type", "string", lambda o: o.get("type", "Opaque")),
        ("Data", "integer", lambda o: len(o.get("data") or {})),
    ),
    "services": (
        (
            ("Name", "string", 0, NAME_DESCRIPTION),
            ("Type", "string", 0, ""),
            ("Cluster-IP", "string", 0, ""),
            ("External-IP", "string", 0, ""),
            ("Port(s)", "string", 0, ""),
            ("Age", "string", 0, AGE_DESCRIPTION),
        ),
        _service_cells,
    ),
    "events": (
        (
            ("Last Seen", "string", 0, ""),
            ("Type", "string", 0, ""),
            ("Reason", "string", 0, ""),
            ("Object", "string", 0, ""),
            ("Message", "string", 0, ""),
        ),
        _event_cells,
    ),
    "deployments.apps": simple(
        ("Ready", "string", lambda o: f"{_replicas(o, 'readyReplicas')}/{_desired(o)}"),
        ("Up-to-date", "integer", lambda o: _replicas(o, "updatedReplicas")),
        ("Available", "integer", lambda o: _replicas(o, "availableReplicas")),
    ),
    "replicasets.apps": simple(
        ("Desired", "integer", _desired),
        ("Current", "integer", lambda o: _replicas(o, "replicas")),
        ("Ready", "integer", lambda o: _replicas(o, "readyReplicas")),
    ),
    "statefulsets.apps": simple(("Ready", "string", lambda o: f"{_replicas(o, 'readyReplicas')}/{_desired(o)}")),
    "jobs.batch": (
        (
            ("Name", "string", 0, NAME_DESCRIPTION),
            ("Status", "string", 0, "Status of the job."),
            ("Completions", "string", 0, "The completion status of the job."),
            ("Duration", "string", 0, "Time required to complete the job."),
            ("Age", "string", 0, AGE_DESCRIPTION),
        ),
        _job_cells,
    ),
    "leases.coordination.k8s.io": simple(
        ("Holder", "string", lambda o: (o.get("spec") or {}).get("holderIdentity", ""))
    ),
    "priorityclasses.scheduling.k8s.io": simple(
        ("Value", "integer", lambda o: o.get("value", 0)),
        ("Global-Default", "boolean", lambda o: bool(o.get("globalDefault", False))),
    ),
}

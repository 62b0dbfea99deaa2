"""Defaults and built-in admission, applied on create as the API server does before storing.

Clients read fields they never wrote: a pod comes back with ``schedulerName: default-scheduler``, a restart policy,
``requests`` copied from ``limits`` where only limits were given (so a pod that writes ``limits: nvidia.com/gpu: 1``
requests one GPU), a QoS class, a ``spec.priority`` resolved from its PriorityClass (403 when that class does not
exist), and the two ``NoExecute`` tolerations of 300 s. Workload kinds get their replica counts, strategies and, for
Jobs, the selector and labels that tie the pods to the Job's UID. Only what the scheduler, controllers and kubectl
read is filled in; the rest of a real server's defaults would be noise.
"""

from __future__ import annotations

from typing import Any

from common import names, quantities
from common.errors import QuantityError
from quotient.emulator import status
from quotient.emulator.objects import Obj, metadata
from quotient.emulator.store import Store

DEFAULT_GRACE_S = 30
# DefaultTolerationSeconds admission: pods tolerate an unreachable or not-ready node this long.
DEFAULT_TOLERATION_S = 300
_NOT_READY = "node.kubernetes.io/not-ready"
_UNREACHABLE = "node.kubernetes.io/unreachable"
# The scalar resources whose requests may be below limits; any other (extended) resource must request its limit.
_COMPUTE = ("cpu", "memory", "ephemeral-storage")


def container_defaults(container: Obj) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    resources = container.get("resources")
    if not isinstance(resources, dict):
        resources = container["resources"] = {}
    limits = resources.get("limits")
    if isinstance(limits, dict) and limits:
        requests = resources.setdefault("requests", {})
        if isinstance(requests, dict):
            for name, value in limits.items():
                requests.setdefault(name, value)


def pod_spec_defaults(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", names.DEFAULT_SCHEDULER)
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            if isinstance(container, dict):
                container_defaults(container)


def qos_class(spec: Obj) -> str:
    """Guaranteed, Burstable or BestEffort, from the containers' CPU and memory requests and limits."""
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    any_set, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            if name not in limits or str(requests.get(name, limits.get(name))) != str(limits.get(name)):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed and containers else "Burstable"


def _template_defaults(obj: Obj) -> None:
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod_spec_defaults(template["spec"])


def apply(storage: str, obj: Obj) -> None:
    """Fill the defaults of a new (or replaced) object of ``storage``, in place on the caller's own copy."""
    if storage == "pods":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            pod_spec_defaults(spec)
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            obj["status"].setdefault("qosClass", qos_class(spec))
    elif storage == "namespaces":
        metadata(obj).setdefault("labels", {})["kubernetes.io/metadata.name"] = metadata(obj).get("name", "")
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif storage in ("deployments.apps", "replicasets.apps", "statefulsets.apps"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        if storage == "deployments.apps":
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
            )
        _template_defaults(obj)
    elif storage == "jobs.batch":
        spec = obj.setdefault("spec", {})
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        _template_defaults(obj)
    elif storage == "services":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
    elif storage == "priorityclasses.scheduling.k8s.io":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    elif storage == "secrets":
        obj.setdefault("type", "Opaque")


def job_selector(job: Obj) -> None:
    """The selector and pod labels that tie a Job's pods to it (``generateSelector``); needs the Job's UID."""
    spec = job.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    uid, name = metadata(job).get("uid", ""), metadata(job).get("name", "")
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template = spec.setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )


# --- Built-in admission plugins for pods ---


def admit_pod(pod: Obj, store: Store) -> status.Failure | None:
    """Priority (from the PriorityClass, or the global default), DefaultTolerationSeconds, ServiceAccount."""
    spec = pod.setdefault("spec", {})
    class_name = spec.get("priorityClassName")
    if class_name:
        found = store.get("priorityclasses.scheduling.k8s.io", "", str(class_name))
        if found is None:
            return status.forbidden(
                "pods", str(metadata(pod).get("name") or ""), f"no PriorityClass with name {class_name} was found"
            )
        spec["priority"] = int(found.get("value", 0))
        spec.setdefault("preemptionPolicy", found.get("preemptionPolicy", "PreemptLowerPriority"))
    else:
        default = next(
            (pc for pc in store.objects("priorityclasses.scheduling.k8s.io") if pc.get("globalDefault") is True), None
        )
        if default is not None:
            spec["priorityClassName"] = metadata(default).get("name")
            spec["priority"] = int(default.get("value", 0))
        else:
            spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list):
        tolerations = spec["tolerations"] = []
    for key in (_NOT_READY, _UNREACHABLE):
        if not any(
            isinstance(t, dict) and t.get("key") == key and t.get("effect") in (None, "NoExecute") for t in tolerations
        ):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_TOLERATION_S}
            )
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    return None


# --- Resource arithmetic shared by validation and the kubelets ---


def parse_resource(name: str, value: Any) -> int:
    """An integer amount: millicores for cpu, bytes for memory-like resources, a count for the rest.
    Raises QuantityError when the value is not a quantity."""
    text = str(value)
    if name == "cpu":
        return quantities.parse_millicores(text)
    if name in _COMPUTE or name.startswith("hugepages-"):
        return quantities.parse_bytes(text)
    return quantities.parse_count(text)


def pod_requests(pod: Obj) -> dict[str, int]:
    """The pod's effective requests: the sum over containers, at least each init container's, plus overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, 0), amount)
    for name, value in (spec.get("overhead") or {}).items():
        try:
            total[name] = total.get(name, 0) + parse_resource(name, value)
        except QuantityError:
            continue
    return total


def _container_requests(container: Any) -> dict[str, int]:
    if not isinstance(container, dict):
        return {}
    resources = container.get("resources") or {}
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    found = {}
    for name, value in amounts.items():
        try:
            found[str(name)] = parse_resource(str(name), value)
        except QuantityError:
            continue
    return found

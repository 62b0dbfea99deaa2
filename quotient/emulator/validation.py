"""What the API server rejects with ``422 Invalid``, where a client could come to depend on it.

Names (DNS subdomains, labels for namespaces, RFC 1035 labels for services), label keys and values, pods that
have no containers, a container without an image, requests above limits, an extended resource (``nvidia.com/gpu``)
whose request is not its limit or not whole, controllers whose selector does not match their template, a Job
whose pods would restart forever, and a pod whose spec changes after creation beyond what Kubernetes allows. The
field paths and messages are the API server's, because kubectl prints 422s from ``details.causes`` alone.
"""

from __future__ import annotations

import re
from typing import Any

from common.errors import QuantityError
from quotient.emulator import crds, defaulting, selectors
from quotient.emulator.objects import Obj, clone, metadata
from quotient.emulator.status import (
    Cause,
    duplicate,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
)

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
    "'[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_RESTART_POLICIES = ("Always", "OnFailure", "Never")
_JOB_RESTART_POLICIES = ("OnFailure", "Never")
_COMPUTE = ("cpu", "memory", "ephemeral-storage")


def check_name(storage: str, name: str, field: str = "metadata.name") -> list[Cause]:
    """The name rule of ``storage``: an RFC 1123 label for namespaces, RFC 1035 for services, else a subdomain."""
    if storage == "namespaces":
        pattern, limit, message = _LABEL, 63, LABEL_MESSAGE
    elif storage == "services":
        pattern, limit, message = _DNS1035, 63, DNS1035_MESSAGE
    else:
        pattern, limit, message = _SUBDOMAIN, 253, SUBDOMAIN_MESSAGE
    causes = []
    if len(name) > limit:
        causes.append(invalid_value(field, name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        causes.append(invalid_value(field, name, message))
    return causes


def check_label(key: str, value: str, field: str) -> list[Cause]:
    causes = []
    prefix, slash, short = key.rpartition("/")
    if (slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix))) or (
        not short or len(short) > 63 or not _QUALIFIED_NAME.match(short)
    ):
        causes.append(
            invalid_value(
                field,
                key,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character, with an optional DNS subdomain prefix and '/'",
            )
        )
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        causes.append(
            invalid_value(
                f"{field}[{key}]" if not field.endswith("]") else field,
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character (at most 63 characters)",
            )
        )
    return causes


def check_metadata(storage: str, obj: Obj, *, namespaced: bool) -> list[Cause]:
    meta = metadata(obj)
    name = meta.get("name")
    if not name:
        return [required("metadata.name", "name or generateName is required")]
    causes = check_name(storage, str(name))
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        causes.append(invalid_value("metadata.labels", str(labels), "must be a map of strings"))
    else:
        for key, value in labels.items():
            if not isinstance(value, str):
                causes.append(invalid_value(f"metadata.labels[{key}]", str(value), "must be a string"))
            else:
                causes += check_label(str(key), value, "metadata.labels")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(value, str) for value in annotations.values()):
        causes.append(invalid_value("metadata.annotations", "", "must be a map of strings"))
    elif sum(len(key) + len(value) for key, value in annotations.items()) > 256 * 1024:
        causes.append(
            Cause(
                field="metadata.annotations",
                reason="FieldValueTooLong",
                message="Too long: must have at most 262144 bytes",
            )
        )
    if namespaced and not meta.get("namespace"):
        causes.append(required("metadata.namespace"))
    return causes


# --- Pods ---


def _resource_causes(container: Obj, path: str) -> list[Cause]:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    causes: list[Cause] = []
    parsed: dict[str, dict[str, int]] = {"requests": {}, "limits": {}}
    for section, values in (("requests", requests), ("limits", limits)):
        if not isinstance(values, dict):
            causes.append(invalid_value(f"{path}.resources.{section}", str(values), "must be a map of quantities"))
            continue
        for name, value in values.items():
            try:
                parsed[section][name] = defaulting.parse_resource(str(name), value)
            except QuantityError:
                causes.append(
                    invalid_value(f"{path}.resources.{section}[{name}]", str(value), "must be a valid quantity")
                )
    for name, amount in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if name in _COMPUTE or name.startswith("hugepages-"):
            if limit is not None and amount > limit:
                causes.append(
                    invalid_value(
                        f"{path}.resources.requests",
                        str(requests[name]),
                        f"must be less than or equal to {name} limit of {limits[name]}",
                    )
                )
            continue
        if limit is None:
            causes.append(required(f"{path}.resources.limits", "Limit must be set for non overcommitable resources"))
        elif amount != limit:
            causes.append(
                invalid_value(
                    f"{path}.resources.requests[{name}]",
                    str(requests[name]),
                    f"must be equal to {name} limit of {limits[name]}",
                )
            )
    return causes


def check_pod_spec(spec: Any, path: str, *, restart_policies: tuple[str, ...] = _RESTART_POLICIES) -> list[Cause]:
    if not isinstance(spec, dict):
        return [required(path)]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(required(f"{path}.containers"))
        containers = []
    seen: set[str] = set()
    for field, items in (("initContainers", spec.get("initContainers") or []), ("containers", containers)):
        for index, container in enumerate(items):
            where = f"{path}.{field}[{index}]"
            if not isinstance(container, dict):
                causes.append(invalid_value(where, str(container), "must be an object"))
                continue
            name = container.get("name")
            if not name:
                causes.append(required(f"{where}.name"))
            elif name in seen:
                causes.append(duplicate(f"{where}.name", name))
            else:
                seen.add(str(name))
                if not _LABEL.match(str(name)) or len(str(name)) > 63:
                    causes.append(invalid_value(f"{where}.name", name, LABEL_MESSAGE))
            if not container.get("image"):
                causes.append(required(f"{where}.image"))
            causes += _resource_causes(container, where)
    policy = spec.get("restartPolicy")
    if policy not in restart_policies:
        causes.append(not_supported(f"{path}.restartPolicy", policy or "", restart_policies))
    node = spec.get("nodeName")
    if node and not _SUBDOMAIN.match(str(node)):
        causes.append(invalid_value(f"{path}.nodeName", node, SUBDOMAIN_MESSAGE))
    return causes


_POD_UPDATE_MESSAGE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def check_pod_update(new: Obj, old: Obj) -> list[Cause]:
    """Pod specs are immutable but for images, the active deadline, added tolerations and removed gates."""
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    comparable = clone(new_spec)
    for field in ("containers", "initContainers"):
        for mine, theirs in zip(comparable.get(field) or [], old_spec.get(field) or [], strict=False):
            if isinstance(mine, dict) and isinstance(theirs, dict) and "image" in theirs:
                mine["image"] = theirs["image"]
    if "activeDeadlineSeconds" in old_spec or "activeDeadlineSeconds" in comparable:
        comparable["activeDeadlineSeconds"] = old_spec.get("activeDeadlineSeconds")
        if comparable["activeDeadlineSeconds"] is None:
            del comparable["activeDeadlineSeconds"]
    old_tolerations = old_spec.get("tolerations") or []
    if all(toleration in (comparable.get("tolerations") or []) for toleration in old_tolerations):
        if "tolerations" in old_spec:
            comparable["tolerations"] = old_spec["tolerations"]
        else:
            comparable.pop("tolerations", None)
    gates = comparable.get("schedulingGates") or []
    if all(gate in (old_spec.get("schedulingGates") or []) for gate in gates):
        if "schedulingGates" in old_spec:
            comparable["schedulingGates"] = old_spec["schedulingGates"]
        else:
            comparable.pop("schedulingGates", None)
    if comparable != old_spec:
        return [forbidden_field("spec", _POD_UPDATE_MESSAGE)]
    return []


# --- Workloads ---


def _check_template(obj: Obj, *, restart_policies: tuple[str, ...] = _RESTART_POLICIES) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    causes: list[Cause] = []
    template = spec.get("template")
    if not isinstance(template, dict):
        return [required("spec.template")]
    labels = (template.get("metadata") or {}).get("labels") or {}
    selector = spec.get("selector")
    if selector is None:
        causes.append(required("spec.selector"))
    elif not selectors.from_object(selector).matches(labels):
        causes.append(
            invalid_value("spec.template.metadata.labels", str(labels), "`selector` does not match template `labels`")
        )
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        causes.append(invalid_value("spec.replicas", replicas, "must be greater than or equal to 0"))
    causes += check_pod_spec(template.get("spec"), "spec.template.spec", restart_policies=restart_policies)
    return causes


def check_crd(crd: Obj) -> list[Cause]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    causes = []
    for field, value in (
        ("spec.group", spec.get("group")),
        ("spec.names.plural", names.get("plural")),
        ("spec.names.kind", names.get("kind")),
    ):
        if not value:
            causes.append(required(field))
    if not spec.get("versions"):
        causes.append(required("spec.versions", "must have exactly one version marked as storage version"))
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if not causes and metadata(crd).get("name") != expected:
        causes.append(
            invalid_value("metadata.name", metadata(crd).get("name", ""), 'must be spec.names.plural+"."+spec.group')
        )
    return causes


def check_create(storage: str, obj: Obj) -> list[Cause]:
    """Kind-specific checks of a new object (metadata is checked separately)."""
    if storage == "pods":
        return check_pod_spec(obj.get("spec"), "spec")
    if storage in ("deployments.apps", "replicasets.apps", "statefulsets.apps", "daemonsets.apps"):
        return _check_template(obj)
    if storage == "jobs.batch":
        return _check_template(obj, restart_policies=_JOB_RESTART_POLICIES)
    if storage == crds.CRDS:
        return check_crd(obj)
    return []


def check_update(storage: str, new: Obj, old: Obj) -> list[Cause]:
    causes = check_create(storage, new)
    if storage == "pods":
        causes += check_pod_update(new, old)
    elif storage == "jobs.batch":
        new_template = (new.get("spec") or {}).get("template")
        if new_template != (old.get("spec") or {}).get("template"):
            causes.append(forbidden_field("spec.template", "field is immutable"))
    return causes

"""The environment of a pod's containers, as the kubelet builds it when they start.

Values from ConfigMaps and Secrets (``env[].valueFrom`` and ``envFrom``), the downward API (``fieldRef``), ``$(VAR)``
expansion, and the device plugin's ``NVIDIA_VISIBLE_DEVICES`` for containers that got GPUs. The admission webhook
of fractional GPUs wires ConfigMap references into a pod's env at creation, so what a sharing pod really sees
(its GPU group's device UUID, its portion) is only known here; the runtime receives it in ``PodLaunch.env``.
A missing ConfigMap or key is a message, not an exception: the kubelet holds the pod and retries.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping, Sequence

from common import names, quantities
from common.errors import QuantityError
from quotient.emulator.objects import Obj, metadata


def pod_env(
    pod: Obj,
    *,
    get: Callable[[str, str, str], Obj | None],
    host_ip: str,
    devices: Sequence[int],
    device_uuids: Sequence[str],
) -> dict[str, dict[str, str]] | str:
    """Each container's environment, or the message of why it cannot be built yet. The containers that asked for
    GPUs take theirs from ``devices`` (the device plugin's allocation, indices into ``device_uuids``) in order."""
    result: dict[str, dict[str, str]] = {}
    spare = list(devices)
    for container in (pod.get("spec") or {}).get("containers") or []:
        if not isinstance(container, dict):
            continue
        env = container_env(container, pod, get, host_ip)
        if isinstance(env, str):
            return env
        wanted = container_gpus(container)
        if wanted:
            mine, spare = spare[:wanted], spare[wanted:]
            visible = ",".join(device_uuids[index] for index in mine if index < len(device_uuids))
            env.setdefault(names.VISIBLE_DEVICES_ENV, visible)
        result[str(container.get("name", ""))] = env
    return result


def container_env(
    container: Obj, pod: Obj, get: Callable[[str, str, str], Obj | None], host_ip: str
) -> dict[str, str] | str:
    namespace = str(metadata(pod).get("namespace") or "")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if not isinstance(source, dict):
            continue
        prefix = str(source.get("prefix") or "")
        for field, storage in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            ref = source.get(field)
            if not isinstance(ref, dict):
                continue
            found = get(storage, namespace, str(ref.get("name")))
            if found is None:
                if ref.get("optional"):
                    continue
                return f'{storage[:-1]} "{ref.get("name")}" not found'
            for key, value in _data(found, storage).items():
                env[prefix + key] = value
    for entry in container.get("env") or []:
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        name = str(entry["name"])
        if "value" in entry:
            env[name] = _expand(str(entry.get("value") or ""), env)
            continue
        source = entry.get("valueFrom") or {}
        for field, storage in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            ref = source.get(field)
            if not isinstance(ref, dict):
                continue
            found = get(storage, namespace, str(ref.get("name")))
            data = _data(found, storage) if found is not None else None
            key = str(ref.get("key"))
            if data is None or key not in data:
                if ref.get("optional"):
                    break
                if data is None:
                    return f'{storage[:-1]} "{ref.get("name")}" not found'
                what = "ConfigMap" if storage == "configmaps" else "Secret"
                return f"couldn't find key {key} in {what} {namespace}/{ref.get('name')}"
            env[name] = data[key]
        field_ref = source.get("fieldRef")
        if isinstance(field_ref, dict):
            env[name] = _downward(pod, str(field_ref.get("fieldPath", "")), host_ip)
    return env


def _data(obj: Obj, storage: str) -> dict[str, str]:
    data = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
    if storage == "secrets":
        decoded = {}
        for key, value in data.items():
            try:
                decoded[key] = base64.b64decode(value).decode()
            except (ValueError, binascii.Error):
                decoded[key] = value
        decoded.update({str(k): str(v) for k, v in (obj.get("stringData") or {}).items()})
        return decoded
    return data


def _expand(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references to earlier variables, as the kubelet expands them."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _downward(pod: Obj, path: str, host_ip: str) -> str:
    meta, spec, status = metadata(pod), pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": host_ip,
        "status.podIP": status.get("podIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    match = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if match is not None:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    return ""


def container_gpus(container: Obj) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(
        names.GPU_RESOURCE, (resources.get("requests") or {}).get(names.GPU_RESOURCE)
    )
    if value is None:
        return 0
    try:
        return quantities.parse_count(str(value))
    except QuantityError:
        return 0

"""The kubelet's admission predicates: does a bound pod fit the node it was bound to?

The real kubelet re-checks what the scheduler decided before it starts a pod: node selector and required
affinity, ``NoExecute`` taints, and resources (pod slots, CPU, memory, extended resources) against the node's
allocatable minus what the pods it already admitted request. A pod that fails is Failed with the kubelet's reason
(``NodeAffinity``, ``Taint``, ``OutOfcpu``, ...), which is how a scheduler that over-commits a node finds out.
GPUs are the device plugin's business (``kubelets.py``), as on a node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names
from common.errors import QuantityError
from quotient.emulator import defaulting, selectors
from quotient.emulator.objects import Obj

# The order in which the kubelet's resource fit reports shortages (noderesources.Fit).
_ADMISSION_ORDER = ("pods", "cpu", "memory", "ephemeral-storage")


def rejection(
    pod: Obj, node: Obj | None, requests: Mapping[str, int], *, used: Mapping[str, int], allocatable: Mapping[str, int]
) -> tuple[str, str] | None:
    """(reason, message) when the kubelet rejects ``pod`` on ``node``, else None."""
    if node is None:
        return ("NodeNotFound", "Pod was rejected: the node does not exist")
    if not selectors.pod_fits_node_labels(pod, node):
        return (
            "NodeAffinity",
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
        )
    taint = _untolerated_no_execute(pod, node)
    if taint is not None:
        return (
            "Taint",
            f"Pod was rejected: Predicate TaintToleration failed: node(s) had untolerated taint {{{taint}}}",
        )
    wanted = {**requests, "pods": 1}
    order = [name for name in _ADMISSION_ORDER if name in wanted] + sorted(
        name for name in wanted if name not in _ADMISSION_ORDER and name != names.GPU_RESOURCE
    )
    for name in order:
        amount = wanted[name]
        if amount == 0:
            continue
        capacity = allocatable.get(name, 0)
        if used.get(name, 0) + amount > capacity:
            return (
                f"OutOf{name}",
                f"Pod was rejected: Node didn't have enough resource: {name}, requested: {amount}, used: "
                f"{used.get(name, 0)}, capacity: {capacity}",
            )
    return None


def allocatable(node: Obj | None) -> dict[str, int]:
    found: dict[str, int] = {}
    if node is None:
        return found
    for name, value in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            found[str(name)] = defaulting.parse_resource(str(name), value)
        except QuantityError:
            continue
    return found


def _untolerated_no_execute(pod: Obj, node: Obj) -> str | None:
    tolerations = [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]
    for taint in (node.get("spec") or {}).get("taints") or []:
        if not isinstance(taint, dict) or taint.get("effect") != "NoExecute":
            continue
        if not any(tolerates(toleration, taint) for toleration in tolerations):
            value = f": {taint['value']}" if taint.get("value") else ""
            return f"{taint.get('key')}{value}"
    return None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or str(toleration.get("value") or "") == str(taint.get("value") or "")

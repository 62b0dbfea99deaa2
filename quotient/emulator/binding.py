"""``pods/binding``: how the API server assigns a pod to a node, the one write a scheduler makes to place a pod.

The node is set once: a pod already assigned, being deleted, still gated, or another pod of the same name (a UID
precondition that does not match) is a 409 with the API server's message, which schedulers match on. Success is a
201 answered with a ``Status``, not the Binding, exactly as the API server answers (the official client's parser
trips on it, which tests must keep seeing); the pod gets ``spec.nodeName``, the Binding's annotations and
``PodScheduled=True``, and every watch sees it MODIFIED.
"""

from __future__ import annotations

from typing import Any

from common import names
from quotient.emulator import status
from quotient.emulator.objects import Obj, child, is_deleting, metadata, set_condition, status_copy
from quotient.emulator.store import Store


def bind(store: Store, namespace: str, name: str, binding: Any, *, now: str) -> Obj | status.Failure:
    """Assign pod ``namespace/name`` to the node the Binding names; 201 with a Status on success."""
    if not isinstance(binding, dict):
        return status.bad_request("the body of the request must be a Binding object")
    meta = child(binding, "metadata")
    if meta.get("name") and meta["name"] != name:
        return status.bad_request("name in URL does not match name in Binding object")
    target = child(binding, "target")
    causes = []
    if target.get("kind") not in (None, "", "Node"):
        causes.append(status.not_supported("target.kind", target.get("kind"), ["Node", "<empty>"]))
    if not target.get("name"):
        causes.append(status.required("target.name"))
    if causes:
        return status.invalid("Binding", name, causes)
    pod = store.get("pods", namespace, name)
    if pod is None:
        return status.not_found("pods", name)
    spec = pod.get("spec") or {}
    reason = None
    if meta.get("uid") and meta["uid"] != metadata(pod).get("uid"):
        found_uid = metadata(pod).get("uid")
        reason = f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {found_uid}"
    elif is_deleting(pod):
        reason = f"pod {name} is being deleted, cannot be assigned to a host"
    elif spec.get("nodeName"):
        reason = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    elif spec.get("schedulingGates"):
        reason = f"pod {name} has non-empty .spec.schedulingGates"
    if reason is not None:
        return status.conflict("pods/binding", name, reason)
    # Copy on write along the changed paths only: stored objects are never mutated, so the rest is shared.
    bound = {**pod, "metadata": dict(metadata(pod)), "spec": {**spec, "nodeName": str(target["name"])}}
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and annotations:
        bound["metadata"]["annotations"] = {**(bound["metadata"].get("annotations") or {}), **annotations}
    bound["status"] = status_copy(pod)
    set_condition(
        bound["status"],
        {"type": names.POD_SCHEDULED_CONDITION, "status": "True", "lastProbeTime": None, "lastTransitionTime": now},
    )
    store.replace("pods", bound)
    return status.success(201)

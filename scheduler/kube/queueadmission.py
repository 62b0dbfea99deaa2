"""The validating admission review of Queues, KAI's queue webhook (v0.14 and later), pure: a request and the queues
that exist in, a verdict out.

KAI's rules (``pkg/admission/webhook/queuehooks/queue_validator.go``), on create and update of a
``scheduling.run.ai/v2`` Queue:

- a Queue without ``spec.resources`` is refused ("resources must be specified");
- with the strict option (KAI's ``--enable-quota-validation``; ours ``--queue-parent-must-exist``) a Queue whose
  ``spec.parentQueue`` does not exist is refused;
- quotas above the parent's draw warnings, which the API server hands to the client and kubectl prints
  (``Warning: ...``): the queue's own quota above its parent's, its siblings' and its own together above the
  parent's, and on update of a parent, its children's together above its new quota.

Where Quotient differs, on purpose: the warnings come whether or not the strict option is on (they never refuse
anything, and a quota that the parent cannot cover is what an operator wants to hear about at once), ``-1`` is read
as KAI's scheduler reads it, unlimited, so a parent of ``-1`` covers any child and a child of ``-1`` adds nothing to
a sum (KAI's webhook compares the raw numbers and would warn that 5 "exceeds" -1), and without the strict option a
missing parent draws a warning instead of nothing. Values the CRD schema refuses (not a number, below -1) never
reach a webhook on a real API server; here they are skipped, not guessed at.

``scheduler.kube.webhook`` serves it on KAI's path and hands it the queues it listed (None when the list failed:
then the checks that need them are left out, or, strict, the queue is refused because its parent cannot be seen).
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from typing import Any

from common import logs
from scheduler.kube.admission import ALLOW, Verdict

log = logs.get("scheduler.kube.webhook")

PATH = "/validate-scheduling-run-ai-v2-queue"
"""KAI's path for the same webhook (controller-runtime's naming for ``scheduling.run.ai/v2`` Queues)."""
GROUP = "scheduling.run.ai"
RESOURCES = (("gpu", "GPU"), ("cpu", "CPU"), ("memory", "Memory"))
UNLIMITED = decimal.Decimal(-1)


def _spec(queue: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = queue.get("spec")
    return spec if isinstance(spec, dict) else {}


def _name(queue: Mapping[str, Any]) -> str:
    metadata = queue.get("metadata")
    return str((metadata if isinstance(metadata, dict) else {}).get("name") or "")


def _quota(queue: Mapping[str, Any], resource: str) -> decimal.Decimal | None:
    """``spec.resources.<resource>.quota`` as a number (unset is 0, KAI's default); None when it is not one."""
    resources = _spec(queue).get("resources")
    section = resources.get(resource) if isinstance(resources, dict) else None
    value = section.get("quota", 0) if isinstance(section, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return decimal.Decimal(str(value))


def _show(value: decimal.Decimal) -> str:
    """A number as written: ``2``, ``0.5``, ``1000`` (never ``1E+3``)."""
    return format(value.normalize(), "f")


def admit(
    request: Mapping[str, Any], *, queues: Sequence[Mapping[str, Any]] | None, parent_must_exist: bool
) -> Verdict:
    """The verdict on one admission request for a Queue; ``queues``: every Queue stored (None: unreadable)."""
    resource = request.get("resource")
    if not isinstance(resource, dict) or resource.get("group") != GROUP or resource.get("resource") != "queues":
        return ALLOW  # a configuration that sends more than queues is not ours to police
    if request.get("subResource") or request.get("operation") not in ("CREATE", "UPDATE"):
        return ALLOW
    queue = request.get("object")
    if not isinstance(queue, dict) or not isinstance(queue.get("spec", {}), dict):
        return Verdict(allowed=False, code=400, reason="BadRequest", message="malformed queue: no spec object")
    name = _name(queue)
    spec = _spec(queue)
    if not isinstance(spec.get("resources"), dict):
        log.info("queue_refused", queue=name, reason="no resources")
        return Verdict(
            allowed=False,
            code=403,
            reason="Forbidden",
            message="resources must be specified: spec.resources needs a gpu, cpu and memory section (quota, limit, "
            "overQuotaWeight), as KAI's queue webhook requires",
        )
    parent_name = spec.get("parentQueue")
    warnings: list[str] = []
    if isinstance(parent_name, str) and parent_name:
        parent = None if queues is None else next((q for q in queues if _name(q) == parent_name), None)
        if parent is None:
            seen = "does not exist" if queues is not None else "could not be read"
            if parent_must_exist:
                log.info("queue_refused", queue=name, reason="parent missing", parent=parent_name)
                return Verdict(
                    allowed=False,
                    code=403,
                    reason="Forbidden",
                    message=f"parent queue {parent_name!r} {seen}; create it first (the scheduler runs with "
                    "--queue-parent-must-exist)",
                )
            if queues is not None:
                warnings.append(
                    f"parent queue {parent_name!r} does not exist: until it does, queue {name!r} is an Orphan and "
                    "takes no work"
                )
        else:
            siblings = [q for q in queues or () if _spec(q).get("parentQueue") == parent_name and _name(q) != name]
            warnings += _over_parent(queue, parent, siblings)
    if request.get("operation") == "UPDATE" and queues is not None:
        children = [q for q in queues if _spec(q).get("parentQueue") == name and _name(q) != name]
        warnings += _children_over(queue, children)
    return Verdict(allowed=True, warnings=tuple(warnings))


def _over_parent(
    queue: Mapping[str, Any], parent: Mapping[str, Any], siblings: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Warnings for a queue whose quota, alone or with its siblings', is above its parent's."""
    warnings = []
    for resource, label in RESOURCES:
        own, limit = _quota(queue, resource), _quota(parent, resource)
        if own is None or limit is None or limit == UNLIMITED:
            continue
        if own > limit:
            warnings.append(
                f"child queue {label} quota ({_show(own)}) exceeds parent queue {_name(parent)} {label} quota "
                f"({_show(limit)})"
            )
        total = sum((q for q in (_quota(s, resource) for s in siblings) if q is not None and q > 0), start=own)
        if own != UNLIMITED and total > limit and total != own:
            warnings.append(
                f"total children {label} quota ({_show(total)}) exceeds parent queue {_name(parent)} {label} quota "
                f"({_show(limit)})"
            )
    return warnings


def _children_over(queue: Mapping[str, Any], children: Sequence[Mapping[str, Any]]) -> list[str]:
    """Warnings for a parent whose (new) quota is below what its children's quotas add up to."""
    warnings = []
    for resource, label in RESOURCES:
        limit = _quota(queue, resource)
        if limit is None or limit == UNLIMITED or not children:
            continue
        quotas = [q for q in (_quota(child, resource) for child in children) if q is not None and q > 0]
        total = sum(quotas, start=decimal.Decimal(0))
        if total > limit:
            warnings.append(
                f"total children {label} quota ({_show(total)}) exceeds queue {_name(queue)} {label} quota "
                f"({_show(limit)})"
            )
    return warnings

"""The validating admission review of PodGroups, KAI's PodGroup webhook, pure: a request in, a verdict out.

KAI's webhook (``pkg/apis/scheduling/v2alpha2/podgroup_webhook.go``, served by its pod-group controller) checks the
spec of every ``scheduling.run.ai/v2alpha2`` PodGroup created or updated. Its rules are
``scheduler.objects.podgrouprules``, read by ``scheduler.objects.podgroups.findings``, the same findings the decoder
keeps as the record's problems, so what this webhook admits the scheduler places by, and what it refuses never
reaches the scheduler, or, stored without it, keeps the group's pending pods out with the same reason:

- refused, on creation and update, with KAI's reasons: ``minMember`` and ``minSubGroup`` both at the top or on one
  subgroup, a duplicate subgroup name, a ``parent`` that is not a subgroup, a cycle, a leaf with ``minSubGroup`` or
  without ``minMember``;
- refused on creation and warned of on update: ``minMember`` on a mid-level subgroup (KAI keeps older objects
  updatable);
- admitted with a warning, which kubectl prints: a ``minSubGroup`` above the number of direct children (the group
  can never be satisfied and waits).

Where Quotient's differs, on purpose: values of the wrong type are refused here too (a real API server's CRD schema
refuses them first, and KAI's webhook could not decode them), as is a ``spec.preemptionDelay`` or
``stalenessGracePeriod`` that is not a Go duration; an annotation the scheduler cannot read (``kai.scheduler/
preemption-delay`` and the like) draws a warning; and an update that leaves the spec as it was is admitted with the
warnings only, so labels and annotations (the scheduler's own ``kai.scheduler/last-eviction-timestamp``) can still
be written on a PodGroup stored before the webhook was registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import logs
from scheduler.kube.admission import ALLOW, Verdict
from scheduler.objects import podgrouprules, podgroups

log = logs.get("scheduler.kube.webhook")

PATH = "/validate-scheduling-run-ai-v2alpha2-podgroup"
"""KAI's path for the same webhook (controller-runtime's naming for ``scheduling.run.ai/v2alpha2`` PodGroups)."""
GROUP = "scheduling.run.ai"


def admit(request: Mapping[str, Any]) -> Verdict:
    """The verdict on one admission request for a PodGroup."""
    resource = request.get("resource")
    if not isinstance(resource, dict) or resource.get("group") != GROUP or resource.get("resource") != "podgroups":
        return ALLOW  # a configuration that sends more than PodGroups is not ours to police
    operation = request.get("operation")
    if request.get("subResource") or operation not in ("CREATE", "UPDATE"):
        return ALLOW
    podgroup = request.get("object")
    if not isinstance(podgroup, dict) or not isinstance(podgroup.get("spec", {}), dict):
        return Verdict(allowed=False, code=400, reason="BadRequest", message="malformed PodGroup: no spec object")
    # The name may be generated after admission; the rules read only the spec.
    named = {**podgroup, "metadata": {**_metadata(podgroup), "name": _metadata(podgroup).get("name") or "-"}}
    found = podgroups.findings(named)
    old = request.get("oldObject")
    creating = str(operation) == "CREATE"
    unchanged = not creating and isinstance(old, dict) and old.get("spec") == podgroup.get("spec")

    def refuses(finding: podgrouprules.Finding) -> bool:
        if unchanged:
            return False
        if finding.severity is podgrouprules.Severity.REFUSED_ON_CREATE:
            return creating
        return finding.severity in (podgrouprules.Severity.UNREADABLE, podgrouprules.Severity.REFUSED)

    refusals = [finding for finding in found if refuses(finding)]
    warnings = tuple(_said(finding) for finding in found if not refuses(finding))
    name = f"{request.get('namespace') or _metadata(podgroup).get('namespace') or ''}/{named['metadata']['name']}"
    if not refusals:
        if warnings:
            log.info("podgroup_admitted_with_warnings", podgroup=name, operation=operation, warnings=len(warnings))
        return Verdict(allowed=True, warnings=warnings)
    unreadable = any(finding.severity is podgrouprules.Severity.UNREADABLE for finding in refusals)
    log.info("podgroup_refused", podgroup=name, operation=operation, reasons=len(refusals))
    return Verdict(
        allowed=False,
        code=400 if unreadable else 403,
        reason="BadRequest" if unreadable else "Forbidden",
        message="; ".join(_said(finding) for finding in refusals),
        warnings=warnings,
    )


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _said(finding: podgrouprules.Finding) -> str:
    return f"{finding.field}: {finding.message}"

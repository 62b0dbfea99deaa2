"""The alerts: the ones the scheduler decides (``overuse.AlertName``) and the Prometheus rules of ``deploy/monitoring``.

The scheduler decides over-consumption, ghosts, unattributed memory, stale telemetry, conflicting publishers and
failed GPUs itself and exports each firing instance as ``quotient_alert{alert=...} 1`` (also an Event and a NATS
``Alert``); most rules of ``deploy/monitoring/rules/quotient.rules.yaml`` forward those, the others watch the
scheduler's own series. The names, the rules, their ``for`` and severity come from the code and the rule file; what
fires each alert is said here once, and every alert name and every rule must have its line (an alert or rule
without one stops the page from being generated).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from common.errors import QuotientError
from quotient.docsgen import blocks
from scheduler.telemetry.overuse import AlertName

RULES = Path("deploy") / "monitoring" / "rules" / "quotient.rules.yaml"
_FORWARDED = re.compile(r'quotient_alert\{alert="([A-Za-z]+)"\}')


class UndocumentedAlert(QuotientError):
    """An alert name or a rule this module does not describe."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Said:
    severity: str
    fires: str


SCHEDULER_ALERTS: Mapping[AlertName, _Said] = {
    AlertName.GPU_MEMORY_OVERCONSUMPTION: _Said(
        "warning; critical under the `evict` policy",
        "a pod's measured GPU memory on a device stays above its allotment (fraction x device memory, `gpu-memory`, "
        "or its NvFractions limit) by more than `--overuse-tolerance` / `--overuse-tolerance-percent` for "
        "`--overuse-grace`; names the pod, node, device, allotted and used memory and the neighbours at risk; "
        "clears when the pod is back under. Under `evict` the pod is evicted after `--overuse-evict-grace`",
    ),
    AlertName.GHOST_ALLOCATION: _Said(
        "warning",
        "a Running pod holds a GPU with no process on it for `--ghost-grace`, or a device is still allotted to a pod "
        "that is gone or finished",
    ),
    AlertName.UNATTRIBUTED_GPU_MEMORY: _Said(
        "warning",
        "processes of no pod the scheduler knows hold more than `--unattributed-threshold` on one device for "
        "`--overuse-grace`",
    ),
    AlertName.TELEMETRY_STALE: _Said(
        "warning",
        "a node's newest accepted telemetry is older than max(3 x its interval, `--telemetry-stale-floor`), or "
        "its messages are refused (the reason is in the alert); placement there falls back to requests",
    ),
    AlertName.GPU_UNHEALTHY: _Said(
        "critical",
        "the node's agent reports a critical Xid, a rise in uncorrectable ECC errors, a lost device, NVML "
        "unreachable or the runtime not ready: the GPU (or every GPU of the node) is out of placement",
    ),
    AlertName.TELEMETRY_CONFLICT: _Said(
        "critical",
        "two live publishers claim one node (a forged or duplicated agent); fires until one remains "
        "([telemetry trust](telemetry-trust.md))",
    ),
}

RULES_OF_THEIR_OWN: Mapping[str, str] = {
    "QuotientPodsPendingTooLong": "a queue's oldest pending pod group has waited more than 15 minutes",
    "QuotientQueueOverLimit": "a queue holds more of a resource than its limit (the limit was lowered, or another "
    "scheduler bound pods)",
    "QuotientSchedulerDown": "no replica reports `quotient_scheduler_leader` 1, including when none is scraped",
    "QuotientInternalErrors": "the scheduler caught and survived a fault (a bug) in the last hour, by `where`",
    "QuotientPodGroupsQuarantined": "pod groups are left out of the cycles because the placement engine fails "
    "with them",
}
"""What each rule that does not forward a scheduler alert watches."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    name: str
    expr: str
    for_: str
    severity: str
    forwards: str | None


def rules(root: Path) -> tuple[Rule, ...]:
    """The alerting rules of the rule file, in order."""
    document = yaml.safe_load((root / RULES).read_text())
    found = []
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            expr = " ".join(str(rule["expr"]).split())
            forwarded = _FORWARDED.search(expr)
            found.append(
                Rule(
                    name=str(rule["alert"]),
                    expr=expr,
                    for_=str(rule.get("for", "0m")),
                    severity=str(rule.get("labels", {}).get("severity", "")),
                    forwards=forwarded.group(1) if forwarded else None,
                )
            )
    return tuple(found)


def _check(found: Sequence[Rule]) -> None:
    problems = [f"alert {name} has no line in SCHEDULER_ALERTS" for name in AlertName if name not in SCHEDULER_ALERTS]
    own = [rule for rule in found if rule.forwards is None]
    problems += [
        f"rule {rule.name} has no line in RULES_OF_THEIR_OWN" for rule in own if rule.name not in RULES_OF_THEIR_OWN
    ]
    problems += [
        f"rule {rule.forwards} forwards no alert the scheduler has"
        for rule in found
        if rule.forwards and rule.forwards not in set(AlertName)
    ]
    if problems:
        raise UndocumentedAlert("quotient/docsgen/alerts.py: " + "; ".join(problems))


def reference(found: Sequence[Rule]) -> str:
    """Two tables: the scheduler's alerts with the rule that forwards each, and the rules of their own."""
    _check(found)
    forwarding = {rule.forwards: rule for rule in found if rule.forwards}
    rows = []
    for name in AlertName:
        said = SCHEDULER_ALERTS[name]
        rule = forwarding.get(name.value)
        forwarded = f"`{rule.name}` (for {rule.for_})" if rule else "none: NATS, Events and `quotient_alert` only"
        rows.append((f"`{name.value}`", blocks.cell(said.severity), blocks.cell(said.fires), forwarded))
    scheduler = blocks.table(("alert", "severity", "fires when", "Prometheus rule"), rows)
    own_rows = [
        (
            f"`{rule.name}`",
            rule.severity,
            blocks.cell(RULES_OF_THEIR_OWN[rule.name]),
            rule.for_,
            f"`{blocks.cell(rule.expr)}`",
        )
        for rule in found
        if rule.forwards is None
    ]
    own = blocks.table(("rule", "severity", "fires when", "for", "expression"), own_rows)
    return scheduler + "\n\nRules on the scheduler's series, in `" + str(RULES) + "`:\n\n" + own

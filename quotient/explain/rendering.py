"""``explain`` as a person reads it: one paragraph per question, every number in human units.

"9 GPUs asked, at most 8 on any node"; memory in GiB; ages as kubectl prints them. What could not be read (the
metrics, an Event list the user may not read) is said at the end, never silently left out.
"""

from __future__ import annotations

from collections.abc import Sequence

from quotient.explain import document, explaining, facts, tables, units
from scheduler.placement import status

Resource = status.Resource
_INDENT = "  "


def _ago(at_ns: int | None, now_ns: int) -> str:
    return "" if at_ns is None else f"{units.age((now_ns - at_ns) / 1e9)} ago"


def _lack(lack: status.Lack) -> str:
    if lack.resource is Resource.GPU:
        return f"{units.gpus(lack.free)} free, {units.gpus(lack.requested)} asked"
    if lack.resource is Resource.PODS:
        return f"{lack.free} pod slot(s) free, {lack.requested} needed"
    what = "memory" if lack.resource is Resource.MEMORY else lack.resource.value
    free, asked = units.amount(lack.resource, lack.free), units.amount(lack.resource, lack.requested)
    return f"{free} {what} free, {asked} asked" if lack.resource is not Resource.CPU else f"{free} free, {asked} asked"


def candidate_text(candidate: status.Candidate) -> str:
    where = candidate.node + (f" gpu {candidate.gpu}" if candidate.gpu is not None else "")
    parts = [_lack(lack) for lack in candidate.lacks] or ["fits on its own (the whole gang does not fit at once)"]
    if candidate.measured_free_bytes is not None:
        parts.append(f"measured free {units.gib(candidate.measured_free_bytes)}")
    if candidate.unattributed_bytes:
        parts.append(f"{units.gib(candidate.unattributed_bytes)} held by a process of no pod")
    if candidate.unhealthy_gpus:
        parts.append(f"gpu {','.join(map(str, candidate.unhealthy_gpus))} unhealthy")
    return f"{where}: " + "; ".join(parts)


def hint_text(hint: facts.Unblock, now_ns: int) -> str:
    if hint.remedy == status.Remedy.LARGER_NODE and hint.resource and hint.needed is not None:
        most = units.amount(hint.resource, hint.current or 0)
        return (
            f"{units.amount(hint.resource, hint.needed)} asked, at most {most} on any node it may use: {hint.message}"
        )
    if hint.remedy == status.Remedy.MORE_NODES and hint.resource and hint.needed is not None:
        offered = units.amount(hint.resource, hint.current or 0)
        return f"{units.amount(hint.resource, hint.needed)} asked, {offered} on all its nodes: {hint.message}"
    if hint.remedy == status.Remedy.PREEMPTION_DELAY and hint.at_ns is not None:
        left = (hint.at_ns - now_ns) / 1e9
        when = f"in {units.age(left)}" if left > 0 else "now"
        return f"{hint.message} (it ends {when}, at {_clock(hint.at_ns)})"
    if hint.pods:
        shown = ", ".join(f"{ns}/{name} on {node}" for ns, name, node in hint.pods[:6])
        more = f" and {len(hint.pods) - 6} more" if len(hint.pods) > 6 else ""
        return f"{hint.message}: {shown}{more}"
    return hint.message


def _clock(at_ns: int) -> str:
    return document.time_text(at_ns) or ""


def queue_text(numbers: explaining.QueueNumbers) -> str:
    resource = numbers.resource

    def show(value: int | None) -> str:
        return units.setting(resource, value) if value is not None else "?"

    parts = [
        f"deserved {show(numbers.deserved)}",
        f"fair share {show(numbers.fair_share)}",
        f"allocated {show(numbers.allocated)}",
        f"requested {show(numbers.requested)}",
        f"limit {show(numbers.limit)}",
    ]
    over = "; over its quota" if numbers.over_quota else ""
    return f"queue {numbers.name} ({resource.value}): " + ", ".join(parts) + over


def _pending(found: explaining.Explanation, pending: explaining.Pending, now_ns: int, style: tables.Style) -> list[str]:
    lines = []
    since = _ago(pending.since_ns, now_ns)
    code = f" ({pending.code})" if pending.code else ""
    if pending.reason:
        lines.append(
            f"{style.bold('Reason')}: {style.yellow(pending.reason)}{code}{', since ' + since if since else ''}"
        )
        lines.append(f"{_INDENT}{pending.message or ''}")
    else:
        lines.append(f"{style.bold('Reason')}: none recorded yet (the scheduler has not looked at it, or it is placed)")
    if pending.resource is not None and pending.requested is not None:
        asked = units.amount(pending.resource, pending.requested)
        lines.append(f"{style.bold('Blocked on')}: {pending.resource.value}, {asked} asked")
    for numbers in pending.queues:
        lines.append(f"{style.bold('Queue')}: {queue_text(numbers)}")
    if pending.candidates:
        lines.append(style.bold("Best nodes:"))
        lines += [f"{_INDENT}{candidate_text(candidate)}" for candidate in pending.candidates]
    if pending.unblock:
        lines.append(style.bold("What would unblock it:"))
        lines += [f"{_INDENT}- {hint_text(hint, now_ns)}" for hint in pending.unblock]
    if pending.reason and not pending.structured:
        lines.append(f"{_INDENT}(no structured status on the PodGroup: a scheduler older than this command wrote it)")
    return lines


def _running(running: explaining.Running, style: tables.Style) -> list[str]:
    if running.share_milli:
        what = f"a share of {units.gpus(running.share_milli)} on gpu {','.join(map(str, running.devices))}"
    elif running.devices:
        what = f"{units.gpus(running.whole_gpus * 1000)} (gpu {','.join(map(str, running.devices))})"
    else:
        what = "no GPU"
    lines = [f"{style.bold('Runs on')}: node {running.node}, {what}"]
    if running.gpu_groups:
        lines.append(f"{style.bold('GPU group')}: {', '.join(running.gpu_groups)}")
    if running.gpu_uuids:
        lines.append(f"{style.bold('Devices')}: {', '.join(running.gpu_uuids)}")
    for ref in running.reservations:
        lines.append(
            f"{style.bold('Reservation pod')}: {ref.namespace}/{ref.name} ({ref.phase or '?'}) on {ref.node or '?'}"
        )
    if running.measured:
        if not running.memory:
            lines.append(f"{style.bold('GPU memory')}: no series for this pod on the leader's /metrics")
        for row in running.memory:
            allotted = units.gib(row.allotted_bytes) if row.allotted_bytes is not None else "?"
            used = units.gib(row.used_bytes) if row.used_bytes is not None else "?"
            over = row.allotted_bytes is not None and row.used_bytes is not None and row.used_bytes > row.allotted_bytes
            text = f"{used} used of {allotted} allotted"
            lines.append(f"{style.bold('GPU memory')} ({row.node} gpu {row.gpu}): {style.red(text) if over else text}")
    alerts = running.alerts
    if alerts:
        for alert in alerts:
            where = f" ({alert.node} gpu {alert.gpu})" if alert.node else ""
            severity = f" [{alert.severity}]" if alert.severity else ""
            said = f": {alert.message}" if alert.message else ""
            lines.append(f"{style.bold('Alert')}: {style.red(alert.name)}{severity}{where}{said}")
    else:
        lines.append(f"{style.bold('Alerts')}: none firing" + ("" if running.measured else " (by its Events)"))
    return lines


def _evicted(evicted: explaining.Evicted, now_ns: int, style: tables.Style) -> list[str]:
    when = _ago(evicted.at_ns, now_ns)
    lines = [f"{style.bold('Evicted')}{' ' + when if when else ''}: {evicted.message}"]
    if evicted.disruption:
        lines.append(f"{_INDENT}DisruptionTarget: {evicted.disruption[0]}: {evicted.disruption[1]}")
    if evicted.for_group:
        lines.append(
            f"{style.bold('Made room for')}: podgroup {evicted.for_group} (queue {evicted.for_queue}, priority "
            f"{evicted.for_priority}), by {evicted.action}"
        )
        placed = [ref for ref in evicted.replacements if ref.node]
        for ref in evicted.replacements:
            where = f"runs on {ref.node}" if ref.node else "not placed yet"
            lines.append(f"{_INDENT}{ref.namespace}/{ref.name}: {where} ({ref.phase or '?'})")
        if not evicted.replacements:
            lines.append(f"{_INDENT}(its pods are gone, or cannot be read)")
        elif not placed and evicted.for_reason:
            lines.append(f"{_INDENT}it still waits: {evicted.for_reason}")
    return lines


def explanation(found: explaining.Explanation, *, now_ns: int, style: tables.Style) -> str:
    pod = f"{found.pod.namespace}/{found.pod.name}"
    state = {
        explaining.State.PENDING: style.yellow("Pending"),
        explaining.State.RUNNING: style.green("Running"),
        explaining.State.EVICTED: style.red("Evicted"),
        explaining.State.FINISHED: "Finished",
    }[found.state]
    lines = [f"{style.bold('Pod')} {pod}: {state}"]
    if not found.ours:
        lines.append(f"{_INDENT}not Quotient's: it names scheduler {found.scheduler_name!r}")
    if found.group:
        size = f", minMember {found.min_member}" if found.min_member is not None else ""
        members = f", {len(found.members)} pod(s)" if found.members else ""
        lines.append(f"{style.bold('Gang')}: podgroup {found.group}{size}{members}; queue {found.queue or '?'}")
    if found.pending is not None:
        lines += _pending(found, found.pending, now_ns, style)
    if found.running is not None:
        lines += _running(found.running, style)
    if found.evicted is not None:
        lines += _evicted(found.evicted, now_ns, style)
    elif found.state is explaining.State.EVICTED:
        lines.append(f"{_INDENT}the pod is gone; no eviction of it is recorded in its Events")
    if found.metrics_source:
        lines.append(style.dim(f"Measured memory from {found.metrics_source}"))
    lines += unread_lines(found.unread, style)
    return "\n".join(lines)


def unread_lines(unread: Sequence[str], style: tables.Style) -> list[str]:
    if not unread:
        return []
    return [style.bold("Could not read:")] + [f"{_INDENT}- {item}" for item in unread]

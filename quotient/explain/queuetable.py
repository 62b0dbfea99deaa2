"""``kubectl quotient queues``: the queue tree as a table, from the Queues' spec and status.

Per queue, in one resource (``--resource``, GPU by default): deserved, fair share, allocated, requested, limit, the
subtree's pending groups and how long the oldest has waited, and whether it is over quota. The tree is shown by
indenting children under their parent (children by priority, then name), as the fair share divides it. The JSON
items carry all three resources. Pure: Queue objects in, rows out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from quotient.explain import document, explaining, facts, tables, units
from scheduler.placement import status

Resource = status.Resource
QUEUE_RESOURCES = (Resource.GPU, Resource.CPU, Resource.MEMORY)
HEADER = ("QUEUE", "DESERVED", "FAIR SHARE", "ALLOCATED", "REQUESTED", "LIMIT", "PENDING", "OLDEST", "OVER QUOTA")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    queue: facts.QueueFacts
    depth: int


def tree(queues: Sequence[facts.QueueFacts]) -> list[Row]:
    """Depth-first, roots first; a queue whose parent is missing (or on a loop of parents) is a root."""
    by_name = {queue.name: queue for queue in queues}
    children: dict[str, list[facts.QueueFacts]] = {}
    roots = []
    for queue in queues:
        if queue.parent and queue.parent in by_name and queue.parent != queue.name:
            children.setdefault(queue.parent, []).append(queue)
        else:
            roots.append(queue)
    out: list[Row] = []
    seen: set[str] = set()

    def order(items: list[facts.QueueFacts]) -> list[facts.QueueFacts]:
        return sorted(items, key=lambda queue: (-queue.priority, queue.name))

    def walk(queue: facts.QueueFacts, depth: int) -> None:
        if queue.name in seen:
            return
        seen.add(queue.name)
        out.append(Row(queue=queue, depth=depth))
        for child in order(children.get(queue.name, [])):
            walk(child, depth + 1)

    for root in order(roots):
        walk(root, 0)
    for queue in order([queue for queue in queues if queue.name not in seen]):  # parents on a loop
        walk(queue, 0)
    return out


def _oldest(queue: facts.QueueFacts, now_ns: int) -> str:
    if not queue.pending_groups or queue.oldest_pending_ns is None:
        return "-"
    return units.age((now_ns - queue.oldest_pending_ns) / 1e9)


def cells(rows: Sequence[Row], resource: Resource, *, now_ns: int) -> list[list[tables.Cell]]:
    out = []
    for row in rows:
        numbers = explaining.queue_numbers(row.queue, resource)
        over_fair = (
            numbers.allocated is not None and numbers.fair_share is not None and numbers.allocated > numbers.fair_share
        )
        pending = row.queue.pending_groups
        out.append(
            [
                tables.Cell(text="  " * row.depth + row.queue.name),
                tables.Cell(text=units.cell(resource, numbers.deserved), right=True),
                tables.Cell(text=units.cell(resource, numbers.fair_share), right=True),
                tables.Cell(
                    text=units.cell(resource, numbers.allocated), right=True, paint=("yellow",) if over_fair else ()
                ),
                tables.Cell(text=units.cell(resource, numbers.requested), right=True),
                tables.Cell(text=units.cell(resource, numbers.limit), right=True),
                tables.Cell(text="-" if pending is None else str(pending), right=True),
                tables.Cell(text=_oldest(row.queue, now_ns), right=True),
                tables.Cell(
                    text="yes" if numbers.over_quota else "no", paint=("yellow",) if numbers.over_quota else ()
                ),
            ]
        )
    return out


def items(rows: Sequence[Row]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        per: Mapping[str, Any] = {
            resource.value: {
                key: value
                for key, value in document.queue_numbers(explaining.queue_numbers(row.queue, resource)).items()
                if key in ("deserved", "fairShare", "allocated", "requested", "quota", "limit")
            }
            for resource in QUEUE_RESOURCES
        }
        out.append(
            {
                "name": row.queue.name,
                "parent": row.queue.parent,
                "depth": row.depth,
                "priority": row.queue.priority,
                "resources": per,
                "pendingGroups": row.queue.pending_groups,
                "oldestPendingSince": document.time_text(row.queue.oldest_pending_ns),
                "overQuota": row.queue.over_quota,
                "conditions": [
                    {"type": kind, "reason": reason, "message": message}
                    for kind, reason, message in row.queue.conditions
                ],
            }
        )
    return out


def unit_note(resource: Resource) -> str:
    return {
        Resource.GPU: "in GPUs",
        Resource.CPU: "in CPU cores",
        Resource.MEMORY: "memory in GiB",
    }.get(resource, "")

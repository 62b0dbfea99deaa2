"""Why each group a cycle leaves pending waits: one ``Status`` per group, from the state the plan leaves behind.

A status depends only on that end state and the group, never on how far an attempt got, so the message describes
what a person can change now: the queue at or over its fair share (``OverQuota``), a gang that does not fit at once
(``GangDoesNotFit``), or the best candidate node and what was missing there (``diagnosis``). Where reclaim looked and
did not act, its reason (in numbers) is added.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.resources import Resources
from scheduler.placement import diagnosis, fairshare, gangs, model, search, shapes, status


class Explainer:
    """Explains pods that found no room, once per distinct shape (lives for one cycle's statuses)."""

    def __init__(self, searcher: search.Searcher) -> None:
        self._searcher = searcher
        self._explained: dict[shapes.Shape, tuple[status.Reason, str]] = {}
        self._summaries: dict[shapes.Shape, tuple[str, bool]] = {}
        self._candidates: dict[shapes.Shape, tuple[status.Candidate, ...]] = {}
        self.alone: dict[tuple[object, ...], tuple[status.Reason, str, str, status.Detail] | None] = {}
        """``failure_status`` of a one-pod minimum, but for the pod's name (``_around``), per shape, queue, amounts and
        refusal (the rest it reads is the queue's): a backlog holds thousands of groups alike but for their names."""

    def candidates(self, shape: shapes.Shape) -> tuple[status.Candidate, ...]:
        """The best few nodes for a pod of this shape, with what each lacked (``diagnosis.candidates``)."""
        found = self._candidates.get(shape)
        if found is None:
            found = self._candidates[shape] = diagnosis.candidates(self._searcher, shape)
        return found

    def explain(self, shape: shapes.Shape) -> tuple[status.Reason, str]:
        found = self._explained.get(shape)
        if found is None:
            found = self._explained[shape] = diagnosis.explain(self._searcher, shape)
        return found

    def summary(self, shape: shapes.Shape) -> tuple[str, bool]:
        """What is free for a pod of this shape in all, and whether one such pod alone would fit (end of cycle)."""
        found = self._summaries.get(shape)
        if found is None:
            found = (diagnosis.free_summary(self._searcher, shape), self._searcher.find(shape) is not None)
            self._summaries[shape] = found
        return found


def failure_status(
    explainer: Explainer,
    *,
    group: model.Group,
    minimum: Sequence[model.Pod],
    pod_shapes: Sequence[shapes.Shape],
    amounts: Resources,
    held: Resources,
    fair: Resources,
    everyone: Resources,
    refusal: str | None,
) -> status.Status:
    """The status of a group whose minimum did not fit (``pod_shapes`` in the minimum's order); ``held`` and
    ``fair`` are its queue's, ``everyone`` what all queues hold, ``refusal`` why reclaim did not act. One explainer
    serves one cycle's end state: the same ``held`` and ``fair`` for every group of a queue, the same ``everyone``."""

    def explain() -> status.Status:
        return _failure_status(
            explainer,
            group=group,
            minimum=minimum,
            pod_shapes=pod_shapes,
            amounts=amounts,
            held=held,
            fair=fair,
            everyone=everyone,
            refusal=refusal,
        )

    if len(minimum) != 1:
        return explain()
    # ``held``, ``fair`` and ``everyone`` are the queue's and the cycle's (fixed once statuses are written).
    key = (pod_shapes[0], group.queue, amounts, refusal)
    pod_text = diagnosis.describe_pod(minimum[0]) + diagnosis.gpu_model_hint(pod_shapes[0])
    try:
        kept = explainer.alone[key]  # a backlog's groups alike but for their names: nearly always there
    except KeyError:
        found = explain()
        explainer.alone[key] = _around(found, pod_text)
        return found
    if kept is None:
        return explain()
    reason, head, tail, detail = kept
    return status.unschedulable(reason, head + pod_text + tail, detail)


def _around(found: status.Status, pod_text: str) -> tuple[status.Reason, str, str, status.Detail] | None:
    """A one-pod status split around the pod's description, for the pods alike but for their names; None where the
    message holds the description more than once (a refusal that names the pod: not shared)."""
    if found.message.count(pod_text) != 1:
        return None
    head, _, tail = found.message.partition(pod_text)
    return found.reason, head, tail, found.detail


def _failure_status(
    explainer: Explainer,
    *,
    group: model.Group,
    minimum: Sequence[model.Pod],
    pod_shapes: Sequence[shapes.Shape],
    amounts: Resources,
    held: Resources,
    fair: Resources,
    everyone: Resources,
    refusal: str | None,
) -> status.Status:
    position = next(
        (index for index, shape in enumerate(pod_shapes) if not explainer.summary(shape)[1]),
        0,
    )
    blocker, shape = minimum[position], pod_shapes[position]
    reason, text = explainer.explain(shape)
    pod_text = diagnosis.describe_pod(blocker) + diagnosis.gpu_model_hint(shape)
    # Over quota only means something when others hold part of the cluster: alone, the queue is just short.
    over = [
        kind
        for kind in fairshare.KINDS
        if fairshare.amount(amounts, kind) > 0
        and fairshare.amount(held, kind) >= fairshare.amount(fair, kind)
        and fairshare.amount(everyone, kind) > fairshare.amount(held, kind)
        and reason is not status.Reason.NO_NODE_FITS
    ]
    if over:
        kind = over[0]
        spare = status.Hint(
            remedy=status.Remedy.SPARE_ROOM,
            message=f"queue {group.queue} is at or over its fair share of {kind.value}: it is placed when room is free "
            "that no queue below its fair share wants, or when its fair share grows (a higher quota or weight)",
            queue=str(group.queue),
            resource=status.resource_of(kind),
            current=fairshare.amount(held, kind),
            needed=fairshare.amount(fair, kind),
        )
        return status.unschedulable(
            status.Reason.OVER_QUOTA,
            f"queue {group.queue} holds {status.amount_text(kind, fairshare.amount(held, kind))} of "
            f"{kind.value}, at or over its fair share of "
            f"{status.amount_text(kind, fairshare.amount(fair, kind))}: it runs on spare room only, and there "
            f"is none for {pod_text}: {text}",
            _detail(
                explainer.candidates(shape),
                refusal,
                resource=status.resource_of(kind),
                requested=fairshare.amount(amounts, kind),
                first=spare,
            ),
        )
    why = f"; not reclaimed: {refusal}" if refusal else ""
    if len(minimum) > 1:
        summary, alone = explainer.summary(shape)
        detail = summary if alone else f"{summary}; {pod_text}: {text}"
        gpu = amounts.milli_gpu
        needs = f", {status.amount_text(fairshare.Kind.GPU, gpu)} in all" if gpu > 0 else ""
        found = explainer.candidates(shape)
        return status.unschedulable(
            status.Reason.GANG_DOES_NOT_FIT,
            f"gang of {len(minimum)} pods must start together ({gangs.requirement(group)}{needs}), "
            f"and they do not all fit at once: {detail}{why}",
            _detail(found, refusal, resource=status.Resource.GPU if gpu > 0 else None, requested=gpu or None),
        )
    return status.unschedulable(reason, f"{pod_text}: {text}{why}", _detail(explainer.candidates(shape), refusal))


def elastic_status(
    explainer: Explainer, step: Sequence[model.Pod], pod_shapes: Sequence[shapes.Shape], refusal: str | None
) -> status.Status:
    """The status of a group whose elastic step beyond the minimum (a pod, or a subgroup's own minimum, with
    ``pod_shapes`` in its order) found no room."""
    position = next((index for index, shape in enumerate(pod_shapes) if not explainer.summary(shape)[1]), 0)
    reason, text = explainer.explain(pod_shapes[position])
    why = f"; not reclaimed: {refusal}" if refusal else ""
    pod = step[position]
    detail = _detail(explainer.candidates(pod_shapes[position]), refusal)
    if len(step) == 1:
        return status.unschedulable(reason, f"elastic pod {pod.name} beyond the minimum waits: {text}{why}", detail)
    leaves = sorted({str(member.subgroup) for member in step})
    return status.unschedulable(
        reason,
        f"{len(step)} pods beyond the minimum (subgroups {', '.join(leaves)}) wait: they must start together, "
        f"to their subgroups' own minimums; {pod.name}: {text}{why}",
        detail,
    )


def _detail(
    found: tuple[status.Candidate, ...],
    refusal: str | None,
    *,
    resource: status.Resource | None = None,
    requested: int | None = None,
    first: status.Hint | None = None,
) -> status.Detail:
    """The structured side of a pending status: the blocking resource (else the best node's first lack), the best
    nodes, and what would unblock it (reclaim's refusal, else room on the nodes)."""
    lacks = found[0].lacks if found else ()
    if resource is None and lacks:
        resource, requested = lacks[0].resource, lacks[0].requested
    hints = [first] if first is not None else []
    if refusal:
        hints.append(status.Hint(remedy=status.Remedy.NOT_RECLAIMED, message=f"not reclaimed: {refusal}"))
    elif first is None and found:
        hints.append(
            status.Hint(
                remedy=status.Remedy.FREE_ROOM,
                message="it is placed when running pods finish or more nodes join",
                resource=resource,
            )
        )
    return status.Detail(resource=resource, requested=requested, candidates=found, hints=tuple(hints))

"""The predicates on a node that do not depend on what is free: readiness, selector, affinity, taints, GPU model.

These depend only on a node's labels, taints, readiness and device models (its *class*) and on a pod's constraints
(its *constraint signature*), and both repeat a great deal: a cluster has a handful of node classes and a workload a
handful of constraint sets. So a verdict is computed once per (class, signature) and cached by the engine; this
module only states the rules. Each rule returns None when the node passes, or a short phrase naming what failed,
which the status messages reuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from scheduler.placement import model


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeClass:
    """What the static predicates read from a node; equal classes get equal verdicts."""

    labels: tuple[tuple[str, str], ...]
    taints: tuple[model.Taint, ...]
    gpu_models: tuple[str, ...]
    schedulable: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """What the static predicates read from a pod; equal signatures get equal verdicts."""

    node_selector: tuple[tuple[str, str], ...]
    affinity: tuple[model.AffinityTerm, ...]
    tolerations: tuple[model.Toleration, ...]
    gpu_models: tuple[str, ...]
    wants_gpu: bool


def node_class(node: model.Node, keys: frozenset[str]) -> NodeClass:
    """The node's class, reading only the label ``keys`` that some pod's selector or affinity mentions.

    Labels nobody asks about (``kubernetes.io/hostname`` above all) would make every node a class of its own.
    """
    return NodeClass(
        labels=tuple(sorted((key, value) for key, value in node.labels.items() if key in keys)),
        taints=tuple(sorted(node.taints, key=lambda taint: (taint.key, taint.value, taint.effect.value))),
        gpu_models=tuple(sorted({device.model for device in node.devices})),
        schedulable=node.ready and not node.unschedulable,
    )


def constraints(pod: model.Pod) -> Constraints:
    return Constraints(
        node_selector=pod.node_selector,
        affinity=pod.affinity,
        tolerations=pod.tolerations,
        gpu_models=pod.gpu_models,
        wants_gpu=pod.requests.milli_gpu > 0 or pod.share is not None,
    )


def label_keys(pod: model.Pod) -> frozenset[str]:
    """The node label keys a pod's selector and required affinity read."""
    keys = {key for key, _ in pod.node_selector}
    keys.update(requirement.key for term in pod.affinity for requirement in term.expressions)
    return frozenset(keys)


def check(node: NodeClass, pod: Constraints) -> str | None:
    """None when a pod with these constraints may go on a node of this class, else why not."""
    if not node.schedulable:
        return "node not ready or cordoned"
    labels = dict(node.labels)
    for key, value in pod.node_selector:
        if labels.get(key) != value:
            return f"node selector {key}={value} does not match"
    if pod.affinity and not any(_term_matches(term, labels) for term in pod.affinity):
        return "required node affinity does not match"
    taint = untolerated(node.taints, pod.tolerations)
    if taint is not None:
        return f"taint {taint.key}={taint.value}:{taint.effect.value} not tolerated"
    if pod.wants_gpu and not node.gpu_models:
        return "no GPUs"
    if pod.gpu_models and not set(pod.gpu_models) & set(node.gpu_models):
        return f"GPU model {', '.join(node.gpu_models) or 'none'} not in {', '.join(pod.gpu_models)}"
    return None


def _term_matches(term: model.AffinityTerm, labels: Mapping[str, str]) -> bool:
    return all(requirement_matches(requirement, labels) for requirement in term.expressions)


def requirement_matches(requirement: model.Requirement, labels: Mapping[str, str]) -> bool:
    """One expression of required node affinity, as Kubernetes evaluates it."""
    value = labels.get(requirement.key)
    operator = requirement.operator
    if operator is model.Operator.IN:
        return value is not None and value in requirement.values
    if operator is model.Operator.NOT_IN:
        return value is None or value not in requirement.values
    if operator is model.Operator.EXISTS:
        return value is not None
    if operator is model.Operator.DOES_NOT_EXIST:
        return value is None
    # Gt / Lt: one integer value; a missing or non-integer label does not match.
    if value is None or len(requirement.values) != 1:
        return False
    try:
        left, right = int(value), int(requirement.values[0])
    except ValueError:
        return False
    return left > right if operator is model.Operator.GT else left < right


def untolerated(taints: tuple[model.Taint, ...], tolerations: tuple[model.Toleration, ...]) -> model.Taint | None:
    """The first taint that forbids scheduling (NoSchedule or NoExecute) and no toleration matches, or None."""
    for taint in taints:
        if taint.effect is model.TaintEffect.PREFER_NO_SCHEDULE:
            continue
        if not any(tolerates(toleration, taint) for toleration in tolerations):
            return taint
    return None


def tolerates(toleration: model.Toleration, taint: model.Taint) -> bool:
    if toleration.effect is not None and toleration.effect is not taint.effect:
        return False
    if toleration.operator is model.TolerationOperator.EXISTS:
        return toleration.key in ("", taint.key)
    return toleration.key == taint.key and toleration.value == taint.value

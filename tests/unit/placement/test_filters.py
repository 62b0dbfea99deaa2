"""Static predicates: required node affinity operators, taints and tolerations, GPU models from affinity."""

from __future__ import annotations

import pytest

from scheduler.placement import filters, model
from tests.unit.placement import builders

IN, NOT_IN, EXISTS, DNE, GT, LT = (
    model.Operator.IN,
    model.Operator.NOT_IN,
    model.Operator.EXISTS,
    model.Operator.DOES_NOT_EXIST,
    model.Operator.GT,
    model.Operator.LT,
)


@pytest.mark.parametrize(
    ("operator", "values", "labels", "matches"),
    [
        (IN, ("a", "b"), {"k": "a"}, True),
        (IN, ("a",), {}, False),
        (NOT_IN, ("a",), {"k": "b"}, True),
        (NOT_IN, ("a",), {}, True),
        (NOT_IN, ("a",), {"k": "a"}, False),
        (EXISTS, (), {"k": ""}, True),
        (DNE, (), {"k": "x"}, False),
        (DNE, (), {}, True),
        (GT, ("5",), {"k": "7"}, True),
        (GT, ("5",), {"k": "5"}, False),
        (GT, ("5",), {"k": "seven"}, False),
        (LT, ("5",), {"k": "3"}, True),
        (LT, ("5",), {}, False),
    ],
)
def test_each_affinity_operator_matches_as_kubernetes_does(
    operator: model.Operator, values: tuple[str, ...], labels: dict[str, str], matches: bool
) -> None:
    requirement = model.Requirement(key="k", operator=operator, values=values)
    assert filters.requirement_matches(requirement, labels) is matches


def _constraints(**kwargs: object) -> filters.Constraints:
    pod = model.Pod(uid=model.PodUid("p"), name="p", **kwargs)  # type: ignore[arg-type]
    return filters.constraints(pod)


def test_terms_are_ored_and_expressions_anded() -> None:
    zone_a = model.Requirement(key="zone", operator=IN, values=("a",))
    fast = model.Requirement(key="disk", operator=IN, values=("ssd",))
    zone_b = model.Requirement(key="zone", operator=IN, values=("b",))
    pod = _constraints(
        affinity=(model.AffinityTerm(expressions=(zone_a, fast)), model.AffinityTerm(expressions=(zone_b,)))
    )
    keys = frozenset({"zone", "disk"})

    def verdict(labels: dict[str, str]) -> str | None:
        return filters.check(filters.node_class(builders.node("n", labels=labels), keys), pod)

    assert verdict({"zone": "a", "disk": "ssd"}) is None
    assert verdict({"zone": "a", "disk": "hdd"}) is not None
    assert verdict({"zone": "b"}) is None


def test_a_toleration_with_exists_and_no_key_tolerates_every_taint() -> None:
    taints = (model.Taint(key="a", value="1"), model.Taint(key="b", effect=model.TaintEffect.NO_EXECUTE))
    everything = (model.Toleration(operator=model.TolerationOperator.EXISTS),)
    assert filters.untolerated(taints, everything) is None


def test_a_toleration_for_another_effect_does_not_tolerate() -> None:
    taint = model.Taint(key="gpu", value="yes", effect=model.TaintEffect.NO_EXECUTE)
    only_no_schedule = (model.Toleration(key="gpu", value="yes", effect=model.TaintEffect.NO_SCHEDULE),)
    assert filters.untolerated((taint,), only_no_schedule) == taint


def test_labels_nobody_selects_on_do_not_split_node_classes() -> None:
    first = filters.node_class(builders.node("a", labels={"kubernetes.io/hostname": "a"}), frozenset())
    second = filters.node_class(builders.node("b", labels={"kubernetes.io/hostname": "b"}), frozenset())
    assert first == second
    assert first != filters.node_class(
        builders.node("b", labels={"kubernetes.io/hostname": "b"}), frozenset({"kubernetes.io/hostname"})
    )


def test_a_gpu_pod_does_not_pass_on_a_node_without_gpus() -> None:
    verdict = filters.check(
        filters.node_class(builders.node("cpu"), frozenset()), _constraints(share=model.GpuShare(milli_gpu=500))
    )
    assert verdict == "no GPUs"

"""A PodGroup's JSON to its record, with KAI v0.15-v0.18's fields: minimums at every level of the subgroup tree,
the preemption delay and its re-arming, the staleness grace; every unreadable value a problem with its field."""

from __future__ import annotations

from typing import Any

import pytest

from common import names
from scheduler.objects import podgrouprules, podgroups
from scheduler.objects.records import PodGroupRecord, SubGroupSpec

NS = 1_000_000_000


def _object(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "pg", "namespace": "ml", "uid": "u1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": metadata, "spec": spec}


def decoded(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> PodGroupRecord:
    record = podgroups.decode(_object(spec, annotations))
    assert record is not None
    return record


def fields_at_fault(record: PodGroupRecord) -> list[str]:
    return [problem.field for problem in record.problems]


def test_a_v013_podgroup_reads_as_before_with_no_problems() -> None:
    record = decoded({"minMember": 4, "queue": "team-a", "subGroups": [{"name": "workers", "minMember": 3}]})

    assert (record.min_member, record.min_member_declared, record.queue) == (4, 4, "team-a")
    assert record.subgroup_tree == (SubGroupSpec(name="workers", min_member=3),)
    assert record.preemption_delay_ns == 0 and record.staleness_grace_ns is None and record.last_eviction_ns == 0
    assert record.problems == ()


def test_min_member_zero_is_kais_no_gang_requirement_and_reads_as_one_for_the_engine_today() -> None:
    record = decoded({"minMember": 0})

    assert record.min_member_declared == 0 and record.min_member == 1 and record.problems == ()


def test_an_unset_min_member_reads_as_one_and_is_declared_none() -> None:
    record = decoded({"queue": "q"})

    assert record.min_member == 1 and record.min_member_declared is None


@pytest.mark.parametrize("value", [-1, "3", 2.5, True])
def test_a_min_member_that_is_not_a_whole_number_from_zero_is_a_problem_and_reads_as_one(value: object) -> None:
    record = decoded({"minMember": value})

    assert record.min_member == 1 and record.min_member_declared is None
    assert fields_at_fault(record) == ["spec.minMember"]


def test_a_subgroup_tree_is_read_whole_and_only_its_leaves_reach_the_engine() -> None:
    record = decoded(
        {
            "minSubGroup": 1,
            "subGroups": [
                {"name": "replica-0"},
                {"name": "replica-0-leader", "parent": "replica-0", "minMember": 1},
                {"name": "replica-0-workers", "parent": "replica-0", "minMember": 2},
                {"name": "replica-1", "minSubGroup": 2},
                {"name": "replica-1-leader", "parent": "replica-1", "minMember": 1},
                {"name": "replica-1-workers", "parent": "replica-1", "minMember": 2},
                {"name": "tools", "minMember": 0},
            ],
        }
    )

    assert record.problems == ()
    assert record.min_subgroup == 1 and record.min_member_declared is None
    assert record.subgroup_tree[3] == SubGroupSpec(name="replica-1", min_subgroup=2)
    assert record.subgroup_tree[1] == SubGroupSpec(name="replica-0-leader", parent="replica-0", min_member=1)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"minMember": 2, "minSubGroup": 1, "subGroups": [{"name": "a", "minMember": 1}]}, "spec.minSubGroup",
         "mutually exclusive"),
        ({"subGroups": [{"name": "a", "minMember": 1, "parent": "nowhere"}]}, "spec.subGroups[0].parent",
         "'nowhere' of 'a' is not a subgroup"),
        ({"subGroups": [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}]}, "spec.subGroups[0].parent",
         "lead back to it: a cycle"),
        ({"subGroups": [{"name": "a", "minMember": 1}, {"name": "a", "minMember": 2}]}, "spec.subGroups[1].name",
         "duplicate subgroup name 'a'"),
        ({"subGroups": [{"name": "a", "minSubGroup": 1}]}, "spec.subGroups[0].minSubGroup", "a leaf takes minMember"),
        ({"subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "parent": "a"}]}, "spec.subGroups[1].minMember",
         "'b': minMember is required on a leaf"),
        ({"subGroups": [{"name": "a", "minMember": 1, "minSubGroup": 1}]}, "spec.subGroups[0].minSubGroup",
         "mutually exclusive"),
        ({"subGroups": [{"minMember": 1}]}, "spec.subGroups[0].name", "needs a name"),
        ({"subGroups": [{"name": "a", "minMember": -2}]}, "spec.subGroups[0].minMember", "-2 is not a whole number"),
        ({"subGroups": "workers"}, "spec.subGroups", "is not a list"),
    ],
)  # fmt: skip
def test_a_subgroup_tree_that_kai_refuses_is_a_problem_naming_the_field(
    spec: dict[str, Any], field: str, words: str
) -> None:
    record = decoded(spec)

    [problem] = [problem for problem in record.problems if problem.field == field]
    assert words in problem.message


@pytest.mark.parametrize(
    ("spec", "field", "words", "severity"),
    [
        ({"minSubGroup": 3, "subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "minMember": 1}]},
         "spec.minSubGroup", "exceeds the number of direct child SubGroups (2)", podgrouprules.Severity.WARNING),
        ({"subGroups": [{"name": "a", "minSubGroup": 2}, {"name": "b", "parent": "a", "minMember": 1}]},
         "spec.subGroups[0].minSubGroup", "exceeds the number of direct child SubGroups (1)",
         podgrouprules.Severity.WARNING),
        ({"subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "parent": "a", "minMember": 1}]},
         "spec.subGroups[0].minMember", "has child SubGroups: b); use minSubGroup",
         podgrouprules.Severity.REFUSED_ON_CREATE),
    ],
)  # fmt: skip
def test_what_kai_only_warns_of_or_refuses_only_on_creation_is_no_problem_and_the_tree_reads_as_written(
    spec: dict[str, Any], field: str, words: str, severity: podgrouprules.Severity
) -> None:
    record = decoded(spec)
    [finding] = podgroups.findings(_object(spec))

    assert record.problems == ()
    assert len(record.subgroup_tree) == len(spec["subGroups"])
    assert (finding.field, finding.severity) == (field, severity) and words in finding.message


def test_a_leaf_without_min_member_is_named_once_per_leaf_and_a_tree_with_a_cycle_is_not_checked_further() -> None:
    leaves = decoded({"subGroups": [{"name": "b"}, {"name": "a"}, {"name": "c", "minMember": 0}]})
    cycle = podgroups.findings(
        _object({"subGroups": [{"name": "a", "parent": "b", "minMember": 1}, {"name": "b", "parent": "a"}]})
    )

    assert [problem.field for problem in leaves.problems] == [
        "spec.subGroups[1].minMember",
        "spec.subGroups[0].minMember",
    ]
    assert {finding.severity for finding in cycle} == {podgrouprules.Severity.REFUSED}
    assert all("cycle" in finding.message for finding in cycle), "no minimum is judged in a tree that loops"


def test_a_broken_entry_leaves_the_rest_of_the_tree_readable() -> None:
    record = decoded({"subGroups": [{"name": "a", "minMember": 1}, {"minMember": 2}, {"name": "b", "minMember": 2}]})

    assert [sub.name for sub in record.subgroup_tree] == ["a", "b"]


def test_the_preemption_delay_comes_from_the_spec_before_the_annotation() -> None:
    both = decoded({"preemptionDelay": "5m"}, {names.PREEMPTION_DELAY_ANNOTATION: "1h"})
    annotation_only = decoded({}, {names.PREEMPTION_DELAY_ANNOTATION: "90s"})

    assert both.preemption_delay_ns == 300 * NS and both.problems == ()
    assert annotation_only.preemption_delay_ns == 90 * NS


@pytest.mark.parametrize(
    ("value", "words"),
    [("5", "Go duration"), ("five minutes", "Go duration"), (300, "Go duration")],
)
def test_a_preemption_delay_that_cannot_be_read_is_a_problem_and_no_delay(value: object, words: str) -> None:
    record = decoded({"preemptionDelay": value})

    assert record.preemption_delay_ns == 0
    [problem] = record.problems
    assert problem.field == "spec.preemptionDelay" and words in problem.message


def test_a_negative_preemption_delay_is_no_delay_as_kais_scheduler_reads_it_with_a_warning_and_no_problem() -> None:
    spec = {"preemptionDelay": "-1m"}
    record = decoded(spec, {names.PREEMPTION_DELAY_ANNOTATION: "1h"})
    [finding] = podgroups.findings(_object(spec))

    assert record.preemption_delay_ns == 0 and record.problems == (), "the spec's value wins, and it means none"
    assert finding.severity is podgrouprules.Severity.WARNING and "negative: no delay" in finding.message


def test_an_unreadable_spec_delay_falls_back_to_a_readable_annotation() -> None:
    record = decoded({"preemptionDelay": "soon"}, {names.PREEMPTION_DELAY_ANNOTATION: "2m"})

    assert record.preemption_delay_ns == 120 * NS and fields_at_fault(record) == ["spec.preemptionDelay"]


def test_the_last_eviction_timestamp_rearms_the_delay_and_a_bad_one_is_a_problem() -> None:
    good = decoded({"preemptionDelay": "2m"}, {names.LAST_EVICTION_ANNOTATION: "2026-07-12T10:33:43Z"})
    bad = decoded({}, {names.LAST_EVICTION_ANNOTATION: "yesterday"})

    assert good.last_eviction_ns == 1_783_852_423 * NS
    assert bad.last_eviction_ns == 0
    assert fields_at_fault(bad) == [f"metadata.annotations[{names.LAST_EVICTION_ANNOTATION}]"]


@pytest.mark.parametrize(
    ("spec", "annotations", "grace_ns"),
    [
        ({"stalenessGracePeriod": "30s"}, None, 30 * NS),
        ({"stalenessGracePeriod": "-1s"}, None, -NS),
        ({}, {names.STALENESS_GRACE_ANNOTATION: "1m30s"}, 90 * NS),
        ({"stalenessGracePeriod": "0"}, {names.STALENESS_GRACE_ANNOTATION: "5s"}, 0),
        ({}, None, None),
    ],
)
def test_the_staleness_grace_is_the_specs_else_the_annotations_and_negative_means_never(
    spec: dict[str, Any], annotations: dict[str, str] | None, grace_ns: int | None
) -> None:
    record = decoded(spec, annotations)

    assert record.staleness_grace_ns == grace_ns and record.problems == ()


def test_an_unknown_preemptibility_is_a_problem_and_the_priority_decides() -> None:
    record = decoded({"preemptibility": "sometimes"})

    assert record.preemptibility is None and fields_at_fault(record) == ["spec.preemptibility"]

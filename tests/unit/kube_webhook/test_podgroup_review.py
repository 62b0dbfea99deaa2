"""KAI's PodGroup webhook: the review of PodGroup creations and updates (KAI's refusals with their reasons, its
warnings, a mid-level ``minMember`` refused only on creation), and the server's third path that serves it. The cases
follow KAI's ``podgroup_webhook_test.go``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.kube import admission, podgroupadmission, webhook
from tests.unit.kube_webhook.test_server import call, make

Obj = dict[str, Any]
PODGROUPS = {"group": "scheduling.run.ai", "version": "v2alpha2", "resource": "podgroups"}


def podgroup(**spec: Any) -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {"queue": "team-a", **spec},
    }


def request(obj: Obj, *, operation: str = "CREATE", old: Obj | None = None, resource: Obj = PODGROUPS) -> Obj:
    body: Obj = {"uid": "u-1", "resource": resource, "namespace": "ml", "operation": operation, "object": obj}
    if old is not None:
        body["oldObject"] = old
    return body


def admit(obj: Obj, *, operation: str = "CREATE", old: Obj | None = None) -> admission.Verdict:
    return podgroupadmission.admit(request(obj, operation=operation, old=old))


TREE = [
    {"name": "decode", "minSubGroup": 1},
    {"name": "decode-leader", "parent": "decode", "minMember": 1},
    {"name": "decode-workers", "parent": "decode", "minMember": 2},
    {"name": "prefill", "minMember": 1},
]


def test_a_podgroup_that_keeps_kais_rules_is_admitted_without_a_word() -> None:
    assert admit(podgroup(minMember=4)) == admission.Verdict(allowed=True)
    assert admit(podgroup(minSubGroup=2, subGroups=TREE)) == admission.Verdict(allowed=True)
    assert admit(podgroup(minMember=0)) == admission.Verdict(allowed=True), "KAI's no gang requirement"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"minMember": 2, "minSubGroup": 1, "subGroups": TREE}, "spec.minSubGroup: minMember and minSubGroup are "
         "mutually exclusive"),
        ({"subGroups": [*TREE, {"name": "prefill", "minMember": 2}]}, "spec.subGroups[4].name: duplicate subgroup "
         "name 'prefill'"),
        ({"subGroups": [{"name": "a", "parent": "nowhere", "minMember": 1}]}, "parent 'nowhere' of 'a' is not a "
         "subgroup"),
        ({"subGroups": [{"name": "a", "parent": "b", "minMember": 1}, {"name": "b", "parent": "a"}]}, "a cycle"),
        ({"subGroups": [{"name": "a", "minMember": 1, "minSubGroup": 1}]}, "subgroup 'a': minMember and minSubGroup "
         "are mutually exclusive"),
        ({"subGroups": [{"name": "a", "minMember": 1, "minSubGroup": 0}]}, "mutually exclusive"),
        ({"subGroups": [{"name": "a", "minSubGroup": 1}]}, "minSubGroup cannot be set on a leaf SubGroup"),
        ({"subGroups": [{"name": "a"}]}, "spec.subGroups[0].minMember: subgroup 'a': minMember is required on a "
         "leaf"),
        ({"subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "parent": "a", "minMember": 1}]},
         "minMember cannot be set on a mid-level SubGroup"),
    ],
)  # fmt: skip
def test_what_kais_webhook_refuses_on_creation_is_refused_with_its_reason(spec: Obj, words: str) -> None:
    verdict = admit(podgroup(**spec))

    assert not verdict.allowed and (verdict.code, verdict.reason) == (403, "Forbidden")
    assert words in verdict.message


def test_every_leaf_without_min_member_is_named_and_kai_checks_no_minimum_of_a_tree_that_loops() -> None:
    leaves = admit(podgroup(subGroups=[{"name": "b"}, {"name": "a"}]))
    looping = admit(podgroup(subGroups=[{"name": "a", "parent": "b", "minMember": 1}, {"name": "b", "parent": "a"}]))

    assert leaves.message.split("; ") == [
        "spec.subGroups[1].minMember: subgroup 'a': minMember is required on a leaf SubGroup (0: no gang requirement)",
        "spec.subGroups[0].minMember: subgroup 'b': minMember is required on a leaf SubGroup (0: no gang requirement)",
    ], "KAI's order: by name"
    assert "mid-level" not in looping.message and looping.warnings == ()


def test_a_min_subgroup_above_the_children_is_admitted_with_kais_warning_at_either_level() -> None:
    top = admit(podgroup(minSubGroup=3, subGroups=TREE))
    nested = admit(podgroup(subGroups=[{**TREE[0], "minSubGroup": 3}, *TREE[1:]]))

    assert top.allowed and top.warnings == (
        "spec.minSubGroup: minSubGroup (3) exceeds the number of direct child SubGroups (2): the group can never be "
        "satisfied and waits",
    )
    assert nested.allowed and nested.warnings == (
        "spec.subGroups[0].minSubGroup: subgroup 'decode': minSubGroup (3) exceeds the number of direct child "
        "SubGroups (2): it can never be satisfied",
    )


def test_a_refusal_carries_the_warnings_too() -> None:
    verdict = admit(podgroup(minSubGroup=5, subGroups=[{"name": "a"}]))

    assert not verdict.allowed and "minMember is required" in verdict.message
    assert len(verdict.warnings) == 1 and "exceeds the number of direct child SubGroups (1)" in verdict.warnings[0]


def test_a_mid_level_min_member_is_refused_on_creation_and_only_warned_of_on_update() -> None:
    spec = {"subGroups": [{"name": "a", "minMember": 1}, {"name": "b", "parent": "a", "minMember": 1}]}
    old = podgroup(minMember=1)

    created = admit(podgroup(**spec))
    updated = admit(podgroup(**spec), operation="UPDATE", old=old)

    assert not created.allowed
    assert updated.allowed and len(updated.warnings) == 1 and "mid-level SubGroup" in updated.warnings[0]


def test_an_update_that_changes_the_spec_is_held_to_the_rules_and_one_that_keeps_it_is_admitted_with_warnings() -> None:
    stored = podgroup(subGroups=[{"name": "a"}])  # stored before the webhook was registered
    relabelled = {**stored, "metadata": {**stored["metadata"], "annotations": {"note": "x"}}}

    changed = admit(podgroup(subGroups=[{"name": "a"}, {"name": "b"}]), operation="UPDATE", old=stored)
    kept = admit(relabelled, operation="UPDATE", old=stored)

    assert not changed.allowed and "subgroup 'b': minMember is required" in changed.message
    assert kept.allowed and kept.warnings == (
        "spec.subGroups[0].minMember: subgroup 'a': minMember is required on a leaf SubGroup (0: no gang requirement)",
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"minMember": "4"}, "spec.minMember"),
        ({"subGroups": [{"name": "a", "minMember": -1}]}, "spec.subGroups[0].minMember"),
        ({"subGroups": "workers"}, "spec.subGroups"),
        ({"preemptionDelay": "5 minutes"}, "spec.preemptionDelay"),
        ({"preemptibility": "sometimes"}, "spec.preemptibility"),
    ],
)
def test_a_value_the_schema_refuses_is_a_bad_request_naming_its_field(spec: Obj, field: str) -> None:
    verdict = admit(podgroup(**spec))

    assert not verdict.allowed and (verdict.code, verdict.reason) == (400, "BadRequest")
    assert verdict.message.startswith(f"{field}: ")


def test_a_negative_delay_and_an_unreadable_annotation_are_admitted_with_warnings() -> None:
    obj = podgroup(preemptionDelay="-5m")
    obj["metadata"]["annotations"] = {"kai.scheduler/staleness-grace-period": "soon"}

    verdict = admit(obj)

    assert verdict.allowed
    negative, annotation = verdict.warnings
    assert negative == "spec.preemptionDelay: '-5m' is negative: no delay"
    assert annotation.startswith("metadata.annotations[kai.scheduler/staleness-grace-period]: 'soon' is not a Go ")


def test_other_resources_subresources_and_deletes_pass_and_a_spec_that_is_no_object_is_a_bad_request() -> None:
    bad = podgroup()
    bad["spec"] = ["minMember", 2]
    queues = {"group": "scheduling.run.ai", "version": "v2", "resource": "queues"}

    assert podgroupadmission.admit(request(podgroup(subGroups=[{"name": "a"}]), resource=queues)).allowed
    assert podgroupadmission.admit({**request(podgroup(subGroups=[{"name": "a"}])), "subResource": "status"}).allowed
    assert podgroupadmission.admit(request(podgroup(subGroups=[{"name": "a"}]), operation="DELETE")).allowed
    assert admit(bad).code == 400


def test_a_generated_name_is_no_obstacle() -> None:
    obj = podgroup(minMember=1)
    obj["metadata"] = {"generateName": "pg-", "namespace": "ml"}

    assert admit(obj) == admission.Verdict(allowed=True)


# --- served ---


def review(obj: Obj) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(obj)}
    ).encode()


async def test_the_server_answers_podgroup_reviews_on_kais_path(tmp_path: Path) -> None:
    server = webhook.WebhookServer(certificate=make(tmp_path / "tls"), scheduler_names=("quotient",))
    await server.start("127.0.0.1", 0)
    try:
        assert server.certificate.ca_pem is not None
        assert webhook.VALIDATE_PODGROUPS_PATH == "/validate-scheduling-run-ai-v2alpha2-podgroup"
        code, body = await call(
            server.port,
            server.certificate.ca_pem,
            path=webhook.VALIDATE_PODGROUPS_PATH,
            body=review(podgroup(minSubGroup=3, subGroups=TREE)),
        )
        refused_code, refused = await call(
            server.port,
            server.certificate.ca_pem,
            path=webhook.VALIDATE_PODGROUPS_PATH,
            body=review(podgroup(subGroups=[{"name": "a"}])),
        )
        bad_code, _ = await call(
            server.port, server.certificate.ca_pem, path=webhook.VALIDATE_PODGROUPS_PATH, body=b"{"
        )
    finally:
        await server.stop()

    response = json.loads(body)["response"]
    assert code == 200 and response["uid"] == "u-1" and response["allowed"] is True
    assert len(response["warnings"]) == 1 and "exceeds the number of direct child SubGroups" in response["warnings"][0]
    answer = json.loads(refused)["response"]
    assert refused_code == 200 and answer["allowed"] is False and answer["status"]["code"] == 403
    assert "minMember is required" in answer["status"]["message"]
    assert bad_code == 400

"""KAI's queue webhook: the review of Queue creations and updates (refusals with their reasons, warnings for quotas
above the parent's), and the server's second path that serves it with the Queues it lists."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from scheduler.kube import admission, certs, kubeapi, queueadmission, webhook
from scheduler.kube.errors import KubeUnavailable
from tests.unit.kube.fakes import MemoryKube
from tests.unit.kube_webhook.test_server import call, make

Obj = dict[str, Any]
QUEUES = {"group": "scheduling.run.ai", "version": "v2", "resource": "queues"}


def queue(name: str, *, parent: str | None = None, gpu: float = -1, cpu: float = -1, memory: float = -1) -> Obj:
    spec: Obj = {
        "resources": {
            "gpu": {"quota": gpu, "limit": -1, "overQuotaWeight": 1},
            "cpu": {"quota": cpu, "limit": -1, "overQuotaWeight": 1},
            "memory": {"quota": memory, "limit": -1, "overQuotaWeight": 1},
        }
    }
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def request(obj: Obj, *, operation: str = "CREATE", resource: Obj = QUEUES) -> Obj:
    return {"uid": "u-1", "resource": resource, "operation": operation, "object": obj}


def admit(
    obj: Obj, queues: Sequence[Obj] | None = (), *, strict: bool = False, operation: str = "CREATE"
) -> admission.Verdict:
    return queueadmission.admit(request(obj, operation=operation), queues=queues, parent_must_exist=strict)


def test_a_queue_without_resources_is_refused_with_kais_reason() -> None:
    verdict = admit({"metadata": {"name": "team-a"}, "spec": {"parentQueue": "default-parent-queue"}})

    assert not verdict.allowed and verdict.code == 403
    assert verdict.message.startswith("resources must be specified")


def test_a_queue_with_resources_and_an_existing_parent_is_admitted_without_a_word() -> None:
    verdict = admit(queue("team-a", parent="org", gpu=2), [queue("org", gpu=8)])

    assert verdict == admission.Verdict(allowed=True)


def test_a_missing_parent_is_refused_when_the_option_is_on_and_warned_of_when_it_is_off() -> None:
    strict = admit(queue("team-a", parent="nowhere"), [queue("org")], strict=True)
    lenient = admit(queue("team-a", parent="nowhere"), [queue("org")])

    assert not strict.allowed and "parent queue 'nowhere' does not exist" in strict.message
    assert "--queue-parent-must-exist" in strict.message
    assert lenient.allowed and lenient.warnings == (
        "parent queue 'nowhere' does not exist: until it does, queue 'team-a' is an Orphan and takes no work",
    )


def test_a_parent_that_cannot_be_read_refuses_only_under_the_option() -> None:
    strict = admit(queue("team-a", parent="org"), None, strict=True)
    lenient = admit(queue("team-a", parent="org"), None)

    assert not strict.allowed and "could not be read" in strict.message
    assert lenient == admission.Verdict(allowed=True)


def test_quotas_above_the_parents_draw_kais_warnings() -> None:
    parent = queue("org", gpu=4, cpu=8000, memory=-1)
    sibling = queue("team-b", parent="org", gpu=2, cpu=1000)

    verdict = admit(queue("team-a", parent="org", gpu=5, cpu=2000, memory=9000), [parent, sibling])

    assert verdict.allowed
    assert verdict.warnings == (
        "child queue GPU quota (5) exceeds parent queue org GPU quota (4)",
        "total children GPU quota (7) exceeds parent queue org GPU quota (4)",
    )


def test_siblings_add_up_even_when_each_fits_and_unlimited_ones_add_nothing() -> None:
    parent = queue("org", gpu=4)
    siblings = [queue("team-b", parent="org", gpu=2.5), queue("team-c", parent="org", gpu=-1)]

    verdict = admit(queue("team-a", parent="org", gpu=2), [parent, *siblings])

    assert verdict.warnings == ("total children GPU quota (4.5) exceeds parent queue org GPU quota (4)",)


def test_lowering_a_parents_quota_below_its_childrens_warns_on_update() -> None:
    children = [queue("team-a", parent="org", gpu=3), queue("team-b", parent="org", gpu=2)]

    verdict = admit(queue("org", gpu=4), [queue("org", gpu=8), *children], operation="UPDATE")

    assert verdict.allowed and verdict.warnings == ("total children GPU quota (5) exceeds queue org GPU quota (4)",)


@pytest.mark.parametrize(
    "changed",
    [
        {"operation": "DELETE"},
        {"resource": {"group": "", "version": "v1", "resource": "pods"}},
        {"subResource": "status"},
    ],
)
def test_what_is_not_a_queue_create_or_update_passes(changed: Obj) -> None:
    body = {**request({"metadata": {"name": "q"}, "spec": {}}), **changed}

    assert queueadmission.admit(body, queues=(), parent_must_exist=True) == admission.ALLOW


def test_a_queue_whose_spec_is_not_an_object_is_a_bad_request() -> None:
    verdict = admit({"metadata": {"name": "q"}, "spec": "all of it"})

    assert not verdict.allowed and verdict.code == 400


# --- served ---


def review(obj: Obj) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request(obj)}
    ).encode()


async def test_the_server_answers_queue_reviews_on_kais_path_with_the_queues_it_lists(tmp_path: Path) -> None:
    kube = MemoryKube()
    await kube.create(kubeapi.QUEUES, queue("org", gpu=1))

    async def list_queues() -> Sequence[Obj]:
        return (await kube.list(kubeapi.QUEUES)).items

    server = webhook.WebhookServer(
        certificate=make(tmp_path / "tls"), scheduler_names=("quotient",), list_queues=list_queues
    )
    await server.start("127.0.0.1", 0)
    try:
        assert server.certificate.ca_pem is not None
        code, body = await call(
            server.port,
            server.certificate.ca_pem,
            path=webhook.VALIDATE_QUEUES_PATH,
            body=review(queue("a", parent="org", gpu=2)),
        )
        refused_code, refused = await call(
            server.port,
            server.certificate.ca_pem,
            path=webhook.VALIDATE_QUEUES_PATH,
            body=review({"metadata": {"name": "b"}, "spec": {}}),
        )
    finally:
        await server.stop()

    response = json.loads(body)["response"]
    assert code == 200 and response["uid"] == "u-1" and response["allowed"] is True
    assert response["warnings"] == ["child queue GPU quota (2) exceeds parent queue org GPU quota (1)"]
    answer = json.loads(refused)["response"]
    assert refused_code == 200 and answer["allowed"] is False
    assert answer["status"]["code"] == 403 and answer["status"]["message"].startswith("resources must be specified")


async def test_a_list_that_fails_leaves_the_parent_unchecked_unless_it_must_exist(tmp_path: Path) -> None:
    async def failing() -> Sequence[Obj]:
        raise KubeUnavailable("the API server is down")

    server = webhook.WebhookServer(
        certificate=make(tmp_path / "tls"),
        scheduler_names=("quotient",),
        list_queues=failing,
        queue_parent_must_exist=True,
    )
    await server.start("127.0.0.1", 0)
    try:
        assert server.certificate.ca_pem is not None
        _, body = await call(
            server.port,
            server.certificate.ca_pem,
            path=webhook.VALIDATE_QUEUES_PATH,
            body=review(queue("a", parent="org")),
        )
    finally:
        await server.stop()

    answer = json.loads(body)["response"]
    assert answer["allowed"] is False and "could not be read" in answer["status"]["message"]


async def test_upkeep_keeps_the_ca_in_every_configuration(tmp_path: Path) -> None:
    kube = MemoryKube()
    for resource, name in (
        (certs.WEBHOOK_CONFIGURATIONS, "quotient-gpu-sharing"),
        (certs.VALIDATING_WEBHOOK_CONFIGURATIONS, "quotient-queue-validation"),
        (certs.VALIDATING_WEBHOOK_CONFIGURATIONS, "quotient-podgroup-validation"),
    ):
        await kube.create(resource, {"metadata": {"name": name}, "webhooks": [{"name": "w", "clientConfig": {}}]})
    listening: list[webhook.WebhookServer] = []
    settings = webhook.WebhookSettings(host="127.0.0.1", port=0, cert_dir=tmp_path / "tls", upkeep_interval_s=3600)
    rounds = 0

    async def one_round(seconds: float) -> None:
        nonlocal rounds
        rounds += 1
        raise _Stop

    with pytest.raises(_Stop):
        await webhook.serve(
            kube, settings, scheduler_names=("quotient",), on_listening=listening.append, sleep=one_round
        )

    [server] = listening
    assert server.certificate.ca_pem is not None and rounds == 1
    stored = [*kube.of(certs.WEBHOOK_CONFIGURATIONS), *kube.of(certs.VALIDATING_WEBHOOK_CONFIGURATIONS)]
    assert len(stored) == 3
    for configuration in stored:
        bundle = base64.b64decode(configuration["webhooks"][0]["clientConfig"]["caBundle"])
        assert server.certificate.ca_pem in bundle, configuration["metadata"]["name"]
    assert datetime.datetime.now(datetime.UTC) < server.certificate.not_after


class _Stop(Exception):
    """Ends ``serve`` after its first upkeep round."""

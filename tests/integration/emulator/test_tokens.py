"""The emulator's projected ServiceAccount tokens and ``TokenReview``, through the official ``kubernetes`` client.

A pod with a ``projected`` volume of a ``serviceAccountToken`` gets, from its node's emulated kubelet, a token bound
to it and its node, in the file the kubelet would mount; ``TokenReview`` (``AuthenticationV1Api``) says who a token
stands for, with the pod and node in ``extra``, and stops honouring it when the pod or the account goes, when it
expires, or for an audience it was not issued for. As on a real API server, a token for another audience is no
good for API requests.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from common import names
from quotient.emulator import authn, projection
from quotient.emulator.emulator import EmulatorThread
from tests import polling
from tests.integration.emulator.conftest import pod_manifest

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
AUDIENCE = "quotient-nats"


def _agent_pod(name: str, node: str, *, expiration_s: int = 3600) -> dict[str, object]:
    pod = pod_manifest(name, nodeName=node, serviceAccountName="agent")
    spec: Any = pod["spec"]
    spec["volumes"] = [
        {
            "name": "nats-token",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": expiration_s, "path": "token"}}
                ]
            },
        }
    ]
    return pod


def _claims(token: str) -> Obj:
    body = token.split(".")[1]
    claims: Obj = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return claims


def _review(api_client: client.ApiClient, token: str, audiences: list[str] | None = None) -> Any:
    spec: Obj = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    return client.AuthenticationV1Api(api_client).create_token_review({"spec": spec}).status


def _projected(emulator: EmulatorThread, pod: str) -> Callable[[], Path | None]:
    def path() -> Path | None:
        found = emulator.call(lambda: emulator.emulator.projected_token_path("default", pod, "nats-token"))
        return found if found is not None and found.exists() else None

    return path


@pytest.fixture
def account(core: client.CoreV1Api) -> Obj:
    created = core.create_namespaced_service_account("default", {"metadata": {"name": "agent"}})
    return {"uid": created.metadata.uid}


def test_a_running_pods_projected_token_names_the_pod_and_its_node_and_a_review_says_so(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    core.create_namespaced_pod("default", _agent_pod("agent-a", "node-0"))
    path = polling.until_sync(_projected(emulator, "agent-a"), timeout_s=5, what="the projected token file")
    pod = core.read_namespaced_pod("agent-a", "default")
    node = core.read_node("node-0")
    token = path.read_text()

    claims = _claims(token)
    assert claims["aud"] == [AUDIENCE]
    assert claims["sub"] == "system:serviceaccount:default:agent"
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["kubernetes.io"]["pod"] == {"name": "agent-a", "uid": pod.metadata.uid}
    assert claims["kubernetes.io"]["node"] == {"name": "node-0", "uid": node.metadata.uid}
    assert path.stat().st_mode & 0o777 == 0o600

    reviewed = _review(api_client, token, [AUDIENCE])
    assert reviewed.authenticated is True
    assert reviewed.audiences == [AUDIENCE]
    assert reviewed.user.username == "system:serviceaccount:default:agent"
    assert reviewed.user.uid == account["uid"]
    assert "system:serviceaccounts:default" in reviewed.user.groups
    assert reviewed.user.extra[names.NODE_NAME_EXTRA] == ["node-0"]
    assert reviewed.user.extra[names.POD_NAME_EXTRA] == ["agent-a"]
    assert reviewed.user.extra[names.POD_UID_EXTRA] == [pod.metadata.uid]
    assert reviewed.user.extra[names.CREDENTIAL_ID_EXTRA] == [f"JTI={claims['jti']}"]


def test_a_token_for_another_audience_is_refused_by_the_review_and_by_the_api(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    core.create_namespaced_pod("default", _agent_pod("agent-a", "node-0"))
    token = polling.until_sync(_projected(emulator, "agent-a"), timeout_s=5, what="the token").read_text()

    for audiences in ([], ["https://kubernetes.default.svc.cluster.local"], ["vault"]):
        reviewed = _review(api_client, token, audiences)
        assert reviewed.authenticated is False
        assert "is invalid for the target audiences" in reviewed.error
    configuration = client.Configuration(host=emulator.url)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(configuration) as as_agent, pytest.raises(client.ApiException) as refused:
        client.CoreV1Api(as_agent).list_namespaced_pod("default")
    assert refused.value.status == 401


def test_a_bound_token_stops_working_when_its_pod_is_deleted_and_its_file_goes(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    core.create_namespaced_pod("default", _agent_pod("agent-a", "node-0"))
    path = polling.until_sync(_projected(emulator, "agent-a"), timeout_s=5, what="the token")
    token = path.read_text()

    core.delete_namespaced_pod("agent-a", "default", grace_period_seconds=0)
    polling.until_sync(lambda: not path.exists(), timeout_s=5, what="the volume cleaned up")

    reviewed = _review(api_client, token, [AUDIENCE])
    assert reviewed.authenticated is False
    assert "is gone" in reviewed.error


def test_a_token_stops_working_when_its_account_is_deleted_or_it_expires(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    issued = core.create_namespaced_service_account_token("agent", "default", {"spec": {"audiences": [AUDIENCE]}})
    token = issued.status.token
    assert _review(api_client, token, [AUDIENCE]).authenticated is True

    emulator.call(lambda: setattr(emulator.emulator.server.access.tokens, "_clock", lambda: 4e9))
    expired = _review(api_client, token, [AUDIENCE])
    assert (expired.authenticated, expired.error) == (False, "invalid bearer token, token has expired")

    emulator.call(lambda: setattr(emulator.emulator.server.access.tokens, "_clock", emulator.emulator.clock))
    core.delete_namespaced_service_account("agent", "default")
    deleted = _review(api_client, token, [AUDIENCE])
    assert deleted.authenticated is False
    assert "invalidated" in deleted.error


def test_a_token_request_bound_to_a_pod_names_the_pod_and_node(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    core.create_namespaced_pod("default", pod_manifest("plain", nodeName="node-1"))
    pod = core.read_namespaced_pod("plain", "default")
    body = {"spec": {"audiences": [AUDIENCE], "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "plain"}}}

    issued = core.create_namespaced_service_account_token("agent", "default", body)

    assert issued.spec.bound_object_ref.uid == pod.metadata.uid
    reviewed = _review(api_client, issued.status.token, [AUDIENCE])
    assert reviewed.user.extra[names.NODE_NAME_EXTRA] == ["node-1"]
    missing = {"spec": {"boundObjectRef": {"kind": "Pod", "name": "nobody"}}}
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_service_account_token("agent", "default", missing)
    assert refused.value.status == 404


def test_a_review_answers_201_for_a_token_the_emulator_never_issued_and_400_without_a_token(
    api_client: client.ApiClient,
) -> None:
    reviewed = _review(api_client, "not-a-token")
    assert (reviewed.authenticated, reviewed.error) == (False, "invalid bearer token")
    with pytest.raises(client.ApiException) as refused:
        client.AuthenticationV1Api(api_client).create_token_review({"spec": {"token": ""}})
    assert refused.value.status == 400


def test_token_reviews_are_created_only_and_need_the_right_to(
    emulator: EmulatorThread, core: client.CoreV1Api, api_client: client.ApiClient, account: Obj
) -> None:
    with pytest.raises(urllib.error.HTTPError) as listed:
        urllib.request.urlopen(f"{emulator.url}/apis/authentication.k8s.io/v1/tokenreviews", timeout=5)
    assert listed.value.code == 405
    token = emulator.call(lambda: emulator.emulator.service_account_token("default", "agent"))
    configuration = client.Configuration(host=emulator.url)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(configuration) as as_agent, pytest.raises(client.ApiException) as refused:
        _review(as_agent, token)
    assert refused.value.status == 403
    record = emulator.call(lambda: emulator.emulator.requests_of(authn.service_account_user("default", "agent").name))
    assert [(asked.verb, asked.api_group, asked.resource) for asked in record.refused] == [
        ("create", "authentication.k8s.io", "tokenreviews")
    ]


def test_the_kubelet_renews_a_projected_token_before_it_expires_and_the_old_one_holds_till_then(
    emulator: EmulatorThread,
    core: client.CoreV1Api,
    api_client: client.ApiClient,
    account: Obj,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Renew after 0.2% of the 600 s life (1.2 s) instead of 80% (8 minutes): the same timer, sooner.
    monkeypatch.setattr(projection, "RENEW_AT", 0.002)
    core.create_namespaced_pod("default", _agent_pod("agent-a", "node-0", expiration_s=600))
    path = polling.until_sync(_projected(emulator, "agent-a"), timeout_s=5, what="the token")
    first = path.read_text()

    second = polling.until_sync(
        lambda: (text := path.read_text()) != first and text, timeout_s=10, what="a renewed token"
    )

    assert _claims(second)["jti"] != _claims(first)["jti"]
    assert _review(api_client, second, [AUDIENCE]).authenticated is True
    assert _review(api_client, first, [AUDIENCE]).authenticated is True

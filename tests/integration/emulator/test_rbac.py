"""RBAC over HTTP, through the official ``kubernetes`` client: the emulator authenticates the tokens it issued and
holds their users to the stored roles, as an API server does, and records what each user was served and refused.

A client without a token is the administrator (every other test of the emulator is one); a service account's token
comes from the real ``TokenRequest`` (``create_namespaced_service_account_token``, ``kubectl create token``).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from quotient.emulator import access, authn
from quotient.emulator.emulator import EmulatorThread
from tests.integration.emulator.conftest import Kubectl, pod_manifest

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
BOT = authn.service_account_user("default", "bot").name
RBAC_GROUP = "rbac.authorization.k8s.io"


def _client(emulator: EmulatorThread, token: str) -> client.ApiClient:
    configuration = client.Configuration(host=emulator.url)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


@pytest.fixture
def bot(emulator: EmulatorThread, core: client.CoreV1Api) -> Iterator[client.ApiClient]:
    """The ServiceAccount default/bot, as a client carrying its token."""
    core.create_namespaced_service_account("default", {"metadata": {"name": "bot"}})
    issued = core.create_namespaced_service_account_token("bot", "default", {"spec": {"expirationSeconds": 3600}})
    with _client(emulator, issued.status.token) as api:
        yield api


def _refusal(call: Callable[[], object]) -> tuple[int, Obj]:
    with pytest.raises(client.ApiException) as raised:
        call()
    return raised.value.status, json.loads(raised.value.body)


def _grant(api_client: client.ApiClient, namespace: str, rules: list[Obj], *, name: str = "bot") -> None:
    """A Role with ``rules`` in ``namespace``, bound to default/bot (as the administrator)."""
    rbac_api = client.RbacAuthorizationV1Api(api_client)
    rbac_api.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac_api.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}],
        },
    )


def test_a_service_account_without_bindings_is_refused_with_the_api_servers_403(bot: client.ApiClient) -> None:
    pods = client.CoreV1Api(bot)

    code, body = _refusal(lambda: pods.patch_namespaced_pod("x", "default", {"metadata": {"labels": {"a": "b"}}}))
    assert code == 403
    assert (
        body["kind"] == "Status" and body["reason"] == "Forbidden" and body["details"] == {"name": "x", "kind": "pods"}
    )
    assert body["message"] == (
        f'pods "x" is forbidden: User "{BOT}" cannot patch resource "pods" in API group "" in the namespace "default"'
    )
    code, body = _refusal(lambda: client.SchedulingV1Api(bot).list_priority_class())
    assert body["message"] == (
        f'priorityclasses.scheduling.k8s.io is forbidden: User "{BOT}" cannot list resource "priorityclasses" in '
        'API group "scheduling.k8s.io" at the cluster scope'
    )
    # Discovery is every authenticated user's (the API server's system:discovery role).
    assert client.VersionApi(bot).get_code().git_version
    assert any(resource.name == "pods" for resource in client.CoreV1Api(bot).get_api_resources().resources)


def test_a_role_binding_grants_its_rules_in_its_namespace_from_the_next_request(
    bot: client.ApiClient, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    pods = client.CoreV1Api(bot)
    core.create_namespaced_pod("default", pod_manifest("web"))
    _grant(api_client, "default", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])

    assert [pod.metadata.name for pod in pods.list_namespaced_pod("default").items] == ["web"]
    assert pods.read_namespaced_pod("web", "default").metadata.name == "web"
    assert _refusal(lambda: pods.list_pod_for_all_namespaces())[0] == 403
    assert _refusal(lambda: pods.list_namespaced_pod("kube-system"))[0] == 403
    assert _refusal(lambda: pods.delete_namespaced_pod("web", "default"))[0] == 403
    # pods does not cover pods/status, and list does not cover watch.
    code, body = _refusal(lambda: pods.read_namespaced_pod_status("web", "default"))
    assert '"pods/status"' in body["message"]
    stream = watch.Watch().stream(pods.list_namespaced_pod, "default", timeout_seconds=1)
    code, body = _refusal(lambda: next(iter(stream)))
    assert code == 403 and "cannot watch resource" in body["message"]


def test_resource_names_limit_gets_and_a_watch_that_selects_the_name(
    bot: client.ApiClient, api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    for name in ("mine", "theirs"):
        core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {"k": "v"}})
    rule = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mine"], "verbs": ["get", "watch"]}
    _grant(api_client, "default", [rule])
    configmaps = client.CoreV1Api(bot)

    assert configmaps.read_namespaced_config_map("mine", "default").data == {"k": "v"}
    assert _refusal(lambda: configmaps.read_namespaced_config_map("theirs", "default"))[0] == 403
    assert (
        _refusal(lambda: configmaps.create_namespaced_config_map("default", {"metadata": {"name": "mine"}}))[0] == 403
    )
    events = watch.Watch().stream(
        configmaps.list_namespaced_config_map, "default", field_selector="metadata.name=mine", timeout_seconds=1
    )
    assert next(iter(events))["object"].metadata.name == "mine"
    everything = watch.Watch().stream(configmaps.list_namespaced_config_map, "default", timeout_seconds=1)
    assert _refusal(lambda: next(iter(everything)))[0] == 403


def test_an_unknown_token_is_401_and_a_deleted_accounts_token_stops_working(
    emulator: EmulatorThread, bot: client.ApiClient, core: client.CoreV1Api
) -> None:
    with _client(emulator, "not-a-token") as stranger:
        code, body = _refusal(lambda: client.CoreV1Api(stranger).list_namespaced_pod("default"))
    assert (code, body["reason"], body["message"]) == (401, "Unauthorized", "Unauthorized")
    assert client.VersionApi(bot).get_code()
    core.delete_namespaced_service_account("bot", "default")
    assert _refusal(lambda: client.VersionApi(bot).get_code())[0] == 401


def test_a_token_request_for_a_missing_account_is_404_and_a_short_one_is_invalid(core: client.CoreV1Api) -> None:
    assert _refusal(lambda: core.create_namespaced_service_account_token("ghost", "default", {"spec": {}}))[0] == 404
    core.create_namespaced_service_account("default", {"metadata": {"name": "brief"}})
    code, body = _refusal(
        lambda: core.create_namespaced_service_account_token("brief", "default", {"spec": {"expirationSeconds": 60}})
    )
    assert code == 422 and "spec.expirationSeconds" in body["message"]


def test_the_record_says_what_each_user_was_served_and_refused(
    emulator: EmulatorThread, bot: client.ApiClient, api_client: client.ApiClient
) -> None:
    _grant(api_client, "default", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])
    pods = client.CoreV1Api(bot)
    pods.list_namespaced_pod("default")
    pods.list_namespaced_pod("default")
    _refusal(lambda: pods.create_namespaced_pod_binding("p", "default", {"target": {"kind": "Node", "name": "n"}}))

    record = emulator.call(lambda: emulator.emulator.requests_of(BOT))
    assert record.served == {access.Asked(verb="list", api_group="", resource="pods", namespace="default")}
    refused = access.Asked(verb="create", api_group="", resource="pods/binding", namespace="default")
    assert set(record.refused) == {refused}
    assert 'cannot create resource "pods/binding"' in record.refused[refused]
    # The same over the test hook, for an emulator in another process.
    with urllib.request.urlopen(f"{emulator.url}/_emulator/requests/{BOT}", timeout=10) as answer:
        hooked = json.loads(answer.read())
    assert hooked["served"] == [{"verb": "list", "api_group": "", "resource": "pods", "namespace": "default"}]
    assert [entry["resource"] for entry in hooked["refused"]] == ["pods/binding"]


def test_a_static_token_from_the_hook_acts_as_the_user_it_names(emulator: EmulatorThread) -> None:
    request = urllib.request.Request(
        f"{emulator.url}/_emulator/tokens",
        data=json.dumps({"user": "jane", "groups": ["team-a"]}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        token = json.loads(answer.read())["token"]
    with _client(emulator, token) as jane:
        _, body = _refusal(lambda: client.CoreV1Api(jane).list_namespace())
    assert body["message"] == (
        'namespaces is forbidden: User "jane" cannot list resource "namespaces" in API group "" at the cluster scope'
    )


def test_kubectl_creates_a_token_through_the_token_request(kubectl: Kubectl, emulator: EmulatorThread) -> None:
    kubectl("create", "serviceaccount", "bot")
    token = kubectl("create", "token", "bot", "--duration", "1h").stdout.strip()
    with _client(emulator, token) as bot:
        _, body = _refusal(lambda: client.CoreV1Api(bot).list_namespaced_pod("default"))
    assert f'User "{BOT}"' in body["message"]

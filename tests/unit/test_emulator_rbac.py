"""The emulator's RBAC decisions (``quotient.emulator.rbac``) and tokens (``authn``), as tables.

The roles and bindings are the examples of the Kubernetes RBAC documentation ("Using RBAC Authorization":
pod-reader, secret-reader, read-secrets-global, configmap-updater, the subresource and wildcard rules, the subject
examples); the expected answers are the ones the documentation gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from quotient.emulator import access, authn, rbac
from quotient.emulator.routing import Target

Obj = dict[str, Any]
GROUP = "rbac.authorization.k8s.io"

JANE = authn.User(name="jane", groups=("system:authenticated",))
DAVE = authn.User(name="dave", groups=("system:authenticated",))
MANAGER = authn.User(name="mia", groups=("manager", "system:authenticated"))
BOT = authn.service_account_user("qa", "bot")
SCHEDULER = authn.service_account_user("quotient-system", "quotient-scheduler")


def _role(name: str, rules: list[Obj], *, namespace: str = "") -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "rules": rules}


def _binding(name: str, kind: str, role: str, subjects: list[Obj], *, namespace: str = "") -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "roleRef": {"apiGroup": GROUP, "kind": kind, "name": role}, "subjects": subjects}


def _user(name: str) -> Obj:
    return {"kind": "User", "apiGroup": GROUP, "name": name}


POLICY = rbac.Policy(
    roles=(
        _role("pod-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]}],
              namespace="default"),
        _role("pod-and-pod-logs-reader", [{"apiGroups": [""], "resources": ["pods", "pods/log"],
                                           "verbs": ["get", "list"]}], namespace="default"),
        _role("configmap-updater", [{"apiGroups": [""], "resources": ["configmaps"],
                                     "resourceNames": ["my-configmap"], "verbs": ["update", "get"]}],
              namespace="default"),
        _role("scaler", [{"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get", "update"]}],
              namespace="default"),
        _role("qa-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], namespace="qa"),
        _role("lonely", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}], namespace="other"),
    ),
    role_bindings=(
        _binding("read-pods", "Role", "pod-reader", [_user("jane")], namespace="default"),
        _binding("read-logs", "Role", "pod-and-pod-logs-reader", [_user("jane")], namespace="default"),
        _binding("update-cm", "Role", "configmap-updater", [_user("jane")], namespace="default"),
        _binding("scale", "Role", "scaler", [_user("jane")], namespace="default"),
        # A RoleBinding may refer to a ClusterRole: its rules hold in the binding's namespace only.
        _binding("read-secrets", "ClusterRole", "secret-reader", [_user("dave")], namespace="development"),
        # A ServiceAccount subject without a namespace is one in the binding's namespace.
        _binding("qa-admins", "Role", "qa-admin", [{"kind": "ServiceAccount", "name": "bot"}], namespace="qa"),
        # A RoleBinding can only name a Role of its own namespace.
        _binding("elsewhere", "Role", "lonely", [_user("jane")], namespace="default"),
        _binding("gone", "ClusterRole", "no-such-role", [_user("dave")], namespace="default"),
    ),
    cluster_roles=(
        _role("secret-reader", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "watch", "list"]}]),
        _role("node-lister", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
    ),
    cluster_role_bindings=(
        _binding("read-secrets-global", "ClusterRole", "secret-reader", [{"kind": "Group", "name": "manager"}]),
        _binding("all-qa-accounts-list-nodes", "ClusterRole", "node-lister",
                 [{"kind": "Group", "name": "system:serviceaccounts:qa"}]),
    ),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Case:
    why: str
    user: authn.User
    verb: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    group: str = ""
    allowed: bool = True


CASES = [
    Case("a Role grants in its namespace", JANE, "list", "pods", "default"),
    Case("a Role grants nothing elsewhere", JANE, "list", "pods", "kube-system", allowed=False),
    Case("nor at the cluster scope", JANE, "list", "pods", allowed=False),
    Case("nor verbs it does not name", JANE, "delete", "pods", "default", "web", allowed=False),
    Case("a subresource is named as resource/subresource", JANE, "get", "pods", "default", "web", "log"),
    Case("the resource alone does not grant its subresources", JANE, "get", "pods", "default", "web", "status",
         allowed=False),
    Case("resourceNames grant the named object", JANE, "get", "configmaps", "default", "my-configmap"),
    Case("and no other", JANE, "get", "configmaps", "default", "other", allowed=False),
    Case("resourceNames cannot grant a list", JANE, "list", "configmaps", "default", allowed=False),
    Case("nor a create", JANE, "create", "configmaps", "default", allowed=False),
    Case("*/scale is any resource's scale", JANE, "update", "deployments", "default", "web", "scale", "apps"),
    Case("and nothing else of it", JANE, "update", "deployments", "default", "web", allowed=False, group="apps"),
    Case("a ClusterRole through a RoleBinding holds in its namespace", DAVE, "get", "secrets", "development", "s"),
    Case("only there", DAVE, "get", "secrets", "default", "s", allowed=False),
    Case("a ClusterRoleBinding holds everywhere", MANAGER, "list", "secrets", "default"),
    Case("at the cluster scope too", MANAGER, "list", "secrets"),
    Case("a service account bound without a namespace, in the binding's", BOT, "delete", "pods", "qa", "p"),
    Case("wildcards cover subresources and groups", BOT, "create", "deployments", "qa", "d", "scale", "apps"),
    Case("the account's namespace group", BOT, "list", "nodes"),
    Case("a Role of another namespace grants nothing", JANE, "delete", "pods", "default", "p", allowed=False),
    Case("a stranger gets nothing", SCHEDULER, "get", "pods", "default", "p", allowed=False),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case.why for case in CASES])
def test_rbac_decides_as_the_kubernetes_documentation_says(case: Case) -> None:
    attributes = rbac.Attributes(
        user=case.user,
        verb=case.verb,
        api_group=case.group,
        resource=case.resource,
        subresource=case.subresource,
        namespace=case.namespace,
        name=case.name,
    )
    assert rbac.authorize(attributes, POLICY).allowed is case.allowed


def test_an_allowing_decision_names_the_binding_and_role() -> None:
    attributes = rbac.Attributes(user=DAVE, verb="get", resource="secrets", namespace="development", name="s")
    assert (
        rbac.authorize(attributes, POLICY).granted_by
        == "RoleBinding/development/read-secrets -> ClusterRole/secret-reader"
    )


def test_a_binding_to_a_missing_role_grants_nothing_and_the_denial_says_so() -> None:
    attributes = rbac.Attributes(user=DAVE, verb="get", resource="pods", namespace="default", name="p")
    decision = rbac.authorize(attributes, POLICY)
    assert not decision.allowed
    assert decision.reason == f'RBAC: clusterrole.{GROUP} "no-such-role" not found'
    assert rbac.forbidden_message(attributes, decision).endswith(
        f': RBAC: clusterrole.{GROUP} "no-such-role" not found'
    )


def test_the_forbidden_message_is_the_api_servers() -> None:
    denied = rbac.Decision(allowed=False)
    namespaced = rbac.Attributes(user=SCHEDULER, verb="patch", resource="pods", namespace="ml", name="x")
    assert rbac.forbidden_message(namespaced, denied) == (
        'User "system:serviceaccount:quotient-system:quotient-scheduler" cannot patch resource "pods" in API group "" '
        'in the namespace "ml"'
    )
    cluster = rbac.Attributes(user=SCHEDULER, verb="update", resource="queues", subresource="status",
                              api_group="scheduling.run.ai")  # fmt: skip
    assert rbac.forbidden_message(cluster, denied) == (
        'User "system:serviceaccount:quotient-system:quotient-scheduler" cannot update resource "queues/status" in '
        'API group "scheduling.run.ai" at the cluster scope'
    )
    path = rbac.Attributes(user=JANE, verb="get", path="/metrics")
    assert rbac.forbidden_message(path, denied) == 'User "jane" cannot get path "/metrics"'


@pytest.mark.parametrize(
    ("path", "allowed"),
    [("/api", True), ("/apis/apps/v1", True), ("/version", True), ("/openapi/v3/apis/apps/v1", True),
     ("/metrics", False), ("/logs/kubelet.log", False)],
)  # fmt: skip
def test_every_authenticated_user_may_read_discovery_and_nothing_else_outside_the_resources(
    path: str, allowed: bool
) -> None:
    attributes = rbac.Attributes(user=JANE, verb="get", path=path)
    assert rbac.authorize(attributes, rbac.DISCOVERY, POLICY).allowed is allowed
    anonymous = rbac.Attributes(user=authn.User(name="system:anonymous"), verb="get", path=path)
    assert not rbac.authorize(anonymous, rbac.DISCOVERY).allowed


# --- what a request asks, read as the API server reads it ---


def _target(plural: str, *, namespace: str = "", name: str = "", sub: str = "", group: str = "") -> Target:
    return Target(
        group=group, version="v1", plural=plural, namespace=namespace, name=name, subresource=sub, watch_path=False
    )


def test_a_namespace_is_its_own_namespace_so_a_role_binding_in_it_can_grant_reading_it() -> None:
    attributes = access.attributes_of(JANE, "get", _target("namespaces", name="team-a"), {})
    assert (attributes.namespace, attributes.name) == ("team-a", "team-a")


def test_a_list_or_watch_selecting_one_name_is_judged_with_that_name() -> None:
    target = _target("configmaps", namespace="default")
    named = access.attributes_of(JANE, "watch", target, {"fieldSelector": "metadata.name=my-configmap"})
    assert named.name == "my-configmap"
    assert access.attributes_of(JANE, "list", target, {"fieldSelector": "metadata.name!=x"}).name == ""
    role = _role("one", [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["my-configmap"],
                          "verbs": ["watch"]}], namespace="default")  # fmt: skip
    policy = rbac.Policy(
        roles=(role,), role_bindings=(_binding("b", "Role", "one", [_user("jane")], namespace="default"),)
    )
    assert rbac.authorize(named, policy).allowed


# --- tokens ---


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_service_accounts_token_is_that_account_until_it_expires_or_the_account_goes() -> None:
    clock = Clock()
    accounts = {("qa", "bot"): "uid-1"}
    tokens = authn.Tokens(clock=clock, account_exists=lambda ns, name, uid: accounts.get((ns, name)) == uid)
    token, expires_at_s = tokens.issue_for_account("qa", "bot", "uid-1", expiration_s=3600, audiences=())

    assert tokens.authenticate(f"Bearer {token}") == BOT
    assert BOT.groups == ("system:serviceaccounts", "system:serviceaccounts:qa", "system:authenticated")
    assert expires_at_s == clock.now_s + 3600
    accounts[("qa", "bot")] = "uid-2"  # deleted and made again: a new account, and the old token is not its
    assert isinstance(tokens.authenticate(f"Bearer {token}"), authn.Unauthorized)
    accounts[("qa", "bot")] = "uid-1"
    clock.now_s += 3600
    assert isinstance(tokens.authenticate(f"Bearer {token}"), authn.Unauthorized)


def test_no_token_is_the_administrator_and_a_token_not_issued_here_is_refused() -> None:
    tokens = authn.Tokens(clock=Clock(), account_exists=lambda ns, name, uid: True)
    assert tokens.authenticate(None) == authn.ADMIN and authn.ADMIN.is_admin
    for header in ("Bearer nope", "Basic amFuZTpzZWNyZXQ=", "Bearer "):
        assert isinstance(tokens.authenticate(header), authn.Unauthorized), header


def test_a_static_token_names_any_user_and_adds_the_authenticated_group() -> None:
    tokens = authn.Tokens(clock=Clock(), account_exists=lambda ns, name, uid: False)
    token = tokens.issue_static(authn.User(name=SCHEDULER.name))
    user = tokens.authenticate(f"Bearer {token}")
    assert user == authn.User(name=SCHEDULER.name, groups=("system:authenticated",))
    assert authn.service_account_of(SCHEDULER.name) == ("quotient-system", "quotient-scheduler")
    assert authn.service_account_of("jane") is None

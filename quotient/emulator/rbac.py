"""RBAC as the API server decides it: a request's attributes and the stored roles and bindings in, allowed or why not.

A pure function of its inputs, so the rules are tested as tables (cases from the Kubernetes RBAC documentation) and
the server only gathers the objects and renders the answer. It follows ``k8s.io/kubernetes/plugin/pkg/auth/
authorizer/rbac``: the ClusterRoleBindings are visited first, then (for a request in a namespace) that namespace's
RoleBindings; a binding applies when one of its subjects is the user (``User``), one of its groups (``Group``) or
its service account (``ServiceAccount``, whose namespace defaults to the binding's); a rule allows when each field
matches:

- ``verbs``, ``apiGroups``: the request's, or ``*``;
- ``resources``: the resource, ``resource/subresource`` for a subresource, ``*`` (everything, subresources too), or
  ``*/subresource`` (that subresource of any resource);
- ``resourceNames``: empty, or naming the object. A request that names no object (create, deletecollection, a list
  or watch without a ``metadata.name`` field selector) is never allowed by a rule with names: names cannot limit
  creation or whole collections;
- ``nonResourceURLs`` (for paths outside the resource tree): the path, or a prefix ending in ``*``.

A RoleBinding grants its role's rules in its own namespace only, a ClusterRole's too; a ClusterRoleBinding grants
everywhere. A binding whose role does not exist grants nothing, and the denial's reason says so (``RBAC:
clusterrole.rbac.authorization.k8s.io "x" not found``), as the API server appends it. Not here: aggregated
ClusterRoles, impersonation, and the ``escalate``/``bind`` checks on writing roles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from quotient.emulator import authn

Obj = Mapping[str, Any]
GROUP = "rbac.authorization.k8s.io"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attributes:
    """What a request asks (the API server's ``authorizer.Attributes``). A resource request has a ``resource``; any
    other (discovery, ``/version``) has a ``path``."""

    user: authn.User
    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def is_resource_request(self) -> bool:
        return bool(self.resource)

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The RBAC objects of the cluster, as stored."""

    cluster_roles: Sequence[Obj] = ()
    cluster_role_bindings: Sequence[Obj] = ()
    roles: Sequence[Obj] = ()
    role_bindings: Sequence[Obj] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    allowed: bool
    granted_by: str = ""
    """The binding and role that allowed it (``ClusterRoleBinding/x -> ClusterRole/y``), for logs and tests."""
    allowed_by: str = ""
    """RBAC's own words for it, which an access review returns as its reason (``RBAC: allowed by
    ClusterRoleBinding "x" of ClusterRole "y" to User "u"``, as ``rbac.go``'s binding describers write it)."""
    reason: str = ""
    """Why not, beyond the rules not matching: the roles that bindings of this user name and that do not exist."""


# The bootstrap policy every API server carries (kube-apiserver's ``system:discovery`` and
# ``system:public-info-viewer``, bound to every authenticated user): discovery, OpenAPI, version and health paths.
DISCOVERY: Policy = Policy(
    cluster_roles=(
        {
            "metadata": {"name": "system:discovery"},
            "rules": [
                {
                    "verbs": ["get"],
                    "nonResourceURLs": [
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/healthz",
                        "/livez",
                        "/openapi",
                        "/openapi/*",
                        "/readyz",
                        "/version",
                        "/version/",
                    ],
                }
            ],
        },
    ),
    cluster_role_bindings=(
        {
            "metadata": {"name": "system:discovery"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "system:discovery"},
            "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": authn.AUTHENTICATED}],
        },
    ),
)


# ``system:basic-user``, bound to every authenticated user too: a user may ask what it may do (``kubectl auth can-i``)
# and who it is (``kubectl auth whoami``).
BASIC_USER: Policy = Policy(
    cluster_roles=(
        {
            "metadata": {"name": "system:basic-user"},
            "rules": [
                {
                    "verbs": ["create"],
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                },
                {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]},
            ],
        },
    ),
    cluster_role_bindings=(
        {
            "metadata": {"name": "system:basic-user"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "system:basic-user"},
            "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": authn.AUTHENTICATED}],
        },
    ),
)
BOOTSTRAP: tuple[Policy, ...] = (DISCOVERY, BASIC_USER)
"""The bootstrap policy every API server carries, beside the stored objects."""


def authorize(attributes: Attributes, *policies: Policy) -> Decision:
    """Whether RBAC allows the request under the union of ``policies`` (the stored objects, the bootstrap ones)."""
    missing: list[str] = []
    for found in _applicable(attributes, policies, missing):
        if any(_rule_allows(attributes, rule) for rule in found.rules):
            return Decision(
                allowed=True,
                granted_by=f"{found.binding} -> {found.role_kind}/{found.role_name}",
                allowed_by=f"RBAC: allowed by {found.description}",
            )
    reason = ""
    if missing:
        reason = "RBAC: " + (missing[0] if len(missing) == 1 else f"[{', '.join(missing)}]")
    return Decision(allowed=False, reason=reason)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """What a user may do in a namespace (``RulesFor``, behind a ``SelfSubjectRulesReview``): the rules of every
    binding that applies there, and why the list may be incomplete (bindings whose role is missing)."""

    resource_rules: tuple[Obj, ...]
    non_resource_rules: tuple[Obj, ...]
    missing: tuple[str, ...] = ()


def rules_of(user: authn.User, namespace: str, *policies: Policy) -> Rules:
    """Every rule that applies to ``user`` in ``namespace`` ("" for the cluster scope) under ``policies``."""
    missing: list[str] = []
    resource: list[Obj] = []
    non_resource: list[Obj] = []
    attributes = Attributes(user=user, verb="", namespace=namespace)
    for found in _applicable(attributes, policies, missing):
        for rule in found.rules:
            if _strings(rule.get("nonResourceURLs")):
                non_resource.append(
                    {"verbs": _strings(rule.get("verbs")), "nonResourceURLs": _strings(rule.get("nonResourceURLs"))}
                )
            if _strings(rule.get("resources")):
                entry: dict[str, Any] = {
                    "verbs": _strings(rule.get("verbs")),
                    "apiGroups": _strings(rule.get("apiGroups")),
                    "resources": _strings(rule.get("resources")),
                }
                if _strings(rule.get("resourceNames")):
                    entry["resourceNames"] = _strings(rule.get("resourceNames"))
                resource.append(entry)
    return Rules(resource_rules=tuple(resource), non_resource_rules=tuple(non_resource), missing=tuple(missing))


def forbidden_message(attributes: Attributes, decision: Decision) -> str:
    """The text after ``... is forbidden: `` in the API server's 403 (``responsewriters.forbiddenMessage``)."""
    user = attributes.user.name
    if not attributes.is_resource_request:
        text = f'User "{user}" cannot {attributes.verb} path "{attributes.path}"'
    elif attributes.namespace:
        text = (
            f'User "{user}" cannot {attributes.verb} resource "{attributes.combined_resource}" in API group '
            f'"{attributes.api_group}" in the namespace "{attributes.namespace}"'
        )
    else:
        text = (
            f'User "{user}" cannot {attributes.verb} resource "{attributes.combined_resource}" in API group '
            f'"{attributes.api_group}" at the cluster scope'
        )
    return f"{text}: {decision.reason}" if decision.reason else text


# --- bindings to rules ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Applicable:
    binding: str
    role_kind: str
    role_name: str
    rules: Sequence[Obj]
    description: str
    """``ClusterRoleBinding "b" of ClusterRole "r" to Group "g"``: the binding, its role, the subject that matched."""


def _applicable(attributes: Attributes, policies: Sequence[Policy], missing: list[str]) -> Iterator[_Applicable]:
    """Every binding that applies to the user where the request is, in the API server's order; a binding whose role
    is missing is noted in ``missing`` instead."""
    cluster_roles = {_name(role): role for policy in policies for role in policy.cluster_roles}
    for policy in policies:
        for binding in policy.cluster_role_bindings:
            subject = _subject(binding, attributes.user, namespace="")
            if subject is None:
                continue
            kind, name = _role_ref(binding)
            role = cluster_roles.get(name) if kind == "ClusterRole" else None
            if role is None:
                missing.append(f'clusterrole.{GROUP} "{name}" not found')
                continue
            yield _Applicable(
                binding=f"ClusterRoleBinding/{_name(binding)}",
                role_kind=kind,
                role_name=name,
                rules=_rules(role),
                description=f'ClusterRoleBinding "{_name(binding)}" of {kind} "{name}" to {subject}',
            )
    if not attributes.namespace:
        return
    roles = {
        _name(role): role for policy in policies for role in policy.roles if _namespace(role) == attributes.namespace
    }
    for policy in policies:
        for binding in policy.role_bindings:
            if _namespace(binding) != attributes.namespace:
                continue
            subject = _subject(binding, attributes.user, namespace=attributes.namespace)
            if subject is None:
                continue
            kind, name = _role_ref(binding)
            role = roles.get(name) if kind == "Role" else cluster_roles.get(name) if kind == "ClusterRole" else None
            if role is None:
                missing.append(f'{kind.lower() or "role"}.{GROUP} "{name}" not found')
                continue
            yield _Applicable(
                binding=f"RoleBinding/{attributes.namespace}/{_name(binding)}",
                role_kind=kind,
                role_name=f"{attributes.namespace}/{name}" if kind == "Role" else name,
                rules=_rules(role),
                description=(f'RoleBinding "{_name(binding)}/{attributes.namespace}" of {kind} "{name}" to {subject}'),
            )


def _subject(binding: Obj, user: authn.User, *, namespace: str) -> str | None:
    """The binding's first subject that is the user, described as ``rbac.go``'s ``describeSubject`` does; None when
    none is."""
    for subject in _list(binding.get("subjects")):
        if _is_subject(subject, user, namespace):
            name = str(subject.get("name") or "")
            if subject.get("kind") == "ServiceAccount":
                name = f"{name}/{subject.get('namespace') or namespace}"
            return f'{subject.get("kind")} "{name}"'
    return None


def _is_subject(subject: object, user: authn.User, namespace: str) -> bool:
    """``appliesToUser``: a ServiceAccount subject without a namespace means one in the binding's namespace."""
    if not isinstance(subject, Mapping):
        return False
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        account_namespace = subject.get("namespace") or namespace
        return bool(account_namespace) and user.name == f"{authn.SERVICE_ACCOUNT_PREFIX}{account_namespace}:{name}"
    return False


# --- one rule ---


def _rule_allows(attributes: Attributes, rule: Obj) -> bool:
    verbs = _strings(rule.get("verbs"))
    if attributes.verb not in verbs and "*" not in verbs:
        return False
    if not attributes.is_resource_request:
        return any(_url_matches(pattern, attributes.path) for pattern in _strings(rule.get("nonResourceURLs")))
    groups = _strings(rule.get("apiGroups"))
    if attributes.api_group not in groups and "*" not in groups:
        return False
    if not any(_resource_matches(pattern, attributes) for pattern in _strings(rule.get("resources"))):
        return False
    names = _strings(rule.get("resourceNames"))
    return not names or attributes.name in names


def _resource_matches(pattern: str, attributes: Attributes) -> bool:
    if pattern in ("*", attributes.combined_resource):
        return True
    return bool(attributes.subresource) and pattern == f"*/{attributes.subresource}"


def _url_matches(pattern: str, path: str) -> bool:
    if pattern == "*" or pattern == path:
        return True
    return pattern.endswith("*") and path.startswith(pattern[:-1])


# --- reading the objects ---


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _strings(value: object) -> list[str]:
    return [item for item in _list(value) if isinstance(item, str)]


def _metadata(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _name(obj: Obj) -> str:
    return str(_metadata(obj).get("name") or "")


def _namespace(obj: Obj) -> str:
    return str(_metadata(obj).get("namespace") or "")


def _role_ref(binding: Obj) -> tuple[str, str]:
    ref = binding.get("roleRef")
    if not isinstance(ref, Mapping):
        return "", ""
    return str(ref.get("kind") or ""), str(ref.get("name") or "")


def _rules(role: Obj) -> list[Obj]:
    return [rule for rule in _list(role.get("rules")) if isinstance(rule, Mapping)]

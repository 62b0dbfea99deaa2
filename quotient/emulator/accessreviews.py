"""Access reviews, answered from the emulator's RBAC: ``kubectl auth can-i`` and ``kubectl auth whoami``.

``kubectl auth can-i VERB RESOURCE`` creates a ``SelfSubjectAccessReview`` (``--list``: a ``SelfSubjectRulesReview``),
``kubectl auth whoami`` a ``SelfSubjectReview``; a service that delegates authorization asks with a
``SubjectAccessReview`` (or a namespaced ``LocalSubjectAccessReview``) about someone else. As on a real server each
is create-only, stored nowhere, and answered ``201`` with the request and its ``status``:

- the access reviews by ``rbac.authorize`` over the stored roles and bindings plus the bootstrap ones, with
  RBAC's reason (``RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to User "u"``); a member of
  ``system:masters`` (the emulator's administrator: every request without a token) is allowed everything, with no
  reason, as the API server's privileged-group authorizer answers before RBAC;
- the rules review with every rule that applies in the namespace (``*`` everywhere for ``system:masters``), and
  ``incomplete`` with the reason when a binding names a role that does not exist;
- ``whoami`` with the requester's user name and groups.

A review must name exactly one of ``resourceAttributes`` and ``nonResourceAttributes`` (422 otherwise, in the API
server's words), a ``SubjectAccessReview`` a user or a group, and a ``LocalSubjectAccessReview`` its own namespace
(400). Who may create a review is RBAC's business like any other create. Pure: the request, the requester and the
policy in, the answer out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quotient.emulator import authn, rbac, status
from quotient.emulator.objects import Obj, timestamp

AUTHORIZATION = "authorization.k8s.io"
AUTHENTICATION = "authentication.k8s.io"
SELF_ACCESS = "selfsubjectaccessreviews"
ACCESS = "subjectaccessreviews"
LOCAL_ACCESS = "localsubjectaccessreviews"
SELF_RULES = "selfsubjectrulesreviews"
WHOAMI = "selfsubjectreviews"
REVIEWS: Mapping[tuple[str, str], str] = {
    (AUTHORIZATION, SELF_ACCESS): "SelfSubjectAccessReview",
    (AUTHORIZATION, ACCESS): "SubjectAccessReview",
    (AUTHORIZATION, LOCAL_ACCESS): "LocalSubjectAccessReview",
    (AUTHORIZATION, SELF_RULES): "SelfSubjectRulesReview",
    (AUTHENTICATION, WHOAMI): "SelfSubjectReview",
}
"""(API group, resource) -> kind of every review answered here."""

_EVERYTHING_RULES = {
    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
}


def is_review(group: str, plural: str) -> bool:
    return (group, plural) in REVIEWS


def answer(
    group: str,
    plural: str,
    body: Any,
    *,
    namespace: str,
    requester: authn.User,
    policy: rbac.Policy,
    now_s: float,
) -> Obj | status.Failure:
    """The answer to ``POST`` of a review (``is_review``) with ``body``, made by ``requester``."""
    kind = REVIEWS[(group, plural)]
    if not isinstance(body, dict):
        return status.bad_request(f"the body of the request must be a {kind} object")
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        return status.bad_request("spec must be an object")
    head: Obj = {
        "kind": kind,
        "apiVersion": f"{group}/v1",
        "metadata": {**_dict(body.get("metadata")), "creationTimestamp": timestamp(now_s)},
    }
    if plural == WHOAMI:
        return {**head, "status": {"userInfo": {"username": requester.name, "groups": list(requester.groups)}}}
    if plural == SELF_RULES:
        scope = str(spec.get("namespace") or "")
        return {**head, "spec": spec, "status": rules_status(requester, scope, policy)}
    user = requester
    if plural in (ACCESS, LOCAL_ACCESS):
        subject = _subject(kind, spec)
        if isinstance(subject, status.Failure):
            return subject
        user = subject
    attributes = _attributes(kind, spec, user, namespace=namespace if plural == LOCAL_ACCESS else None)
    if isinstance(attributes, status.Failure):
        return attributes
    return {**head, "spec": spec, "status": access_status(attributes, policy)}


def access_status(attributes: rbac.Attributes, policy: rbac.Policy) -> Obj:
    """``SubjectAccessReviewStatus``: allowed, and why (RBAC's reason, or why the answer may be wrong)."""
    if attributes.user.is_admin:
        return {"allowed": True}
    decision = rbac.authorize(attributes, policy, *rbac.BOOTSTRAP)
    if decision.allowed:
        return {"allowed": True, "reason": decision.allowed_by}
    answered: Obj = {"allowed": False}
    if decision.reason:
        answered["reason"] = decision.reason
    return answered


def rules_status(user: authn.User, namespace: str, policy: rbac.Policy) -> Obj:
    """``SubjectRulesReviewStatus``: what ``user`` may do in ``namespace``."""
    if user.is_admin:
        return {**_EVERYTHING_RULES, "incomplete": False}
    rules = rbac.rules_of(user, namespace, policy, *rbac.BOOTSTRAP)
    answered: Obj = {
        "resourceRules": list(rules.resource_rules),
        "nonResourceRules": list(rules.non_resource_rules),
        "incomplete": bool(rules.missing),
    }
    if rules.missing:
        answered["evaluationError"] = "; ".join(rules.missing)
    return answered


def _subject(kind: str, spec: Mapping[str, Any]) -> authn.User | status.Failure:
    """The user a ``SubjectAccessReview`` asks about, exactly as given (no group is added)."""
    user = spec.get("user") or ""
    groups = spec.get("groups") or []
    if not isinstance(user, str) or not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return status.bad_request("spec.user must be a string and spec.groups a list of strings")
    if not user and not groups:
        return status.invalid(
            kind,
            "",
            [status.invalid_value("spec.user", user, "at least one of user or group must be specified")],
            group=AUTHORIZATION,
        )
    return authn.User(name=user, groups=tuple(groups))


def _attributes(
    kind: str, spec: Mapping[str, Any], user: authn.User, *, namespace: str | None
) -> rbac.Attributes | status.Failure:
    """The RBAC attributes a review asks about; a ``Failure`` for a review that is not well formed.
    ``namespace``: the URL's, for a ``LocalSubjectAccessReview`` (which must ask about it)."""
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if resource is not None and non_resource is not None:
        detail = "cannot be specified in combination with resourceAttributes"
        if namespace is not None:
            detail = "disallowed on this kind of request"
        cause = status.invalid_value("spec.nonResourceAttributes", non_resource, detail)
        return status.invalid(kind, "", [cause], group=AUTHORIZATION)
    if resource is None and non_resource is None:
        detail = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        return status.invalid(
            kind, "", [status.invalid_value("spec.resourceAttributes", None, detail)], group=AUTHORIZATION
        )
    if non_resource is not None:
        given = _dict(non_resource)
        return rbac.Attributes(user=user, verb=str(given.get("verb") or ""), path=str(given.get("path") or ""))
    given = _dict(resource)
    asked_namespace = str(given.get("namespace") or "")
    if namespace is not None and asked_namespace != namespace:
        return status.bad_request(f"spec.resourceAttributes.namespace must match namespace: {namespace}")
    resource_name = str(given.get("resource") or "")
    return rbac.Attributes(
        user=user,
        verb=str(given.get("verb") or ""),
        api_group=str(given.get("group") or ""),
        # A review of no resource asks about every one (RBAC matches "*"), as the API server reads it.
        resource=resource_name or "*",
        subresource=str(given.get("subresource") or ""),
        namespace=asked_namespace,
        name=str(given.get("name") or ""),
    )


def _dict(value: object) -> Obj:
    return dict(value) if isinstance(value, dict) else {}

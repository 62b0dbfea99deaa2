"""Impersonation (``kubectl --as USER --as-group GROUP``): a request made on behalf of another user, as the API
server's impersonation filter (``k8s.io/apiserver/pkg/endpoints/filters/impersonation.go``) allows it.

The requester names the user in ``Impersonate-User`` (and groups in ``Impersonate-Group``, a uid in
``Impersonate-Uid``, extra values in ``Impersonate-Extra-KEY``); RBAC must let the requester ``impersonate`` each:
``users`` by name, or for a service account's user name (``system:serviceaccount:NS:NAME``) ``serviceaccounts``
``NAME`` in ``NS``; ``groups``; ``uids`` and ``userextras/KEY`` in ``authentication.k8s.io``. The emulator's
administrator may impersonate anyone. The request then runs as the impersonated user: the groups given, or a service
account's own groups when none are given, plus ``system:authenticated`` (unless ``system:unauthenticated`` or it
is given, or the user is ``system:anonymous``). Groups without a user are a 400. Pure: the headers' values, the
requester and the policy in, the user (or the 403) out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quotient.emulator import authn, rbac, status

USER_HEADER = "Impersonate-User"
GROUP_HEADER = "Impersonate-Group"
UID_HEADER = "Impersonate-Uid"
EXTRA_PREFIX = "Impersonate-Extra-"
_ANONYMOUS = "system:anonymous"
_UNAUTHENTICATED = "system:unauthenticated"
_AUTHENTICATION = "authentication.k8s.io"


def impersonated(
    *,
    user: str,
    groups: Sequence[str],
    uid: str,
    extra: Mapping[str, Sequence[str]],
    requester: authn.User,
    policy: rbac.Policy,
) -> authn.User | status.Failure | None:
    """Whom the request stands for; None when it impersonates no one, a ``Failure`` when it may not."""
    if not user:
        if groups or uid or extra:
            return status.bad_request(
                f"requested impersonation of {list(groups) or uid or list(extra)} without impersonating a user"
            )
        return None
    account = authn.service_account_of(user)
    asked: list[rbac.Attributes] = []
    if account is not None:
        asked.append(_asked(requester, "serviceaccounts", account[1], namespace=account[0]))
    else:
        asked.append(_asked(requester, "users", user))
    asked += [_asked(requester, "groups", group) for group in groups]
    if uid:
        asked.append(_asked(requester, "uids", uid, group=_AUTHENTICATION))
    for key, values in extra.items():
        asked += [_asked(requester, "userextras", value, group=_AUTHENTICATION, subresource=key) for value in values]
    if not requester.is_admin:
        for attributes in asked:
            decision = rbac.authorize(attributes, policy, *rbac.BOOTSTRAP)
            if not decision.allowed:
                message = rbac.forbidden_message(attributes, decision)
                return status.forbidden(attributes.resource, attributes.name, message, group=attributes.api_group)
    chosen = list(groups)
    if account is not None and not groups:
        chosen = ["system:serviceaccounts", f"system:serviceaccounts:{account[0]}"]
    if user != _ANONYMOUS and not {authn.AUTHENTICATED, _UNAUTHENTICATED} & set(chosen):
        chosen.append(authn.AUTHENTICATED)
    return authn.User(name=user, groups=tuple(chosen))


def _asked(
    requester: authn.User, resource: str, name: str, *, namespace: str = "", group: str = "", subresource: str = ""
) -> rbac.Attributes:
    return rbac.Attributes(
        user=requester,
        verb="impersonate",
        api_group=group,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )

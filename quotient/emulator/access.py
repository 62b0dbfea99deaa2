"""The emulator's front door: who each request is (``authn``), whether RBAC lets it through (``rbac``), and a record
of what every user asked, served and refused.

The server asks here before it serves anything: an unknown token is ``401``; a request RBAC does not allow is the
API server's ``403`` (``pods "x" is forbidden: User "system:serviceaccount:ns:sa" cannot patch resource "pods" in API
group "" in the namespace "ml"``). The administrator (a request without a token) skips RBAC, as ``system:masters``
does. The roles and bindings are read from the store on every check, so a ``kubectl apply`` of a Role counts from the
next request, as on a real server (there, after the informer's short lag).

The record keeps, per user, the set of ``(verb, API group, resource[/subresource], namespace)`` it was served and the
set it was refused (with the first refusal's message), so a test can say which rights a component used and that it
was refused nothing. It is bounded by the distinct combinations, not by the number of requests. Paths outside the
resource tree (discovery, ``/version``, OpenAPI) are authorized by the bootstrap discovery role and not recorded;
the test hooks under ``/_emulator/`` are not part of the API and are open to every caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from common import logs
from quotient.emulator import authn, discovery, impersonation, podproxy, projection, rbac, routing, status
from quotient.emulator.objects import Obj, metadata, timestamp
from quotient.emulator.store import Store

log = logs.get("emulator.access")

_USER_KEY = web.RequestKey("quotient.user", authn.User)
_STORAGES = {
    "cluster_roles": f"clusterroles.{rbac.GROUP}",
    "cluster_role_bindings": f"clusterrolebindings.{rbac.GROUP}",
    "roles": f"roles.{rbac.GROUP}",
    "role_bindings": f"rolebindings.{rbac.GROUP}",
}
TOKEN_REQUEST_VERSION = "authentication.k8s.io/v1"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Asked:
    """One kind of request a user made: what RBAC judged, without the object's name."""

    verb: str
    api_group: str
    resource: str
    """``resource`` or ``resource/subresource``."""
    namespace: str
    """"" at the cluster scope (or across all namespaces)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """What one user asked: served (RBAC let it through, whatever the answer) and refused (403, with the message)."""

    served: frozenset[Asked] = frozenset()
    refused: Mapping[Asked, str] = dataclasses.field(default_factory=dict)

    def as_json(self) -> Obj:
        return {
            "served": [dataclasses.asdict(asked) for asked in sorted(self.served)],
            "refused": [
                {**dataclasses.asdict(asked), "message": message} for asked, message in sorted(self.refused.items())
            ],
        }


class Access:
    """Authentication, authorization and the record, over the emulator's store."""

    def __init__(self, store: Store, *, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self.tokens = authn.Tokens(clock=clock, account_exists=self._account_exists, pod_exists=self._pod_exists)
        self._served: dict[str, set[Asked]] = {}
        self._refused: dict[str, dict[Asked, str]] = {}

    # --- the checks the server makes ---

    def authenticate(self, request: web.Request) -> status.Failure | None:
        """Who the request is (kept on the request for the checks below): the token's user, or the user it
        impersonates (``impersonation``); a 401 for a token not issued here, a 403 for an impersonation RBAC
        does not allow."""
        user = self.tokens.authenticate(request.headers.get("Authorization"))
        if isinstance(user, authn.Unauthorized):
            return status.Failure(code=401, reason="Unauthorized", message=user.message)
        headers = request.headers
        if any(key.lower().startswith("impersonate-") for key in headers):
            extra: dict[str, list[str]] = {}
            for key, value in headers.items():
                if key.lower().startswith(impersonation.EXTRA_PREFIX.lower()):
                    extra.setdefault(key[len(impersonation.EXTRA_PREFIX) :].lower(), []).append(value)
            acting = impersonation.impersonated(
                user=headers.get(impersonation.USER_HEADER, ""),
                groups=headers.getall(impersonation.GROUP_HEADER, []),
                uid=headers.get(impersonation.UID_HEADER, ""),
                extra=extra,
                requester=user,
                policy=self.policy(),
            )
            if isinstance(acting, status.Failure):
                log.info("impersonation_refused", user=user.name, message=acting.message)
                return acting
            user = acting or user
        request[_USER_KEY] = user
        return None

    def check_path(self, request: web.Request, path: str) -> status.Failure | None:
        """A request outside the resource tree (discovery, ``/version``, OpenAPI, health), judged by its path;
        None for resource requests (``check_resource`` judges those) and the test hooks."""
        user = self.user_of(request)
        if user.is_admin or path.startswith("/_emulator/") or _is_resource_path(request.method, path):
            return None
        attributes = rbac.Attributes(user=user, verb=request.method.lower(), path=path)
        decision = rbac.authorize(attributes, *rbac.BOOTSTRAP, self.policy())
        if decision.allowed:
            return None
        return status.Failure(
            code=403, reason="Forbidden", message=f"forbidden: {rbac.forbidden_message(attributes, decision)}"
        )

    def check_resource(
        self, request: web.Request, target: routing.Target, verb: str | None = None
    ) -> status.Failure | None:
        """RBAC's answer to a resource request (``verb``: the request's own unless given, as for ``pods/proxy``);
        recorded either way. None when it may go on (a method no verb fits is left to the server's 405)."""
        verb = verb or routing.verb(request, target)
        if verb is None:
            return None
        user = self.user_of(request)
        attributes = attributes_of(user, verb, target, request.query)
        asked = Asked(
            verb=verb,
            api_group=attributes.api_group,
            resource=attributes.combined_resource,
            namespace=attributes.namespace,
        )
        if user.is_admin:
            self._served.setdefault(user.name, set()).add(asked)
            return None
        decision = rbac.authorize(attributes, self.policy(), *rbac.BOOTSTRAP)
        if decision.allowed:
            self._served.setdefault(user.name, set()).add(asked)
            return None
        message = rbac.forbidden_message(attributes, decision)
        failure = status.forbidden(attributes.resource, attributes.name, message, group=attributes.api_group)
        self._refused.setdefault(user.name, {}).setdefault(asked, failure.message)
        log.info("request_forbidden", user=user.name, message=failure.message)
        return failure

    @staticmethod
    def user_of(request: web.Request) -> authn.User:
        user: authn.User = request.get(_USER_KEY, authn.ADMIN)
        return user

    def policy(self) -> rbac.Policy:
        return rbac.Policy(**{field: self._store.objects(storage) for field, storage in _STORAGES.items()})

    # --- the record ---

    def record_of(self, user: str) -> Record:
        return Record(served=frozenset(self._served.get(user, ())), refused=dict(self._refused.get(user, {})))

    # --- tokens ---

    def token_request(self, namespace: str, name: str, body: Any) -> Obj | status.Failure:
        """``POST .../serviceaccounts/NAME/token``: a ``TokenRequest`` answered with a token for the account."""
        account = self._store.get("serviceaccounts", namespace, name)
        if account is None:
            return status.not_found("serviceaccounts", name)
        spec = (body.get("spec") if isinstance(body, dict) else None) or {}
        if not isinstance(spec, dict):
            return status.bad_request("spec must be an object")
        expiration = spec.get("expirationSeconds", authn.DEFAULT_EXPIRATION_S)
        if not isinstance(expiration, int) or expiration < authn.MIN_EXPIRATION_S:
            return status.invalid(
                "TokenRequest",
                name,
                [
                    status.invalid_value(
                        "spec.expirationSeconds", expiration, "may not specify a duration less than 10 minutes"
                    )
                ],
                group="authentication.k8s.io",
            )
        audiences = [str(audience) for audience in spec.get("audiences") or [] if isinstance(audience, str)]
        ref = spec.get("boundObjectRef")
        pod = projection.bound_pod(self._store, namespace, ref) if isinstance(ref, dict) else None
        if isinstance(pod, status.Failure):
            return pod
        token, expires_at_s = self.tokens.issue_for_account(
            namespace,
            name,
            str(metadata(account).get("uid") or ""),
            expiration_s=expiration,
            audiences=audiences,
            pod=pod,
        )
        return {
            "kind": "TokenRequest",
            "apiVersion": TOKEN_REQUEST_VERSION,
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": timestamp(self._clock())},
            "spec": {
                "audiences": audiences or [authn.ISSUER],
                "expirationSeconds": expiration,
                "boundObjectRef": (
                    {"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.uid} if pod is not None else None
                ),
            },
            "status": {"token": token, "expirationTimestamp": timestamp(expires_at_s)},
        }

    def _account_exists(self, namespace: str, name: str, uid: str) -> bool:
        account = self._store.get("serviceaccounts", namespace, name)
        return account is not None and metadata(account).get("uid") == uid

    def _pod_exists(self, namespace: str, name: str, uid: str) -> bool:
        pod = self._store.get("pods", namespace, name)
        return pod is not None and metadata(pod).get("uid") == uid


def attributes_of(user: authn.User, verb: str, target: routing.Target, query: Mapping[str, str]) -> rbac.Attributes:
    """The attributes RBAC judges, read from the request as the API server's ``RequestInfoFactory`` reads them: a
    Namespace's own name is its namespace; a list or watch with a ``metadata.name`` field selector names its object;
    ``POST .../bindings`` is a create of ``bindings``."""
    namespace, name = target.namespace, target.name
    if target.group == "" and target.plural == "namespaces" and name:
        namespace = name
    if verb in ("list", "watch") and not name:
        name = _selected_name(query.get("fieldSelector") or "")
    return rbac.Attributes(
        user=user,
        verb=verb,
        api_group=target.group,
        resource=target.plural,
        subresource=target.subresource,
        namespace=namespace,
        name=name,
    )


def _selected_name(selector: str) -> str:
    for term in selector.split(","):
        field, _, value = term.partition("==") if "==" in term else term.partition("=")
        if field.strip() == "metadata.name":  # "metadata.name!=x" leaves "metadata.name!" here
            return value.strip()
    return ""


def _is_resource_path(method: str, path: str) -> bool:
    if podproxy.parse(path) is not None:
        return True
    parts = [part for part in path.split("/") if part]
    if parts[:1] not in (["api"], ["apis"]):
        return False
    if method == "GET" and discovery.is_document(parts):
        return False
    return routing.parse_resource_path(path) is not None

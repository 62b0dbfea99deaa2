"""Who a request is: the bearer tokens the emulator issued, and the users they stand for.

A real API server authenticates every request before anything else; the emulator does it the same way for the
tokens it issued, so RBAC (``rbac``) has a user to judge. Three kinds of caller:

- **No ``Authorization`` header**: the cluster's administrator (``system:admin`` in ``system:masters``), allowed
  everything, as every test and tool that talked to the emulator before it had identities expects.
- **A service account's token**, issued through the real ``TokenRequest`` subresource
  (``POST .../serviceaccounts/NAME/token``, which ``kubectl create token`` sends) or ``Emulator.service_account_token``:
  the user ``system:serviceaccount:NS:NAME`` in the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:NS`` and ``system:authenticated``. Like a bound token it stops working when the account
  is deleted (the uid it was issued for is gone) or when it expires.
- **A static token** (``Emulator.static_token``), as the API server's ``--token-auth-file`` gives: any user name and
  groups, a service account's name included, whether or not the account exists. A fresh cluster's scheduler can so
  act as ``quotient-system/quotient-scheduler`` before the namespace that would hold the account exists.

A service account token may be **bound to a pod** (the kubelet's projected ``serviceAccountToken`` volumes,
``projection``; a ``TokenRequest`` with a ``boundObjectRef`` of kind Pod): its claims then name the pod and its node,
it stops working when that pod is gone, and a ``TokenReview`` (``tokenreview``) returns the pod and node in the
user's ``extra``, as the API server does since 1.30. A token is for its audiences: one issued for another audience
(``quotient-nats``, say) is ``401`` for API requests, as the API server's ``--api-audiences`` makes it.

Any other bearer token is ``401 Unauthorized``, as on a real server. kubectl never sends a token over plain HTTP
(client-go's kubeconfig loader drops credentials for a server without TLS), so ``kubectl --token`` against the
emulator is the administrator; the Python clients (and so the scheduler) do send it. Tokens are shaped like the API
server's (a JWT: header, claims, signature, base64url) so tools that read their claims work; the emulator never
checks a signature, only its own table.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence

from common import names

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
AUTHENTICATED = "system:authenticated"
MASTERS = "system:masters"
ISSUER = "https://kubernetes.default.svc.cluster.local"
# TokenRequest: the API server's default and minimum expirationSeconds.
DEFAULT_EXPIRATION_S = 3600
MIN_EXPIRATION_S = 600
API_AUDIENCE = ISSUER
"""What the API server itself accepts (its ``--api-audiences`` default to its issuer)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """An authenticated user (the API server's ``user.Info``): a name and groups."""

    name: str
    groups: tuple[str, ...] = ()

    @property
    def is_admin(self) -> bool:
        """Members of ``system:masters`` pass every authorization check, before RBAC is asked."""
        return MASTERS in self.groups


ADMIN = User(name="system:admin", groups=(MASTERS, AUTHENTICATED))


def service_account_user(namespace: str, name: str) -> User:
    """The user a service account's token authenticates as."""
    return User(
        name=f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


def service_account_of(user_name: str) -> tuple[str, str] | None:
    """(namespace, name) when ``user_name`` is a service account's user name."""
    if not user_name.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, sep, name = user_name[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return (namespace, name) if sep and namespace and name else None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodBinding:
    """The pod a token is bound to, and the node it runs on (the kubelet's projected tokens)."""

    namespace: str
    name: str
    uid: str
    node: str = ""
    node_uid: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What one issued token stands for."""

    user: User
    expires_at_s: float | None
    account_uid: str = ""
    """The service account the token was issued for (TokenRequest); "" for a static token."""
    audiences: tuple[str, ...] = ()
    """Who the token is for ("": a static token, good for the API)."""
    pod: PodBinding | None = None
    token_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reviewed:
    """A ``TokenReview``'s answer for a token that is valid for the audiences asked."""

    user: User
    uid: str
    audiences: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unauthorized:
    """A bearer token the emulator did not issue, or no longer honours: 401."""

    message: str = "Unauthorized"


class Tokens:
    """The tokens issued so far. ``account_exists(namespace, name, uid)`` says whether a service account is still
    the one a token was issued for."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        account_exists: Callable[[str, str, str], bool],
        pod_exists: Callable[[str, str, str], bool] = lambda namespace, name, uid: True,
    ) -> None:
        self._clock = clock
        self._account_exists = account_exists
        self._pod_exists = pod_exists
        self._grants: dict[str, Grant] = {}

    def issue_for_account(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        expiration_s: int,
        audiences: Sequence[str],
        pod: PodBinding | None = None,
    ) -> tuple[str, float]:
        """A token for a service account (``TokenRequest``), bound to ``pod`` when given; (token, expiry in seconds
        since the epoch)."""
        now = self._clock()
        expires_at_s = now + expiration_s
        user = service_account_user(namespace, name)
        token_id = str(uuid.uuid4())
        scope: dict[str, object] = {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}}
        if pod is not None:
            scope["pod"] = {"name": pod.name, "uid": pod.uid}
            if pod.node:
                scope["node"] = {"name": pod.node, "uid": pod.node_uid}
        claims = {
            "aud": list(audiences) or [API_AUDIENCE],
            "exp": int(expires_at_s),
            "iat": int(now),
            "nbf": int(now),
            "iss": ISSUER,
            "jti": token_id,
            "sub": user.name,
            "kubernetes.io": scope,
        }
        token = _jwt(claims)
        self._grants[token] = Grant(
            user=user,
            expires_at_s=expires_at_s,
            account_uid=uid,
            audiences=tuple(audiences) or (API_AUDIENCE,),
            pod=pod,
            token_id=token_id,
        )
        return token, expires_at_s

    def issue_static(self, user: User) -> str:
        """A token that stands for ``user`` until the emulator stops (``--token-auth-file``)."""
        groups = user.groups if AUTHENTICATED in user.groups else (*user.groups, AUTHENTICATED)
        token = _jwt({"iss": ISSUER, "sub": user.name, "iat": int(self._clock())})
        self._grants[token] = Grant(user=User(name=user.name, groups=groups), expires_at_s=None)
        return token

    def authenticate(self, authorization: str | None) -> User | Unauthorized:
        """The user of a request's ``Authorization`` header: the administrator without one."""
        if not authorization:
            return ADMIN
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Unauthorized()
        grant = self._valid(token.strip())
        if isinstance(grant, Unauthorized) or (grant.audiences and API_AUDIENCE not in grant.audiences):
            return Unauthorized()
        return grant.user

    def review(self, token: str, audiences: Sequence[str]) -> Reviewed | Unauthorized:
        """A ``TokenReview``: who ``token`` stands for, if it is valid and for one of ``audiences`` (the API's when
        empty); else why not, in the API server's words."""
        grant = self._valid(token.strip())
        if isinstance(grant, Unauthorized):
            return grant
        wanted = tuple(audiences) or (API_AUDIENCE,)
        own = grant.audiences or (API_AUDIENCE,)
        matched = tuple(audience for audience in wanted if audience in own)
        if not matched:
            return Unauthorized(
                message=f"token audiences {list(own)} is invalid for the target audiences {list(wanted)}"
            )
        extra: dict[str, tuple[str, ...]] = {}
        if grant.token_id:
            extra[names.CREDENTIAL_ID_EXTRA] = (f"JTI={grant.token_id}",)
        if grant.pod is not None:
            extra[names.POD_NAME_EXTRA] = (grant.pod.name,)
            extra[names.POD_UID_EXTRA] = (grant.pod.uid,)
            if grant.pod.node:
                extra[names.NODE_NAME_EXTRA] = (grant.pod.node,)
                extra[names.NODE_UID_EXTRA] = (grant.pod.node_uid,)
        return Reviewed(user=grant.user, uid=grant.account_uid, audiences=matched, extra=extra)

    def _valid(self, token: str) -> Grant | Unauthorized:
        """The grant of ``token`` while it holds: issued here, not expired, its account and its pod still there."""
        grant = self._grants.get(token)
        if grant is None:
            return Unauthorized(message="invalid bearer token")
        if grant.expires_at_s is not None and self._clock() >= grant.expires_at_s:
            return Unauthorized(message="invalid bearer token, token has expired")
        if grant.account_uid:
            account = service_account_of(grant.user.name)
            if account is None or not self._account_exists(*account, grant.account_uid):
                return Unauthorized(message="invalid bearer token, service account token has been invalidated")
        pod = grant.pod
        if pod is not None and not self._pod_exists(pod.namespace, pod.name, pod.uid):
            return Unauthorized(message=f"invalid bearer token, pod {pod.namespace}/{pod.name} ({pod.uid}) is gone")
        return grant


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(claims: dict[str, object]) -> str:
    header = {"alg": "RS256", "kid": "quotient-emulator"}
    encoded = (_b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    return ".".join((*encoded, _b64(secrets.token_bytes(32))))

"""Who may publish for which node: the auth callout's decision, from what the API server said of a token.

Pure: a ``TokenReview`` (and, where the review names no node, the node the pod runs on) in, a ``Grant`` or a
``Denial`` with its reason out. Time is an argument.

The rule: the token must be authenticated by the API server for the callout's audience, stand for the agent's
ServiceAccount (``system:serviceaccount:<namespace>:<name>``, nothing else: a token of any other pod is worth nothing
here), and be bound to a pod that runs on a node; that node is the one the connection may publish for, on
``quotient.v1.telemetry.<node>`` and ``quotient.v1.health.<node>`` only, and it may subscribe to nothing. The grant
lasts until the token expires (read from the token itself, which the review has just vouched for), at most
``max_ttl_s``: the server then disconnects the agent, which reconnects with the token its kubelet has renewed
meanwhile, so a pod that is gone loses its connection within that time.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json

from common import subjects
from scheduler.kube.tokenreview import TokenReview

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class DenialReason(enum.StrEnum):
    """Why a connection was refused: the ``reason`` label of ``quotient_nats_auth_total`` (a fixed set)."""

    MALFORMED_REQUEST = "malformed_request"
    """The server's request did not decode or verify (never expected from a real server)."""
    NO_TOKEN = "no_token"
    """The client sent no token (an agent without its projected volume, or something else knocking)."""
    TOKEN_REJECTED = "token_rejected"
    """The API server does not honour the token for the callout's audience (forged, expired, its pod gone...)."""
    NOT_THE_AGENT = "not_the_agent"
    """A valid token of another ServiceAccount."""
    NO_POD = "no_pod"
    """The token is not bound to a pod (a TokenRequest's token, not a projected one)."""
    NO_NODE = "no_node"
    """The pod is gone or not bound to a node."""
    BAD_NODE = "bad_node"
    """The node's name cannot be a NATS subject token."""
    API_UNAVAILABLE = "api_unavailable"
    """The API server could not be asked (the agent retries; so does the server's next connection)."""


GRANTED = "granted"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The callout's settings: whose tokens, for which audience, for how long at most."""

    agent_namespace: str
    agent_account: str
    audience: str
    max_ttl_s: int

    @property
    def agent_user(self) -> str:
        return f"{SERVICE_ACCOUNT_PREFIX}{self.agent_namespace}:{self.agent_account}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """An agent pod that the token stands for: its pod, and its node when the review names it."""

    namespace: str
    pod: str
    pod_uid: str
    node: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """Publish on ``publish`` only, as the user ``name``, until ``expires_at_s``."""

    node: str
    pod: str
    name: str
    publish: tuple[str, ...]
    expires_at_s: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Denial:
    reason: DenialReason
    message: str

    @property
    def error(self) -> str:
        """What the response says, and so what the NATS server logs: the reason, then the words."""
        return f"{self.reason.value}: {self.message}"


def identify(review: TokenReview, policy: Policy) -> Identity | Denial:
    """The agent pod a reviewed token stands for, or why it stands for none."""
    if not review.authenticated:
        return Denial(reason=DenialReason.TOKEN_REJECTED, message=review.error or "the API server refused the token")
    if policy.audience not in review.audiences:
        return Denial(reason=DenialReason.TOKEN_REJECTED, message=f"the token is not for audience {policy.audience}")
    if review.username != policy.agent_user:
        return Denial(
            reason=DenialReason.NOT_THE_AGENT,
            message=f"{review.username or 'the token'} is not the agent's ServiceAccount ({policy.agent_user})",
        )
    if not review.pod_name:
        return Denial(reason=DenialReason.NO_POD, message="the token is not bound to a pod (use a projected token)")
    return Identity(
        namespace=policy.agent_namespace, pod=review.pod_name, pod_uid=review.pod_uid, node=review.node_name
    )


def grant(identity: Identity, *, node: str, token: str, now_s: float, policy: Policy) -> Grant | Denial:
    """What the agent pod ``identity``, running on ``node``, may do with a connection made at ``now_s``."""
    where = f"pod {identity.namespace}/{identity.pod}"
    if not node:
        return Denial(reason=DenialReason.NO_NODE, message=f"{where} is gone or runs on no node")
    try:
        publish = (subjects.telemetry(node), subjects.health(node))
    except ValueError as exc:
        return Denial(reason=DenialReason.BAD_NODE, message=f"{where}: {exc}")
    longest = int(now_s) + policy.max_ttl_s
    expires = token_expiry_s(token)
    return Grant(
        node=node,
        pod=f"{identity.namespace}/{identity.pod}",
        name=f"agent:{node}",
        publish=publish,
        expires_at_s=min(longest, expires) if expires else longest,
    )


def token_expiry_s(token: str) -> int:
    """The ``exp`` claim of a Kubernetes ServiceAccount token (a JWT), or 0 where it has none to read. Not a check:
    the API server has reviewed the token; this only bounds the grant by it."""
    parts = token.split(".")
    if len(parts) != 3:
        return 0
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return 0
    expiry = claims.get("exp") if isinstance(claims, dict) else None
    return expiry if isinstance(expiry, int) and not isinstance(expiry, bool) and expiry > 0 else 0

"""The NATS auth callout service: every scheduler replica answers the server's authorization requests for agents.

nats-server (``authorization { auth_callout { ... } }`` in ``deploy/base/nats/auth.conf``) sends each connecting
client that is not one of its ``auth_users`` (the scheduler and the readers, by nkey) to ``$SYS.REQ.USER.AUTH`` as
a JWT it signs, and waits for a signed answer. Every replica subscribes in one queue group, so the server gets an
answer from whichever is up, leader or standby, and agents can connect while the leader changes.

Each request: the server's JWT is verified and read (``common.natsjwt``); the client's token (the agent's projected
ServiceAccount token, sent as its CONNECT ``auth_token``) is reviewed by the API server for the callout's audience
(``scheduler.kube.tokenreview``); ``policy`` decides; the answer is a user JWT that may publish on the node's two
subjects, or an error the server logs (``<reason>: <why>``), signed by the callout's account key (the ``issuer`` the
server trusts). Every outcome is counted in ``quotient_nats_auth_total{outcome,reason}``. A request that cannot even
be read gets no answer (the server then refuses the client after its auth timeout).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter

from common import config, credentials, logs, names, natsjwt
from common.config import Setting
from common.errors import ConfigError
from common.messaging import Subscription
from scheduler.kube import kubeapi, tokenreview
from scheduler.natsauth import policy

log = logs.get("scheduler.natsauth")

AUTH_SUBJECT: Final = "$SYS.REQ.USER.AUTH"
"""Where nats-server sends authorization requests (``AuthCalloutSubject``)."""
QUEUE: Final = "quotient-auth-callout"
DEFAULT_AGENT_ACCOUNT: Final = "quotient-system/quotient-agent"
DEFAULT_MAX_TTL_S: Final = 3600.0

SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="nats_callout_issuer_seed",
        parse=config.parse_existing_file,
        default=None,
        help="the auth callout's account nkey seed (SA...): with it, this replica answers NATS's authorization "
        "requests for agents (the Secret quotient-nats-callout that `quotient nats-keys` makes)",
        metavar="FILE",
    ),
    Setting(
        name="nats_callout_agent_account",
        parse=config.parse_str,
        default=DEFAULT_AGENT_ACCOUNT,
        help="the agents' ServiceAccount, namespace/name: only its pods' tokens are admitted",
        metavar="NS/NAME",
    ),
    Setting(
        name="nats_callout_audience",
        parse=config.parse_str,
        default=names.NATS_TOKEN_AUDIENCE,
        help="the audience the agents' projected tokens carry (the DaemonSet's volume) and the TokenReview asks for",
        metavar="AUDIENCE",
    ),
    Setting(
        name="nats_callout_max_ttl",
        parse=config.parse_positive_duration_s,
        default=DEFAULT_MAX_TTL_S,
        help="an agent's connection lasts until its token expires, at most this long; then it connects again",
        metavar="DUR",
    ),
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CalloutSettings:
    issuer_seed: Path
    policy: policy.Policy


def settings_from(values: Mapping[str, object]) -> CalloutSettings | None:
    """The callout's settings (None without ``--nats-callout-issuer-seed``: this replica serves no callout)."""
    if values["nats_callout_issuer_seed"] is None:
        return None
    if not values.get("nats"):
        raise ConfigError("--nats-callout-issuer-seed: the callout is served over NATS; give --nats too")
    namespace, sep, account = str(values["nats_callout_agent_account"]).partition("/")
    if not sep or not namespace or not account or "/" in account:
        raise ConfigError(
            f"--nats-callout-agent-account: {values['nats_callout_agent_account']!r} is not namespace/name"
        )
    audience = str(values["nats_callout_audience"]).strip()
    if not audience:
        raise ConfigError("--nats-callout-audience: an audience is needed")
    return CalloutSettings(
        issuer_seed=Path(str(values["nats_callout_issuer_seed"])),
        policy=policy.Policy(
            agent_namespace=namespace,
            agent_account=account,
            audience=audience,
            max_ttl_s=max(1, round(float(str(values["nats_callout_max_ttl"])))),
        ),
    )


class RequestServer(Protocol):
    """What the callout needs of the bus (``NatsBus.serve_requests``)."""

    async def serve_requests(
        self, subject: str, *, queue: str, handler: Callable[[bytes], Awaitable[bytes | None]], concurrency: int = 64
    ) -> Subscription: ...


class CalloutMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.answers = Counter(
            "quotient_nats_auth",
            "NATS auth callout answers: granted, or denied by reason (no_token, token_rejected, not_the_agent, ...)",
            ["outcome", "reason"],
            registry=registry,
        )


class CalloutService:
    """Answers ``$SYS.REQ.USER.AUTH`` once ``start`` subscribed it (call it after each fresh connection of a bus
    that lost its subscriptions; nats-py's own reconnects keep them)."""

    def __init__(
        self,
        *,
        api: kubeapi.KubeApi,
        settings: CalloutSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._policy = settings.policy
        # Read and check the key now: a wrong file is a clear ConfigError at start, not refused agents later.
        self._seed = credentials.read_account_seed_file(settings.issuer_seed)
        self.issuer = credentials.account_public_key(self._seed)
        self._clock = clock
        self.metrics = CalloutMetrics(registry)

    async def start(self, bus: RequestServer) -> Subscription:
        subscription = await bus.serve_requests(AUTH_SUBJECT, queue=QUEUE, handler=self.answer)
        log.info("nats_auth_callout_serving", issuer=self.issuer, agents=self._policy.agent_user)
        return subscription

    async def answer(self, data: bytes) -> bytes | None:
        """The signed answer to one authorization request (None: not a request this server could have sent)."""
        now_s = self._clock()
        request = natsjwt.authorization_request(data.decode("ascii", errors="replace"), now_s=now_s)
        if isinstance(request, natsjwt.Refused):
            self._count(policy.Denial(reason=policy.DenialReason.MALFORMED_REQUEST, message=request.reason))
            log.warning("nats_auth_request_unreadable", reason=request.reason)
            return None
        outcome = await self.decide(request, now_s=now_s)
        self._count(outcome)
        issued_at_s = int(now_s)
        if isinstance(outcome, policy.Denial):
            log.info("nats_auth_denied", reason=outcome.reason.value, message=outcome.message, host=request.client_host)
            response = natsjwt.authorization_response(
                request=request, seed=self._seed, issued_at_s=issued_at_s, error=outcome.error
            )
            return response.encode("ascii")
        user = natsjwt.user_jwt(
            user_nkey=request.user_nkey,
            name=outcome.name,
            publish=outcome.publish,
            seed=self._seed,
            issued_at_s=issued_at_s,
            expires_at_s=outcome.expires_at_s,
        )
        log.debug("nats_auth_granted", node=outcome.node, pod=outcome.pod, expires_at_s=outcome.expires_at_s)
        response = natsjwt.authorization_response(request=request, seed=self._seed, issued_at_s=issued_at_s, user=user)
        return response.encode("ascii")

    async def decide(self, request: natsjwt.AuthorizationRequest, *, now_s: float) -> policy.Grant | policy.Denial:
        """Review the request's token and decide (the API calls are here; the rule is ``policy``'s)."""
        if not request.auth_token:
            return policy.Denial(reason=policy.DenialReason.NO_TOKEN, message="the client sent no token")
        review = await tokenreview.review(self._api, request.auth_token, audiences=[self._policy.audience])
        if isinstance(review, tokenreview.Unreviewed):
            return policy.Denial(reason=policy.DenialReason.API_UNAVAILABLE, message=review.reason)
        identity = policy.identify(review, self._policy)
        if isinstance(identity, policy.Denial):
            return identity
        node = identity.node
        if not node:
            found = await tokenreview.node_of_pod(
                self._api, namespace=identity.namespace, name=identity.pod, uid=identity.pod_uid
            )
            if isinstance(found, tokenreview.Unreviewed):
                return policy.Denial(reason=policy.DenialReason.API_UNAVAILABLE, message=found.reason)
            node = found
        return policy.grant(identity, node=node, token=request.auth_token, now_s=now_s, policy=self._policy)

    def _count(self, outcome: policy.Grant | policy.Denial) -> None:
        if isinstance(outcome, policy.Denial):
            self.metrics.answers.labels(outcome="denied", reason=outcome.reason.value).inc()
        else:
            self.metrics.answers.labels(outcome=policy.GRANTED, reason=policy.GRANTED).inc()

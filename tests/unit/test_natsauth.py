"""The NATS auth callout's rule (``scheduler.natsauth.policy``) as a table, and its service over a fake API.

The service is driven with requests signed as nats-server signs them (a server key), and its answers are read back
with the codec as the server reads them; the real server's acceptance is ``tests/e2e/test_nats_callout.py``'s.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from agent import app as agent_app
from common import credentials, names, natsjwt
from common.errors import ConfigError
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeUnavailable
from scheduler.kube.tokenreview import TokenReview
from scheduler.natsauth import callout, policy

NOW = 1_800_000_000
POLICY = policy.Policy(agent_namespace="quotient-system", agent_account="quotient-agent", audience="quotient-nats",
                       max_ttl_s=3600)  # fmt: skip
AGENT = POLICY.agent_user
SERVER = credentials.generate_seed("server")
Reason = policy.DenialReason


def _token(*, exp: int | None) -> str:
    claims = {"sub": AGENT, **({"exp": exp} if exp is not None else {})}
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


def _review(
    *,
    authenticated: bool = True,
    username: str = AGENT,
    audiences: tuple[str, ...] = ("quotient-nats",),
    node: str | None = "gpu-7",
    pod: str | None = "quotient-agent-abcde",
    error: str = "",
) -> TokenReview:
    extra: dict[str, tuple[str, ...]] = {}
    if pod is not None:
        extra[names.POD_NAME_EXTRA] = (pod,)
        extra[names.POD_UID_EXTRA] = ("uid-1",)
    if node is not None:
        extra[names.NODE_NAME_EXTRA] = (node,)
    return TokenReview(authenticated=authenticated, username=username, audiences=audiences, extra=extra, error=error)


@pytest.mark.parametrize(
    ("review", "reason"),
    [
        (_review(authenticated=False, error="invalid bearer token"), Reason.TOKEN_REJECTED),
        (_review(audiences=("https://kubernetes.default.svc",)), Reason.TOKEN_REJECTED),
        (_review(username="system:serviceaccount:quotient-system:quotient-scheduler"), Reason.NOT_THE_AGENT),
        (_review(username="system:serviceaccount:other:quotient-agent"), Reason.NOT_THE_AGENT),
        (_review(username="jane"), Reason.NOT_THE_AGENT),
        (_review(pod=None, node=None), Reason.NO_POD),
    ],
    ids=["not authenticated", "the API's audience", "the scheduler", "another namespace", "a person", "unbound"],
)
def test_a_token_that_is_not_a_live_agent_pods_stands_for_no_agent(review: TokenReview, reason: Reason) -> None:
    denied = policy.identify(review, POLICY)

    assert isinstance(denied, policy.Denial)
    assert denied.reason is reason
    assert denied.error.startswith(f"{reason.value}: ")


def test_an_agent_pods_token_stands_for_its_pod_and_the_node_the_review_names() -> None:
    assert policy.identify(_review(), POLICY) == policy.Identity(
        namespace="quotient-system", pod="quotient-agent-abcde", pod_uid="uid-1", node="gpu-7"
    )
    assert policy.identify(_review(node=None), POLICY) == policy.Identity(
        namespace="quotient-system", pod="quotient-agent-abcde", pod_uid="uid-1", node=""
    )


def test_the_grant_is_the_nodes_two_subjects_until_the_token_expires_at_most_the_longest_grant() -> None:
    identity = policy.Identity(namespace="quotient-system", pod="p", pod_uid="u", node="")

    soon = policy.grant(identity, node="ip-10-0-0-1.ec2.internal", token=_token(exp=NOW + 600), now_s=NOW,
                        policy=POLICY)  # fmt: skip
    late = policy.grant(identity, node="gpu-7", token=_token(exp=NOW + 86_400), now_s=NOW, policy=POLICY)
    unreadable = policy.grant(identity, node="gpu-7", token="opaque", now_s=NOW, policy=POLICY)

    assert soon == policy.Grant(
        node="ip-10-0-0-1.ec2.internal",
        pod="quotient-system/p",
        name="agent:ip-10-0-0-1.ec2.internal",
        publish=("quotient.v1.telemetry.ip-10-0-0-1~ec2~internal", "quotient.v1.health.ip-10-0-0-1~ec2~internal"),
        expires_at_s=NOW + 600,
    )
    assert isinstance(late, policy.Grant) and late.expires_at_s == NOW + 3600
    assert isinstance(unreadable, policy.Grant) and unreadable.expires_at_s == NOW + 3600


def test_a_pod_on_no_node_or_a_node_no_subject_can_name_gets_nothing() -> None:
    identity = policy.Identity(namespace="quotient-system", pod="p", pod_uid="u", node="")

    assert policy.grant(identity, node="", token="t", now_s=NOW, policy=POLICY) == policy.Denial(
        reason=Reason.NO_NODE, message="pod quotient-system/p is gone or runs on no node"
    )
    bad = policy.grant(identity, node="gpu 7", token="t", now_s=NOW, policy=POLICY)
    assert isinstance(bad, policy.Denial) and bad.reason is Reason.BAD_NODE


# --- the service over a fake API ---


class FakeApi:
    """The two calls the callout makes: a TokenReview's create and a pod's get."""

    def __init__(self, review: Mapping[str, Any] | Exception, pod: Mapping[str, Any] | None = None) -> None:
        self.review = review
        self.pod = pod
        self.asked: list[Mapping[str, Any]] = []

    async def create(self, resource: kubeapi.Resource, body: Mapping[str, Any], *, namespace: str | None = None) -> Any:
        assert (resource.group, resource.plural, namespace) == ("authentication.k8s.io", "tokenreviews", None)
        self.asked.append(body)
        if isinstance(self.review, Exception):
            raise self.review
        return {**body, "status": self.review}

    async def get(self, resource: kubeapi.Resource, *, name: str, namespace: str | None = None) -> Any:
        assert resource is kubeapi.PODS and namespace == "quotient-system"
        return self.pod


def _service(tmp_path: Path, api: FakeApi) -> tuple[callout.CalloutService, bytes, CollectorRegistry]:
    seed = credentials.generate_account_seed()
    (tmp_path / "callout.seed").write_bytes(seed)
    settings = callout.CalloutSettings(issuer_seed=tmp_path / "callout.seed", policy=POLICY)
    registry = CollectorRegistry()
    service = callout.CalloutService(
        api=cast(kubeapi.KubeApi, api), settings=settings, registry=registry, clock=lambda: NOW
    )
    return service, seed, registry


def _request(token: str) -> bytes:
    claims = {
        "sub": "A" * 56,
        "aud": natsjwt.REQUEST_AUDIENCE,
        "exp": NOW + 2,
        "nats": {
            "type": natsjwt.AUTHORIZATION_REQUEST,
            "server_id": {"name": "nats-0", "id": credentials.seed_public_key(SERVER)},
            "user_nkey": credentials.public_key(credentials.generate_user_seed()),
            "client_info": {"host": "10.1.2.3"},
            "connect_opts": {"auth_token": token} if token else {},
        },
    }
    return natsjwt.encode(claims, seed=SERVER, issued_at_s=NOW).encode()


def _answer(service: callout.CalloutService, request: bytes) -> natsjwt.Claims:
    answer = asyncio.run(service.answer(request))
    assert answer is not None
    claims = natsjwt.decode(answer.decode(), expected_type=natsjwt.AUTHORIZATION_RESPONSE, now_s=NOW)
    assert isinstance(claims, natsjwt.Claims)
    assert claims.issuer == service.issuer
    assert claims.audience == credentials.seed_public_key(SERVER)
    return claims


def _count(registry: CollectorRegistry, outcome: str, reason: str) -> float:
    value = registry.get_sample_value("quotient_nats_auth_total", {"outcome": outcome, "reason": reason})
    return value or 0.0


def _status(**fields: Any) -> dict[str, Any]:
    extra = {names.POD_NAME_EXTRA: ["quotient-agent-abcde"], names.POD_UID_EXTRA: ["uid-1"]}
    return {"authenticated": True, "user": {"username": AGENT, "extra": extra}, "audiences": ["quotient-nats"]} | fields


def test_an_agents_token_is_reviewed_for_the_callouts_audience_and_answered_with_its_nodes_subjects(
    tmp_path: Path,
) -> None:
    status = _status()
    status["user"]["extra"][names.NODE_NAME_EXTRA] = ["gpu-7"]
    api = FakeApi(status)
    service, _, registry = _service(tmp_path, api)
    token = _token(exp=NOW + 1200)

    claims = _answer(service, _request(token))

    assert api.asked[0]["spec"] == {"token": token, "audiences": ["quotient-nats"]}
    user = natsjwt.decode(str(claims.nats["jwt"]), expected_type=natsjwt.USER, now_s=NOW)
    assert isinstance(user, natsjwt.Claims)
    assert (user.subject, user.name, user.expires_at_s) == (claims.subject, "agent:gpu-7", NOW + 1200)
    assert user.nats["pub"] == {"allow": ["quotient.v1.telemetry.gpu-7", "quotient.v1.health.gpu-7"]}
    assert user.nats["sub"] == {"deny": [">"]}
    assert _count(registry, "granted", "granted") == 1


def test_where_the_review_names_no_node_the_pods_own_node_is_granted(tmp_path: Path) -> None:
    pod = {"metadata": {"uid": "uid-1"}, "spec": {"nodeName": "gpu-3"}}
    service, _, _ = _service(tmp_path, FakeApi(_status(), pod))

    claims = _answer(service, _request(_token(exp=NOW + 1200)))

    user = natsjwt.decode(str(claims.nats["jwt"]), expected_type=natsjwt.USER, now_s=NOW)
    assert isinstance(user, natsjwt.Claims) and user.name == "agent:gpu-3"


@pytest.mark.parametrize(
    ("api", "token", "reason"),
    [
        (FakeApi(_status()), "", Reason.NO_TOKEN),
        (FakeApi(KubeUnavailable("503")), "t", Reason.API_UNAVAILABLE),
        (FakeApi({"authenticated": False, "error": "token has expired"}), "t", Reason.TOKEN_REJECTED),
        (FakeApi(_status(), {"metadata": {"uid": "another"}, "spec": {"nodeName": "gpu-3"}}), "t", Reason.NO_NODE),
    ],
    ids=["no token", "API down", "expired", "pod replaced"],
)
def test_a_refusal_says_why_and_is_counted_by_reason(tmp_path: Path, api: FakeApi, token: str, reason: Reason) -> None:
    service, _, registry = _service(tmp_path, api)

    claims = _answer(service, _request(token))

    assert str(claims.nats["error"]).startswith(f"{reason.value}: ")
    assert "jwt" not in claims.nats
    assert _count(registry, "denied", reason.value) == 1


def test_a_request_that_is_not_the_servers_gets_no_answer_and_is_counted(tmp_path: Path) -> None:
    service, seed, registry = _service(tmp_path, FakeApi(_status()))
    # Signed by an account (ours, even), not by a server.
    forged = natsjwt.encode({"sub": "x", "aud": natsjwt.REQUEST_AUDIENCE, "nats": {"type": "authorization_request"}},
                            seed=seed, issued_at_s=NOW)  # fmt: skip

    assert asyncio.run(service.answer(forged.encode())) is None
    assert asyncio.run(service.answer(b"\xff garbage")) is None
    assert _count(registry, "denied", Reason.MALFORMED_REQUEST.value) == 2


def test_the_callout_settings_need_nats_and_an_account_of_the_form_namespace_slash_name(tmp_path: Path) -> None:
    seed = tmp_path / "callout.seed"
    values: dict[str, object] = {
        "nats": "nats://127.0.0.1:4222",
        "nats_callout_issuer_seed": seed,
        "nats_callout_agent_account": "gpu-system/agent",
        "nats_callout_audience": "quotient-nats",
        "nats_callout_max_ttl": 900.0,
    }

    made = callout.settings_from(values)
    assert made is not None and made.policy.agent_user == "system:serviceaccount:gpu-system:agent"
    assert made.policy.max_ttl_s == 900
    assert callout.settings_from(values | {"nats_callout_issuer_seed": None}) is None
    with pytest.raises(ConfigError, match="--nats-callout-agent-account"):
        callout.settings_from(values | {"nats_callout_agent_account": "agent"})
    with pytest.raises(ConfigError, match="give --nats too"):
        callout.settings_from(values | {"nats": None})


# --- how the agent authenticates ---


def test_the_agent_uses_what_it_is_given_else_the_mounted_token_else_nothing(tmp_path: Path) -> None:
    mounted = tmp_path / "token"
    seed = tmp_path / "agent.seed"

    def chosen(token: Path | None, given_seed: Path | None) -> tuple[Path | None, Path | None]:
        return agent_app.nats_credentials(
            {"nats_token_file": token, "nats_nkey_seed": given_seed}, default_token=mounted
        )

    assert chosen(None, None) == (None, None)
    assert chosen(None, seed) == (None, seed)
    mounted.write_text("t")
    assert chosen(None, None) == (mounted, None)
    assert chosen(None, seed) == (None, seed)  # a seed given wins over the token a fallback DaemonSet still mounts
    assert chosen(tmp_path / "elsewhere", None) == (tmp_path / "elsewhere", None)
    with pytest.raises(ConfigError, match="give one"):
        chosen(mounted, seed)

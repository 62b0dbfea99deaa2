"""The NATS JWT codec (``common.natsjwt``): what the auth callout reads from the server and writes back.

The known answer comes from nats-io/jwt's own encoding rules (``v2/claims.go``): the header, the ``jti`` as the
SHA-512/256 of the standard claims, the signature over ``header.claims``; the server's acceptance of what this
module writes is proven against a real nats-server in ``tests/e2e/test_nats_callout.py``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from common import credentials, natsjwt

NOW = 1_800_000_000
ISSUER = credentials.generate_account_seed()
SERVER = credentials.generate_seed("server")


def _parts(token: str) -> list[Any]:
    return [json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))) for part in token.split(".")[:2]]


def _request(*, token: str = "sa-token", audience: str = natsjwt.REQUEST_AUDIENCE, seed: bytes = SERVER) -> str:
    server = credentials.seed_public_key(seed)
    claims = {
        "sub": credentials.account_public_key(ISSUER),
        "aud": audience,
        "exp": NOW + 2,
        "nats": {
            "type": natsjwt.AUTHORIZATION_REQUEST,
            "server_id": {"name": "nats-0", "host": "0.0.0.0", "id": server, "version": "2.15.1"},
            "user_nkey": credentials.public_key(credentials.generate_user_seed()),
            "client_info": {"host": "10.0.0.7", "id": 9, "user": "[REDACTED]", "kind": "Client", "type": "nats"},
            "connect_opts": {"auth_token": token, "name": "quotient-agent-node-a", "lang": "python3", "protocol": 1},
        },
    }
    return natsjwt.encode(claims, seed=seed, issued_at_s=NOW)


def test_a_token_is_written_as_nats_io_jwt_writes_it() -> None:
    token = natsjwt.encode({"sub": "UXYZ", "name": "n", "nats": {"type": "user"}}, seed=ISSUER, issued_at_s=NOW)

    header, body = _parts(token)
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    standard = {key: body[key] for key in ("iat", "iss", "name", "sub")}
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode()).digest()
    assert body["jti"] == base64.b32encode(digest).decode().rstrip("=")
    assert body["iss"] == credentials.account_public_key(ISSUER)
    assert body["nats"] == {"type": "user", "version": 2}
    signed, _, signature = token.rpartition(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    assert credentials.verify(body["iss"], signed.encode(), raw)


def test_the_servers_request_is_read_with_the_clients_token_and_the_key_to_answer_to() -> None:
    request = natsjwt.authorization_request(_request(), now_s=NOW)

    assert isinstance(request, natsjwt.AuthorizationRequest)
    assert request.server_id == credentials.seed_public_key(SERVER)
    assert request.auth_token == "sa-token"
    assert request.client_host == "10.0.0.7"
    assert request.client_name == "quotient-agent-node-a"
    assert credentials.public_key_kind(request.user_nkey) == "user"


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda token: token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB"), "signature"),
        (lambda token: token.replace(".", "", 1), "three parts"),
        (lambda token: "x" * (natsjwt.MAX_TOKEN_BYTES + 1), "exceeds"),
        (lambda token: "e30.e30.e30", "header"),
    ],
    ids=["tampered signature", "two parts", "too large", "no algorithm"],
)
def test_a_token_that_is_not_a_signed_nats_jwt_is_refused_with_the_reason(mangle: Any, reason: str) -> None:
    refused = natsjwt.authorization_request(mangle(_request()), now_s=NOW)

    assert isinstance(refused, natsjwt.Refused)
    assert reason in refused.reason


def test_a_request_signed_by_an_account_not_a_server_is_refused() -> None:
    refused = natsjwt.authorization_request(_request(seed=credentials.generate_account_seed()), now_s=NOW)

    assert refused == natsjwt.Refused(reason="authorization_request claims are issued by a server key")


def test_a_request_for_another_audience_or_past_its_expiry_is_refused() -> None:
    assert isinstance(natsjwt.authorization_request(_request(audience="elsewhere"), now_s=NOW), natsjwt.Refused)
    assert natsjwt.authorization_request(_request(), now_s=NOW + 3) == natsjwt.Refused(reason="claim is expired")


def test_a_user_claim_is_not_taken_for_a_request() -> None:
    user = natsjwt.user_jwt(
        user_nkey="U" * 56, name="a", publish=["x"], seed=ISSUER, issued_at_s=NOW, expires_at_s=NOW + 60
    )

    assert natsjwt.decode(user, expected_type=natsjwt.AUTHORIZATION_REQUEST, now_s=NOW) == natsjwt.Refused(
        reason="the claim is not of type authorization_request"
    )


def test_the_user_jwt_grants_publish_on_the_subjects_given_and_no_subscription() -> None:
    request = natsjwt.authorization_request(_request(), now_s=NOW)
    assert isinstance(request, natsjwt.AuthorizationRequest)
    subjects = ["quotient.v1.telemetry.node-a", "quotient.v1.health.node-a"]

    user = natsjwt.user_jwt(
        user_nkey=request.user_nkey,
        name="agent:node-a",
        publish=subjects,
        seed=ISSUER,
        issued_at_s=NOW,
        expires_at_s=NOW + 600,
    )

    claims = natsjwt.decode(user, expected_type=natsjwt.USER, now_s=NOW)
    assert isinstance(claims, natsjwt.Claims)
    assert (claims.subject, claims.audience, claims.name) == (request.user_nkey, "$G", "agent:node-a")
    assert claims.expires_at_s == NOW + 600
    assert claims.nats["pub"] == {"allow": subjects}
    assert claims.nats["sub"] == {"deny": [">"]}
    assert (claims.nats["subs"], claims.nats["data"], claims.nats["payload"]) == (-1, -1, -1)


def test_the_response_carries_the_user_or_the_error_for_the_server_that_asked() -> None:
    request = natsjwt.authorization_request(_request(), now_s=NOW)
    assert isinstance(request, natsjwt.AuthorizationRequest)

    denied = natsjwt.authorization_response(request=request, seed=ISSUER, issued_at_s=NOW, error="no_node: why")
    granted = natsjwt.authorization_response(request=request, seed=ISSUER, issued_at_s=NOW, user="a.b.c")

    for token, payload in ((denied, {"error": "no_node: why"}), (granted, {"jwt": "a.b.c"})):
        claims = natsjwt.decode(token, expected_type=natsjwt.AUTHORIZATION_RESPONSE, now_s=NOW)
        assert isinstance(claims, natsjwt.Claims)
        assert (claims.subject, claims.audience) == (request.user_nkey, request.server_id)
        assert {key: claims.nats[key] for key in payload} == payload
    with pytest.raises(ValueError, match="exactly one"):
        natsjwt.authorization_response(request=request, seed=ISSUER, issued_at_s=NOW)

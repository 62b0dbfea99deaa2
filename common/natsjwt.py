"""NATS JWTs, as the auth callout exchanges them: the server's authorization request in, a user JWT wrapped in an
authorization response out.

Written here, over ``common.credentials`` (the one module that holds nkeys), because no well-kept Python library
does it: ``nats-jwt`` on PyPI says of itself that it is "not well-tested and in the development stage" and pins
old ``pytz`` and ``pycryptodome``; ``nats-callout`` pins a beta of ``adaptix`` and brings PyJWT, which knows no
``ed25519-nkey`` algorithm. The format is small and fixed by nats-io/jwt v2 (``v2/claims.go``, ``header.go``,
``authorization_claims.go``, ``user_claims.go``), which this module follows:

- three base64url (unpadded) parts: the header ``{"typ":"JWT","alg":"ed25519-nkey"}``, the claims, and the Ed25519
  signature of ``header.claims`` by the issuer's key;
- the claims are the standard ``aud``, ``exp``, ``jti``, ``iat``, ``iss``, ``name``, ``nbf``, ``sub`` and a ``nats``
  object holding the claim's ``type`` and ``version`` 2; ``jti`` is the SHA-512/256 of the standard claims (``jti``
  empty) in base32 without padding, as the Go library computes it (the server does not check it).

Decoding checks what the Go decoder checks (three parts, header, signature by the key named in ``iss``, the issuer's
kind) and what the server's callout then checks of a claim (its type, expiry and not-before), and answers a value:
the claims, or why they were refused. Time is an argument: nothing here reads a clock.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from common import credentials

HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}
VERSION: Final = 2
MAX_TOKEN_BYTES: Final = 1024 * 1024  # nats-io/jwt's MaxTokenSize
AUTHORIZATION_REQUEST: Final = "authorization_request"
AUTHORIZATION_RESPONSE: Final = "authorization_response"
USER: Final = "user"
REQUEST_AUDIENCE: Final = "nats-authorization-request"
"""The ``aud`` of every request the server sends (``AuthRequestSubject`` in the server)."""
GLOBAL_ACCOUNT: Final = "$G"
"""The account users of a server without accounts belong to; a user JWT names it as its ``aud`` (config mode)."""
NO_LIMIT: Final = -1
_STANDARD = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")  # ClaimsData's fields, in its order
_ISSUERS = {AUTHORIZATION_REQUEST: "server", AUTHORIZATION_RESPONSE: "account", USER: "account"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """A token that is not a valid NATS JWT of the kind expected, and why."""

    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """A decoded, verified JWT: its standard claims and its ``nats`` object."""

    issuer: str
    subject: str
    audience: str
    issued_at_s: int
    expires_at_s: int
    """0: no expiry."""
    name: str
    nats: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AuthorizationRequest:
    """What the server asks of the callout about one connecting client (``jwt.AuthorizationRequest``)."""

    server_id: str
    """The server's public key (``N...``): the response's audience."""
    server_name: str
    user_nkey: str
    """A user key the server made for this connection: the subject of the response and of the user JWT."""
    client_host: str
    client_name: str
    auth_token: str
    """The client's ``auth_token`` of its CONNECT: what the agent sends its ServiceAccount token as."""
    expires_at_s: int


def encode(claims: Mapping[str, Any], *, seed: bytes, issued_at_s: int) -> str:
    """A signed JWT of ``claims`` (``sub``, ``aud``, ``exp``, ``name`` and a ``nats`` object with its ``type``), issued
    by the key of ``seed`` at ``issued_at_s``: ``iss``, ``iat``, ``jti`` and the ``nats`` version are filled in.
    ``ConfigError`` if ``seed`` is not an nkey seed."""
    issuer = credentials.seed_public_key(seed)
    standard = {key: claims[key] for key in _STANDARD if claims.get(key)}
    standard.update(iss=issuer, iat=issued_at_s)
    standard.pop("jti", None)
    digest = hashlib.new("sha512_256", _go_json({key: standard[key] for key in _STANDARD if key in standard}))
    standard["jti"] = base64.b32encode(digest.digest()).decode("ascii").rstrip("=")
    body = {key: standard[key] for key in _STANDARD if key in standard}
    body["nats"] = {**dict(claims.get("nats") or {}), "version": VERSION}
    signed = f"{_b64(_go_json(HEADER))}.{_b64(_go_json(body))}"
    signature = credentials.sign(seed, signed.encode("ascii"))
    return f"{signed}.{_b64(signature)}"


def decode(token: str, *, expected_type: str, now_s: float) -> Claims | Refused:
    """The claims of ``token`` if it is a NATS JWT of ``expected_type``, signed by its issuer, of the issuer kind that
    type has (a server for a request, an account otherwise), and valid at ``now_s``; else why not."""
    if len(token) > MAX_TOKEN_BYTES:
        return Refused(reason=f"token of {len(token)} bytes exceeds {MAX_TOKEN_BYTES}")
    parts = token.split(".")
    if len(parts) != 3:
        return Refused(reason="not a JWT: expected three parts")
    header, body, signature = (_unb64(part) for part in parts)
    if header is None or body is None or signature is None:
        return Refused(reason="not a JWT: a part is not base64url")
    head, claims = _json_object(header), _json_object(body)
    if head is None or claims is None:
        return Refused(reason="not a JWT: a part is not a JSON object")
    if str(head.get("typ", "")).upper() != "JWT" or str(head.get("alg", "")).lower() != HEADER["alg"]:
        return Refused(reason=f"unsupported JWT header {head}")
    issuer = claims.get("iss")
    if not isinstance(issuer, str) or not credentials.verify(issuer, f"{parts[0]}.{parts[1]}".encode(), signature):
        return Refused(reason="signature does not verify with the key named as issuer")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != expected_type:
        return Refused(reason=f"the claim is not of type {expected_type}")
    if credentials.public_key_kind(issuer) != _ISSUERS.get(expected_type):
        return Refused(reason=f"{expected_type} claims are issued by a {_ISSUERS.get(expected_type)} key")
    expires, not_before = _int(claims.get("exp")), _int(claims.get("nbf"))
    if expires is None or not_before is None:
        return Refused(reason="exp and nbf must be whole seconds")
    if expires and now_s > expires:
        return Refused(reason="claim is expired")
    if not_before and not_before > now_s:
        return Refused(reason="claim is not yet valid")
    return Claims(
        issuer=issuer,
        subject=str(claims.get("sub") or ""),
        audience=str(claims.get("aud") or ""),
        issued_at_s=_int(claims.get("iat")) or 0,
        expires_at_s=expires,
        name=str(claims.get("name") or ""),
        nats=nats,
    )


def authorization_request(token: str, *, now_s: float) -> AuthorizationRequest | Refused:
    """The server's authorization request, verified (signed by the server key it names) and read."""
    claims = decode(token, expected_type=AUTHORIZATION_REQUEST, now_s=now_s)
    if isinstance(claims, Refused):
        return claims
    if claims.audience != REQUEST_AUDIENCE:
        return Refused(reason=f"a request's audience is {REQUEST_AUDIENCE!r}, not {claims.audience!r}")
    server, client, connect = (_mapping(claims.nats.get(key)) for key in ("server_id", "client_info", "connect_opts"))
    user_nkey = str(claims.nats.get("user_nkey") or "")
    if credentials.public_key_kind(user_nkey) != "user":
        return Refused(reason="the request names no user public key for the connection")
    if server.get("id") != claims.issuer:
        return Refused(reason="the request is not signed by the server it names")
    return AuthorizationRequest(
        server_id=claims.issuer,
        server_name=str(server.get("name") or ""),
        user_nkey=user_nkey,
        client_host=str(client.get("host") or ""),
        client_name=str(client.get("name") or connect.get("name") or ""),
        auth_token=str(connect.get("auth_token") or ""),
        expires_at_s=claims.expires_at_s,
    )


def user_jwt(
    *,
    user_nkey: str,
    name: str,
    publish: Sequence[str],
    seed: bytes,
    issued_at_s: int,
    expires_at_s: int,
    account: str = GLOBAL_ACCOUNT,
) -> str:
    """A user JWT for the connection ``user_nkey``: publish on ``publish`` only, subscribe nothing, until
    ``expires_at_s`` (the server disconnects the client then), in ``account``; signed by the issuer account's
    ``seed``. Limits are those ``jwt.NewUserClaims`` gives (none)."""
    permissions = {
        "pub": {"allow": list(publish)} if publish else {"deny": [">"]},
        "sub": {"deny": [">"]},
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        "payload": NO_LIMIT,
        "type": USER,
    }
    claims = {"sub": user_nkey, "aud": account, "name": name, "exp": expires_at_s, "nats": permissions}
    return encode(claims, seed=seed, issued_at_s=issued_at_s)


def authorization_response(
    *, request: AuthorizationRequest, seed: bytes, issued_at_s: int, user: str = "", error: str = ""
) -> str:
    """The answer to ``request``: the user JWT that admits the client, or the ``error`` that refuses it (the server
    logs it), signed by the issuer account's ``seed``. Exactly one of ``user`` and ``error``."""
    if bool(user) == bool(error):
        raise ValueError("an authorization response carries a user JWT or an error, exactly one")
    nats = {"type": AUTHORIZATION_RESPONSE, **({"jwt": user} if user else {"error": error})}
    claims = {"sub": request.user_nkey, "aud": request.server_id, "nats": nats}
    return encode(claims, seed=seed, issued_at_s=issued_at_s)


def _go_json(value: object) -> bytes:
    """JSON as Go's ``json.Marshal`` writes it: compact, UTF-8, with ``<``, ``>`` and ``&`` escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028")):
        text = text.replace(char, escaped)
    return text.replace("\u2029", "\\u2029").encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(part: str) -> bytes | None:
    if not part.isascii():
        return None
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except ValueError:
        return None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else None

"""``TokenReview`` (``authentication.k8s.io/v1``, create only): whether a bearer token is one the emulator issued and
still honours, for which audiences, and whom it stands for.

A service that authenticates its clients with Kubernetes tokens asks the API server this way; Quotient's NATS auth
callout does, for the agents' projected ServiceAccount tokens. As on a real server the review is always answered
``201`` with its status: ``authenticated: false`` and an ``error`` for a token that does not hold (unknown, expired,
its ServiceAccount or its pod gone, issued for other audiences), else the user, its uid and groups, the audiences
matched and ``extra`` (for a token bound to a pod: the pod, the node and the token's id). A review without a token is
``400``, as the API server's REST handler answers. Who may ask is RBAC's business (``create`` on ``tokenreviews``,
which ``system:auth-delegator`` grants); nothing is stored.
"""

from __future__ import annotations

from typing import Any

from quotient.emulator import authn, status
from quotient.emulator.objects import Obj, timestamp

GROUP = "authentication.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "tokenreviews"
KIND = "TokenReview"


def review(tokens: authn.Tokens, body: Any, *, now_s: float) -> Obj | status.Failure:
    """The answer to ``POST /apis/authentication.k8s.io/v1/tokenreviews`` with ``body``."""
    if not isinstance(body, dict):
        return status.bad_request("the body of the request must be a TokenReview object")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        return status.bad_request("spec must be an object")
    token = spec.get("token")
    if not isinstance(token, str) or not token.strip():
        return status.bad_request("token is required for TokenReview in authentication")
    raw_audiences = spec.get("audiences") or []
    if not isinstance(raw_audiences, list) or not all(isinstance(item, str) for item in raw_audiences):
        return status.bad_request("spec.audiences must be a list of strings")
    audiences = [str(item) for item in raw_audiences]
    answer = tokens.review(token, audiences)
    review_status: Obj
    if isinstance(answer, authn.Unauthorized):
        review_status = {"authenticated": False, "user": {}, "error": answer.message}
    else:
        user: Obj = {"username": answer.user.name, "groups": list(answer.user.groups)}
        if answer.uid:
            user["uid"] = answer.uid
        if answer.extra:
            user["extra"] = {key: list(values) for key, values in answer.extra.items()}
        review_status = {"authenticated": True, "user": user, "audiences": list(answer.audiences)}
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    return {
        "kind": KIND,
        "apiVersion": API_VERSION,
        "metadata": {**dict(metadata or {}), "creationTimestamp": timestamp(now_s)},
        "spec": {"token": token, **({"audiences": audiences} if audiences else {})},
        "status": review_status,
    }

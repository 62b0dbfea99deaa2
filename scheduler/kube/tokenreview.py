"""Who a bearer token stands for, as the API server says (``TokenReview``), and the node a pod runs on.

The NATS auth callout (``scheduler.natsauth``) admits an agent by its pod's projected ServiceAccount token: it asks
the API server to review the token for the audience the DaemonSet's volume names, and reads the pod binding of the
answer. Kubernetes 1.30 and later put the node in the review's ``status.user.extra``
(``authentication.kubernetes.io/node-name``); before that only the pod is there, and its ``spec.nodeName`` is read
(``node_of_pod``). The raw JSON of both answers is read here, at the Kubernetes edge, into records; a fault of the API
is a value (``Unreviewed``), since one agent's connection must never break the callout.

Rights: ``create`` on ``tokenreviews.authentication.k8s.io`` (what ``system:auth-delegator`` grants) and ``get`` on
``pods`` (which the binder has already).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from common import names
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeError

TOKEN_REVIEWS = kubeapi.Resource(
    group="authentication.k8s.io", version="v1", plural="tokenreviews", kind="TokenReview", namespaced=False
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TokenReview:
    """The API server's answer about a token (``TokenReviewStatus``)."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    error: str = ""

    def first(self, key: str) -> str:
        """The first value of ``extra[key]``, or ""."""
        values = self.extra.get(key) or ()
        return values[0] if values else ""

    @property
    def pod_name(self) -> str:
        return self.first(names.POD_NAME_EXTRA)

    @property
    def pod_uid(self) -> str:
        return self.first(names.POD_UID_EXTRA)

    @property
    def node_name(self) -> str:
        return self.first(names.NODE_NAME_EXTRA)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unreviewed:
    """The API did not answer usefully (unavailable, forbidden, malformed): nothing is known of the token."""

    reason: str


async def review(api: kubeapi.KubeApi, token: str, *, audiences: Sequence[str]) -> TokenReview | Unreviewed:
    """Ask the API server who ``token`` stands for, for ``audiences``."""
    body = {
        "apiVersion": TOKEN_REVIEWS.api_version,
        "kind": TOKEN_REVIEWS.kind,
        "spec": {"token": token, "audiences": list(audiences)},
    }
    try:
        answer = await api.create(TOKEN_REVIEWS, body)
    except KubeError as exc:
        return Unreviewed(reason=f"the TokenReview failed: {exc}")
    return decode(answer)


def decode(answer: Mapping[str, object]) -> TokenReview | Unreviewed:
    """A ``TokenReview`` as the API answered it, read into a record."""
    status = answer.get("status")
    if not isinstance(status, dict):
        return Unreviewed(reason="the TokenReview came back without a status")
    user = _mapping(status.get("user"))
    extra = {
        str(key): tuple(str(value) for value in values)
        for key, values in _mapping(user.get("extra")).items()
        if isinstance(values, list)
    }
    audiences = status.get("audiences")
    return TokenReview(
        authenticated=status.get("authenticated") is True,
        username=str(user.get("username") or ""),
        audiences=tuple(str(audience) for audience in audiences) if isinstance(audiences, list) else (),
        extra=extra,
        error=str(status.get("error") or ""),
    )


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


async def node_of_pod(api: kubeapi.KubeApi, *, namespace: str, name: str, uid: str) -> str | Unreviewed:
    """The node the pod ``namespace/name`` (with uid ``uid``) is bound to; "" when it is gone, was replaced by another
    of its name, or is not bound."""
    try:
        pod = await api.get(kubeapi.PODS, name=name, namespace=namespace)
    except KubeError as exc:
        return Unreviewed(reason=f"reading pod {namespace}/{name} failed: {exc}")
    if pod is None:
        return ""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or (uid and meta.get("uid") != uid):
        return ""
    return str(spec.get("nodeName") or "")

"""Admission webhooks: the emulator calls the Mutating and Validating WebhookConfigurations stored in it.

As a real API server does, on each create or update that a webhook's rules, namespace selector and object selector
match, it POSTs an ``admission.k8s.io/v1`` ``AdmissionReview`` over HTTPS, trusting only the configuration's
``caBundle``, and applies the returned JSONPatch or rejects the request with the webhook's message ("admission
webhook "x" denied the request: ..."), passing the webhook's warnings on to the client. A webhook that cannot be
reached fails the request with 500 unless its ``failurePolicy`` is ``Ignore``. A ``service`` client config is
routed to an address the test or the demo gives (``route_service``), while the TLS server name stays
``<service>.<namespace>.svc`` so the certificate is checked as in a cluster. Mutating webhooks run in the order of
their configurations' names, each seeing the previous one's result; the request carries no name when the object
has only ``generateName``, as in a real cluster.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import ssl
import uuid
from typing import Any

import aiohttp

from common import logs
from quotient.emulator import patches, selectors, status
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, labels_of
from quotient.emulator.store import Store

log = logs.get("emulator.admission")

MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"
DEFAULT_TIMEOUT_S = 10  # admissionregistration/v1 default timeoutSeconds


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attributes:
    """What a webhook is told about a request."""

    kind: Kind
    operation: str  # CREATE, UPDATE, DELETE
    namespace: str
    name: str
    subresource: str
    obj: Obj | None
    old: Obj | None
    dry_run: bool


class _CallFailed(Exception):
    """The webhook could not be called or answered nonsense; handled by its failurePolicy."""


class Webhooks:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._routes: dict[tuple[str, str], str] = {}
        self._session: aiohttp.ClientSession | None = None

    def route_service(self, namespace: str, name: str, address: str) -> None:
        """Send calls for the webhook service ``namespace/name`` to ``address`` (``host:port``)."""
        self._routes[(namespace, name)] = address

    def configured(self) -> bool:
        return bool(self._store.count(MUTATING) or self._store.count(VALIDATING))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def mutate(self, attributes: Attributes, warnings: list[str] | None = None) -> Obj | status.Failure:
        """The object after every matching mutating webhook (the input when none matches); the webhooks' warnings
        are appended to ``warnings``."""
        obj = attributes.obj
        assert obj is not None
        for config in self._store.objects(MUTATING):
            for hook in config.get("webhooks") or []:
                if not isinstance(hook, dict) or not self._matches(hook, dataclasses.replace(attributes, obj=obj)):
                    continue
                outcome = await self._call(hook, dataclasses.replace(attributes, obj=obj), True, warnings)
                if isinstance(outcome, status.Failure):
                    return outcome
                if outcome is not None:
                    obj = outcome
        return obj

    async def validate(self, attributes: Attributes, warnings: list[str] | None = None) -> status.Failure | None:
        """The first refusal of a matching validating webhook, or None; their warnings go into ``warnings``."""
        for config in self._store.objects(VALIDATING):
            for hook in config.get("webhooks") or []:
                if not isinstance(hook, dict) or not self._matches(hook, attributes):
                    continue
                outcome = await self._call(hook, attributes, False, warnings)
                if isinstance(outcome, status.Failure):
                    return outcome
        return None

    # Matching

    def _matches(self, hook: Obj, attributes: Attributes) -> bool:
        if not any(_rule_matches(rule, attributes) for rule in hook.get("rules") or [] if isinstance(rule, dict)):
            return False
        object_selector = hook.get("objectSelector")
        if object_selector is not None:
            selector = selectors.from_object(object_selector)
            candidates = [obj for obj in (attributes.obj, attributes.old) if obj is not None]
            if not any(selector.matches(labels_of(obj)) for obj in candidates):
                return False
        namespace_selector = hook.get("namespaceSelector")
        if namespace_selector is not None:
            if attributes.kind.namespaced:
                namespace = self._store.get("namespaces", "", attributes.namespace)
                labels = labels_of(namespace) if namespace is not None else {}
            elif attributes.kind.storage == "namespaces":
                labels = labels_of(attributes.obj or attributes.old or {})
            else:
                return True
            if not selectors.from_object(namespace_selector).matches(labels):
                return False
        return True

    # Calling

    async def _call(
        self, hook: Obj, attributes: Attributes, mutating: bool, warnings: list[str] | None
    ) -> Obj | status.Failure | None:
        name = str(hook.get("name", ""))
        try:
            response = await self._post(hook, attributes)
        except _CallFailed as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("webhook_ignored", webhook=name, error=str(exc))
                return None
            return status.internal(f'failed calling webhook "{name}": {exc}')
        given = response.get("warnings")
        if warnings is not None and isinstance(given, list):
            # The API server passes a webhook's warnings on to the client, allowed or not (kubectl prints both).
            warnings.extend(str(text) for text in given if text)
        if not response.get("allowed"):
            return _denied(name, response.get("status"))
        patch = response.get("patch")
        if not mutating or not patch:
            return None
        if response.get("patchType") != "JSONPatch":
            return status.internal(f'received invalid webhook response from "{name}": patchType must be JSONPatch')
        try:
            operations = json.loads(base64.b64decode(patch))
        except (ValueError, binascii.Error) as exc:
            return status.internal(f'received invalid webhook response from "{name}": {exc}')
        assert attributes.obj is not None
        patched = patches.json_patch(attributes.obj, operations)
        if isinstance(patched, status.Failure):
            return status.internal(f'failed to apply the patch of webhook "{name}": {patched.message}')
        return patched

    def _endpoint(self, hook: Obj) -> tuple[str, str | None]:
        """The URL to POST to and the TLS server name to check."""
        client = hook.get("clientConfig") or {}
        if client.get("url"):
            return str(client["url"]), None
        service = client.get("service") or {}
        namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
        path, port = str(service.get("path") or "/"), int(service.get("port") or 443)
        address = self._routes.get((namespace, name))
        if address is None:
            raise _CallFailed(f"service {namespace}/{name} is not routed (Emulator.route_service)")
        return f"https://{address}{path}", f"{name}.{namespace}.svc" if port else None

    async def _post(self, hook: Obj, attributes: Attributes) -> Obj:
        versions = hook.get("admissionReviewVersions") or []
        if "v1" not in versions:
            raise _CallFailed(f"none of the admissionReviewVersions {versions} is supported (v1)")
        url, server_name = self._endpoint(hook)
        timeout_s = int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
        context = _tls_context((hook.get("clientConfig") or {}).get("caBundle"))
        request_uid = str(uuid.uuid4())
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": _request(attributes, request_uid),
        }
        if self._session is None:
            self._session = aiohttp.ClientSession()
        target = f"{url}{'&' if '?' in url else '?'}timeout={timeout_s}s"
        try:
            async with self._session.post(
                target,
                json=review,
                ssl=context if url.startswith("https://") else False,
                server_hostname=server_name,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as answer:
                if answer.status != 200:
                    raise _CallFailed(f'Post "{target}": HTTP {answer.status}')
                body = await answer.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError, ssl.SSLError) as exc:
            raise _CallFailed(f'failed to call webhook: Post "{target}": {exc or type(exc).__name__}') from exc
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict):
            raise _CallFailed("the webhook answered no AdmissionReview response")
        if response.get("uid") != request_uid:
            raise _CallFailed(f"expected response.uid={request_uid!r}, got {response.get('uid')!r}")
        return response


def _rule_matches(rule: Obj, attributes: Attributes) -> bool:
    operations = rule.get("operations") or []
    if "*" not in operations and attributes.operation not in operations:
        return False
    kind = attributes.kind
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and kind.group not in groups:
        return False
    if "*" not in versions and kind.version not in versions:
        return False
    resource = f"{kind.plural}/{attributes.subresource}" if attributes.subresource else kind.plural
    allowed = rule.get("resources") or []
    wanted = {resource, "*/*"}
    if attributes.subresource:
        wanted |= {f"{kind.plural}/*", f"*/{attributes.subresource}"}
    else:
        wanted.add("*")
    if not wanted & set(allowed):
        return False
    scope = rule.get("scope", "*")
    return bool(scope == "*" or (scope == "Namespaced") == kind.namespaced)


def _request(attributes: Attributes, uid: str) -> Obj:
    kind = attributes.kind
    gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
    gvr = {"group": kind.group, "version": kind.version, "resource": kind.plural}
    options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
    request: Obj = {
        "uid": uid,
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": attributes.name,
        "namespace": attributes.namespace,
        "operation": attributes.operation,
        "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
        "object": attributes.obj,
        "oldObject": attributes.old,
        "dryRun": attributes.dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": options.get(attributes.operation, "CreateOptions")},
    }
    if attributes.subresource:
        request["subResource"] = request["requestSubResource"] = attributes.subresource
    if not attributes.name:
        del request["name"]
    return request


def _tls_context(ca_bundle: Any) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if isinstance(ca_bundle, str) and ca_bundle:
        try:
            pem = base64.b64decode(ca_bundle).decode()
            context = ssl.create_default_context(cadata=pem)
        except (ValueError, binascii.Error, ssl.SSLError) as exc:
            raise _CallFailed(f"invalid caBundle: {exc}") from exc
    return context


def _denied(name: str, result: Any) -> status.Failure:
    """``webhookerrors.ToStatusErr``: the webhook's Status, its message prefixed with who denied."""
    result = result if isinstance(result, dict) else {}
    denied_by = f'admission webhook "{name}" denied the request'
    code = int(result.get("code") or 400)
    code = max(code, 400)
    if result.get("message"):
        message = f"{denied_by}: {result['message']}"
    elif result.get("reason"):
        message = f"{denied_by}: {result['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return status.Failure(code=code, reason=str(result.get("reason") or ""), message=message)

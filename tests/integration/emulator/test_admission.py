"""Admission webhooks: the emulator calls a real HTTPS webhook, trusting only the configuration's caBundle."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from quotient.emulator import status
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.emulator import Emulator
from quotient.emulator.objects import Obj
from tests.conftest import require_tool
from tests.integration.emulator.conftest import FAST, cluster, pod_manifest
from tests.polling import until

SERVICE = "webhook.quotient-system.svc"


@dataclass
class Certificates:
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    openssl = require_tool("openssl")
    directory = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=quotient-test-ca",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={SERVICE}")
    (directory / "san.cnf").write_text(f"subjectAltName=DNS:{SERVICE}\n")
    run(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "1",
        "-extfile",
        "san.cnf",
    )
    return Certificates(ca=directory / "ca.crt", cert=directory / "tls.crt", key=directory / "tls.key")


@dataclass
class Webhook:
    port: int
    requests: list[Obj] = field(default_factory=list)
    # Called by ``/observe`` (which allows everything) while the API server waits on its answer.
    meanwhile: Callable[[Obj], Awaitable[None]] | None = None


@pytest.fixture
async def webhook(certificates: Certificates) -> AsyncIterator[Webhook]:
    """Mutates pods (a label and an env var), denies those annotated ``deny``, validates that ``bad`` is absent."""
    found = Webhook(port=0)

    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        found.requests.append(review["request"])
        pod = review["request"]["object"]
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
        if "deny" in (pod["metadata"].get("annotations") or {}):
            response = {
                "uid": review["request"]["uid"],
                "allowed": False,
                "status": {"code": 403, "message": "pods annotated deny are refused"},
            }
        else:
            patch = [
                {"op": "add", "path": "/metadata/labels/mutated", "value": "yes"},
                {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "FROM_WEBHOOK", "value": "1"}]},
            ]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    async def validate(request: web.Request) -> web.Response:
        review = await request.json()
        labels = review["request"]["object"]["metadata"].get("labels") or {}
        allowed = "bad" not in labels
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": allowed,
                    "status": {"message": "bad pods are invalid", "reason": "Invalid"},
                },
            }
        )

    async def observe(request: web.Request) -> web.Response:
        review = await request.json()
        found.requests.append(review["request"])
        if found.meanwhile is not None:
            await found.meanwhile(review["request"])
        response = {"uid": review["request"]["uid"], "allowed": True}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    app = web.Application()
    app.router.add_post("/observe", observe)
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.cert, certificates.key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    found.port = int(runner.addresses[0][1])
    yield found
    await runner.cleanup()


def _configuration(
    kind: str,
    certificates: Certificates,
    *,
    path: str,
    failure_policy: str = "Fail",
    operations: tuple[str, ...] = ("CREATE",),
) -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": f"quotient-{path.strip('/')}"},
        "webhooks": [
            {
                "name": f"{path.strip('/')}.quotient.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure_policy,
                "clientConfig": {
                    "service": {"namespace": "quotient-system", "name": "webhook", "path": path, "port": 443},
                    "caBundle": base64.b64encode(certificates.ca.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": list(operations),
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                    ]
                },
            }
        ],
    }


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with Emulator(cluster(), config=FAST) as running:
        yield running


async def test_a_mutating_webhook_patches_pods_and_can_deny_them(
    emulator: Emulator, webhook: Webhook, certificates: Certificates
) -> None:
    emulator.route_service("quotient-system", "webhook", f"127.0.0.1:{webhook.port}")
    assert not isinstance(
        await emulator.create(_configuration("MutatingWebhookConfiguration", certificates, path="/mutate")),
        status.Failure,
    )
    created = await emulator.create(pod_manifest("patched"))
    assert not isinstance(created, status.Failure), created
    assert created["metadata"]["labels"]["mutated"] == "yes"
    assert created["spec"]["containers"][0]["env"] == [{"name": "FROM_WEBHOOK", "value": "1"}]
    assert webhook.requests[0]["operation"] == "CREATE" and webhook.requests[0]["namespace"] == "default"
    denied = await emulator.create(pod_manifest("refused", annotations={"deny": "yes"}))
    assert isinstance(denied, status.Failure) and denied.code == 403
    assert (
        denied.message == 'admission webhook "mutate.quotient.dev" denied the request: pods annotated deny are refused'
    )
    system = await emulator.create(pod_manifest("untouched", namespace="kube-system"))
    assert not isinstance(system, status.Failure) and "mutated" not in system["metadata"]["labels"]


async def test_controllers_pods_pass_the_webhook_without_a_name(
    emulator: Emulator, webhook: Webhook, certificates: Certificates
) -> None:
    emulator.route_service("quotient-system", "webhook", f"127.0.0.1:{webhook.port}")
    await emulator.create(_configuration("MutatingWebhookConfiguration", certificates, path="/mutate"))
    await emulator.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "rs"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            },
        }
    )
    pods = await until(lambda: emulator.list("v1", "Pod", "default"), what="the ReplicaSet's pod")
    assert pods[0]["metadata"]["labels"]["mutated"] == "yes"
    assert "name" not in webhook.requests[-1] and webhook.requests[-1]["object"]["metadata"]["generateName"] == "rs-"


async def test_a_validating_webhook_rejects_and_an_unreachable_one_fails_closed_or_open(
    emulator: Emulator, webhook: Webhook, certificates: Certificates
) -> None:
    emulator.route_service("quotient-system", "webhook", f"127.0.0.1:{webhook.port}")
    await emulator.create(_configuration("ValidatingWebhookConfiguration", certificates, path="/validate"))
    rejected = await emulator.create(pod_manifest("bad-pod", labels={"bad": "true"}))
    assert isinstance(rejected, status.Failure) and rejected.code == 400 and rejected.reason == "Invalid"
    assert "bad pods are invalid" in rejected.message
    assert not isinstance(await emulator.create(pod_manifest("good-pod")), status.Failure)
    emulator.route_service("quotient-system", "webhook", "127.0.0.1:1")
    failed = await emulator.create(pod_manifest("unlucky"))
    assert isinstance(failed, status.Failure) and failed.code == 500
    assert 'failed calling webhook "validate.quotient.dev"' in failed.message
    lenient = _configuration("ValidatingWebhookConfiguration", certificates, path="/validate", failure_policy="Ignore")
    lenient["metadata"]["name"] = "lenient"
    kind = emulator.kind_of("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
    await emulator.api.delete(kind, "", "quotient-validate", DeleteOptions())
    await emulator.create(lenient)
    assert not isinstance(await emulator.create(pod_manifest("lucky")), status.Failure)


async def test_a_certificate_the_ca_bundle_does_not_trust_is_a_failed_call(
    emulator: Emulator, webhook: Webhook, certificates: Certificates, tmp_path: Path
) -> None:
    emulator.route_service("quotient-system", "webhook", f"127.0.0.1:{webhook.port}")
    other = _configuration("MutatingWebhookConfiguration", certificates, path="/mutate")
    other["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(certificates.cert.read_bytes()).decode()
    await emulator.create(other)
    failed = await emulator.create(pod_manifest("untrusted"))
    assert isinstance(failed, status.Failure) and failed.code == 500
    assert "CERTIFICATE_VERIFY_FAILED" in failed.message or "certificate" in failed.message.lower()


async def test_a_patch_that_loses_a_race_during_admission_is_applied_again_to_the_object_as_it_now_is(
    emulator: Emulator, webhook: Webhook, certificates: Certificates
) -> None:
    """While a webhook reviews a ``kubectl patch``, another writer (a controller writing status) changes the object.
    The API server applies the patch again to the new object instead of answering 409; only a patch or update that
    names the old resourceVersion itself is refused."""
    emulator.route_service("quotient-system", "webhook", f"127.0.0.1:{webhook.port}")
    observe = _configuration("ValidatingWebhookConfiguration", certificates, path="/observe", operations=("UPDATE",))
    assert not isinstance(await emulator.create(observe), status.Failure)
    created = await emulator.create(pod_manifest("raced"))
    assert not isinstance(created, status.Failure), created
    kind = emulator.kind_of("v1", "Pod")
    writes, written_so_far = 0, 0

    async def another_writer(review: Obj) -> None:
        nonlocal writes, written_so_far
        if writes == 0:
            writes, written_so_far = 1, written_so_far + 1
            current = emulator.api.store.get("pods", "default", "raced")
            assert current is not None
            written = {**(current.get("status") or {}), "message": f"written meanwhile ({written_so_far})"}
            emulator.api.write_status(kind, "default", "raced", written, uid=current["metadata"]["uid"])

    webhook.meanwhile = another_writer
    patched = await emulator.api.patch(
        kind, "default", "raced", "application/merge-patch+json", {"metadata": {"labels": {"patched": "yes"}}}
    )
    assert not isinstance(patched, status.Failure), patched
    assert patched["metadata"]["labels"]["patched"] == "yes"
    assert patched["status"]["message"] == "written meanwhile (1)"
    assert len([r for r in webhook.requests if r["operation"] == "UPDATE"]) == 2  # reviewed again, as re-applied

    writes = 0
    stale = str(created["metadata"]["resourceVersion"])
    refused = await emulator.api.patch(
        kind,
        "default",
        "raced",
        "application/merge-patch+json",
        {"metadata": {"resourceVersion": stale, "labels": {"patched": "again"}}},
    )
    assert isinstance(refused, status.Failure) and refused.code == 409 and refused.reason == "Conflict"

    current = emulator.api.store.get("pods", "default", "raced")
    assert current is not None
    writes = 0
    named = {**current, "metadata": {**current["metadata"], "labels": {"replaced": "yes"}}}
    lost = await emulator.api.update(kind, "default", "raced", named)
    assert isinstance(lost, status.Failure) and lost.code == 409, "an update naming the version it read loses the race"
    writes = 0
    current = emulator.api.store.get("pods", "default", "raced")
    assert current is not None
    unconditional = {**current, "metadata": {**current["metadata"], "labels": {"replaced": "yes"}}}
    del unconditional["metadata"]["resourceVersion"]
    replaced = await emulator.api.update(kind, "default", "raced", unconditional)
    assert not isinstance(replaced, status.Failure), replaced
    assert replaced["metadata"]["labels"] == {"replaced": "yes"}

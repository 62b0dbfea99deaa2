"""The webhook's HTTPS server on loopback, and ``serve``: certificates, caBundle upkeep, renewal and reload.

Time is a :class:`VirtualClock`: the upkeep rounds run when the test advances it, never after a real wait.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from common import config
from common.errors import ConfigError
from scheduler import settings
from scheduler.kube import certs, webhook
from scheduler.kube.errors import KubeUnavailable
from tests.unit.kube.fakes import MemoryKube, VirtualClock
from tests.unit.kube_webhook.reviews import pod, review_body

SERVICE_NAME = "quotient-scheduler-webhook.quotient-system.svc"
CONFIGURATION = "quotient-gpu-sharing"
# Real time: the TLS clients here check certificates against the real clock.
NOW = datetime.datetime.now(datetime.UTC)


def make(directory: Path, *, now: datetime.datetime = NOW, days: int = 365) -> certs.ServingCertificate:
    return certs.generate(
        directory,
        service="quotient-scheduler-webhook",
        namespace="quotient-system",
        validity=datetime.timedelta(days=days),
        now=now,
    )


async def call(
    port: int, ca_pem: bytes, *, method: str = "POST", path: str = webhook.MUTATE_PATH, body: bytes = b""
) -> tuple[int, bytes]:
    """One HTTPS request that trusts only ``ca_pem`` and checks the Service's name, as the API server does."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            f"https://127.0.0.1:{port}{path}",
            data=body,
            ssl=context,
            server_hostname=SERVICE_NAME,
            headers={"Content-Type": "application/json"},
        ) as answer,
    ):
        return answer.status, await answer.read()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[webhook.WebhookServer]:
    running = webhook.WebhookServer(certificate=make(tmp_path / "tls"), scheduler_names=("quotient",))
    await running.start("127.0.0.1", 0)
    yield running
    await running.stop()


def ca(certificate: certs.ServingCertificate) -> bytes:
    assert certificate.ca_pem is not None
    return certificate.ca_pem


# --- the server ---


async def test_the_server_answers_reviews_and_health_over_tls(server: webhook.WebhookServer) -> None:
    trusted = ca(server.certificate)
    health = await call(server.port, trusted, method="GET", path=webhook.HEALTH_PATH)
    status, body = await call(server.port, trusted, body=review_body(pod({"gpu-fraction": "0.5"})))
    response = json.loads(body)["response"]

    assert health == (200, b"ok\n")
    assert status == 200 and response["allowed"] is True and response["patchType"] == "JSONPatch"


async def test_a_client_that_trusts_another_ca_is_refused_the_handshake(
    server: webhook.WebhookServer, tmp_path: Path
) -> None:
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await call(server.port, ca(make(tmp_path / "other")), method="GET", path=webhook.HEALTH_PATH)


async def test_malformed_and_oversized_bodies_and_wrong_methods_get_http_errors(server: webhook.WebhookServer) -> None:
    trusted = ca(server.certificate)

    status, body = await call(server.port, trusted, body=b"{")
    assert status == 400 and b"not JSON" in body
    assert (await call(server.port, trusted, body=b" " * (webhook.MAX_REVIEW_BYTES + 1)))[0] == 413
    assert (await call(server.port, trusted, method="GET"))[0] == 405
    assert (await call(server.port, trusted, path="/validate"))[0] == 404


async def test_a_new_certificate_is_served_from_the_next_handshake_on(
    server: webhook.WebhookServer, tmp_path: Path
) -> None:
    old = server.certificate
    new = make(tmp_path / "new")
    server.use_certificate(new)

    assert (await call(server.port, ca(new), method="GET", path=webhook.HEALTH_PATH))[0] == 200
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await call(server.port, ca(old), method="GET", path=webhook.HEALTH_PATH)


async def test_a_port_in_use_is_a_configuration_error(server: webhook.WebhookServer) -> None:
    second = webhook.WebhookServer(certificate=server.certificate, scheduler_names=("quotient",))

    with pytest.raises(ConfigError, match=f"127.0.0.1:{server.port}"):
        await second.start("127.0.0.1", server.port)


# --- serve: the webhook as the scheduler runs it ---


def stored_configuration(kube: MemoryKube) -> dict[str, Any]:
    return kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)]


def bundle_of(kube: MemoryKube) -> bytes:
    encoded = stored_configuration(kube)["webhooks"][0]["clientConfig"].get("caBundle", "")
    return base64.b64decode(encoded)


class Served:
    """``webhook.serve`` running as a task on a virtual clock."""

    def __init__(self, kube: MemoryKube, settings: webhook.WebhookSettings, *, ago: datetime.timedelta) -> None:
        self.clock = VirtualClock()
        # The virtual wall clock starts ``ago`` before the real one: the TLS client checks validity in real time.
        self.clock.epoch = datetime.datetime.now(datetime.UTC) - ago - datetime.timedelta(seconds=self.clock.now_s)
        self.listening: asyncio.Future[webhook.WebhookServer] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(
            webhook.serve(
                kube,
                settings,
                scheduler_names=("quotient",),
                on_listening=self.listening.set_result,
                now=self.clock.wall,
                sleep=self.clock.sleep,
            )
        )

    async def server(self) -> webhook.WebhookServer:
        return await asyncio.wait_for(asyncio.shield(self.listening), 10)

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


class Start(Protocol):
    def __call__(
        self, kube: MemoryKube, settings: webhook.WebhookSettings, ago: datetime.timedelta = ...
    ) -> Awaitable[Served]: ...


@pytest.fixture
async def serving() -> AsyncIterator[Start]:
    started: list[Served] = []

    async def start(
        kube: MemoryKube, settings: webhook.WebhookSettings, ago: datetime.timedelta = datetime.timedelta(0)
    ) -> Served:
        served = Served(kube, settings, ago=ago)
        started.append(served)
        await served.server()
        await served.clock.settle()
        return served

    yield start
    for served in started:
        await served.stop()


def with_configuration() -> MemoryKube:
    kube = MemoryKube()
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION, "resourceVersion": "1"},
        "webhooks": [{"name": "gpu-sharing.quotient.dev", "clientConfig": {"service": {"name": "x"}}}],
    }
    return kube


SETTINGS = webhook.WebhookSettings(host="127.0.0.1", port=0, upkeep_interval_s=60.0)


async def test_serving_writes_the_ca_that_the_api_server_must_trust_and_puts_it_back_when_it_goes(
    serving: Start,
) -> None:
    kube = with_configuration()
    served = await serving(kube, SETTINGS)
    server = await served.server()

    assert bundle_of(kube) == server.certificate.ca_pem
    assert (await call(server.port, bundle_of(kube), method="GET", path=webhook.HEALTH_PATH))[0] == 200
    del stored_configuration(kube)["webhooks"][0]["clientConfig"]["caBundle"]  # kubectl replace, or a re-create
    await served.clock.advance(60)
    assert bundle_of(kube) == server.certificate.ca_pem


async def test_a_certificate_near_its_end_is_renewed_trusted_first_and_served_second(
    serving: Start,
) -> None:
    kube = with_configuration()
    hours = datetime.timedelta(hours=2)
    served = await serving(kube, webhook.WebhookSettings(host="127.0.0.1", port=0, cert_validity_s=3 * 3600.0), hours)
    server = await served.server()
    first = server.certificate

    await served.clock.advance(2 * 3600)
    renewed = server.certificate

    assert renewed is not first and renewed.not_after > first.not_after
    bundle = bundle_of(kube)
    assert ca(first) in bundle and ca(renewed) in bundle, "the old CA stays trusted until it expires"
    assert (await call(server.port, ca(renewed), method="GET", path=webhook.HEALTH_PATH))[0] == 200


async def test_an_upkeep_failure_is_logged_and_retried_while_the_webhook_keeps_serving(
    serving: Start,
) -> None:
    kube = with_configuration()
    kube.fail["get"] = deque([KubeUnavailable("connection refused")])
    served = await serving(kube, SETTINGS)
    server = await served.server()

    assert bundle_of(kube) == b""
    assert (await call(server.port, ca(server.certificate), method="GET", path=webhook.HEALTH_PATH))[0] == 200
    await served.clock.advance(60)
    assert bundle_of(kube) == server.certificate.ca_pem


async def test_provided_certificates_are_served_reloaded_when_renewed_and_the_bundle_left_alone(
    serving: Start, tmp_path: Path
) -> None:
    kube = with_configuration()
    issued = make(tmp_path)
    settings = webhook.WebhookSettings(
        host="127.0.0.1", port=0, certificates=webhook.CertificateSource.PROVIDED, cert_dir=tmp_path
    )
    served = await serving(kube, settings)
    server = await served.server()

    assert (await call(server.port, ca(issued), method="GET", path=webhook.HEALTH_PATH))[0] == 200
    renewed = make(tmp_path, now=NOW + datetime.timedelta(minutes=1))  # cert-manager renewed the Secret
    await served.clock.advance(60)
    assert (await call(server.port, ca(renewed), method="GET", path=webhook.HEALTH_PATH))[0] == 200
    assert kube.calls == [], "cert-manager's CA injector owns the caBundle"


async def test_provided_certificates_without_a_directory_are_a_configuration_error() -> None:
    settings = webhook.WebhookSettings(certificates=webhook.CertificateSource.PROVIDED)

    with pytest.raises(ConfigError, match=r"tls\.crt"):
        await webhook.serve(MemoryKube(), settings, scheduler_names=("quotient",))


# --- settings ---


def resolve(environ: dict[str, str]) -> webhook.WebhookSettings:
    values = config.resolve(settings.WEBHOOK_SETTINGS, argparse.Namespace(), environ=environ, file_values={})
    return settings.webhook_settings_from(values)


def test_the_default_settings_match_the_base_deployment() -> None:
    assert resolve({}) == webhook.WebhookSettings()
    assert webhook.WebhookSettings().port == 9443


def test_settings_come_from_the_environment_as_the_cert_manager_overlay_gives_them() -> None:
    settings = resolve(
        {
            "QUOTIENT_WEBHOOK_CERTS": "provided",
            "QUOTIENT_WEBHOOK_CERT_DIR": "/var/run/quotient/webhook-tls",
            "QUOTIENT_WEBHOOK_NAMESPACE": "gpu-system",
        }
    )

    assert settings.certificates is webhook.CertificateSource.PROVIDED
    assert settings.cert_dir == Path("/var/run/quotient/webhook-tls")
    assert settings.namespace == "gpu-system"


def test_provided_certificates_without_a_directory_are_refused_when_settings_are_read() -> None:
    with pytest.raises(ConfigError, match="--webhook-cert-dir"):
        resolve({"QUOTIENT_WEBHOOK_CERTS": "provided"})
    with pytest.raises(ConfigError, match="QUOTIENT_WEBHOOK_CERTS"):
        resolve({"QUOTIENT_WEBHOOK_CERTS": "cert-manager"})

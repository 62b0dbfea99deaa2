"""The mutating admission webhook of GPU sharing, served over HTTPS by every scheduler replica.

The review itself (what a pod's GPU annotations get: a refusal that says what to fix, or the JSONPatch wiring a
share's GPU environment) is pure and lives in ``scheduler.kube.admission``; this module serves it. Every replica
serves the webhook (the Service spreads calls over all of them; pod creation must not wait for an election).
:func:`serve` runs it as the scheduler does: a certificate made at start (or provided by cert-manager), the server,
and an upkeep round every minute that keeps this replica's CA in the configuration's ``caBundle`` (another replica's
restart may have pushed it out; a re-applied configuration has none), renews the certificate when two thirds of its
validity are gone, and reloads a provided certificate that cert-manager renewed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

from aiohttp import web

from common import logs
from common.errors import ConfigError
from scheduler.kube import admission, certs, kubeapi
from scheduler.kube.errors import KubeError

log = logs.get("scheduler.kube.webhook")

MUTATE_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 9443  # the port controller-runtime's webhooks use; the Service maps 443 onto it
# A pod is at most ~1.5 MiB (etcd's object limit); an AdmissionReview carries it once on CREATE.
MAX_REVIEW_BYTES = 4 * 1024 * 1024


# --- the HTTPS server ---


class WebhookServer:
    """``POST /mutate-pods`` (AdmissionReviews) and ``GET /healthz`` over TLS, on the running event loop."""

    def __init__(self, *, certificate: certs.ServingCertificate, scheduler_names: Collection[str]) -> None:
        self._names = frozenset(scheduler_names)
        self._certificate = certificate
        self._context = certs.server_context(certificate)
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when started with port 0)."""
        return self._port

    @property
    def certificate(self) -> certs.ServingCertificate:
        return self._certificate

    def use_certificate(self, certificate: certs.ServingCertificate) -> None:
        """Serve ``certificate`` from the next handshake on; raises ``ConfigError`` (the old one stays) on failure."""
        certs.load_into(self._context, certificate)
        self._certificate = certificate

    async def start(self, host: str = "0.0.0.0", port: int = DEFAULT_PORT) -> None:
        """Listen on ``host:port`` (0: a free port); raises ``ConfigError`` when the address cannot be used."""
        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post(MUTATE_PATH, self._mutate)
        app.router.add_get(HEALTH_PATH, self._health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, ssl_context=self._context)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"the admission webhook cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self._runner = runner
        address = runner.addresses[0]
        self._port = int(address[1])
        log.info("webhook_listening", host=host, port=self._port, names=",".join(sorted(self._names)))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _mutate(self, request: web.Request) -> web.Response:
        answer = admission.review(await request.read(), scheduler_names=self._names)
        return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# --- settings, and the webhook as the scheduler runs it ---


class CertificateSource(enum.StrEnum):
    SELF_SIGNED = "self-signed"
    """A CA and certificate made at start; this process writes its CA into the configuration's caBundle."""
    PROVIDED = "provided"
    """``tls.crt`` and ``tls.key`` in the certificate directory (cert-manager's Secret); its CA injector owns the
    caBundle."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSettings:
    """The webhook's settings; the defaults are those of deploy/base. ``enabled`` is for the caller: whether to
    run :func:`serve` at all. ``port`` 0 picks a free port (tests)."""

    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    certificates: CertificateSource = CertificateSource.SELF_SIGNED
    cert_dir: Path | None = None
    service: str = "quotient-scheduler-webhook"
    namespace: str = "quotient-system"
    configuration: str = "quotient-gpu-sharing"
    cert_validity_s: float = 365 * 24 * 3600.0
    upkeep_interval_s: float = 60.0


async def serve(
    api: kubeapi.KubeApi,
    settings: WebhookSettings,
    *,
    scheduler_names: Collection[str],
    on_listening: Callable[[WebhookServer], None] | None = None,
    now: Callable[[], datetime.datetime] = _utcnow,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Serve the webhook until cancelled, with an upkeep round at start and every ``upkeep_interval_s``.

    Raises ``ConfigError`` at start when the certificate cannot be made or read or the port cannot be used.
    Upkeep failures (the API unreachable, RBAC missing) are logged and retried next round, never fatal: the
    webhook keeps serving whatever the API server manages to reach.
    """
    owned: Path | None = None
    directory = settings.cert_dir
    if directory is None:
        if settings.certificates is CertificateSource.PROVIDED:
            raise ConfigError("provided webhook certificates need the directory that holds tls.crt and tls.key")
        directory = owned = Path(tempfile.mkdtemp(prefix="quotient-webhook-"))
    try:
        upkeep = _Upkeep(api, settings, directory)
        server = WebhookServer(certificate=upkeep.initial(now()), scheduler_names=scheduler_names)
        await server.start(settings.host, settings.port)
        try:
            if on_listening is not None:
                on_listening(server)
            while True:
                await upkeep.round(server, now())
                await sleep(settings.upkeep_interval_s)
        finally:
            await server.stop()
    finally:
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)


class _Upkeep:
    """One replica's certificate and caBundle upkeep (see :func:`serve`)."""

    def __init__(self, api: kubeapi.KubeApi, settings: WebhookSettings, directory: Path) -> None:
        self._api = api
        self._settings = settings
        self._directory = directory
        self._loaded: tuple[int, int, int, int] | None = None
        self._missing = False

    def initial(self, now: datetime.datetime) -> certs.ServingCertificate:
        certificate = self._certificate(now)
        self._loaded = certs.fingerprint(certificate)
        return certificate

    def _certificate(self, now: datetime.datetime) -> certs.ServingCertificate:
        if self._settings.certificates is CertificateSource.PROVIDED:
            return certs.load_provided(self._directory)
        return certs.generate(
            self._directory,
            service=self._settings.service,
            namespace=self._settings.namespace,
            validity=datetime.timedelta(seconds=self._settings.cert_validity_s),
            now=now,
        )

    async def round(self, server: WebhookServer, now: datetime.datetime) -> None:
        configuration = self._settings.configuration
        try:
            if self._settings.certificates is CertificateSource.PROVIDED:
                # cert-manager renewed the Secret and the kubelet swapped the files: serve the new pair.
                seen = certs.fingerprint(server.certificate)
                if seen is not None and seen != self._loaded:
                    server.use_certificate(certs.load_provided(self._directory))
                    self._loaded = seen
                    log.info("webhook_certificate_reloaded", not_after=server.certificate.not_after.isoformat())
                return
            certificate = server.certificate
            if certificate.renewal_due(now):
                certificate = self._certificate(now)
            assert certificate.ca_pem is not None
            outcome = await certs.patch_ca_bundle(
                self._api, configuration_name=configuration, ca_pem=certificate.ca_pem, now=now
            )
            missing = outcome is certs.BundleOutcome.NO_CONFIGURATION
            if missing and not self._missing:  # once, not every round: a local run may have no configuration
                log.warning("webhook_configuration_missing", configuration=configuration)
            self._missing = missing
            if certificate is not server.certificate:
                # Trusted first, served second: the API server never meets a certificate it does not trust yet.
                server.use_certificate(certificate)
                log.info("webhook_certificate_renewed", not_after=certificate.not_after.isoformat())
        except (KubeError, ConfigError) as exc:
            log.error("webhook_upkeep_failed", configuration=configuration, error=str(exc))

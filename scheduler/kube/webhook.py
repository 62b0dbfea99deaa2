"""The admission webhooks, served over HTTPS by every scheduler replica: GPU sharing for pods (mutating), KAI's
queue validation and KAI's PodGroup validation (validating), on three paths of one server.

The reviews themselves are pure: ``scheduler.kube.admission`` (what a pod's GPU annotations get: a refusal that
says what to fix, or the JSONPatch wiring a share's GPU environment), ``scheduler.kube.queueadmission`` (a Queue
refused or admitted with warnings) and ``scheduler.kube.podgroupadmission`` (a PodGroup's spec held to KAI's
rules, which needs nothing but the request); this module serves them, listing the Queues the queue review needs
through the API on each call (queues change rarely and a create is rarer still; every replica answers, leader or
not, so it cannot count on a leader's watches). Every replica serves the webhooks (the Service spreads calls over all
of them; pod creation must not wait for an election). :func:`serve` runs them as the scheduler does: a certificate
made at start (or provided by cert-manager), the server, and an upkeep round every minute that keeps this replica's
CA in the ``caBundle`` of every configuration (another replica's restart may have pushed it out; a re-applied
configuration has none), renews the certificate when two thirds of its validity are gone, and reloads a provided
certificate that cert-manager renewed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from common import logs
from common.errors import ConfigError
from scheduler.kube import admission, certs, kubeapi, podgroupadmission, queueadmission
from scheduler.kube.errors import KubeError

log = logs.get("scheduler.kube.webhook")

MUTATE_PATH = "/mutate-pods"
VALIDATE_QUEUES_PATH = queueadmission.PATH
VALIDATE_PODGROUPS_PATH = podgroupadmission.PATH
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 9443  # the port controller-runtime's webhooks use; the Service maps 443 onto it
# A pod is at most ~1.5 MiB (etcd's object limit); an AdmissionReview carries it once on CREATE.
MAX_REVIEW_BYTES = 4 * 1024 * 1024


QueueLister = Callable[[], Awaitable[Sequence[dict[str, Any]]]]
"""Every Queue stored; raises ``KubeError`` when they cannot be read."""


# --- the HTTPS server ---


class WebhookServer:
    """``POST /mutate-pods``, ``POST /validate-scheduling-run-ai-v2-queue`` and
    ``POST /validate-scheduling-run-ai-v2alpha2-podgroup`` (AdmissionReviews) and ``GET /healthz`` over TLS, on the
    running event loop."""

    def __init__(
        self,
        *,
        certificate: certs.ServingCertificate,
        scheduler_names: Collection[str],
        list_queues: QueueLister | None = None,
        queue_parent_must_exist: bool = False,
    ) -> None:
        self._names = frozenset(scheduler_names)
        self._list_queues = list_queues
        self._queue_parent_must_exist = queue_parent_must_exist
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
        app.router.add_post(VALIDATE_QUEUES_PATH, self._validate_queue)
        app.router.add_post(VALIDATE_PODGROUPS_PATH, self._validate_podgroup)
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

    async def _validate_queue(self, request: web.Request) -> web.Response:
        read = admission.read_review(await request.read())
        if isinstance(read, admission.ReviewAnswer):
            answer = read
        else:
            queues: Sequence[dict[str, Any]] | None = None
            if self._list_queues is not None:
                try:
                    queues = await self._list_queues()
                except KubeError as exc:
                    log.warning("queue_review_list_failed", error=str(exc))
            verdict = queueadmission.admit(read.request, queues=queues, parent_must_exist=self._queue_parent_must_exist)
            answer = admission.respond(read.uid, verdict)
        return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)

    async def _validate_podgroup(self, request: web.Request) -> web.Response:
        read = admission.read_review(await request.read())
        answer = (
            read
            if isinstance(read, admission.ReviewAnswer)
            else admission.respond(read.uid, podgroupadmission.admit(read.request))
        )
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
    queue_configuration: str = "quotient-queue-validation"
    """The ValidatingWebhookConfiguration of the queue webhook, whose ``caBundle`` is kept too."""
    podgroup_configuration: str = "quotient-podgroup-validation"
    """The ValidatingWebhookConfiguration of the PodGroup webhook, whose ``caBundle`` is kept too."""
    queue_parent_must_exist: bool = False
    """KAI's strict queue validation: refuse a Queue whose parent does not exist."""
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

        async def list_queues() -> Sequence[dict[str, Any]]:
            return (await api.list(kubeapi.QUEUES)).items

        server = WebhookServer(
            certificate=upkeep.initial(now()),
            scheduler_names=scheduler_names,
            list_queues=list_queues,
            queue_parent_must_exist=settings.queue_parent_must_exist,
        )
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
        self._missing: set[str] = set()

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
        configurations = (
            (self._settings.configuration, certs.WEBHOOK_CONFIGURATIONS),
            (self._settings.queue_configuration, certs.VALIDATING_WEBHOOK_CONFIGURATIONS),
            (self._settings.podgroup_configuration, certs.VALIDATING_WEBHOOK_CONFIGURATIONS),
        )
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
            for configuration, resource in configurations:
                if not configuration:
                    continue
                outcome = await certs.patch_ca_bundle(
                    self._api, configuration_name=configuration, ca_pem=certificate.ca_pem, now=now, resource=resource
                )
                if outcome is not certs.BundleOutcome.NO_CONFIGURATION:
                    self._missing.discard(configuration)
                elif configuration not in self._missing:  # once, not every round: a local run may have none
                    log.warning("webhook_configuration_missing", configuration=configuration, kind=resource.kind)
                    self._missing.add(configuration)
            if certificate is not server.certificate:
                # Trusted first, served second: the API server never meets a certificate it does not trust yet.
                server.use_certificate(certificate)
                log.info("webhook_certificate_renewed", not_after=certificate.not_after.isoformat())
        except (KubeError, ConfigError) as exc:
            log.error("webhook_upkeep_failed", configuration=configuration, error=str(exc))

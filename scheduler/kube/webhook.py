"""The mutating admission webhook of GPU sharing: refuse bad GPU annotations at creation, wire a share's GPU env.

A fractional pod (``gpu-fraction`` or ``gpu-memory``) learns which device it shares only at binding, long after its
spec became immutable. So at creation the webhook points the chosen container's ``NVIDIA_VISIBLE_DEVICES`` and
``GPU_PORTION`` at keys of a ConfigMap that does not exist yet, names that ConfigMap in the pod's annotation
``quotient.dev/gpu-configmap``, and sets ``runtimeClassName: nvidia`` when the pod names no runtime class. The
binder writes the ConfigMap (the device UUIDs, comma-separated when ``gpu-fraction-num-devices`` > 1, and the
portion) before it binds; until then the kubelet holds the container (``CreateContainerConfigError``), so a share
never starts without its assignment. The references are not optional for that reason: CUDA images set
``NVIDIA_VISIBLE_DEVICES=all`` themselves, and a container that started without ours would see every GPU of its
node. For the same reason the pod's other containers (and init containers) get ``NVIDIA_VISIBLE_DEVICES=void``,
which makes the NVIDIA runtime expose no GPU to them.

At admission a pod made from ``generateName`` has no name yet, and a pod recreated under an old name could meet
its predecessor's ConfigMap before garbage collection removes it, so the ConfigMap's name is the pod's name (or
``generateName``) with a digest of the admission request's uid, which is unique per request.

Validation is :func:`scheduler.kube.gpurequest.parse`, the very reading the scheduler uses, so the webhook and the
scheduler never disagree; a problem becomes a refusal (422, the problem's message, which kubectl prints). Pods of
other schedulers, pods without a share, and operations other than CREATE pass untouched. A body that is not an
``admission.k8s.io/v1`` AdmissionReview gets HTTP 400 with a message; a review whose pod is malformed is refused
in the review (400), never a crash.

Every scheduler replica serves the webhook (the Service spreads calls over all of them). :func:`serve` runs it as
the scheduler does: a certificate made at start (or provided by cert-manager), the server, and an upkeep round
every minute that keeps this replica's CA in the configuration's ``caBundle`` (another replica's restart may have
pushed it out; a re-applied configuration has none), renews the certificate when two thirds of its validity are
gone, and reloads a provided certificate that cert-manager renewed.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import enum
import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from common import config, logs
from common.config import Setting
from common.errors import ConfigError
from scheduler.kube import certs, client, gpurequest
from scheduler.kube.errors import KubeError
from scheduler.kube.gpurequest import AnnotationProblem

log = logs.get("scheduler.kube.webhook")

MUTATE_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 9443  # the port controller-runtime's webhooks use; the Service maps 443 onto it
CONFIGMAP_ANNOTATION = "quotient.dev/gpu-configmap"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
GPU_PORTION = "GPU_PORTION"
"""The env variables of the chosen container, and the keys of the pod's ConfigMap the binder writes."""
RUNTIME_CLASS = "nvidia"
NO_DEVICES = "void"
"""NVIDIA_VISIBLE_DEVICES value that makes the NVIDIA container runtime behave as runc: no GPU, no driver."""
DEFAULT_SCHEDULER = "default-scheduler"  # the API server's default for spec.schedulerName
ADMISSION_VERSION = "admission.k8s.io/v1"
# A pod is at most ~1.5 MiB (etcd's object limit); an AdmissionReview carries it once on CREATE.
MAX_REVIEW_BYTES = 4 * 1024 * 1024
_CONFIGMAP_NAME_MAX = 253  # a DNS subdomain
_DIGEST_CHARS = 10
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")


# --- the review: pure, bytes in, bytes out ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the webhook says about one pod: allowed (with a JSONPatch, maybe empty) or refused with a Status."""

    allowed: bool
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""


ALLOW = Verdict(allowed=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReviewAnswer:
    """The HTTP answer to a review request."""

    status: int
    body: bytes
    content_type: str = "application/json"


def review(body: bytes, *, scheduler_names: Collection[str]) -> ReviewAnswer:
    """Answer an AdmissionReview: 200 with the review's response, or 400 with a message when it is not one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return _bad_review(f"the body is not JSON: {exc}")
    if not isinstance(document, dict):
        return _bad_review("the body is not a JSON object")
    if document.get("apiVersion") != ADMISSION_VERSION or document.get("kind") != "AdmissionReview":
        return _bad_review(
            f"expected an AdmissionReview of {ADMISSION_VERSION}, got kind {document.get('kind')!r} of "
            f"{document.get('apiVersion')!r}"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        return _bad_review("the AdmissionReview carries no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _bad_review("the AdmissionReview request has no uid")
    verdict = admit(request, scheduler_names=scheduler_names)
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "reason": verdict.reason, "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    answer = {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}
    return ReviewAnswer(status=200, body=json.dumps(answer).encode())


def _bad_review(message: str) -> ReviewAnswer:
    log.warning("admission_review_malformed", error=message)
    return ReviewAnswer(status=400, body=f"{message}\n".encode(), content_type="text/plain")


def admit(request: Mapping[str, Any], *, scheduler_names: Collection[str]) -> Verdict:
    """The verdict on one admission request (the ``request`` of an AdmissionReview)."""
    resource = request.get("resource")
    if resource != {"group": "", "version": "v1", "resource": "pods"} or request.get("subResource"):
        return ALLOW  # a configuration that sends more than pods is not ours to police
    if request.get("operation") != "CREATE":
        return ALLOW
    pod = request.get("object")
    problem = _shape_problem(pod)
    if problem is not None:
        log.warning("admission_pod_malformed", namespace=str(request.get("namespace")), error=problem)
        return Verdict(allowed=False, code=400, reason="BadRequest", message=f"malformed pod: {problem}")
    assert isinstance(pod, dict)
    if (pod["spec"].get("schedulerName") or DEFAULT_SCHEDULER) not in scheduler_names:
        return ALLOW
    who = _display_name(pod, request)
    parsed = gpurequest.parse(pod)
    if isinstance(parsed, AnnotationProblem):
        log.info("gpu_request_refused", pod=who, field=parsed.field, message=parsed.message)
        return Verdict(allowed=False, code=422, reason="Invalid", message=parsed.message)
    if not parsed.is_share:
        return ALLOW
    configmap = configmap_name(pod, request_uid=str(request.get("uid") or ""))
    patch, warnings = share_patch(pod, chosen=parsed.container, configmap=configmap)
    log.info("gpu_share_admitted", pod=who, configmap=configmap, container=parsed.container, devices=parsed.devices)
    return Verdict(allowed=True, patch=patch, warnings=warnings)


def configmap_name(pod: Mapping[str, Any], *, request_uid: str) -> str:
    """The pod's GPU ConfigMap: its name (or ``generateName``) and a digest of the request's uid, a DNS name."""
    metadata = pod.get("metadata") or {}
    base = str(metadata.get("name") or metadata.get("generateName") or "pod").lower()
    labels = (label.strip("-") for label in _NOT_DNS.sub("-", base).split("."))
    base = ".".join(label for label in labels if label)
    suffix = f"-gpu-{hashlib.sha256(request_uid.encode()).hexdigest()[:_DIGEST_CHARS]}"
    base = base[: _CONFIGMAP_NAME_MAX - len(suffix)].rstrip("-.") or "pod"
    return base + suffix


def share_patch(
    pod: Mapping[str, Any], *, chosen: str | None, configmap: str
) -> tuple[tuple[Mapping[str, Any], ...], tuple[str, ...]]:
    """The JSONPatch that wires a share into ``pod``, and the warnings for values of the pod's that it replaces."""
    operations: list[Mapping[str, Any]] = []
    warnings: list[str] = []
    annotations = pod["metadata"].get("annotations")
    if annotations is None:
        operations.append({"op": "add", "path": "/metadata/annotations", "value": {CONFIGMAP_ANNOTATION: configmap}})
    else:
        operations.append(
            {"op": "add", "path": f"/metadata/annotations/{_pointer(CONFIGMAP_ANNOTATION)}", "value": configmap}
        )
    spec = pod["spec"]
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or []):
            if field == "containers" and container["name"] == chosen:
                wanted = {name: _from_configmap(name, configmap) for name in (VISIBLE_DEVICES, GPU_PORTION)}
            else:
                wanted = {VISIBLE_DEVICES: {"name": VISIBLE_DEVICES, "value": NO_DEVICES}}
            path = f"/spec/{field}/{index}/env"
            env = container.get("env")
            if env is None:
                operations.append({"op": "add", "path": path, "value": list(wanted.values())})
                continue
            for name, entry in wanted.items():
                # Every entry of the name: the kubelet lets the last of duplicates win.
                found = [position for position, existing in enumerate(env) if existing["name"] == name]
                for position in found:
                    if env[position] != entry:
                        operations.append({"op": "replace", "path": f"{path}/{position}", "value": entry})
                        warnings.append(
                            f"{field[:-1]} {container['name']!r}: {name} is set by Quotient's GPU sharing; the pod's "
                            "own value was replaced"
                        )
                if not found:
                    operations.append({"op": "add", "path": f"{path}/-", "value": entry})
    if not spec.get("runtimeClassName"):
        operations.append({"op": "add", "path": "/spec/runtimeClassName", "value": RUNTIME_CLASS})
    return tuple(operations), tuple(dict.fromkeys(warnings))


def _from_configmap(name: str, configmap: str) -> Mapping[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": name}}}


def _pointer(key: str) -> str:
    """A key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _display_name(pod: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    metadata = pod["metadata"]
    name = metadata.get("name") or f"{metadata.get('generateName') or ''}*"
    return f"{request.get('namespace') or metadata.get('namespace') or ''}/{name}"


def _shape_problem(pod: object) -> str | None:
    """Why ``pod`` cannot be read as a pod (the fields that the GPU reading and the patch touch), or None."""
    if not isinstance(pod, dict):
        return "the request carries no pod object"
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(metadata, dict):
        return "metadata is not an object"
    for key in ("name", "generateName", "namespace"):
        if not isinstance(metadata.get(key) or "", str):
            return f"metadata.{key} is not a string"
    annotations = metadata.get("annotations")
    if annotations is not None and not (
        isinstance(annotations, dict) and all(isinstance(value, str) for value in annotations.values())
    ):
        return "metadata.annotations must map names to strings"
    if not isinstance(spec, dict):
        return "spec is not an object"
    for key in ("schedulerName", "runtimeClassName"):
        if not isinstance(spec.get(key) or "", str):
            return f"spec.{key} is not a string"
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return "spec.containers is not a non-empty list"
    for field in ("containers", "initContainers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            return f"spec.{field} is not a list"
        for index, container in enumerate(items):
            where = f"spec.{field}[{index}]"
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                return f"{where} has no name"
            env = container.get("env")
            if env is not None and not (
                isinstance(env, list) and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in env)
            ):
                return f"{where}.env is not a list of named variables"
            resources = container.get("resources")
            if resources is not None and not (
                isinstance(resources, dict)
                and all(isinstance(resources.get(part) or {}, dict) for part in ("limits", "requests"))
            ):
                return f"{where}.resources is not an object of limits and requests"
    return None


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
        answer = review(await request.read(), scheduler_names=self._names)
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


SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="webhook", parse=config.parse_bool, default=True, help="serve the GPU-sharing admission webhook"),
    Setting(name="webhook_host", parse=config.parse_str, default="0.0.0.0", help="address the webhook listens on"),
    Setting(name="webhook_port", parse=config.parse_port, default=DEFAULT_PORT, help="HTTPS port of the webhook"),
    Setting(
        name="webhook_certs",
        parse=config.choice(*CertificateSource),
        default=CertificateSource.SELF_SIGNED.value,
        help="self-signed (made at start, CA written into the caBundle) or provided (cert-manager's Secret)",
    ),
    Setting(
        name="webhook_cert_dir",
        parse=config.parse_str,
        default=None,
        help="where tls.crt and tls.key are written (self-signed; default: a private temporary directory) or read "
        "(provided)",
    ),
    Setting(
        name="webhook_service", parse=config.parse_str, default="quotient-scheduler-webhook", help="the webhook Service"
    ),
    Setting(
        name="webhook_namespace",
        parse=config.parse_str,
        default="quotient-system",
        help="the webhook Service's namespace",
    ),
    Setting(
        name="webhook_configuration",
        parse=config.parse_str,
        default="quotient-gpu-sharing",
        help="the MutatingWebhookConfiguration whose caBundle is kept",
    ),
    Setting(
        name="webhook_cert_validity",
        parse=config.parse_positive_duration_s,
        default=365 * 24 * 3600.0,
        help="validity of a self-signed certificate (renewed after two thirds)",
    ),
    Setting(
        name="webhook_upkeep_interval",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="how often the caBundle is checked and the certificate renewed or reloaded",
    ),
)


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


def settings_from(values: Mapping[str, object]) -> WebhookSettings:
    """The webhook's settings from :data:`SETTINGS` as ``common.config.resolve`` returns them."""
    source = CertificateSource(str(values["webhook_certs"]))
    cert_dir = Path(str(values["webhook_cert_dir"])) if values["webhook_cert_dir"] else None
    if source is CertificateSource.PROVIDED and cert_dir is None:
        raise ConfigError("--webhook-cert-dir: provided certificates need the directory that holds tls.crt and tls.key")
    return WebhookSettings(
        enabled=bool(values["webhook"]),
        host=str(values["webhook_host"]),
        port=int(str(values["webhook_port"])),
        certificates=source,
        cert_dir=cert_dir,
        service=str(values["webhook_service"]),
        namespace=str(values["webhook_namespace"]),
        configuration=str(values["webhook_configuration"]),
        cert_validity_s=float(str(values["webhook_cert_validity"])),
        upkeep_interval_s=float(str(values["webhook_upkeep_interval"])),
    )


async def serve(
    api: client.KubeApi,
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

    def __init__(self, api: client.KubeApi, settings: WebhookSettings, directory: Path) -> None:
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

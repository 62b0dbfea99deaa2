"""The admission webhook's TLS certificates: made at start, or provided (cert-manager); and the ``caBundle``.

The API server calls the webhook over HTTPS and trusts only the ``caBundle`` of the webhook configuration. Without
cert-manager, each scheduler replica makes its own certificate authority at start and signs a serving certificate
for the webhook Service's names with it (``<service>.<namespace>.svc`` and ``.svc.cluster.local``; loopback names
for tests). The CA's private key is thrown away once the serving certificate is signed, so it never reaches a disk
or a Secret; ``ssl`` loads certificates only from files, so the serving pair is written to a private directory.
ECDSA P-256 keys: generated in about a millisecond (an RSA key takes tens) and accepted by every API server.

Every replica serves the webhook (the Service spreads calls over the leader and the standby), so the ``caBundle``
must trust every live replica's CA at once: :func:`merge_bundle` adds ours to the CAs already there, drops expired
and unreadable ones, and keeps the newest up to a bound, in an order that does not depend on who writes, so two
replicas agree on one bundle instead of rewriting it in turn; :func:`patch_ca_bundle` writes it (a read, then a
replace that carries the read's ``resourceVersion``, so concurrent writers never lose each other's CAs). A live
replica whose CA was pushed out by others' restarts puts it back at its next upkeep round. With cert-manager the
serving pair comes from a mounted Secret (``tls.crt``, ``tls.key``, ``ca.crt``) and its CA injector owns the
``caBundle``.

``cryptography`` enters the code base here only.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import enum
import hashlib
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common import logs
from common.errors import ConfigError
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeConflict

log = logs.get("scheduler.kube.certs")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
"""The file names of a ``kubernetes.io/tls`` Secret as cert-manager writes it; ours are written the same way."""

WEBHOOK_CONFIGURATIONS = kubeapi.Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = kubeapi.Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingwebhookconfigurations",
    kind="ValidatingWebhookConfiguration",
    namespaced=False,
)

# Nodes' and the API server's clocks may differ; a certificate that starts "now" would be refused for a moment.
_CLOCK_SKEW = datetime.timedelta(minutes=5)
MAX_BUNDLE_CAS = 8
"""Two replicas and a rollout's surge pod are live at once (deploy/base/scheduler); the rest is room for restarts
between two upkeep rounds, after which each live replica puts its CA back if it was pushed out."""
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServingCertificate:
    """A serving certificate and key on disk, and the CA that a client must trust for it."""

    cert_path: Path
    key_path: Path
    ca_pem: bytes | None
    """PEM of the signing CA, for the ``caBundle``; None for a provided pair without ``ca.crt``."""
    not_before: datetime.datetime
    not_after: datetime.datetime

    def renewal_due(self, now: datetime.datetime) -> bool:
        """Two thirds of the validity are gone (cert-manager's default rule for renewing)."""
        return now >= self.not_before + (self.not_after - self.not_before) * 2 / 3


def dns_names(*, service: str, namespace: str) -> tuple[str, ...]:
    """The names the API server (and tests on loopback) may use to reach the webhook Service."""
    return (
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        service,
        "localhost",
    )


def generate(
    directory: Path, *, service: str, namespace: str, validity: datetime.timedelta, now: datetime.datetime
) -> ServingCertificate:
    """A fresh CA and a serving certificate for the Service, valid from ``now`` for ``validity``, written to
    ``directory`` (``tls.crt``, ``tls.key`` readable by this user only, ``ca.crt``). Raises ``ConfigError`` when
    the directory cannot be written."""
    if validity <= datetime.timedelta(0):
        raise ConfigError(f"the webhook certificate's validity must be positive, not {validity}")
    not_before, not_after = now - _CLOCK_SKEW, now + validity
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quotient"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"quotient webhook CA {service}.{namespace}"),
        ]
    )
    ca_subject_key = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signing=False), critical=True)
        .add_extension(ca_subject_key, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = dns_names(service=service, namespace=namespace)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signing=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name) for name in names]
                + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")]
            ),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_subject_key), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The key first and the certificate last: a reload that sees the new certificate finds its key already there.
        _write_atomically(directory / KEY_FILE, key_pem, mode=0o600)
        _write_atomically(directory / CA_FILE, ca_pem, mode=0o644)
        _write_atomically(directory / CERT_FILE, leaf.public_bytes(serialization.Encoding.PEM), mode=0o644)
    except OSError as exc:
        raise ConfigError(f"cannot write the webhook certificate to {directory}: {exc.strerror or exc}") from exc
    return ServingCertificate(
        cert_path=directory / CERT_FILE,
        key_path=directory / KEY_FILE,
        ca_pem=ca_pem,
        not_before=not_before,
        not_after=not_after,
    )


def load_provided(directory: Path) -> ServingCertificate:
    """The pair in ``directory`` (``tls.crt``, ``tls.key``, optionally ``ca.crt``), as a cert-manager Secret is
    mounted. Raises ``ConfigError`` naming the file when one is missing or is not a certificate."""
    cert_path, key_path, ca_path = directory / CERT_FILE, directory / KEY_FILE, directory / CA_FILE
    try:
        cert_pem = cert_path.read_bytes()
        if not key_path.is_file():
            raise ConfigError(f"the webhook's private key {key_path} is missing")
        ca_pem = ca_path.read_bytes() if ca_path.is_file() else None
    except OSError as exc:
        raise ConfigError(f"cannot read the webhook certificate in {directory}: {exc.strerror or exc}") from exc
    certificates = _parse_bundle(cert_pem)
    if not certificates:
        raise ConfigError(f"{cert_path} holds no PEM certificate")
    leaf = certificates[0]
    return ServingCertificate(
        cert_path=cert_path,
        key_path=key_path,
        ca_pem=ca_pem or None,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
    )


def server_context(certificate: ServingCertificate) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) serving ``certificate``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_into(context, certificate)
    return context


def load_into(context: ssl.SSLContext, certificate: ServingCertificate) -> None:
    """(Re)load the pair into a live context: handshakes after this use it, open connections keep theirs.

    The pair is tried on a scratch context first: a failed load can leave a context with the new certificate and
    the old key, which would fail every handshake after it.
    """
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certificate.cert_path, certificate.key_path)
        context.load_cert_chain(certificate.cert_path, certificate.key_path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the webhook certificate {certificate.cert_path} with its key {certificate.key_path}: {exc}"
        ) from exc


def fingerprint(certificate: ServingCertificate) -> tuple[int, int, int, int] | None:
    """What changes when a mounted Secret is updated (the kubelet swaps a symlink): the files' identities and times."""
    try:
        stats = [certificate.cert_path.stat(), certificate.key_path.stat()]
    except OSError:
        return None
    return (stats[0].st_ino, stats[0].st_mtime_ns, stats[1].st_ino, stats[1].st_mtime_ns)


# --- the caBundle ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BundleCheck:
    """What a ``caBundle`` holds with respect to one CA."""

    trusted: bool
    """The CA is in the bundle."""
    stale: bool
    """The bundle holds something to clean up: an expired CA or a block that is not a certificate."""


def check_bundle(bundle: bytes, ca_pem: bytes, *, now: datetime.datetime) -> BundleCheck:
    ours = {_digest(cert) for cert in _parse_bundle(ca_pem)}
    blocks = _PEM_BLOCK.findall(bundle)
    certificates = _parse_bundle(bundle)
    expired = any(cert.not_valid_after_utc <= now for cert in certificates)
    return BundleCheck(
        trusted=bool(ours) and ours <= {_digest(cert) for cert in certificates},
        stale=expired or len(certificates) != len(blocks) or (bool(bundle.strip()) and not blocks),
    )


def merge_bundle(
    bundles: Sequence[bytes], ca_pem: bytes, *, now: datetime.datetime, limit: int = MAX_BUNDLE_CAS
) -> bytes:
    """Our CA and the unexpired CAs of ``bundles``, once each, newest first, at most ``limit`` (ours always kept).

    The order depends only on the certificates, so replicas that merge the same CAs write the same bytes.
    """
    ours = _parse_bundle(ca_pem)
    ours_digests = {_digest(cert) for cert in ours}
    others: dict[str, x509.Certificate] = {}
    for bundle in bundles:
        for cert in _parse_bundle(bundle):
            digest = _digest(cert)
            if digest not in ours_digests and cert.not_valid_after_utc > now:
                others[digest] = cert
    newest_first = sorted(others.values(), key=_age_order)
    kept = sorted([*ours, *newest_first[: max(0, limit - len(ours))]], key=_age_order)
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in kept)


def _age_order(cert: x509.Certificate) -> tuple[float, str]:
    return (-cert.not_valid_before_utc.timestamp(), _digest(cert))


def _digest(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _parse_bundle(bundle: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle, skipping blocks that do not parse."""
    found = []
    for block in _PEM_BLOCK.findall(bundle):
        try:
            found.append(x509.load_pem_x509_certificate(block))
        except ValueError:
            continue
    return found


def _key_usage(*, signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=signing,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=not signing,
        crl_sign=not signing,
        encipher_only=False,
        decipher_only=False,
    )


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        temporary.chmod(mode)  # the umask may have narrowed the mode os.open was given
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# --- writing the caBundle into the webhook configuration ---


class BundleOutcome(enum.StrEnum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"
    """Our CA was already trusted by every webhook of the configuration, and nothing in it had expired."""
    NO_CONFIGURATION = "no-configuration"
    """The configuration does not exist (or has no webhooks): nothing to trust us yet."""


async def patch_ca_bundle(
    api: kubeapi.KubeApi,
    *,
    configuration_name: str,
    ca_pem: bytes,
    now: datetime.datetime | None = None,
    attempts: int = 5,
    resource: kubeapi.Resource = WEBHOOK_CONFIGURATIONS,
) -> BundleOutcome:
    """Make every webhook of the MutatingWebhookConfiguration (or the ``resource`` given: the Validating one) trust
    ``ca_pem``, keeping the other replicas' CAs.

    A read, then a replace that carries the read's ``resourceVersion``: a concurrent writer (another replica,
    cert-manager, kubectl) makes it 409, and it starts over, up to ``attempts`` times. Raises ``KubeError`` for
    faults (``KubeForbidden`` when RBAC lacks get/update on the configuration).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    for _ in range(attempts):
        current = await api.get(resource, name=configuration_name)
        hooks = [hook for hook in (current or {}).get("webhooks") or [] if isinstance(hook, dict)]
        if current is None or not hooks:
            return BundleOutcome.NO_CONFIGURATION
        bundles = [_decoded_bundle(hook) for hook in hooks]
        checks = [check_bundle(bundle, ca_pem, now=now) for bundle in bundles]
        if all(check.trusted and not check.stale for check in checks):
            return BundleOutcome.UNCHANGED
        encoded = base64.b64encode(merge_bundle(bundles, ca_pem, now=now)).decode()
        for hook in hooks:
            client_config = hook.get("clientConfig")
            hook["clientConfig"] = {**(client_config if isinstance(client_config, dict) else {}), "caBundle": encoded}
        try:
            await api.replace(resource, current, name=configuration_name)
        except KubeConflict:
            continue
        log.info("webhook_ca_bundle_written", configuration=configuration_name, webhooks=len(hooks))
        return BundleOutcome.WRITTEN
    raise KubeConflict(f"{resource.kind.lower()} {configuration_name} kept changing: {attempts} conflicts")


def _decoded_bundle(hook: Mapping[str, Any]) -> bytes:
    encoded = (hook.get("clientConfig") or {}).get("caBundle")
    if not isinstance(encoded, str):
        return b""
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return b"not base64"  # stale: the merge writes a clean bundle

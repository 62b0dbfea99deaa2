"""NATS's TLS certificates, made offline: a CA of our own and the certificate every NATS server presents.

``quotient nats-keys`` (a cluster without cert-manager), the embedded server of the demo, the benchmarks and the tests
use it. One certificate serves both ends of TLS on NATS: clients dial the servers by the NATS Service's names or a
pod's name under the headless Service (``quotient-nats-0.quotient-nats-headless.<namespace>.svc``, which a wildcard
covers), and the servers dial each other's routes with it, as TLS clients, so it carries both server and client
authentication. Loopback names are in it too, for ``kubectl port-forward`` and the embedded server.

The CA's private key is thrown away once the server certificate is signed (as the webhook's is, in
``scheduler.kube.certs``): it never reaches a disk or a Secret, and a rotation makes a new CA, trusted next to the old
one for a while (``previous_ca``; ``deploy/README.md`` says how). ECDSA P-256: generated in about a millisecond, and
accepted by nats-server, Python's ``ssl`` and nats-py.

``cryptography`` enters here and in ``scheduler.kube.certs`` only (the import contracts in ``pyproject.toml``).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common import natstls
from common.errors import ConfigError

SERVICE = "quotient-nats"
HEADLESS_SERVICE = "quotient-nats-headless"
"""deploy/base/nats/service.yaml: the client Service and the StatefulSet's governing Service."""
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
DEFAULT_VALIDITY = datetime.timedelta(days=365)
# Nodes' clocks may differ: a certificate that starts "now" would be refused for a moment by a node a little behind.
_CLOCK_SKEW = datetime.timedelta(minutes=5)
_KEY_FILE_MODE = 0o600
_PUBLIC_FILE_MODE = 0o644


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TlsMaterial:
    """A CA bundle to trust, and the server's certificate and key (kept out of the repr)."""

    ca_pem: bytes
    """The new CA, followed by the previous one during a rotation."""
    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)
    not_after: datetime.datetime


def dns_names(namespace: str) -> tuple[str, ...]:
    """The names by which clients and routes reach the NATS servers of ``namespace``."""
    service, pods = f"{SERVICE}.{namespace}", f"{HEADLESS_SERVICE}.{namespace}"
    return (
        f"{service}.svc",
        f"{service}.svc.cluster.local",
        service,
        SERVICE,
        f"*.{pods}.svc",
        f"*.{pods}.svc.cluster.local",
        *LOOPBACK_NAMES,
    )


def generate(
    *,
    names: Sequence[str],
    now: datetime.datetime,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    ips: Sequence[str] = LOOPBACK_IPS,
    previous_ca: bytes | None = None,
) -> TlsMaterial:
    """A fresh CA and a certificate for ``names`` and ``ips`` signed by it, valid from ``now`` for ``validity``.
    ``previous_ca``: PEM whose first certificate (the CA the servers present now) is trusted too, for a rotation."""
    if validity <= datetime.timedelta(0):
        raise ConfigError(f"the NATS certificates' validity must be positive, not {validity}")
    if not names:
        raise ConfigError("the NATS server certificate needs at least one name")
    not_before, not_after = now - _CLOCK_SKEW, now + validity
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "quotient"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"quotient NATS CA {now:%Y-%m-%d %H:%M:%S}"),
        ]
    )
    ca_key_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ca_key_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        addresses = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    except ValueError as exc:
        raise ConfigError(f"not an IP address for the NATS certificate: {exc}") from None
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        # Server for the clients; client too, for the routes a server dials to its peers.
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(n) for n in names), *addresses]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    bundle = ca.public_bytes(serialization.Encoding.PEM)
    if previous_ca is not None:
        bundle += first_certificate(previous_ca)
    return TlsMaterial(
        ca_pem=bundle,
        cert_pem=leaf.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        not_after=not_after,
    )


def first_certificate(pem: bytes) -> bytes:
    """The first certificate of a PEM bundle, as PEM; ``ConfigError`` when there is none."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate bundle: {exc}") from None
    return certificates[0].public_bytes(serialization.Encoding.PEM)


def write_files(directory: Path, material: TlsMaterial) -> natstls.TlsFiles:
    """``tls.crt``, ``tls.key`` (readable by this user only) and ``ca.crt`` in ``directory``, as a ``kubernetes.io/tls``
    Secret is mounted; an existing file is refused (``ConfigError``), never replaced."""
    files = natstls.TlsFiles.in_directory(directory)
    existing = [str(path) for path in (files.cert, files.key, files.ca) if path.exists()]
    if existing:
        raise ConfigError(f"refusing to overwrite {', '.join(existing)}; move them away first")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_new(files.key, material.key_pem, mode=_KEY_FILE_MODE)
        _write_new(files.cert, material.cert_pem, mode=_PUBLIC_FILE_MODE)
        _write_new(files.ca, material.ca_pem, mode=_PUBLIC_FILE_MODE)
    except OSError as exc:
        raise ConfigError(f"cannot write the NATS certificates to {directory}: {exc.strerror or exc}") from None
    return files


def for_loopback(directory: Path, *, now: datetime.datetime | None = None) -> natstls.TlsFiles:
    """Certificates for servers on this machine (``localhost``, 127.0.0.1, ::1) written to ``directory``: the embedded
    server of the demo, the benchmarks and the tests."""
    moment = now or datetime.datetime.now(datetime.UTC)
    return write_files(directory, generate(names=LOOPBACK_NAMES, now=moment))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write_new(path: Path, content: bytes, *, mode: int) -> None:
    # O_EXCL: never follow a planted symlink or clobber a file made since the check. The mode is set again after
    # creation because the umask may have narrowed it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content)
    finally:
        os.close(fd)

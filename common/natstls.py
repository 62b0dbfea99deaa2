"""TLS on NATS: the clients' contexts (``natsconn``, ``natsbatches``) and the server's ``tls`` blocks
(``natsserver``, ``natscluster``, ``deploy/base/nats/nats.conf``).

Why it is shaped this way:
- The server authenticates its clients by nkey (and the auth callout), not by certificate, so a client needs no
  certificate of its own: TLS here is server-side, and every client *pins* the server's CA (``--nats-ca``), with the
  host name checked, rather than trusting the system's CAs. A client given no CA uses the system's CAs only when the
  server asks for TLS or the URL says ``tls://`` (as nats-py does), so a public CA still works.
- A client that wants TLS (a CA to pin, a ``tls://`` URL: :func:`wants_tls`) starts the TLS handshake at once,
  before the server's first line ("TLS first", nats-server 2.10.4 and later; the servers here say ``handshake_first``).
  Classic NATS sends INFO in clear and the client upgrades only when INFO says ``tls_required``; nats-py believes that
  line, so whoever sits between could strip the flag and read the CONNECT, with the agent's token, in clear. With the
  handshake first, nothing is said before the server's certificate is verified. ``handshake_first: auto`` lets the
  servers still serve classic clients (a reader's ``nats`` CLI without ``--tlsfirst``): it waits a moment for a
  handshake, then sends INFO. A client that does not want TLS upgrades only where a server requires it
  (:func:`upgrade_needed`), with the system's CAs, as nats-py does.
- The CA file is read at every connection attempt (:func:`client_context`), and :func:`reload_ca` adds it again to a
  context that a library keeps across reconnects: a rotated CA reaches a running process with the kubelet's update of
  the mounted ConfigMap, without a restart (``deploy/README.md``, "Rotating the certificates").
- Routes between the servers of a cluster are mutual TLS (nats-server forces ``verify`` on routes): one certificate
  serves both ends, so it carries both server and client authentication (``quotient.natscerts`` makes it so).

The certificates themselves are made by ``quotient.natscerts`` (``quotient nats-keys``) or cert-manager; this module
only reads files, through ``ssl``.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from common.errors import BusUnavailable, ConfigError

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
"""The file names of a ``kubernetes.io/tls`` Secret as cert-manager writes them; ``quotient nats-keys`` does too."""

# How long the server waits for a client's TLS handshake (nats-server's default is 2 s, half a second less under
# load is a common cause of spurious failures; the scheduler's fast path connects in milliseconds).
HANDSHAKE_TIMEOUT_S = 2.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """A server's certificate and key, and the CA that signed it (which routes verify their peers with)."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def in_directory(cls, directory: Path) -> TlsFiles:
        """The files of a mounted ``kubernetes.io/tls`` Secret (or of ``quotient nats-keys --out-dir``)."""
        return cls(cert=directory / CERT_FILE, key=directory / KEY_FILE, ca=directory / CA_FILE)


def client_context(ca: Path | None) -> ssl.SSLContext:
    """A client context, TLS 1.2 or later, that verifies the server's certificate and host name against ``ca`` (the
    system's CAs when None). ``ConfigError`` naming the file when it cannot be read or holds no certificate."""
    if ca is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # host name checked, certificate required, no system CAs
        reload_ca(context, ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def reload_ca(context: ssl.SSLContext, ca: Path) -> None:
    """Add the certificates of ``ca`` to ``context`` (a rotated CA file: the old CAs stay trusted until the process
    restarts). ``ConfigError`` naming the file when it cannot be read or holds no certificate."""
    try:
        context.load_verify_locations(cafile=str(ca))
    except FileNotFoundError:
        raise ConfigError(f"--nats-ca: the CA file {ca} does not exist") from None
    except ssl.SSLError as exc:
        raise ConfigError(f"--nats-ca: {ca} holds no PEM certificate the TLS library accepts: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--nats-ca: cannot read {ca}: {exc.strerror or exc}") from None


def url_wants_tls(url: str) -> bool:
    return urlsplit(url).scheme == "tls"


def wants_tls(*, urls: Iterable[str], ca: Path | None) -> bool:
    """Whether a client must speak TLS whatever the server offers: a ``tls://`` URL, or a CA to pin."""
    return ca is not None or any(url_wants_tls(url) for url in urls)


def upgrade_needed(info: Mapping[str, Any], *, wanted: bool, url: str) -> bool:
    """Whether to upgrade a connection after the server's INFO (classic NATS: a client that wanted TLS did its
    handshake first): when the server requires TLS, or when the client wants it and the server offers it. A client
    that wants TLS from a server that offers none is refused here (``BusUnavailable``, retried like a server that is
    down), never sent in clear."""
    if info.get("tls_required"):
        return True
    if not wanted:
        return False
    if info.get("tls_available"):
        return True
    raise BusUnavailable(f"{url} does not offer TLS, and --nats-ca or a tls:// URL asks for it")


def server_block(files: TlsFiles, *, routes: bool = False) -> str:
    """A nats-server ``tls { ... }`` block: for the client port (clients present no certificate; the handshake may
    come first), or with ``routes`` inside ``cluster { }`` (the peer's certificate verified)."""
    lines = [
        "tls {",
        f'  cert_file: "{files.cert}"',
        f'  key_file: "{files.key}"',
        f'  ca_file: "{files.ca}"',
        f"  verify: {'true' if routes else 'false'}",
        f"  timeout: {HANDSHAKE_TIMEOUT_S}",
    ]
    if not routes:
        lines.append("  handshake_first: auto")
    lines.append("}")
    return "\n".join(lines)

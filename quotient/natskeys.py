"""``quotient nats-keys``: fresh nkey credentials for the NATS users of a deployment and its auth callout.

The NATS server configuration in ``deploy/base/nats/auth.conf`` names the nkey users ``scheduler`` and ``reader``
(and, in the fallback without the auth callout, ``deploy/overlays/static-nkeys``, ``agent``), and the auth callout's
issuer, an account key (``callout``); it reads their public keys from environment variables
(``$QUOTIENT_SCHEDULER_NKEY``, ..., ``$QUOTIENT_CALLOUT_NKEY``). Those come from the ``quotient-nats-users`` Secret;
each process gets its private seed from its own Secret (``quotient-nats-scheduler``, ...; the scheduler also
``quotient-nats-callout``, whose key signs the agents' grants). No key is ever committed: an operator runs

    quotient nats-keys --namespace quotient-system | kubectl apply -f -

once per cluster, and again to rotate (then restarts NATS and the Quotient pods). With ``--out-dir`` the same keys
go to local files instead (``agent.seed``, ... with mode 0600, and ``users.env``), for the demo and the tests.

It also makes NATS's TLS certificates (on by default, since deploy/base serves TLS only and its servers do not start
without them; ``--no-tls`` where cert-manager issues them, ``deploy/overlays/cert-manager``): a CA of its own and the
servers' certificate for the NATS Services' names (``quotient.natscerts``), as the Secret ``quotient-nats-tls``
(mounted by the NATS servers only) and the CA alone as the ConfigMap ``quotient-nats-ca`` (mounted by every client:
the CA's certificate is public, and no client pod, nor its node, holds the servers' key). ``--tls-only`` makes the
certificates alone, to rotate them; ``--previous-ca`` keeps trusting the CA the servers present now meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from common import credentials, names, natstls
from common.errors import ConfigError
from quotient import natscerts

ROLES = ("agent", "scheduler", "reader")
CALLOUT = "callout"
"""The auth callout's account key (``SA...``): the scheduler signs the agents' grants with it (Secret
``quotient-nats-callout``), and the server trusts its public key as the callout's ``issuer`` (auth.conf)."""
DEFAULT_NAMESPACE = "quotient-system"
USERS_SECRET = "quotient-nats-users"
SEED_KEY = "seed"
USERS_ENV_FILE = "users.env"
_SEED_FILE_MODE = 0o600
_ENV_FILE_MODE = 0o644  # public keys only
# A namespace name is an RFC 1123 label (Kubernetes validation.IsDNS1123Label).
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UserKey:
    """One NATS key pair (a user's, or the callout's account key); the seed stays out of the repr so a log line
    cannot leak it."""

    role: str
    seed: bytes = dataclasses.field(repr=False)
    public_key: str


def seed_secret_name(role: str) -> str:
    """The Secret holding ``role``'s seed under the key ``seed`` (the DaemonSet mounts ``quotient-nats-agent``)."""
    return f"quotient-nats-{role}"


def env_name(role: str) -> str:
    """The environment variable through which nats-server reads ``role``'s public key (see auth.conf)."""
    return f"QUOTIENT_{role.upper()}_NKEY"


def generate_keys() -> tuple[UserKey, ...]:
    """A fresh key pair for each role, in ``ROLES`` order, then the callout's account key (``CALLOUT``)."""
    keys = []
    for role in ROLES:
        seed = credentials.generate_user_seed()
        keys.append(UserKey(role=role, seed=seed, public_key=credentials.public_key(seed)))
    issuer = credentials.generate_account_seed()
    keys.append(UserKey(role=CALLOUT, seed=issuer, public_key=credentials.account_public_key(issuer)))
    return tuple(keys)


def render_secrets(namespace: str) -> str:
    """Fresh keys as a multi-document YAML: one seed Secret per role and the ``quotient-nats-users`` Secret."""
    return secrets_yaml(namespace=namespace, keys=generate_keys())


def secrets_yaml(*, namespace: str, keys: Sequence[UserKey]) -> str:
    """The Secrets for the given keys in ``namespace``; ``ConfigError`` if the namespace is not a valid name."""
    if not _DNS1123_LABEL.match(namespace):
        raise ConfigError(
            f"--namespace {namespace!r} is not a Kubernetes namespace name (lower-case letters, digits and '-', "
            "at most 63 characters, starting and ending with a letter or digit)"
        )
    documents: list[Mapping[str, object]] = [
        _secret(
            name=seed_secret_name(key.role),
            namespace=namespace,
            component=f"{key.role}-credentials",
            data={SEED_KEY: key.seed.decode("ascii")},
        )
        for key in keys
    ]
    documents.append(
        _secret(
            name=USERS_SECRET,
            namespace=namespace,
            component="nats-users",
            data={env_name(key.role): key.public_key for key in keys},
        )
    )
    header = (
        "# NATS nkey credentials for Quotient, made by `quotient nats-keys`. The seeds below are private keys:\n"
        "# apply them (kubectl apply -f -), do not commit or share this output.\n"
    )
    return header + yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def _secret(*, name: str, namespace: str, component: str, data: Mapping[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                names.PART_OF_LABEL: names.PRODUCT,
                names.COMPONENT_LABEL: component,
                names.MANAGED_BY_LABEL: "quotient-nats-keys",
            },
        },
        "type": "Opaque",
        "stringData": dict(data),
    }


def write_key_files(out_dir: Path, keys: Sequence[UserKey]) -> list[Path]:
    """Write ``<role>.seed`` (mode 0600) per key and ``users.env``; refuse to replace any existing file."""
    targets = [out_dir / f"{key.role}.seed" for key in keys] + [out_dir / USERS_ENV_FILE]
    existing = [str(path) for path in targets if path.exists()]
    if existing:
        raise ConfigError(f"--out-dir {out_dir}: refusing to overwrite {', '.join(existing)}; move them away first")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for key, path in zip(keys, targets[:-1], strict=True):
            _write_new(path, key.seed + b"\n", mode=_SEED_FILE_MODE)
        env = "".join(f"{env_name(key.role)}={key.public_key}\n" for key in keys)
        _write_new(targets[-1], env.encode("ascii"), mode=_ENV_FILE_MODE)
    except OSError as exc:
        raise ConfigError(f"--out-dir {out_dir}: cannot write key files: {exc}") from None
    return targets


def _write_new(path: Path, content: bytes, *, mode: int) -> None:
    # O_EXCL: never follow a planted symlink or clobber a file created since the check above. The mode is set
    # again after creation because the umask may have narrowed it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content)
    finally:
        os.close(fd)


# --- TLS: the NATS servers' certificate and the CA the clients pin ---

TLS_SECRET = "quotient-nats-tls"
"""Mounted by the NATS servers (deploy/base/nats/statefulset.yaml); cert-manager's Certificate writes the same."""
CA_CONFIG_MAP = "quotient-nats-ca"
"""Mounted by every client (``--nats-ca``): the CA's certificate only."""
TLS_DIR = "tls"
"""With ``--out-dir``: where ``tls.crt``, ``tls.key`` and ``ca.crt`` go."""


def tls_material(args: argparse.Namespace) -> natscerts.TlsMaterial | None:
    """The certificates the arguments ask for (None with ``--no-tls``); ``ConfigError`` for a bad ``--previous-ca``
    or validity."""
    if not args.tls and not args.tls_only:
        return None
    previous = None
    if args.previous_ca is not None:
        try:
            previous = args.previous_ca.read_bytes()
        except OSError as exc:
            raise ConfigError(f"--previous-ca {args.previous_ca}: {exc.strerror or exc}") from None
    if args.tls_days <= 0:
        raise ConfigError(f"--tls-days must be positive, not {args.tls_days}")
    return natscerts.generate(
        names=natscerts.dns_names(args.namespace),
        now=datetime.datetime.now(datetime.UTC),
        validity=datetime.timedelta(days=args.tls_days),
        previous_ca=previous,
    )


def tls_yaml(*, namespace: str, material: natscerts.TlsMaterial) -> str:
    """The servers' Secret (``kubernetes.io/tls``) and the clients' CA ConfigMap, as YAML documents."""
    labels = {names.PART_OF_LABEL: names.PRODUCT, names.MANAGED_BY_LABEL: "quotient-nats-keys"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": TLS_SECRET,
            "namespace": namespace,
            "labels": {**labels, names.COMPONENT_LABEL: "nats-tls"},
        },
        "type": "kubernetes.io/tls",
        "stringData": {
            natstls.CERT_FILE: material.cert_pem.decode("ascii"),
            natstls.KEY_FILE: material.key_pem.decode("ascii"),
            natstls.CA_FILE: material.ca_pem.decode("ascii"),
        },
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CA_CONFIG_MAP,
            "namespace": namespace,
            "labels": {**labels, names.COMPONENT_LABEL: "nats-ca"},
        },
        "data": {natstls.CA_FILE: material.ca_pem.decode("ascii")},
    }
    return yaml.safe_dump_all([secret, config_map], sort_keys=False, explicit_start=True)


def _add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"also make the NATS servers' certificate ({TLS_SECRET}) and the CA the clients pin ({CA_CONFIG_MAP}); "
        "--no-tls where cert-manager issues them (default: on)",
    )
    parser.add_argument(
        "--tls-only", action="store_true", help="make the certificates only, no nkeys (rotating the certificates)"
    )
    parser.add_argument(
        "--previous-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM of the CA the servers present now (the ConfigMap's ca.crt): trusted beside the new CA, so clients "
        "keep connecting while the servers restart with the new certificate",
    )
    parser.add_argument(
        "--tls-days", type=int, default=natscerts.DEFAULT_VALIDITY.days, help="validity of the certificates in days"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotient nats-keys",
        description=(
            "Make fresh nkey credentials for the NATS users agent, scheduler and reader. Without --out-dir, print "
            "Kubernetes Secrets (pipe them to `kubectl apply -f -`); with it, write seed files and users.env."
        ),
    )
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help=f"namespace of the Secrets (default {DEFAULT_NAMESPACE})"
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="write agent.seed, scheduler.seed, reader.seed (mode 0600) and users.env here instead of printing",
    )
    _add_tls_arguments(parser)
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``quotient nats-keys``; 0 on success, 1 on a configuration error (argparse exits 2 on bad usage)."""
    args = _parser().parse_args(list(argv))
    try:
        keys = () if args.tls_only else generate_keys()
        tls = tls_material(args)
        if tls is not None:
            print(f"the NATS certificates expire at {tls.not_after:%Y-%m-%d %H:%M} UTC", file=sys.stderr)
        if args.out_dir is None:
            # secrets_yaml checks the namespace; with --tls-only (no users Secret to print) it is checked here.
            if args.tls_only and not _DNS1123_LABEL.match(args.namespace):
                raise ConfigError(f"--namespace {args.namespace!r} is not a Kubernetes namespace name")
            text = (
                secrets_yaml(namespace=args.namespace, keys=keys)
                if keys
                else "# NATS's TLS certificates for Quotient, made by `quotient nats-keys`. tls.key below is a private "
                "key:\n# apply it (kubectl apply -f -), do not commit or share this output.\n"
            )
            if tls is not None:
                text += tls_yaml(namespace=args.namespace, material=tls)
            sys.stdout.write(text)
            return 0
        written = write_key_files(args.out_dir, keys) if keys else []
        if tls is not None:
            files = natscerts.write_files(args.out_dir / TLS_DIR, tls)
            written += [files.cert, files.key, files.ca]
    except ConfigError as exc:
        print(f"quotient nats-keys: error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0

"""``quotient nats-keys``: fresh nkey credentials for the three NATS users of a deployment.

The NATS server configuration in ``deploy/base/nats/auth.conf`` names three nkey users, ``agent``, ``scheduler`` and
``reader``, whose public keys it reads from environment variables (``$QUOTIENT_AGENT_NKEY``, ...). Those come from
the ``quotient-nats-users`` Secret; each process gets its private seed from its own Secret
(``quotient-nats-agent``, ...). No key is ever committed: an operator runs

    quotient nats-keys --namespace quotient-system | kubectl apply -f -

once per cluster, and again to rotate (then restarts NATS and the Quotient pods). With ``--out-dir`` the same keys
go to local files instead (``agent.seed``, ... with mode 0600, and ``users.env``), for the demo and the tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from common import credentials, names
from common.errors import ConfigError

ROLES = ("agent", "scheduler", "reader")
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
    """One NATS user's key pair; the seed stays out of the repr so a log line cannot leak it."""

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
    """A fresh key pair for each role, in ``ROLES`` order."""
    keys = []
    for role in ROLES:
        seed = credentials.generate_user_seed()
        keys.append(UserKey(role=role, seed=seed, public_key=credentials.public_key(seed)))
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
    return parser


def main(argv: Sequence[str]) -> int:
    """Run ``quotient nats-keys``; 0 on success, 1 on a configuration error (argparse exits 2 on bad usage)."""
    args = _parser().parse_args(list(argv))
    try:
        keys = generate_keys()
        if args.out_dir is None:
            sys.stdout.write(secrets_yaml(namespace=args.namespace, keys=keys))
            return 0
        written = write_key_files(args.out_dir, keys)
    except ConfigError as exc:
        print(f"quotient nats-keys: error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0

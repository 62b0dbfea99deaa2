"""NATS nkey credentials: making user seeds, deriving their public keys, and reading seed files.

Every Quotient process authenticates to NATS as an nkey user (``agent``, ``scheduler``, ``reader``): it holds a
private seed (``SU...``, mounted from a Secret) and the server knows only the public key (``U...``). This is the one
module that imports ``nkeys``; it turns the library's terse errors into ``ConfigError`` messages that name the file
and what is wrong with it, and it never puts a seed, or any part of one, into a message or a repr.

The ``nkeys`` decoder checks the prefix but not the CRC-16 that closes every encoded key, so a seed with one mistyped
character would decode to a different key and fail later as an opaque "authorization violation". We check the whole
encoding here, where the message can still say which file is wrong.

The NATS auth callout (``common.natsjwt``) signs with an *account* seed (``SA...``) and checks the server's signature
with its public key (``N...``); ``sign`` and ``verify`` are those two operations. ``nkeys`` signs but cannot verify
with a bare public key, so ``verify`` uses PyNaCl's Ed25519 directly (the library ``nkeys`` itself is built on, so
always installed with it).
"""

from __future__ import annotations

import base64
import os
import pathlib
import secrets

import nacl.exceptions
import nacl.signing
import nkeys

from common.errors import ConfigError

# An Ed25519 seed is 32 bytes; encoded it is 2 prefix bytes + 32 + a 2-byte CRC = 36 bytes, 58 base32 characters.
_RAW_SEED_BYTES = 32
_ENCODED_SEED_BYTES = 2 + _RAW_SEED_BYTES + 2
SEED_LENGTH = 58
# A seed file holds one line; anything much longer is the wrong file (a .creds file with a JWT, a binary).
_MAX_SEED_FILE_BYTES = 4096
# An encoded public key is 1 prefix byte + 32 + a 2-byte CRC = 35 bytes, 56 base32 characters.
_ENCODED_PUBLIC_BYTES = 1 + _RAW_SEED_BYTES + 2
PUBLIC_KEY_LENGTH = 56
_KINDS = {
    nkeys.PREFIX_BYTE_USER: "user",
    nkeys.PREFIX_BYTE_ACCOUNT: "account",
    nkeys.PREFIX_BYTE_SERVER: "server",
    nkeys.PREFIX_BYTE_OPERATOR: "operator",
    nkeys.PREFIX_BYTE_CLUSTER: "cluster",
}


def generate_user_seed() -> bytes:
    """A fresh nkey seed for a NATS user (``SU...``), from the operating system's CSPRNG."""
    return bytes(nkeys.encode_seed(secrets.token_bytes(_RAW_SEED_BYTES), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    """The public key (``U...``) of a user seed; ``ConfigError`` if ``seed`` is not a valid user seed."""
    problem = _seed_problem(seed)
    if problem is not None:
        raise ConfigError(f"not a NATS user nkey seed: {problem}")
    try:
        pair = nkeys.from_seed(bytearray(seed))
        key = bytes(pair.public_key).decode("ascii")
        pair.wipe()
    except nkeys.NkeysError as exc:
        raise ConfigError(f"not a NATS user nkey seed: {exc}") from None
    return key


def sign_nonce(seed: bytes, nonce: bytes) -> str:
    """The signature of the server's ``nonce`` that proves holding ``seed`` (the ``sig`` of a NATS CONNECT): Ed25519,
    URL-safe base64 without padding, as nats-py sends it. ``ConfigError`` if ``seed`` is not a user seed."""
    problem = _seed_problem(seed)
    if problem is not None:
        raise ConfigError(f"not a NATS user nkey seed: {problem}")
    try:
        pair = nkeys.from_seed(bytearray(seed))
        try:
            signature = pair.sign(nonce)
        finally:
            pair.wipe()
    except nkeys.NkeysError as exc:
        raise ConfigError(f"not a NATS user nkey seed: {exc}") from None
    return base64.urlsafe_b64encode(signature).rstrip(b"=").decode("ascii")


def generate_account_seed() -> bytes:
    """A fresh nkey seed for a NATS account (``SA...``): the auth callout's issuer key."""
    return bytes(nkeys.encode_seed(secrets.token_bytes(_RAW_SEED_BYTES), nkeys.PREFIX_BYTE_ACCOUNT))


def account_public_key(seed: bytes) -> str:
    """The public key (``A...``) of an account seed; ``ConfigError`` if ``seed`` is not one."""
    problem = _seed_problem(seed, nkeys.PREFIX_BYTE_ACCOUNT)
    if problem is not None:
        raise ConfigError(f"not a NATS account nkey seed: {problem}")
    return _public_of(seed)


def generate_seed(kind: str) -> bytes:
    """A fresh nkey seed of ``kind`` (``user``, ``account``, ``server``, ``operator``, ``cluster``)."""
    prefix = {name: byte for byte, name in _KINDS.items()}[kind]
    return bytes(nkeys.encode_seed(secrets.token_bytes(_RAW_SEED_BYTES), prefix))


def seed_public_key(seed: bytes) -> str:
    """The public key of a seed of any kind; ``ConfigError`` if ``seed`` is not a well-formed seed."""
    if all(_seed_problem(seed, role) is not None for role in _KINDS):
        raise ConfigError("not a NATS nkey seed")
    return _public_of(seed)


def sign(seed: bytes, data: bytes) -> bytes:
    """The raw Ed25519 signature of ``data`` by the key of ``seed`` (of any kind), as a NATS JWT carries it;
    ``ConfigError`` if ``seed`` is not a well-formed seed."""
    if all(_seed_problem(seed, role) is not None for role in _KINDS):
        raise ConfigError("not a NATS nkey seed")
    try:
        pair = nkeys.from_seed(bytearray(seed))
        try:
            return bytes(pair.sign(data))
        finally:
            pair.wipe()
    except nkeys.NkeysError as exc:
        raise ConfigError(f"cannot sign with this nkey seed: {exc}") from None


def public_key_kind(key: str) -> str | None:
    """What an encoded public key belongs to (``user``, ``account``, ``server``, ``operator``, ``cluster``), or None
    when ``key`` is not a well-formed public key (its length, base32 or CRC-16 wrong)."""
    raw = _public_raw(key)
    return _KINDS.get(raw[0]) if raw is not None else None


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``data`` by the key whose public key is ``public_key``."""
    raw = _public_raw(public_key)
    if raw is None or raw[0] not in _KINDS:
        return False
    try:
        nacl.signing.VerifyKey(raw[1:-2]).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True


def _public_raw(key: str) -> bytes | None:
    if len(key) != PUBLIC_KEY_LENGTH or not key.isascii():
        return None
    try:
        raw = base64.b32decode(key + "=" * (-len(key) % 8))
    except ValueError:
        return None
    return raw if len(raw) == _ENCODED_PUBLIC_BYTES and _crc_ok(raw) else None


def _public_of(seed: bytes) -> str:
    try:
        pair = nkeys.from_seed(bytearray(seed))
        key = bytes(pair.public_key).decode("ascii")
        pair.wipe()
    except nkeys.NkeysError as exc:
        raise ConfigError(f"not a NATS nkey seed: {exc}") from None
    return key


def read_seed_file(path: str | os.PathLike[str]) -> bytes:
    """The user seed held in ``path`` (surrounding whitespace removed), or ``ConfigError`` naming the file."""
    return _read_seed(path, nkeys.PREFIX_BYTE_USER)


def read_account_seed_file(path: str | os.PathLike[str]) -> bytes:
    """The account seed (``SA...``) held in ``path``, such as the auth callout's issuer key, or ``ConfigError``."""
    return _read_seed(path, nkeys.PREFIX_BYTE_ACCOUNT)


def _read_seed(path: str | os.PathLike[str], role: int) -> bytes:
    name = os.fspath(path)
    try:
        with pathlib.Path(name).open("rb") as handle:
            content = handle.read(_MAX_SEED_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"nkey seed file {name} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"nkey seed file {name} is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(
            f"nkey seed file {name} is not readable by uid {os.geteuid()} (check the Secret's defaultMode and fsGroup)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read nkey seed file {name}: {exc.strerror or exc}") from None
    if len(content) > _MAX_SEED_FILE_BYTES:
        raise ConfigError(f"nkey seed file {name} is larger than {_MAX_SEED_FILE_BYTES} bytes; it should hold one seed")
    seed = content.strip()
    if not seed:
        raise ConfigError(f"nkey seed file {name} is empty")
    problem = _seed_problem(seed, role)
    if problem is not None:
        raise ConfigError(f"nkey seed file {name} does not hold a NATS {_KINDS[role]} nkey seed: {problem}")
    return seed


def _seed_problem(seed: bytes, role: int = nkeys.PREFIX_BYTE_USER) -> str | None:
    """What is wrong with ``seed`` as an encoded seed of ``role`` (a user's by default), in words that reveal none
    of it; None if nothing."""
    if not seed.startswith(b"S"):
        return "a seed starts with 'S' (a user seed with 'SU', an account seed with 'SA')"
    if len(seed) != SEED_LENGTH:
        return f"a seed is {SEED_LENGTH} characters long, this is {len(seed)}"
    try:
        raw = base64.b32decode(seed + b"=" * (-len(seed) % 8))
    except ValueError:  # binascii.Error, and non-ASCII input
        return "it is not base32 (characters A-Z and 2-7)"
    if len(raw) != _ENCODED_SEED_BYTES or not _crc_ok(raw):
        return "its checksum does not match (a character was changed or lost)"
    if raw[0] & 0xF8 != nkeys.PREFIX_BYTE_SEED:
        return "it is not a seed"
    found = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
    if found != role and role == nkeys.PREFIX_BYTE_USER:
        return "it is the seed of an operator, account, server or cluster key, not of a user ('SU...')"
    if found != role:
        return f"it is the seed of a {_KINDS.get(found, 'different')} key, not of the {_KINDS[role]} key needed"
    return None


def _crc_ok(raw: bytes) -> bool:
    return int(nkeys.crc16(raw[:-2])) == int.from_bytes(raw[-2:], "little")

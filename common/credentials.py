"""NATS nkey credentials: making user seeds, deriving their public keys, and reading seed files.

Every Quotient process authenticates to NATS as an nkey user (``agent``, ``scheduler``, ``reader``): it holds a
private seed (``SU...``, mounted from a Secret) and the server knows only the public key (``U...``). This is the one
module that imports ``nkeys``; it turns the library's terse errors into ``ConfigError`` messages that name the file
and what is wrong with it, and it never puts a seed, or any part of one, into a message or a repr.

The ``nkeys`` decoder checks the prefix but not the CRC-16 that closes every encoded key, so a seed with one mistyped
character would decode to a different key and fail later as an opaque "authorization violation". We check the whole
encoding here, where the message can still say which file is wrong.
"""

from __future__ import annotations

import base64
import os
import pathlib
import secrets

import nkeys

from common.errors import ConfigError

# An Ed25519 seed is 32 bytes; encoded it is 2 prefix bytes + 32 + a 2-byte CRC = 36 bytes, 58 base32 characters.
_RAW_SEED_BYTES = 32
_ENCODED_SEED_BYTES = 2 + _RAW_SEED_BYTES + 2
SEED_LENGTH = 58
# A seed file holds one line; anything much longer is the wrong file (a .creds file with a JWT, a binary).
_MAX_SEED_FILE_BYTES = 4096


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


def read_seed_file(path: str | os.PathLike[str]) -> bytes:
    """The user seed held in ``path`` (surrounding whitespace removed), or ``ConfigError`` naming the file."""
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
    problem = _seed_problem(seed)
    if problem is not None:
        raise ConfigError(f"nkey seed file {name} does not hold a NATS user nkey seed: {problem}")
    return seed


def _seed_problem(seed: bytes) -> str | None:
    """What is wrong with ``seed`` as an encoded user seed, in words that reveal none of it; None if nothing."""
    if not seed.startswith(b"S"):
        return "a seed starts with 'S' (a user seed with 'SU')"
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
    role = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
    if role != nkeys.PREFIX_BYTE_USER:
        return "it is the seed of an operator, account, server or cluster key, not of a user ('SU...')"
    return None


def _crc_ok(raw: bytes) -> bool:
    return int(nkeys.crc16(raw[:-2])) == int.from_bytes(raw[-2:], "little")

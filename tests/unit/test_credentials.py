"""nkey seeds and public keys (common/credentials.py) and the Secrets and files of `quotient nats-keys`."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common import credentials
from common.errors import ConfigError
from quotient import natskeys

# The user pair of nats.py's own test suite (FOO_USER_SEED, FOO_USER_NKEY): a known answer from another codebase.
KNOWN_SEED = b"SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"
KNOWN_PUBLIC_KEY = "UCK5N7N66OBOINFXAYC2ACJQYFSOD4VYNU6APEJTAVFZB2SVHLKGEW7L"
# An account seed (SA...), valid but of the wrong role for a NATS user.
ACCOUNT_SEED = b"SAAH4Y2SYX6L5OFQ6BNXIKVDHKJSVZNN6BMNQKVMIM6ZA2KZ7UV7TXKVXU"


def _one_character_changed(seed: bytes) -> bytes:
    position = 20
    replacement = b"B" if seed[position : position + 1] != b"B" else b"C"
    return seed[:position] + replacement + seed[position + 1 :]


# --- seeds and public keys ---


def test_a_generated_seed_is_a_user_seed() -> None:
    seed = credentials.generate_user_seed()

    assert seed.startswith(b"SU")
    assert len(seed) == credentials.SEED_LENGTH
    assert credentials.public_key(seed).startswith("U")


def test_every_generated_seed_is_new() -> None:
    assert len({credentials.generate_user_seed() for _ in range(20)}) == 20


def test_the_public_key_of_a_known_seed_is_the_known_public_key() -> None:
    assert credentials.public_key(KNOWN_SEED) == KNOWN_PUBLIC_KEY


@pytest.mark.parametrize(
    ("seed", "reason"),
    [
        (b"", "starts with 'S'"),
        (b"UCK5N7N66OBOINFXAYC2ACJQYFSOD4VYNU6APEJTAVFZB2SVHLKGEW7L", "starts with 'S'"),
        (KNOWN_SEED[:-1], "58 characters"),
        (KNOWN_SEED.lower(), "starts with 'S'"),
        (b"S" + b"1" * 57, "not base32"),
        (_one_character_changed(KNOWN_SEED), "checksum"),
        (ACCOUNT_SEED, "not of a user"),
    ],
    ids=["empty", "public-key", "short", "lower-case", "not-base32", "one-character-changed", "account-seed"],
)
def test_a_malformed_seed_is_refused_with_the_reason(seed: bytes, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        credentials.public_key(seed)


# --- seed files ---


def test_a_seed_file_with_a_trailing_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "agent.seed"
    path.write_bytes(KNOWN_SEED + b"\n")

    assert credentials.read_seed_file(path) == KNOWN_SEED
    assert credentials.read_seed_file(str(path)) == KNOWN_SEED


def test_a_missing_seed_file_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.seed"

    with pytest.raises(ConfigError, match=f"{path} does not exist"):
        credentials.read_seed_file(path)


def test_a_directory_is_not_a_seed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        credentials.read_seed_file(tmp_path)


def test_an_unreadable_seed_file_is_reported_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.seed"
    path.write_bytes(KNOWN_SEED)

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    # Tests often run as root, for whom a mode of 0000 changes nothing: refuse the open itself.
    monkeypatch.setattr(Path, "open", refuse)

    with pytest.raises(ConfigError, match="is not readable by uid"):
        credentials.read_seed_file(path)


def test_an_empty_seed_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.seed"
    path.write_bytes(b"\n")

    with pytest.raises(ConfigError, match="is empty"):
        credentials.read_seed_file(path)


def test_a_corrupt_seed_file_is_refused_without_showing_its_content(tmp_path: Path) -> None:
    corrupt = _one_character_changed(KNOWN_SEED)
    path = tmp_path / "agent.seed"
    path.write_bytes(corrupt)

    with pytest.raises(ConfigError, match="does not hold a NATS user nkey seed") as caught:
        credentials.read_seed_file(path)

    message = str(caught.value)
    assert corrupt.decode() not in message
    assert corrupt.decode()[2:12] not in message
    assert caught.value.__cause__ is None


def test_a_credentials_file_is_not_a_seed_file(tmp_path: Path) -> None:
    path = tmp_path / "user.creds"
    path.write_bytes(b"-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5In0\n" + KNOWN_SEED + b"\n")

    with pytest.raises(ConfigError, match="does not hold a NATS user nkey seed"):
        credentials.read_seed_file(path)


def test_a_large_file_is_not_read_as_a_seed(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"S" * 100_000)

    with pytest.raises(ConfigError, match="larger than"):
        credentials.read_seed_file(path)


# --- quotient nats-keys ---


def _documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_rendered_secrets_are_valid_kubernetes_secrets_in_the_namespace() -> None:
    documents = _documents(natskeys.render_secrets("gpu-system"))

    assert [doc["metadata"]["name"] for doc in documents] == [
        "quotient-nats-agent",
        "quotient-nats-scheduler",
        "quotient-nats-reader",
        "quotient-nats-callout",
        "quotient-nats-users",
    ]
    for doc in documents:
        kubernetes_validate.validate(doc, "1.32", strict=True)
        assert doc["metadata"]["namespace"] == "gpu-system"


def test_the_users_secret_holds_the_public_key_of_each_seed_secret() -> None:
    documents = {doc["metadata"]["name"]: doc["stringData"] for doc in _documents(natskeys.render_secrets("q"))}

    users = documents["quotient-nats-users"]
    assert set(users) == {
        "QUOTIENT_AGENT_NKEY",
        "QUOTIENT_SCHEDULER_NKEY",
        "QUOTIENT_READER_NKEY",
        "QUOTIENT_CALLOUT_NKEY",
    }
    for role in natskeys.ROLES:
        seed = documents[f"quotient-nats-{role}"]["seed"]
        assert users[f"QUOTIENT_{role.upper()}_NKEY"] == credentials.public_key(seed.encode())
    # The callout's key is an account's (the server's auth_callout issuer), not a user's.
    issuer = documents["quotient-nats-callout"]["seed"].encode()
    assert users["QUOTIENT_CALLOUT_NKEY"] == credentials.account_public_key(issuer)
    assert len(set(users.values())) == 4


def test_each_rendering_makes_new_keys() -> None:
    assert natskeys.render_secrets("q") != natskeys.render_secrets("q")


@pytest.mark.parametrize("namespace", ["", "Quotient", "-x", "a" * 64, "a.b", "a_b"])
def test_an_invalid_namespace_is_refused(namespace: str) -> None:
    with pytest.raises(ConfigError, match="is not a Kubernetes namespace name"):
        natskeys.render_secrets(namespace)


def test_a_user_key_never_shows_its_seed_in_its_repr() -> None:
    key = natskeys.generate_keys()[0]

    assert key.seed.decode() not in repr(key)
    assert key.public_key in repr(key)


def test_nats_keys_prints_secrets_for_kubectl(capsys: pytest.CaptureFixture[str]) -> None:
    assert natskeys.main(["--namespace", "ml-platform"]) == 0

    documents = _documents(capsys.readouterr().out)
    nkey_secrets = {natskeys.seed_secret_name(role) for role in (*natskeys.ROLES, natskeys.CALLOUT)}
    assert nkey_secrets | {natskeys.USERS_SECRET} <= {doc["metadata"]["name"] for doc in documents}
    assert {doc["metadata"]["namespace"] for doc in documents} == {"ml-platform"}


def test_nats_keys_writes_private_seed_files_and_a_users_env_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "keys"

    assert natskeys.main(["--out-dir", str(out)]) == 0

    env = dict(line.split("=", 1) for line in (out / "users.env").read_text().splitlines())
    for role in natskeys.ROLES:
        path = out / f"{role}.seed"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert env[f"QUOTIENT_{role.upper()}_NKEY"] == credentials.public_key(credentials.read_seed_file(path))
    assert capsys.readouterr().out == ""


def test_nats_keys_refuses_to_overwrite_existing_key_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "scheduler.seed").write_bytes(KNOWN_SEED)

    assert natskeys.main(["--out-dir", str(tmp_path)]) == 1

    assert "refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "scheduler.seed").read_bytes() == KNOWN_SEED
    assert not (tmp_path / "agent.seed").exists()


def test_nats_keys_reports_a_bad_namespace_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert natskeys.main(["--namespace", "Not_A_Name"]) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    assert "quotient nats-keys: error:" in captured.err

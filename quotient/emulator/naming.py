"""Names the API server and the controllers make up: ``generateName`` suffixes and pod-template hashes.

Both draw from apimachinery's SafeEncodeString alphabet (no vowels, no confusable characters), so generated names
look like a cluster's (``web-7c9d4b8f6d-x2kqp``) and never spell words.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from typing import Any

NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATED_SUFFIX = 5
_GENERATE_ATTEMPTS = 8  # the API server retries a generated name that exists (RetryGenerateName)
_MAX_NAME = 63


def random_suffix(length: int = _GENERATED_SUFFIX) -> str:
    return "".join(secrets.choice(NAME_ALPHABET) for _ in range(length))


def generate(prefix: str, *, taken: Callable[[str], bool]) -> str:
    """A name for ``generateName: prefix`` that is not ``taken`` (after a few tries, one that may be)."""
    for _ in range(_GENERATE_ATTEMPTS):
        candidate = prefix[: _MAX_NAME - _GENERATED_SUFFIX] + random_suffix()
        if not taken(candidate):
            return candidate
    return prefix + random_suffix()


def template_hash(template: Any) -> str:
    """A stable ``pod-template-hash`` for a pod template (10 characters of the safe alphabet)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).digest()
    return "".join(NAME_ALPHABET[byte % len(NAME_ALPHABET)] for byte in digest[:10])

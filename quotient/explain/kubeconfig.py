"""The namespace a kubectl user works in: their kubeconfig context's ``namespace``, else ``default``.

kubectl passes no flags to a plugin, so the plugin reads what kubectl would: ``--kubeconfig``, else every file of
``$KUBECONFIG`` (the first to set a key wins, as kubectl merges them), else ``~/.kube/config``; the context is
``--context`` or the files' ``current-context``. Credentials are not read here (the client does that); only the two
names. A file that cannot be read gives ``default``: the connection itself then says what is wrong with it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

DEFAULT_NAMESPACE = "default"


def files(explicit: str | None) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        return [Path(part).expanduser() for part in listed.split(os.pathsep) if part]
    return [Path("~/.kube/config").expanduser()]


def _load(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def namespace(*, kubeconfig: str | None, context: str | None) -> str:
    documents = [_load(path) for path in files(kubeconfig)]
    current = context or next(
        (str(doc["current-context"]) for doc in documents if isinstance(doc.get("current-context"), str)), ""
    )
    if not current:
        return DEFAULT_NAMESPACE
    for doc in documents:
        for entry in doc.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == current:
                found = (
                    (entry.get("context") or {}).get("namespace") if isinstance(entry.get("context"), dict) else None
                )
                return str(found) if isinstance(found, str) and found else DEFAULT_NAMESPACE
    return DEFAULT_NAMESPACE

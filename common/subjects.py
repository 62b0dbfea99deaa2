"""NATS subject names of wire protocol v1, in one place.

Subjects carry the node name (or alert name) as their last token. NATS tokens may not contain ``.``, ``*``, ``>``
or whitespace; Kubernetes node names may contain dots (``ip-10-0-0-1.ec2.internal``), so a node name is escaped
into a single token by :func:`node_token` and read back by :func:`node_from_token`.
"""

from __future__ import annotations

PREFIX = "quotient.v1"
TELEMETRY_PREFIX = f"{PREFIX}.telemetry"
HEALTH_PREFIX = f"{PREFIX}.health"
ALERTS_PREFIX = f"{PREFIX}.alerts"
DECISIONS = f"{PREFIX}.decisions"

TELEMETRY_ALL = f"{TELEMETRY_PREFIX}.>"
HEALTH_ALL = f"{HEALTH_PREFIX}.>"
ALERTS_ALL = f"{ALERTS_PREFIX}.>"

TELEMETRY_STREAM = "QUOTIENT_TELEMETRY"

_FORBIDDEN = frozenset(" \t\r\n.*>")


def node_token(node: str) -> str:
    """One subject token for a node name: dots become ``~`` (never valid in a Kubernetes name, so reversible)."""
    if not node:
        raise ValueError("empty node name")
    token = node.replace(".", "~")
    # "~" stands for "." in a token, so a name holding one would share a subject with its dotted twin.
    if "~" in node or any(ch in _FORBIDDEN for ch in token):
        raise ValueError(f"node name {node!r} cannot be a NATS subject token")
    return token


def node_from_token(token: str) -> str:
    return token.replace("~", ".")


def telemetry(node: str) -> str:
    return f"{TELEMETRY_PREFIX}.{node_token(node)}"


def health(node: str) -> str:
    return f"{HEALTH_PREFIX}.{node_token(node)}"


def alert(name: str) -> str:
    if not name or any(ch in _FORBIDDEN for ch in name):
        raise ValueError(f"alert name {name!r} cannot be a NATS subject token")
    return f"{ALERTS_PREFIX}.{name}"


def node_of(subject: str) -> str | None:
    """The node a telemetry or health subject names, or None for any other subject."""
    for prefix in (TELEMETRY_PREFIX, HEALTH_PREFIX):
        if subject.startswith(prefix + "."):
            token = subject[len(prefix) + 1 :]
            if token and "." not in token:
                return node_from_token(token)
    return None

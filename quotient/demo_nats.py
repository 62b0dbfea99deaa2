"""The demo's NATS, secured as ``deploy/`` secures it: fresh keys, deploy's own users, and the auth callout.

``quotient nats-keys`` makes the keys (into the demo's work directory); the embedded nats-server loads
``deploy/base/nats/auth.conf`` unchanged (the scheduler and the viewer are nkey users, every agent goes through the
auth callout that the scheduler serves), with the public keys in its environment as the ``quotient-nats-users``
Secret gives them in a cluster, and TLS only, as deploy's servers (a CA and a loopback certificate made here; every
client pins the CA). Where the emulated nodes' agents run in this process over ``FakeProbe`` (no C
compiler for the mock NVML driver) they share one connection, which cannot hold a node's identity each: NATS then
loads ``deploy/overlays/static-nkeys/auth.conf`` and they connect as the shared ``agent`` user, the documented
fallback, and the demo says so.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Final

from common.natsserver import NatsServer
from quotient import natscerts, natskeys

DEPLOY: Final = Path(__file__).resolve().parents[1] / "deploy"
CALLOUT_AUTH: Final = DEPLOY / "base" / "nats" / "auth.conf"
STATIC_AUTH: Final = DEPLOY / "overlays" / "static-nkeys" / "auth.conf"


@dataclasses.dataclass(slots=True, kw_only=True)
class DemoNats:
    server: NatsServer
    keys: Path
    callout: bool
    """Whether NATS runs the auth callout (the agents are processes, each with its node's token)."""
    ca: Path
    """The CA of the server's certificate, which every client pins (``--nats-ca``)."""

    def seed(self, role: str) -> Path:
        return self.keys / f"{role}.seed"

    def scheduler_arguments(self) -> list[str]:
        """How the scheduler connects: the scheduler user, and the callout's key where NATS runs the callout."""
        arguments = [
            "--nats",
            self.server.url,
            "--nats-ca",
            str(self.ca),
            "--nats-nkey-seed",
            str(self.seed("scheduler")),
        ]
        if self.callout:
            arguments += ["--nats-callout-issuer-seed", str(self.seed(natskeys.CALLOUT))]
        return arguments


def start(workdir: Path, *, callout: bool) -> DemoNats:
    """Make the keys in ``workdir/keys`` and start nats-server with deploy's users (and callout)."""
    keys = workdir / "keys"
    generated = natskeys.generate_keys()
    natskeys.write_key_files(keys, generated)
    server_dir = workdir / "nats"
    server_dir.mkdir(parents=True, exist_ok=True)
    auth = CALLOUT_AUTH if callout else STATIC_AUTH
    tls = natscerts.for_loopback(workdir / "tls")
    server = NatsServer(
        workdir=server_dir,
        tls=tls,
        extra_config=f'include "{os.path.relpath(auth, server_dir)}"\n',
        env={natskeys.env_name(key.role): key.public_key for key in generated},
    )
    return DemoNats(server=server.start(), keys=keys, callout=callout, ca=tls.ca)


def auth_summary(answers: dict[str, float], *, callout: bool) -> str:
    """The summary's line on how the agents authenticated, from the scheduler's ``quotient_nats_auth_total``
    (``outcome/reason`` -> count)."""
    if not callout:
        return "agents shared the NATS agent nkey (no auth callout: the agents run in one process)"
    granted = round(answers.get("granted/granted", 0))
    denied = {key.split("/", 1)[1]: round(value) for key, value in answers.items() if key.startswith("denied/")}
    refused = ", ".join(f"{count} {reason}" for reason, count in sorted(denied.items()) if count) or "none"
    return (
        f"each agent connected as its own node through the NATS auth callout ({granted} connections granted, "
        f"refused: {refused}): it may publish for that node only"
    )

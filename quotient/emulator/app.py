"""``quotient emulator``: a local Kubernetes API server with emulated nodes, for kubectl, the scheduler and demos.

Prints one JSON line on stdout once it listens (``{"url": ..., "port": ...}``), so a parent process that asked for
port 0 learns the port; logs go to stderr. ``--kubeconfig-out FILE`` writes a kubeconfig pointing at it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from common import clusterspec, config, logs
from common.config import Setting
from common.errors import ConfigError, QuotientError
from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.emulator.kubelets import KubeletConfig
from quotient.emulator.server import ServerConfig

log = logs.get("emulator.app")


def _parse_non_negative_s(raw: object) -> float:
    return config.parse_positive_duration_s(raw) if str(raw).strip() not in ("0", "0s") else 0.0


SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="port", parse=config.parse_port, default=8080, help="port to listen on (0: a free one)"),
    Setting(name="host", parse=config.parse_str, default="127.0.0.1", help="address to listen on"),
    Setting(name="nodes", parse=config.parse_str, default="2x8xA100-80GB", help="cluster spec: a file or inline form"),
    Setting(name="kubelet_delay", parse=_parse_non_negative_s, default=0.1, help="time from binding to Running"),
    Setting(
        name="bookmark_interval", parse=config.parse_positive_duration_s, default=10.0, help="watch bookmark period"
    ),
    Setting(name="history", parse=lambda raw: int(str(raw)), default=20_000, help="watch history kept, in events"),
    Setting(name="scripted_pods", parse=config.parse_bool, default=True, help="create the cluster spec's pods"),
    Setting(
        name="kubeconfig_out", parse=config.parse_str, default=None, help="write a kubeconfig here", metavar="FILE"
    ),
    *config.LOG_SETTINGS,
)


async def _serve(values: dict[str, object]) -> None:
    spec = clusterspec.resolve(str(values["nodes"]))
    emulator = Emulator(
        spec,
        config=EmulatorConfig(
            kubelet=KubeletConfig(start_delay_s=float(str(values["kubelet_delay"]))),
            server=ServerConfig(bookmark_interval_s=float(str(values["bookmark_interval"]))),
            history_events=int(str(values["history"])),
            scripted_pods=bool(values["scripted_pods"]),
        ),
    )
    await emulator.start(str(values["host"]), int(str(values["port"])))
    try:
        if values["kubeconfig_out"]:
            emulator.write_kubeconfig(Path(str(values["kubeconfig_out"])))
        print(json.dumps({"url": emulator.url, "port": emulator.port}), flush=True)
        await asyncio.Event().wait()
    finally:
        await emulator.stop()


def _run(values: dict[str, object]) -> None:
    import uvloop

    async def main_task() -> None:
        task = asyncio.ensure_future(_serve(values))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    uvloop.run(main_task())


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient emulator", description=__doc__.split("\n")[0] if __doc__ else None)
    config.add_arguments(parser, SETTINGS)
    try:
        values = config.resolve(SETTINGS, parser.parse_args(list(argv)))
    except ConfigError as exc:
        print(f"quotient emulator: {exc}", file=sys.stderr)
        return 2
    logs.setup(level=str(values["log_level"]), fmt=str(values["log_format"]))
    try:
        _run(values)
    except QuotientError as exc:
        log.error("emulator_failed", error=str(exc))
        return 1
    except OSError as exc:
        log.error("emulator_failed", error=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``quotient emulator``: a local Kubernetes API server with emulated nodes, for kubectl, the scheduler and demos.

Prints one JSON line on stdout once it listens (``{"url": ..., "port": ...}``), so a parent process that asked for
port 0 learns the port; logs go to stderr. ``--kubeconfig-out FILE`` writes a kubeconfig pointing at it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from common import clusterspec, command, config
from common.config import Setting
from common.errors import QuotientError
from quotient.emulator.emulator import Emulator, EmulatorConfig
from quotient.emulator.kubelets import KubeletConfig
from quotient.emulator.server import ServerConfig


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
        name="default_scheduler",
        parse=config.parse_bool,
        default=False,
        help="place pods naming default-scheduler, as kube-scheduler would",
    ),
    Setting(
        name="kubeconfig_out", parse=config.parse_str, default=None, help="write a kubeconfig here", metavar="FILE"
    ),
    *config.LOG_SETTINGS,
)


async def _serve(values: Mapping[str, object]) -> None:
    try:
        spec = clusterspec.resolve(str(values["nodes"]))
        emulator = Emulator(
            spec,
            config=EmulatorConfig(
                kubelet=KubeletConfig(start_delay_s=float(str(values["kubelet_delay"]))),
                server=ServerConfig(bookmark_interval_s=float(str(values["bookmark_interval"]))),
                history_events=int(str(values["history"])),
                scripted_pods=bool(values["scripted_pods"]),
                default_scheduler=bool(values["default_scheduler"]),
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
    except OSError as exc:  # the port is taken, the kubeconfig cannot be written: say so and exit 1
        raise QuotientError(str(exc)) from exc


def main(argv: Sequence[str]) -> int:
    return command.run_service(
        argv,
        prog="quotient emulator",
        description=__doc__.split("\n")[0] if __doc__ else "",
        settings=SETTINGS,
        prepare=command.values_as_is,
        serve=_serve,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

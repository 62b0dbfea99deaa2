"""``quotient reserve``: the entry point of a reservation pod, which holds one GPU for the pods that share it.

The device plugin gave this pod one GPU (it requests ``nvidia.com/gpu: 1``), so NVML inside it sees exactly that
device. The entry point reads the device's UUID and index through the agent's probe (the one module that imports
pynvml), writes them to its own pod's annotations (``quotient.dev/gpu-uuid``, ``quotient.dev/gpu-index``), where
the scheduler waits for them before it binds the sharing pods, and then idles until it is deleted. It lives in
``quotient/`` because it joins the agent's probe and the scheduler's Kubernetes client, which only the composition
root may import together.

Failures say what is wrong and exit non-zero (the kubelet restarts the pod; the scheduler's timeout deletes it if it
never reports): no GPU visible (the device plugin or runtime class is misconfigured), NVML unusable, the API refusing
the patch (RBAC). An API that is only unavailable is retried with backoff.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence

from agent.gpus.probe import GpuProbe
from common import config, logs
from common.backoff import Backoff
from common.config import Setting
from common.errors import ConfigError, QuotientError
from scheduler.kube import client, reservations
from scheduler.kube.errors import KubeError, KubeUnavailable

log = logs.get("reserve")

SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="pod_name", parse=config.parse_str, default=None, help="this pod's name (the downward API)"),
    Setting(name="pod_namespace", parse=config.parse_str, default=None, help="this pod's namespace (the downward API)"),
    Setting(
        name="kubeconfig", parse=config.parse_existing_file, default=None, help="kubeconfig file (default: in-cluster)"
    ),
    Setting(name="kube_server", parse=config.parse_str, default=None, help="API server URL without credentials"),
    *config.LOG_SETTINGS,
)


def read_device(probe: GpuProbe) -> tuple[str, int]:
    """The UUID and index of the one device this pod sees; ``ConfigError`` when it sees none or several."""
    probe.open()
    try:
        devices = probe.sample().devices
    finally:
        probe.close()
    if len(devices) != 1:
        raise ConfigError(
            f"a reservation pod must see exactly one GPU, this one sees {len(devices)}: check that it requests "
            "nvidia.com/gpu: 1 and runs with the nvidia runtime class"
        )
    return devices[0].uuid, devices[0].index


async def report_device(
    api: client.KubeApi,
    *,
    namespace: str,
    name: str,
    uuid: str,
    index: int,
    backoff: Backoff | None = None,
    attempts: int = 20,
    sleep: Callable[[float], object] = asyncio.sleep,
) -> None:
    """Write the device to this pod's annotations, retrying while the API is unavailable."""
    patch = {
        "metadata": {"annotations": {reservations.UUID_ANNOTATION: uuid, reservations.INDEX_ANNOTATION: str(index)}}
    }
    delays = backoff or Backoff(base_s=0.2, cap_s=10.0)
    for attempt in range(attempts):
        try:
            await api.patch(client.PODS, patch, name=name, namespace=namespace)
            log.info("reserved", pod=f"{namespace}/{name}", uuid=uuid, index=index)
            return
        except KubeUnavailable as exc:
            log.warning("report_retry", attempt=attempt + 1, error=str(exc))
            result = sleep(delays.delay_s(attempt))
            if asyncio.iscoroutine(result):
                await result
    raise KubeUnavailable(f"the API did not take the device's UUID after {attempts} attempts")


async def run(api: client.KubeApi, probe: GpuProbe, *, namespace: str, name: str, stop: asyncio.Event) -> None:
    uuid, index = await asyncio.to_thread(read_device, probe)
    await report_device(api, namespace=namespace, name=name, uuid=uuid, index=index)
    await stop.wait()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="quotient reserve", description="hold one GPU for a GPU group (a pod)")
    config.add_arguments(parser, SETTINGS)
    try:
        values = config.resolve(SETTINGS, parser.parse_args(list(argv)))
        if not values["pod_name"] or not values["pod_namespace"]:
            raise ConfigError(
                "--pod-name and --pod-namespace (or QUOTIENT_POD_NAME, QUOTIENT_POD_NAMESPACE) are needed"
            )
    except ConfigError as exc:
        print(f"quotient reserve: {exc}", file=sys.stderr)
        return 2
    logs.setup(level=str(values["log_level"]), fmt=str(values["log_format"]))
    from agent.gpus.nvml import NvmlProbe

    async def main_task() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        api = await client.KubeClient.connect(
            kubeconfig=str(values["kubeconfig"]) if values["kubeconfig"] else None,
            server=str(values["kube_server"]) if values["kube_server"] else None,
        )
        try:
            await run(api, NvmlProbe(), namespace=str(values["pod_namespace"]), name=str(values["pod_name"]), stop=stop)
        finally:
            with contextlib.suppress(KubeError):
                await api.close()

    try:
        asyncio.run(main_task())
    except QuotientError as exc:  # GpuError, KubeError, ConfigError: each says what is wrong
        log.error("reserve_failed", error=str(exc))
        return 1
    return 0

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

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from agent.gpus.probe import GpuProbe
from common import command, config, logs, names, retrying
from common.backoff import Backoff
from common.config import Setting
from common.errors import ConfigError
from scheduler.kube import client, kubeapi
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
    api: kubeapi.KubeApi,
    *,
    namespace: str,
    name: str,
    uuid: str,
    index: int,
    backoff: Backoff | None = None,
    attempts: int = 20,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Write the device to this pod's annotations, retrying while the API is unavailable."""
    patch = {
        "metadata": {
            "annotations": {names.RESERVATION_UUID_ANNOTATION: uuid, names.RESERVATION_INDEX_ANNOTATION: str(index)}
        }
    }

    def log_retry(attempt: int, error: BaseException, delay_s: float) -> None:
        log.warning("report_retry", attempt=attempt, error=str(error))

    try:
        await retrying.retry(
            lambda: api.patch(kubeapi.PODS, patch, name=name, namespace=namespace),
            backoff=backoff or Backoff(base_s=0.2, cap_s=10.0),
            retry_on=KubeUnavailable,
            attempts=attempts,
            on_retry=log_retry,
            sleep=sleep,
        )
    except KubeUnavailable as exc:
        raise KubeUnavailable(f"the API did not take the device's UUID after {attempts} attempts") from exc
    log.info("reserved", pod=f"{namespace}/{name}", uuid=uuid, index=index)


async def run(api: kubeapi.KubeApi, probe: GpuProbe, *, namespace: str, name: str) -> None:
    """Report the device this pod holds, then hold it until the pod is deleted (SIGTERM cancels this)."""
    uuid, index = await asyncio.to_thread(read_device, probe)
    await report_device(api, namespace=namespace, name=name, uuid=uuid, index=index)
    await asyncio.Event().wait()


def _prepare(values: Mapping[str, object]) -> Mapping[str, object]:
    if not values["pod_name"] or not values["pod_namespace"]:
        raise ConfigError("--pod-name and --pod-namespace (or QUOTIENT_POD_NAME, QUOTIENT_POD_NAMESPACE) are needed")
    return values


async def _serve(values: Mapping[str, object]) -> None:
    from agent.gpus.nvml import NvmlProbe

    api = await client.KubeClient.connect(
        kubeconfig=str(values["kubeconfig"]) if values["kubeconfig"] else None,
        server=str(values["kube_server"]) if values["kube_server"] else None,
    )
    try:
        await run(api, NvmlProbe(), namespace=str(values["pod_namespace"]), name=str(values["pod_name"]))
    finally:
        with contextlib.suppress(KubeError):
            await api.close()


def main(argv: Sequence[str]) -> int:
    # GpuError, KubeError and ConfigError raised while running each say what is wrong: logged, exit status 1.
    return command.run_service(
        argv,
        prog="quotient reserve",
        description="hold one GPU for a GPU group (a pod)",
        settings=SETTINGS,
        prepare=_prepare,
        serve=_serve,
    )

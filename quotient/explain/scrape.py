"""The scheduler leader's ``/metrics``, read and queried: measured GPU memory per pod and device, and alerts firing.

Only the leader follows telemetry, so only its ``/metrics`` carries the measured series. It is found from the Lease
(``holderIdentity`` is the leader's pod name, as ``deploy/`` sets ``--identity=$(POD_NAME)``) and read through the
API server's pod proxy (``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics``, RBAC ``get`` on ``pods/proxy``), so
the user needs nothing but their kubeconfig; ``--metrics-url`` reads a URL instead (a port-forward, a test). Reading
never raises: a scrape that fails is a value that says why, and the caller answers from the API objects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeError

METRICS_PORT_NAME = "metrics"
DEFAULT_METRICS_PORT = 8080
"""``deploy/base/scheduler/deployment.yaml``'s ``--metrics-port`` and container port ``metrics``."""
TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unread:
    """Why the metrics could not be read (said to the user; explain still answers from the API objects)."""

    reason: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """One scrape, and where it came from."""

    source: str
    samples: tuple[Sample, ...]

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [
            sample
            for sample in self.samples
            if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float | None:
        found = self.select(name, **labels)
        return found[0].value if found else None

    def alerts(self, **labels: str) -> list[Mapping[str, str]]:
        """The label sets of every ``quotient_alert`` firing that matches ``labels``."""
        return [sample.labels for sample in self.select("quotient_alert", **labels) if sample.value >= 1]


def parse(text: str, *, source: str) -> Metrics | Unread:
    try:
        samples = tuple(
            Sample(name=sample.name, labels=dict(sample.labels), value=float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if not math.isnan(float(sample.value))
        )
    except (ValueError, TypeError, IndexError) as exc:
        return Unread(reason=f"{source}: not Prometheus text ({exc})")
    if not any(sample.name.startswith("quotient_") for sample in samples):
        return Unread(reason=f"{source}: no quotient_ series there (is it the scheduler's /metrics?)")
    return Metrics(source=source, samples=samples)


async def from_url(url: str) -> Metrics | Unread:
    """``--metrics-url``: the URL as given (``http://127.0.0.1:8080/metrics``)."""
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session, session.get(url) as answer:
            text = await answer.text()
            if answer.status != 200:
                return Unread(reason=f"{url}: HTTP {answer.status}")
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return Unread(reason=f"{url}: {type(exc).__name__}: {exc}")
    return parse(text, source=url)


def _port_of(pod: Mapping[str, object] | None) -> int:
    """The leader pod's container port named ``metrics`` (deploy's), else 8080."""
    spec = pod.get("spec") if pod else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    for container in containers if isinstance(containers, list) else ():
        for port in container.get("ports") or () if isinstance(container, dict) else ():
            if isinstance(port, dict) and port.get("name") == METRICS_PORT_NAME:
                number = port.get("containerPort")
                if isinstance(number, int) and not isinstance(number, bool):
                    return number
    return DEFAULT_METRICS_PORT


async def from_leader(
    api: kubeapi.KubeApi, get_text: Callable[[str], Awaitable[str]], *, namespace: str, lease: str
) -> Metrics | Unread:
    """The leader's ``/metrics`` through the pod proxy: Lease ``namespace/lease`` names the pod; ``get_text`` is
    ``KubeClient.get_text``."""
    try:
        record = await api.get(kubeapi.LEASES, name=lease, namespace=namespace)
    except KubeError as exc:
        return Unread(reason=f"Lease {namespace}/{lease}: {exc}")
    spec = record.get("spec") if record else None
    holder = spec.get("holderIdentity") if isinstance(spec, dict) else None
    if record is None:
        return Unread(reason=f"no Lease {namespace}/{lease}: no scheduler leads (or it runs without leader election)")
    if not isinstance(holder, str) or not holder:
        return Unread(reason=f"Lease {namespace}/{lease} has no holder: no scheduler leads now")
    try:
        pod = await api.get(kubeapi.PODS, name=holder, namespace=namespace)
    except KubeError as exc:
        return Unread(reason=f"the leader pod {namespace}/{holder}: {exc}")
    if pod is None:
        return Unread(reason=f"the Lease names {holder!r}, which is no pod in {namespace} (a scheduler outside it)")
    port = _port_of(pod)
    path = kubeapi.PODS.path(namespace=namespace, name=f"{holder}:{port}", subresource="proxy") + "/metrics"
    try:
        text = await get_text(path)
    except KubeError as exc:
        return Unread(reason=f"{path}: {exc}")
    return parse(text, source=f"pod {namespace}/{holder} port {port} (through the API server's proxy)")

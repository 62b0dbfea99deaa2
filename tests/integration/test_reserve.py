"""``quotient reserve`` against the emulator through the real Kubernetes client: the device it sees ends up in its
pod's annotations, where the scheduler's reservation manager reads it as ready."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.gpus.fake import FakeGpu, FakeProbe
from common.errors import ConfigError
from quotient import reserve
from quotient.emulator import status
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from scheduler.kube import reservations
from scheduler.kube.client import KubeClient
from scheduler.kube.errors import KubeUnavailable
from scheduler.kube.kubeapi import PODS
from scheduler.objects import pods
from scheduler.objects.records import PodRecord, ReservationPhase

pytestmark = pytest.mark.integration

A100 = 85_899_345_920


def probe(*indices: int) -> FakeProbe:
    gpus = [
        FakeGpu(index=i, uuid=f"GPU-{i:08x}", model="NVIDIA A100-SXM4-80GB", memory_total_bytes=A100) for i in indices
    ]
    return FakeProbe(gpus, clock=time.time_ns)


def record(pod: dict[str, object]) -> PodRecord:
    """The pod as the scheduler's watch reads it."""
    decoded = pods.decode(pod)
    assert decoded is not None, pod
    return decoded


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(config=EmulatorConfig(default_queues=False)) as running:
        yield running


def test_the_one_visible_device_is_read_and_several_or_none_are_refused_with_the_reason() -> None:
    assert reserve.read_device(probe(5)) == ("GPU-00000005", 5)
    with pytest.raises(ConfigError, match="exactly one GPU, this one sees 2"):
        reserve.read_device(probe(0, 1))
    with pytest.raises(ConfigError, match="sees 0"):
        reserve.read_device(probe())


async def test_the_reservation_pod_reports_its_device_and_the_manager_sees_it_ready(emulator: EmulatorThread) -> None:
    settings = reservations.Settings()
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}}
    created = emulator.run(lambda: emulator.emulator.create(namespace))
    assert not isinstance(created, status.Failure), created
    async with KubeClient.for_server(emulator.url, request_timeout_s=5.0) as api:
        body = reservations.manifest(settings, node="node-x", group="node-x-gpu0-abc")
        pod = await api.create(PODS, body, namespace=settings.namespace)
        manager = reservations.ReservationManager(api, settings)
        manager.observe(record(pod))
        assert manager.reservations["node-x-gpu0-abc"].phase is ReservationPhase.WAITING_FOR_UUID
        uuid, index = reserve.read_device(probe(3))
        await reserve.report_device(
            api, namespace=settings.namespace, name=body["metadata"]["name"], uuid=uuid, index=index
        )
        stored = await api.get(PODS, name=body["metadata"]["name"], namespace=settings.namespace)
        assert stored is not None
        manager.observe(record(stored))
        ready = manager.reservations["node-x-gpu0-abc"]
        assert ready.phase is ReservationPhase.READY and ready.uuid == "GPU-00000003" and ready.index == 3
        answer = await manager.reserve("node-x-gpu0-abc", "node-x")
        assert answer == reservations.Reserved(group="node-x-gpu0-abc", uuid="GPU-00000003", index=3, created=False)
        elsewhere = await manager.reserve("node-x-gpu0-abc", "node-y")
        assert isinstance(elsewhere, reservations.NotReserved) and elsewhere.reason == "ReservationElsewhere"


class FlakyApi:
    """A Kubernetes API that is unavailable for its first ``failures`` patches."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.patches: list[dict[str, Any]] = []

    async def patch(self, resource: object, body: dict[str, Any], *, name: str, namespace: str) -> dict[str, Any]:
        self.patches.append(body)
        if len(self.patches) <= self.failures:
            raise KubeUnavailable("the API server is restarting")
        return body


async def test_an_unavailable_api_is_retried_with_backoff_until_it_takes_the_device() -> None:
    api, waits = FlakyApi(failures=2), list[float]()

    async def sleep(delay_s: float) -> None:
        waits.append(delay_s)

    await reserve.report_device(api, namespace="ns", name="r", uuid="GPU-1", index=1, sleep=sleep)  # type: ignore[arg-type]
    assert len(api.patches) == 3 and len(waits) == 2
    assert api.patches[-1] == {
        "metadata": {"annotations": {"quotient.dev/gpu-uuid": "GPU-1", "quotient.dev/gpu-index": "1"}}
    }


async def test_an_api_that_stays_unavailable_fails_the_report_after_its_attempts() -> None:
    async def sleep(delay_s: float) -> None:
        return None

    api = FlakyApi(failures=10)
    with pytest.raises(KubeUnavailable, match="did not take the device's UUID after 4 attempts"):
        await reserve.report_device(api, namespace="ns", name="r", uuid="GPU-1", index=1, attempts=4, sleep=sleep)  # type: ignore[arg-type]
    assert len(api.patches) == 4

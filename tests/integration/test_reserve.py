"""``quotient reserve`` against the emulator through the real Kubernetes client: the device it sees ends up in its
pod's annotations, where the scheduler's reservation manager reads it as ready."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.gpus.fake import FakeGpu, FakeProbe
from common.errors import ConfigError
from quotient import reserve
from quotient.emulator import status
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from scheduler.kube import reservations
from scheduler.kube.client import PODS, KubeClient

pytestmark = pytest.mark.integration

A100 = 85_899_345_920


def probe(*indices: int) -> FakeProbe:
    gpus = [
        FakeGpu(index=i, uuid=f"GPU-{i:08x}", model="NVIDIA A100-SXM4-80GB", memory_total_bytes=A100) for i in indices
    ]
    return FakeProbe(gpus, clock=time.time_ns)


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
        manager.observe(pod)
        assert manager.reservations["node-x-gpu0-abc"].phase is reservations.Phase.WAITING_FOR_UUID
        uuid, index = reserve.read_device(probe(3))
        await reserve.report_device(
            api, namespace=settings.namespace, name=body["metadata"]["name"], uuid=uuid, index=index
        )
        stored = await api.get(PODS, name=body["metadata"]["name"], namespace=settings.namespace)
        assert stored is not None
        manager.observe(stored)
        ready = manager.reservations["node-x-gpu0-abc"]
        assert ready.phase is reservations.Phase.READY and ready.uuid == "GPU-00000003" and ready.index == 3
        answer = await manager.reserve("node-x-gpu0-abc", "node-x")
        assert answer == reservations.Reserved(group="node-x-gpu0-abc", uuid="GPU-00000003", index=3, created=False)
        elsewhere = await manager.reserve("node-x-gpu0-abc", "node-y")
        assert isinstance(elsewhere, reservations.NotReserved) and elsewhere.reason == "ReservationElsewhere"

"""The dispatcher settles every bind and eviction: bound, conflict (lost), gone, failed, not reserved, evicted.

Each test gives a plan to a real dispatcher and binder over ``MemoryKube`` (held to the real client's contract by
the contract suite), lets the binder finish, and checks what the cluster state, the API, the events, the metrics and
the ``Decision`` messages show.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

import msgpack
import pytest

from common import names, subjects
from common.backoff import Backoff
from scheduler import audit
from scheduler import dispatch as dispatch_module
from scheduler.dispatch import Dispatcher
from scheduler.kube import binding, events, kubeapi
from scheduler.kube.errors import KubeUnavailable
from scheduler.metrics import SchedulerMetrics
from scheduler.objects import nodes, podgroups, pods
from scheduler.placement import decisions, model, plan
from scheduler.state.cache import ClusterState
from scheduler.state.snapshot import SnapshotBuilder
from tests.unit.kube.fakes import MemoryKube

NOW = 1_800_000_000_000_000_000


class Events:
    """An ``EventSink`` that keeps what it was told."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, ref: events.ObjectRef, *, type: events.EventType, reason: str, message: str) -> None:
        self.recorded.append((ref.name, reason, message))

    def reasons(self) -> list[tuple[str, str]]:
        return [(name, reason) for name, reason, _ in self.recorded]


class Bus:
    """A connected ``MessageBus`` that keeps what is published."""

    connected = True

    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, msgpack.unpackb(payload)))

    async def subscribe(self, subject: str, handler: Any) -> Any:
        raise AssertionError("not used")

    async def flush(self, timeout_s: float = 2.0) -> None:
        return None

    async def close(self) -> None:
        return None

    def decisions(self) -> list[dict[str, Any]]:
        return [message for subject, message in self.published if subject == subjects.DECISIONS]


@dataclasses.dataclass
class World:
    api: MemoryKube
    state: ClusterState
    dispatcher: Dispatcher
    binder: binding.Binder
    events: Events
    bus: Bus
    metrics: SchedulerMetrics
    quarantined: list[tuple[str, float]]

    async def pod(self, name: str, *, queue: str = "team", gpus: int = 1, node: str | None = None) -> Mapping[str, Any]:
        """A pending pod of ours in its own PodGroup, in the API and in the state."""
        container: dict[str, Any] = {"name": "main", "resources": {"limits": {names.GPU_RESOURCE: str(gpus)}}}
        spec: dict[str, Any] = {"schedulerName": "quotient", "containers": [container]}
        if node:
            spec["nodeName"] = node
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "annotations": {names.POD_GROUP_ANNOTATION: f"pg-{name}"}},
            "spec": spec,
        }
        created = await self.api.create(kubeapi.PODS, body, namespace="ml")
        group = podgroups.decode({"metadata": {"name": f"pg-{name}", "namespace": "ml"}, "spec": {"queue": queue}})
        record = pods.decode(created)
        assert group is not None and record is not None
        self.state.put_podgroup(group)
        self.state.put_pod(record)
        return created

    def place(self, pod: Mapping[str, Any], *, node: str = "n1", devices: tuple[int, ...] = (0,)) -> plan.Plan:
        meta = pod["metadata"]
        placement = decisions.Placement(
            pod=model.PodUid(meta["uid"]),
            group=model.GroupId(f"ml/pg-{meta['name']}"),
            node=model.NodeName(node),
            devices=devices,
        )
        return plan.Plan(placements=(placement,), evictions=(), statuses={})

    def dispatch(self, result: plan.Plan, *, cycle: int = 7) -> None:
        snapshot = SnapshotBuilder(self.state).build(NOW).snapshot
        self.dispatcher.dispatch(result, snapshot, cycle=cycle)

    def sample(self, name: str, *labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, dict(zip(("outcome",), labels, strict=False)))
        return value or 0.0


@pytest.fixture
async def world() -> World:
    api = MemoryKube()
    state = ClusterState(scheduler_names=["quotient"])
    node = nodes.decode(
        {
            "metadata": {"name": "n1", "uid": "uid-n1"},
            "status": {
                "allocatable": {"cpu": "8", "memory": "64Gi", names.GPU_RESOURCE: "2"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node is not None
    state.put_node(node)
    recorded, bus, metrics = Events(), Bus(), SchedulerMetrics()
    quarantined: list[tuple[str, float]] = []
    dispatcher = Dispatcher(
        state,
        metrics=metrics,
        recorder=recorded,
        decisions=audit.DecisionPublisher(bus, identity="test"),
        quarantine=lambda node, seconds: quarantined.append((node, seconds)),
        reservation_timeout_s=60.0,
        on_change=lambda: None,
    )
    binder = binding.Binder(
        api, report=dispatcher.on_report, backoff=Backoff(base_s=0.001, cap_s=0.001), max_attempts=3
    )
    dispatcher.binder = binder
    return World(api, state, dispatcher, binder, recorded, bus, metrics, quarantined)


async def test_a_placement_is_assumed_at_once_then_bound_and_published_with_its_devices_queue_and_cycle(
    world: World,
) -> None:
    pod = await world.pod("a")
    uid = pod["metadata"]["uid"]
    world.dispatch(world.place(pod, devices=(1,)), cycle=7)

    assert world.state.assumed[uid].node == "n1", "assumed before the API answers"
    assert world.dispatcher.in_flight[uid].bind is not None
    await world.binder.drain()

    stored = await world.api.get(kubeapi.PODS, name="a", namespace="ml")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][names.GPU_DEVICES_ANNOTATION] == "1"
    [decision] = world.bus.decisions()
    assert (decision["action"], decision["node_name"], decision["gpu_indices"], decision["queue"]) == (
        "bind",
        "n1",
        [1],
        "team",
    )
    assert (decision["reason"], decision["cycle"]) == ("Scheduled", 7)
    assert uid not in world.dispatcher.in_flight
    assert world.sample("quotient_binds_total", "bound") == 1.0
    assert world.events.recorded == [("a", "Scheduled", "Successfully assigned ml/a to n1")]


async def test_a_pod_bound_elsewhere_meanwhile_is_lost_its_assumption_forgotten_and_an_event_says_so(
    world: World,
) -> None:
    pod = await world.pod("b")
    uid = pod["metadata"]["uid"]
    await world.api.bind_pod(namespace="ml", name="b", node="n9", uid=uid)  # another leader got there first
    world.dispatch(world.place(pod))
    await world.binder.drain()

    assert uid not in world.state.assumed
    assert world.events.reasons() == [("b", "FailedBinding")]
    assert "not bound to n1" in world.events.recorded[0][2]
    assert world.bus.decisions() == []
    assert world.sample("quotient_binds_total", "lost") == 1.0


async def test_a_pod_deleted_before_its_bind_is_gone_without_an_event(world: World) -> None:
    pod = await world.pod("c")
    uid = pod["metadata"]["uid"]
    await world.api.delete(kubeapi.PODS, name="c", namespace="ml")
    world.dispatch(world.place(pod))
    await world.binder.drain()

    assert uid not in world.state.assumed
    assert world.events.recorded == []
    assert world.sample("quotient_binds_total", "gone") == 1.0


async def test_an_api_that_keeps_failing_ends_the_bind_as_failed_and_the_pod_is_pending_again(world: World) -> None:
    pod = await world.pod("d")
    uid = pod["metadata"]["uid"]
    world.api.fail["bind"] = collections.deque(KubeUnavailable("503") for _ in range(3))
    world.dispatch(world.place(pod))
    await world.binder.drain()

    assert uid not in world.state.assumed
    assert world.events.reasons() == [("d", "FailedBinding")]
    assert "failed 3 times" in world.events.recorded[0][2]
    assert world.sample("quotient_binds_total", "failed") == 1.0
    stored = await world.api.get(kubeapi.PODS, name="d", namespace="ml")
    assert stored is not None and not stored["spec"].get("nodeName")


async def test_a_share_whose_node_could_not_hold_a_gpu_quarantines_that_node(world: World) -> None:
    pod = await world.pod("e")
    uid = pod["metadata"]["uid"]
    ref = binding.PodRef(namespace="ml", name="e", uid=uid)
    report = binding.Report(
        pod=ref, outcome=binding.Outcome.NOT_RESERVED, node="n1", message="no UUID", reason="ReservationTimeout"
    )
    await world.dispatcher.on_report(report)  # what the binder reports when the reservation pod got no GPU

    assert world.quarantined == [("n1", 60.0)]
    assert world.events.reasons() == [("e", "FailedBinding")]


async def test_an_eviction_is_announced_carried_out_once_and_kept_until_the_watch_shows_the_pod_gone(
    world: World,
) -> None:
    pod = await world.pod("f", node="n1")
    uid = pod["metadata"]["uid"]
    eviction = decisions.Eviction(
        pod=model.PodUid(uid),
        group=model.GroupId("ml/pg-f"),
        node=model.NodeName("n1"),
        reason=decisions.EvictionReason.RECLAIM,
        beneficiary=model.GroupId("ml/pg-other"),
        message="reclaimed for team-b",
    )
    result = plan.Plan(placements=(), evictions=(eviction,), statuses={})
    world.dispatch(result)
    world.dispatch(result)  # a second cycle that still sees the victim does not evict it again
    await world.binder.drain()

    assert world.events.reasons() == [("f", "Evict")]
    assert world.api.calls.count(("evict", "f")) == 1
    assert await world.api.get(kubeapi.PODS, name="f", namespace="ml") is None
    [decision] = world.bus.decisions()
    assert (decision["action"], decision["reason"], decision["node_name"]) == ("evict", "Evicted", "n1")
    assert world.dispatcher.is_evicting(uid)
    # Until the watch shows it gone, the snapshot sees it leaving: no cycle takes it as a victim again.
    assert uid in world.state.evicting
    assert world.metrics.registry.get_sample_value("quotient_evictions_total", {"reason": "reclaim"}) == 1.0
    world.dispatcher.pod_deleted(uid)
    world.state.delete_pod(uid)
    assert not world.dispatcher.is_evicting(uid)
    assert uid not in world.state.evicting


async def test_an_eviction_the_api_refuses_is_dropped_so_a_later_decision_may_try_again(world: World) -> None:
    pod = await world.pod("g", node="n1")
    uid = pod["metadata"]["uid"]
    record = world.state.pods[uid]
    world.api.fail["evict"] = collections.deque(KubeUnavailable("503") for _ in range(3))
    started = world.dispatcher.evict(
        record,
        node="n1",
        disruption=names.TERMINATION_BY_SCHEDULER,
        message="over its allotment",
        decision_reason="GpuMemoryOverconsumption",
        metric="GpuMemoryOverconsumption",
    )
    assert started and not world.dispatcher.evict(
        record, node="n1", disruption="x", message="x", decision_reason="x", metric="x"
    )
    await world.binder.drain()

    assert not world.dispatcher.is_evicting(uid)
    assert uid not in world.state.evicting  # a victim again for a later decision
    assert world.bus.decisions() == []
    assert await world.api.get(kubeapi.PODS, name="g", namespace="ml") is not None


async def test_a_nomination_no_plan_renews_is_cleared_after_its_ttl_and_a_renewed_one_is_kept(world: World) -> None:
    clock = [1000.0]
    dispatcher = Dispatcher(
        world.state,
        metrics=world.metrics,
        recorder=world.events,
        decisions=audit.DecisionPublisher(world.bus, identity="test"),
        quarantine=lambda node, seconds: None,
        reservation_timeout_s=60.0,
        on_change=lambda: None,
        clock_s=lambda: clock[0],
    )
    dispatcher.binder = world.binder
    stale, renewed = await world.pod("stale"), await world.pod("renewed")
    for pod in (stale, renewed):  # nominated by a previous leader, or by a plan whose room went elsewhere
        await world.api.patch(
            kubeapi.PODS,
            {"status": {"nominatedNodeName": "n1"}},
            name=pod["metadata"]["name"],
            namespace="ml",
            subresource="status",
        )
        record = pods.decode(await world.api.get(kubeapi.PODS, name=pod["metadata"]["name"], namespace="ml") or {})
        assert record is not None and record.nominated_node == "n1"
        world.state.put_pod(record)
    nominate = world.place(renewed)
    nominate = plan.Plan(placements=(), evictions=(), statuses={}, nominations=nominate.placements)
    snapshot = SnapshotBuilder(world.state).build(NOW).snapshot

    dispatcher.dispatch(nominate, snapshot, cycle=1)  # first sight of both: the clock starts
    clock[0] += dispatch_module.NOMINATION_TTL_S + 1
    dispatcher.dispatch(nominate, snapshot, cycle=2)
    await world.binder.drain()

    status = {
        name: ((await world.api.get(kubeapi.PODS, name=name, namespace="ml")) or {}).get("status", {})
        for name in ("stale", "renewed")
    }
    assert status["stale"].get("nominatedNodeName") is None, "cleared: no plan nominated it for the whole TTL"
    assert status["renewed"].get("nominatedNodeName") == "n1"

"""Reservation pods: their manifest, reading one back from the API, and what reconciliation decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import names
from scheduler.kube import binding, reservations
from scheduler.kube.reservations import Settings
from scheduler.objects import nodes, pods
from scheduler.objects.records import NodeRecord, PodRecord, Reservation
from scheduler.objects.records import ReservationPhase as Phase
from scheduler.placement import model
from scheduler.state import gpugroups, models
from scheduler.state.gpugroups import ActionKind, Sharer

SETTINGS = Settings(uuid_timeout_s=10.0, drain_grace_s=2.0)


def reservation_pod(group: str = "node-a-gpu0-x", *, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    pod = reservations.manifest(SETTINGS, node="node-a", group=group)
    pod["metadata"]["uid"] = "uid-r"
    if uuid is not None:
        pod["metadata"]["annotations"][names.RESERVATION_UUID_ANNOTATION] = uuid
        pod["metadata"]["annotations"][names.RESERVATION_INDEX_ANNOTATION] = "3"
    pod["metadata"].update(extra.pop("metadata", {}))
    pod.update(extra)
    return pod


def held(phase: Phase, *, group: str = "g", failed: str | None = None) -> Reservation:
    return Reservation(
        group=group, node="node-a", namespace="ns", name=f"r-{group}", uid="u", phase=phase, uuid=None, failed=failed
    )


def sharer(uid: str, *, started: bool) -> Sharer:
    return Sharer(uid=uid, namespace="default", name=uid, node="node-a", started=started)


def plan(
    reservations_by_group: Mapping[str, Reservation],
    sharers: Mapping[str, tuple[Sharer, ...]],
    *,
    now_s: float = 100.0,
    waiting: dict[str, float] | None = None,
    idle: dict[str, float] | None = None,
    busy: frozenset[str] = frozenset(),
    settings: Settings = SETTINGS,
) -> list[tuple[ActionKind, str]]:
    actions = gpugroups.reconcile(
        reservations_by_group,
        sharers,
        busy=busy,
        waiting_since_s=waiting or {},
        idle_since_s=idle or {},
        now_s=now_s,
        limits=settings.limits,
    )
    return [(action.kind, action.group) for action in actions]


def test_the_manifest_holds_one_whole_gpu_on_its_node_through_the_nvidia_runtime() -> None:
    pod = reservations.manifest(SETTINGS, node="node-a", group="node-a-gpu0-x")
    assert pod["spec"]["nodeName"] == "node-a"
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["command"] == ["quotient", "reserve"]
    assert pod["metadata"]["namespace"] == "quotient-reservation"
    assert pod["metadata"]["labels"][names.RESERVATION_GROUP_LABEL] == "node-a-gpu0-x"


def test_the_pod_name_is_a_dns_label_and_the_same_for_the_same_group() -> None:
    name = reservations.pod_name("Node_With.Odd-Name" * 5, "group-1")
    assert len(name) <= 63 and name == name.lower() and name.replace("-", "").isalnum()
    assert name == reservations.pod_name("Node_With.Odd-Name" * 5, "group-1")
    assert name != reservations.pod_name("Node_With.Odd-Name" * 5, "group-2")


def read(obj: Mapping[str, Any]) -> Reservation | None:
    """The reservation the pod decoder reads off a pod (a uid is added: the decoder refuses a pod without one)."""
    return record({**obj, "metadata": {"uid": "uid-x", **obj["metadata"]}}).reservation


def record(obj: Mapping[str, Any]) -> PodRecord:
    decoded = pods.decode(obj)
    assert decoded is not None
    return decoded


def test_a_reservation_is_read_back_from_its_pod_in_each_phase() -> None:
    waiting = read(reservation_pod())
    assert waiting is not None and waiting.phase is Phase.WAITING_FOR_UUID and waiting.node == "node-a"
    ready = read(reservation_pod(uuid="GPU-1"))
    assert ready is not None and ready.phase is Phase.READY and ready.uuid == "GPU-1" and ready.index == 3
    draining = read(reservation_pod(uuid="GPU-1", metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}))
    assert draining is not None and draining.phase is Phase.DRAINING
    failed = read(reservation_pod(status={"phase": "Failed", "reason": "UnexpectedAdmissionError"}))
    assert failed is not None and failed.failed is not None and "UnexpectedAdmissionError" in failed.failed
    assert read({"metadata": {"name": "other", "labels": {"app": "x"}}}) is None


def test_a_reservation_without_sharing_pods_is_drained_only_after_the_grace() -> None:
    ready = {"g": held(Phase.READY)}
    assert plan(ready, {}, now_s=101.0, idle={"g": 100.0}) == []
    assert plan(ready, {}, now_s=102.5, idle={"g": 100.0}) == [(ActionKind.DRAIN, "g")]
    assert plan(ready, {"g": (sharer("a", started=True),)}, now_s=500.0, idle={}) == []


def test_a_reservation_waiting_past_the_timeout_or_failed_expires_and_a_busy_one_is_left_alone() -> None:
    waiting = {"g": held(Phase.WAITING_FOR_UUID)}
    members = {"g": (sharer("a", started=False),)}
    assert plan(waiting, members, now_s=105.0, waiting={"g": 100.0}) == []
    assert plan(waiting, members, now_s=111.0, waiting={"g": 100.0}) == [(ActionKind.EXPIRE, "g")]
    assert plan(waiting, members, now_s=111.0, waiting={"g": 100.0}, busy=frozenset({"g"})) == []
    failed = {"g": held(Phase.WAITING_FOR_UUID, failed="the reservation pod failed")}
    assert plan(failed, members) == [(ActionKind.EXPIRE, "g")]
    assert plan({"g": held(Phase.DRAINING)}, {}) == []


def test_a_vanished_reservation_is_made_again_for_pods_not_started_and_evicts_or_reports_running_ones() -> None:
    assert plan({}, {"g": (sharer("a", started=False), sharer("b", started=False))}) == [(ActionKind.RE_RESERVE, "g")]
    mixed = {"g": (sharer("a", started=True), sharer("b", started=False))}
    assert plan({}, mixed) == [(ActionKind.EVICT_ORPHAN, "g")]
    report = Settings(evict_orphans=False)
    assert plan({}, mixed, settings=report) == [(ActionKind.REPORT_ORPHAN, "g")]
    assert plan({}, mixed, busy=frozenset({"g"})) == []


def test_the_gpu_portion_is_the_share_as_a_decimal_fraction() -> None:
    assert binding.portion_text(500) == "0.5"
    assert binding.portion_text(250) == "0.25"
    assert binding.portion_text(37) == "0.037"
    assert binding.portion_text(1000) == "1"


def test_the_configmap_names_the_devices_and_portion_and_is_owned_by_its_pod() -> None:
    pod = binding.PodRef(namespace="team", name="infer", uid="uid-1")
    body = binding.configmap_body(name="infer-gpu-1", pod=pod, uuids=("GPU-a", "GPU-b"), share_milli=250)
    assert body["data"] == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "GPU_PORTION": "0.25"}
    metadata = body["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["namespace"] == "team"
    assert metadata["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "infer", "uid": "uid-1"}]


def _node(gpus: int = 2) -> NodeRecord:
    node = nodes.decode(
        {
            "metadata": {"name": "node-a", "labels": {"nvidia.com/gpu.memory": "81920"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}},
        }
    )
    assert node is not None
    return node


def _share(uid: str, group: str) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": uid,
            "namespace": "default",
            "annotations": {
                "gpu-fraction": "0.5",
                "quotient.dev/gpu-devices": "0",
                "quotient.dev/gpu-share": "500",
                "quotient.dev/gpu-groups": group,
            },
            "labels": {"runai-gpu-group": group},
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def test_a_reservation_with_shares_is_accounted_through_them_and_one_without_holds_a_whole_device() -> None:
    reservation = reservation_pod("grp", uuid="GPU-1")
    reservation["metadata"]["uid"] = "uid-res"
    with_shares = models.build_node(_node(), [record(reservation), record(_share("s1", "grp"))], {})
    assert isinstance(with_shares, model.Node)
    assert [device.allotted_milli_gpu for device in with_shares.devices] == [500, 0]
    alone = models.build_node(_node(), [record(reservation)], {})
    assert isinstance(alone, model.Node)
    assert [device.allotted_milli_gpu for device in alone.devices] == [1000, 0]
    assert alone.devices[0].holders == (model.PodUid("uid-res"),)


class _RacingApi:
    """An API whose watch shows the reservation ready (UUID written) before the create's own answer arrives, as a
    loaded API server may deliver them."""

    def __init__(self) -> None:
        self.manager: reservations.ReservationManager | None = None

    async def create(self, resource: object, body: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        created = {**body, "metadata": {**body["metadata"], "uid": "uid-r"}}
        ready = {
            **created,
            "metadata": {
                **created["metadata"],
                "annotations": {**created["metadata"]["annotations"], names.RESERVATION_UUID_ANNOTATION: "GPU-9"},
            },
        }
        assert self.manager is not None
        self.manager.observe(record(ready))  # the watch event, first
        return created  # the answer: the pod as created, without the UUID


async def test_a_uuid_the_watch_showed_before_the_creates_answer_is_not_lost() -> None:
    api = _RacingApi()
    manager = reservations.ReservationManager(api, Settings(uuid_timeout_s=0.5))  # type: ignore[arg-type]
    api.manager = manager
    answer = await manager.reserve("node-a-gpu0-x", "node-a")
    assert answer == reservations.Reserved(group="node-a-gpu0-x", uuid="GPU-9", index=None, created=True)


def test_the_sharers_of_each_group_follow_their_pods_phase_and_deletion() -> None:
    from scheduler.state import cache

    state = cache.ClusterState(scheduler_names=["quotient"])
    pending = {**_share("s1", "grp"), "status": {"phase": "Pending"}}
    pending["spec"] = {**pending["spec"], "schedulerName": "quotient"}
    state.put_pod(record(pending))
    plain = {"metadata": {"uid": "plain", "name": "plain", "namespace": "default"}, "spec": {"nodeName": "n"}}
    state.put_pod(record(plain))
    sharers = gpugroups.Sharers(state)
    assert state.sharing_pods == {"s1"}
    [member] = sharers.by_group()["grp"]
    assert (member.uid, member.node, member.started) == ("s1", "node-a", False)
    state.put_pod(record({**pending, "status": {"phase": "Running"}}))  # a status write only: a new record is kept
    [member] = sharers.by_group()["grp"]
    assert member.started
    state.delete_pod("s1")
    assert sharers.by_group() == {} and state.sharing_pods == set()

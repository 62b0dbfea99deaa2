"""From Kubernetes objects to a snapshot the real engine places: the state layer's contract."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from common import names
from scheduler.objects import nodes, podgroups, pods, queues, records
from scheduler.placement import engine, model
from scheduler.state.cache import Assumption, ClusterState
from scheduler.state.models import build_queues
from scheduler.state.snapshot import SnapshotBuilder

T = TypeVar("T")

NOW = 1_800_000_000_000_000_000


def node_json(name: str, *, gpus: int = 4, memory_mib: int = 81920, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def queue_json(name: str, parent: str | None = None, **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resources": resources
        or {k: {"quota": -1, "limit": -1, "overQuotaWeight": 1} for k in ("gpu", "cpu", "memory")}
    }
    if parent:
        spec["parentQueue"] = parent
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec}


def podgroup_json(
    name: str, *, queue_name: str = "test", min_member: int = 1, namespace: str = "default"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"minMember": min_member, "queue": queue_name},
    }


def pod_json(
    name: str,
    *,
    group: str,
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
    scheduler: str = "quotient",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {"pod-group-name": group, **(annotations or {})},
            "creationTimestamp": "2026-01-01T00:00:01Z",
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def decoded(decode: Callable[[Mapping[str, Any]], T | None], obj: Mapping[str, Any]) -> T:
    record = decode(obj)
    assert record is not None
    return record


def node(name: str, **kw: Any) -> records.NodeRecord:
    return decoded(nodes.decode, node_json(name, **kw))


def queue(name: str, parent: str | None = None, **resources: Any) -> records.QueueRecord:
    return decoded(queues.decode, queue_json(name, parent, **resources))


def podgroup(name: str, **kw: Any) -> records.PodGroupRecord:
    return decoded(podgroups.decode, podgroup_json(name, **kw))


def pod(name: str, **kw: Any) -> records.PodRecord:
    return decoded(pods.decode, pod_json(name, **kw))


def seeded_state() -> ClusterState:
    state = ClusterState(scheduler_names=["quotient"])
    state.put_node(node("n1"))
    state.put_queue(queue("default"))
    state.put_queue(queue("test", "default"))
    return state


def test_the_seeds_fractions_land_on_one_device_through_the_real_engine() -> None:
    state = seeded_state()
    for name, fraction in (("gpu-sharing", "0.5"), ("inference-api", "0.25")):
        state.put_podgroup(podgroup(f"pg-{name}"))
        state.put_pod(pod(name, group=f"pg-{name}", annotations={"gpu-fraction": fraction}))
    built = SnapshotBuilder(state).build(NOW)
    plan = engine.Engine().run(built.snapshot)
    placed = {p.pod: p for p in plan.placements}
    assert set(placed) == {"uid-gpu-sharing", "uid-inference-api"}
    assert placed[model.PodUid("uid-gpu-sharing")].devices == placed[model.PodUid("uid-inference-api")].devices
    assert placed[model.PodUid("uid-gpu-sharing")].gpu_groups == placed[model.PodUid("uid-inference-api")].gpu_groups


def test_devices_held_by_bound_and_assumed_pods_and_other_schedulers_are_not_offered_again() -> None:
    state = seeded_state()
    state.put_podgroup(podgroup("pg-a"))
    bound = pod("a", group="pg-a", gpus=1, node_name="n1", annotations={names.GPU_DEVICES_ANNOTATION: "2"})
    state.put_pod(bound)
    state.put_pod(pod("foreign", group="none", gpus=2, node_name="n1", scheduler="default-scheduler"))
    state.put_podgroup(podgroup("pg-b"))
    state.put_pod(pod("b", group="pg-b", gpus=1))
    state.assume("uid-b", Assumption(node="n1", devices=(3,)))
    built = SnapshotBuilder(state).build(NOW)
    devices = built.snapshot.nodes[model.NodeName("n1")].devices
    assert [d.holders for d in devices] == [("uid-foreign",), ("uid-foreign",), ("uid-a",), ("uid-b",)]
    assert not any(d.is_free for d in devices)


def test_unchanged_nodes_and_groups_are_the_same_objects_in_the_next_snapshot() -> None:
    state = seeded_state()
    state.put_node(node("n2"))
    state.put_podgroup(podgroup("pg-a"))
    state.put_pod(pod("a", group="pg-a", gpus=1))
    builder = SnapshotBuilder(state)
    first = builder.build(NOW).snapshot
    state.put_pod(pod("x", group="other", node_name="n2", gpus=1))
    second = builder.build(NOW).snapshot
    assert second.nodes[model.NodeName("n1")] is first.nodes[model.NodeName("n1")]
    assert second.nodes[model.NodeName("n2")] is not first.nodes[model.NodeName("n2")]
    assert second.groups[model.GroupId("default/pg-a")] is first.groups[model.GroupId("default/pg-a")]


def test_a_pod_whose_eviction_was_asked_or_whose_deletion_began_is_leaving_and_stops_being_so_if_it_failed() -> None:
    state = seeded_state()
    state.put_podgroup(podgroup("pg-a"))
    state.put_pod(pod("a", group="pg-a", gpus=1, node_name="n1"))
    state.put_podgroup(podgroup("pg-d"))
    deleting = pod_json("d", group="pg-d", gpus=1, node_name="n1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    state.put_pod(decoded(pods.decode, deleting))
    builder = SnapshotBuilder(state)

    def leaving() -> dict[str, bool]:
        groups = builder.build(NOW).snapshot.groups
        return {str(p.name): p.leaving for g in groups.values() for p in g.members}

    assert leaving() == {"a": False, "d": True}
    state.mark_evicting("uid-a", True)  # the dispatcher asked; the watch has not shown a deletion yet
    assert leaving() == {"a": True, "d": True}
    state.mark_evicting("uid-a", False)  # the API refused: a victim again
    assert leaving() == {"a": False, "d": True}


def test_a_nomination_the_dispatcher_asked_for_is_in_the_next_snapshot_before_the_api_shows_it() -> None:
    # The next cycle must take the group as nominated (room held for it) while the status patch is on its way.
    state = seeded_state()
    state.put_podgroup(podgroup("pg-a"))
    state.put_pod(pod("a", group="pg-a", gpus=1))
    builder = SnapshotBuilder(state)

    def nominated() -> str | None:
        groups = builder.build(NOW).snapshot.groups
        return next(str(p.nominated_node) if p.nominated_node else None for g in groups.values() for p in g.members)

    assert nominated() is None
    state.mark_nominating("uid-a", "n1")
    assert nominated() == "n1"
    shown = pod_json("a", group="pg-a", gpus=1)
    shown["status"]["nominatedNodeName"] = "n1"
    state.put_pod(decoded(pods.decode, shown))  # the watch shows it: the record is the truth again
    assert not state.nominating
    assert nominated() == "n1"
    state.mark_nominating("uid-a", None)  # cleared (expired): at once too
    assert nominated() is None


def test_a_running_pod_whose_podgroup_the_watch_shows_deleted_first_keeps_its_group_until_it_is_gone() -> None:
    # The garbage collector deletes a pod's own PodGroup after the pod, but the two watches may show it the other
    # way round: meanwhile the evicted pod still holds its room and must count as leaving, not as nobody's.
    state = seeded_state()
    state.put_podgroup(podgroup("pg-a"))
    state.put_pod(pod("a", group="pg-a", gpus=1, node_name="n1"))
    state.put_pod(pod("p", group="pg-a", gpus=1))
    builder = SnapshotBuilder(state)

    def members() -> dict[str, tuple[str, bool]]:
        groups = builder.build(NOW).snapshot.groups
        return {str(p.name): (p.phase.value, p.leaving) for g in groups.values() for p in g.members}

    assert members() == {"a": ("Running", False), "p": ("Pending", False)}
    state.mark_evicting("uid-a", True)
    state.delete_podgroup("default", "pg-a")
    assert members() == {"a": ("Running", True)}  # the pending pod waits for a new group
    state.delete_pod("uid-a")
    assert members() == {}
    assert not state.departed


def test_a_podgroup_deleted_with_no_pod_on_a_node_is_gone_at_once() -> None:
    state = seeded_state()
    state.put_podgroup(podgroup("pg-p"))
    state.put_pod(pod("p", group="pg-p", gpus=1))
    state.delete_podgroup("default", "pg-p")
    assert not state.departed
    assert not SnapshotBuilder(state).build(NOW).snapshot.groups


def test_an_invalid_gpu_annotation_is_reported_and_keeps_the_pod_out_without_touching_others() -> None:
    state = seeded_state()
    state.put_podgroup(podgroup("pg-bad"))
    state.put_pod(pod("bad", group="pg-bad", annotations={"gpu-fraction": "1.7"}))
    state.put_podgroup(podgroup("pg-good"))
    state.put_pod(pod("good", group="pg-good", gpus=1))
    built = SnapshotBuilder(state).build(NOW)
    assert [issue.name for issue in built.pod_issues] == ["bad"]
    assert "out of range" in built.pod_issues[0].message
    plan = engine.Engine().run(built.snapshot)
    assert [p.pod for p in plan.placements] == ["uid-good"]


def test_queue_cycles_missing_parents_and_malformed_specs_are_reported_not_fatal() -> None:
    bad = decoded(queues.decode, {"metadata": {"name": "bad"}, "spec": {"resources": {"gpu": {"quota": "lots"}}}})
    listed = {
        "ok": queue("ok"),
        "a": queue("a", "b"),
        "b": queue("b", "a"),
        "orphan": queue("orphan", "gone"),
        "bad": bad,
        "child-of-bad": queue("child-of-bad", "bad"),
    }
    kept, issues = build_queues(listed)
    assert set(kept) == {"ok"}
    by_queue = {issue.queue: issue.condition for issue in issues}
    assert by_queue == {"a": "Cycle", "b": "Cycle", "orphan": "Orphan", "bad": "Invalid", "child-of-bad": "Orphan"}


def test_queue_units_follow_kai() -> None:
    parsed = queues.queue_from(
        {
            "metadata": {"name": "q"},
            "spec": {
                "resources": {"gpu": {"quota": 1.5, "limit": -1, "overQuotaWeight": 3}, "memory": {"quota": 1000}}
            },
        }
    )
    assert isinstance(parsed, model.Queue)
    assert parsed.gpu == model.QueueResource(quota=1500, limit=-1, over_quota_weight=3)
    assert parsed.memory.quota == 1000 * 10**6 and parsed.cpu.limit == 0


def test_a_pod_joins_the_group_the_grouper_decided_before_its_annotation_is_written() -> None:
    state = seeded_state()
    unannotated = pod_json("fresh", group="ignored", gpus=1)
    del unannotated["metadata"]["annotations"]["pod-group-name"]
    state.put_pod(decoded(pods.decode, unannotated))
    state.put_podgroup(podgroup("pg-fresh"))
    builder = SnapshotBuilder(state)
    assert not builder.build(NOW).snapshot.groups
    state.note_group("uid-fresh", "pg-fresh")
    groups = builder.build(NOW).snapshot.groups
    assert [str(member.uid) for member in groups[model.GroupId("default/pg-fresh")].members] == ["uid-fresh"]


def test_a_podgroup_spec_kai_would_refuse_keeps_its_pending_pods_out_with_the_reason_and_counts_its_running_ones() -> (
    None
):
    state = seeded_state()
    invalid = podgroup_json("pg-bad")
    invalid["spec"]["subGroups"] = [
        {"name": "a", "parent": "b", "minMember": 1},
        {"name": "b", "parent": "a", "minMember": 1},
    ]
    state.put_podgroup(decoded(podgroups.decode, invalid))
    state.put_pod(
        pod("running", group="pg-bad", gpus=1, node_name="n1", annotations={names.GPU_DEVICES_ANNOTATION: "0"})
    )
    state.put_pod(pod("waiting", group="pg-bad", gpus=1))
    built = SnapshotBuilder(state).build(NOW)
    [issue] = built.pod_issues
    assert (issue.name, issue.reason) == ("waiting", "InvalidPodGroup")
    assert issue.message.startswith("PodGroup default/pg-bad: spec.subGroups") and "cycle" in issue.message
    [group] = built.snapshot.groups.values()
    assert [p.name for p in group.members] == ["running"], "the running pod still holds its GPU"
    assert not built.snapshot.nodes[model.NodeName("n1")].devices[0].is_free


def test_a_podgroups_delay_grace_and_subgroup_minimums_reach_the_engines_group() -> None:
    state = seeded_state()
    spec = podgroup_json("pg-sub", min_member=1)
    spec["spec"]["subGroups"] = [{"name": "workers", "minMember": 2}]
    spec["spec"]["preemptionDelay"] = "2m"
    spec["spec"]["stalenessGracePeriod"] = "30s"
    state.put_podgroup(decoded(podgroups.decode, spec))
    worker = pod("w-0", group="pg-sub", gpus=1, node_name="n1", annotations={names.GPU_DEVICES_ANNOTATION: "0"})
    state.put_pod(dataclasses.replace(worker, subgroup="workers"))
    [group] = SnapshotBuilder(state).build(NOW).snapshot.groups.values()
    created_ns = 1_767_225_600 * 1_000_000_000  # the PodGroup's creationTimestamp, 2026-01-01T00:00:00Z
    assert group.evictions_from_ns == created_ns + 120 * 1_000_000_000
    assert group.stale_grace_ns == 30 * 1_000_000_000
    assert group.below_min_since_ns == NOW, "one worker of the two its subgroup needs: stale from now"

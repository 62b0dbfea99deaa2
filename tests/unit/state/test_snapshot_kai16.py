"""KAI v0.15-v0.18's knobs from the records into the engine's model (issue 16): subgroup trees and ``minSubGroup``,
``minMember: 0``, the task order, compute modes and per-container GPU memory, the last eviction re-arming the
preemption delay."""

from __future__ import annotations

import dataclasses

from common import names
from scheduler.objects import podgroups, pods
from scheduler.placement import model
from scheduler.state.snapshot import SnapshotBuilder
from tests.unit.state.test_snapshot import NOW, decoded, pod, pod_json, podgroup_json, seeded_state

GIB = 1024**3
S = 1_000_000_000


def _group(state: object) -> model.Group:
    assert isinstance(state, type(seeded_state()))
    [group] = SnapshotBuilder(state).build(NOW).snapshot.groups.values()
    return group


def test_a_two_level_tree_with_min_subgroup_reaches_the_engine_and_minmember_beside_it_is_not_read() -> None:
    state = seeded_state()
    spec = podgroup_json("pg-tree", min_member=5)
    spec["spec"]["subGroups"] = [
        {"name": "decode", "minSubGroup": 1},
        {"name": "leaders", "parent": "decode", "minMember": 1},
        {"name": "workers", "parent": "decode", "minMember": 2},
        {"name": "prefill", "minMember": 1},
    ]
    state.put_podgroup(decoded(podgroups.decode, spec))
    state.put_pod(dataclasses.replace(pod("p-0", group="pg-tree", gpus=1), subgroup="prefill"))

    group = _group(state)

    assert group.min_member == 0, "KAI reads no PodGroup minMember beside subgroups"
    assert group.min_subgroup is None
    assert model.SubGroup(name="decode", parent=None, min_subgroup=1) in group.subgroups
    assert model.SubGroup(name="workers", min_member=2, parent="decode") in group.subgroups


def test_min_member_zero_reaches_the_engine_as_zero_and_unset_as_one() -> None:
    for declared, expected in ((0, 0), (3, 3)):
        state = seeded_state()
        state.put_podgroup(decoded(podgroups.decode, podgroup_json("pg", min_member=declared)))
        state.put_pod(pod("p-0", group="pg", gpus=1))
        assert _group(state).min_member == expected
    state = seeded_state()
    unset = podgroup_json("pg")
    del unset["spec"]["minMember"]
    state.put_podgroup(decoded(podgroups.decode, unset))
    state.put_pod(pod("p-0", group="pg", gpus=1))
    assert _group(state).min_member == 1


def test_a_pending_pod_of_no_leaf_subgroup_is_left_out_with_the_reason_and_an_unlabelled_one_joins_default() -> None:
    state = seeded_state()
    spec = podgroup_json("pg-tree")
    spec["spec"]["subGroups"] = [{"name": "default", "minMember": 1}, {"name": "workers", "minMember": 1}]
    state.put_podgroup(decoded(podgroups.decode, spec))
    state.put_pod(pod("plain", group="pg-tree", gpus=1))
    state.put_pod(dataclasses.replace(pod("stray", group="pg-tree", gpus=1), subgroup="nowhere"))

    built = SnapshotBuilder(state).build(NOW)

    [group] = built.snapshot.groups.values()
    assert [(member.name, member.subgroup) for member in group.members] == [("plain", "default")]
    [issue] = built.pod_issues
    assert issue.name == "stray" and issue.reason == "InvalidPodGroup"
    assert "subgroup 'nowhere'" in issue.message and "default, workers" in issue.message


def test_the_task_priority_label_orders_a_pod_and_an_unreadable_one_goes_after_the_readable() -> None:
    state = seeded_state()
    state.put_podgroup(decoded(podgroups.decode, podgroup_json("pg")))
    for name, label in (("high", "7"), ("garbled", "seven"), ("plain", None)):
        raw = pod_json(name, group="pg", gpus=1)
        if label is not None:
            raw["metadata"]["labels"] = {names.TASK_PRIORITY_LABEL: label}
        state.put_pod(decoded(pods.decode, raw))

    orders = {member.name: member.task_order for member in _group(state).members}

    assert orders == {"high": -7, "garbled": model.UNREADABLE_TASK, "plain": model.UNLABELLED_TASK}


def test_a_per_container_memory_request_is_reserved_its_limit_is_not_and_its_mode_marks_the_device() -> None:
    state = seeded_state()
    state.put_podgroup(decoded(podgroups.decode, podgroup_json("pg")))
    annotations = {
        f"{names.CONTAINER_ANNOTATION_PREFIX}main{names.GPU_MEMORY_REQUEST_SUFFIX}": "20Gi",
        f"{names.CONTAINER_ANNOTATION_PREFIX}main{names.GPU_MEMORY_LIMIT_SUFFIX}": "40Gi",
        f"{names.CONTAINER_ANNOTATION_PREFIX}main{names.GPU_COMPUTE_MODE_SUFFIX}": names.SM_SHARING,
        names.GPU_DEVICES_ANNOTATION: "0",
        names.GPU_GROUPS_ANNOTATION: "n1-gpu0-a",
    }
    state.put_pod(pod("nv", group="pg", annotations=annotations, node_name="n1"))

    built = SnapshotBuilder(state).build(NOW).snapshot
    [member] = built.groups[model.GroupId("default/pg")].members
    device = built.nodes[model.NodeName("n1")].devices[0]

    assert member.share is not None
    assert member.share.memory_bytes == 20 * GIB and member.share.compute_mode is model.ComputeMode.SM_SHARING
    assert device.allotted_milli_gpu == 250, "20Gi of an 80Gi device: the request, not the 40Gi limit"
    assert device.compute_mode is model.ComputeMode.SM_SHARING


def test_the_last_eviction_re_arms_the_preemption_delay() -> None:
    state = seeded_state()
    spec = podgroup_json("pg")
    spec["spec"]["preemptionDelay"] = "60s"
    spec["metadata"]["annotations"] = {names.LAST_EVICTION_ANNOTATION: "2026-01-01T01:00:00Z"}
    state.put_podgroup(decoded(podgroups.decode, spec))
    state.put_pod(pod("p-0", group="pg", gpus=1))

    group = _group(state)

    evicted_ns = (1_767_225_600 + 3600) * S
    assert group.evictions_from_ns == evicted_ns + 60 * S

"""Applying a plan to a snapshot: the world as it is once the binder has done its work.

The simulator, the benchmark and tests need the next snapshot after a cycle: placed pods running on their nodes
and devices (shares in their GPU groups, reservation pods counted), evicted pods gone from their nodes and pending
again (their owners recreate them), gangs that fell below their minimum marked with the time. Unchanged nodes and
groups are the same objects in the new snapshot, so the engine's indexes only rebuild what the plan touched.
"""

from __future__ import annotations

import dataclasses

from common.resources import Resources
from scheduler.placement import decisions, gangs, model, plan

FULL = model.MILLI_GPU_PER_DEVICE


@dataclasses.dataclass(slots=True)
class _NodeEdit:
    used: Resources
    devices: list[model.Device]


def apply(snapshot: model.Snapshot, result: plan.Plan, *, now_ns: int | None = None) -> model.Snapshot:
    """The snapshot after ``result`` is carried out at ``now_ns`` (default: the snapshot's time)."""
    now = snapshot.now_ns if now_ns is None else now_ns
    nodes: dict[model.NodeName, _NodeEdit] = {}
    pods: dict[model.PodUid, model.Pod] = {}
    touched: set[model.GroupId] = set()

    def edit(name: model.NodeName) -> _NodeEdit | None:
        if name not in snapshot.nodes:
            return None
        if name not in nodes:
            node = snapshot.nodes[name]
            nodes[name] = _NodeEdit(used=node.used, devices=list(node.devices))
        return nodes[name]

    members = {pod.uid: pod for uid in _touched_groups(result) for pod in snapshot.groups[uid].members}
    for eviction in result.evictions:
        pod = pods.get(eviction.pod, members.get(eviction.pod))
        if pod is None or pod.phase is not model.PodPhase.RUNNING:
            continue
        touched.add(eviction.group)
        node = edit(pod.node) if pod.node is not None else None
        if node is not None:
            _release(node, pod)
        pods[pod.uid] = dataclasses.replace(
            pod,
            phase=model.PodPhase.PENDING,
            node=None,
            devices=(),
            gpu_groups=(),
            allotted_milli_gpu=0,
            started_ns=None,
        )
    for placement in result.placements:
        pod = pods.get(placement.pod, members.get(placement.pod))
        if pod is None:
            continue
        touched.add(placement.group)
        node = edit(placement.node)
        if node is None:
            continue
        _take(node, pod, placement)
        pods[pod.uid] = dataclasses.replace(
            pod,
            phase=model.PodPhase.RUNNING,
            node=placement.node,
            devices=placement.devices,
            gpu_groups=placement.gpu_groups,
            allotted_milli_gpu=max(placement.share_milli, default=0),
            started_ns=now,
            nominated_node=None,
        )
    for nomination in result.nominations:
        pod = pods.get(nomination.pod, members.get(nomination.pod))
        if pod is not None and pod.phase is model.PodPhase.PENDING:
            touched.add(nomination.group)
            pods[pod.uid] = dataclasses.replace(pod, nominated_node=nomination.node)
    new_nodes = dict(snapshot.nodes)
    for name, node_edit in nodes.items():
        held = sum(1 for device in node_edit.devices if device.allotted_milli_gpu > 0 or device.gpu_group is not None)
        new_nodes[name] = dataclasses.replace(
            snapshot.nodes[name],
            used=dataclasses.replace(node_edit.used, milli_gpu=held * FULL),
            devices=tuple(node_edit.devices),
        )
    new_groups = dict(snapshot.groups)
    for group_id in sorted(touched):
        group = snapshot.groups[group_id]
        new_members = tuple(pods.get(pod.uid, pod) for pod in group.members)
        new_groups[group_id] = dataclasses.replace(
            group, members=new_members, below_min_since_ns=_below_min_since(group, new_members, now)
        )
    return dataclasses.replace(snapshot, nodes=new_nodes, groups=new_groups, now_ns=now)


def _touched_groups(result: plan.Plan) -> list[model.GroupId]:
    found = {placement.group for placement in result.placements}
    found.update(eviction.group for eviction in result.evictions)
    found.update(nomination.group for nomination in result.nominations)
    return sorted(found)


def _below_min_since(group: model.Group, members: tuple[model.Pod, ...], now: int) -> int | None:
    running = any(pod.phase is model.PodPhase.RUNNING for pod in members)
    if not running or gangs.below_minimum(dataclasses.replace(group, members=members)) is None:
        return None
    return group.below_min_since_ns if group.below_min_since_ns is not None else now


def _release(node: _NodeEdit, pod: model.Pod) -> None:
    node.used = node.used - pod.requests
    for index in pod.devices:
        if index >= len(node.devices):
            continue
        device = node.devices[index]
        holders = tuple(uid for uid in device.holders if uid != pod.uid)
        if pod.share is None:
            node.devices[index] = dataclasses.replace(device, allotted_milli_gpu=0, holders=holders, whole=False)
            continue
        allotted = max(0, device.allotted_milli_gpu - pod.allotted_milli_gpu)
        group = device.gpu_group
        mode = device.compute_mode
        if allotted == 0 and not holders and group is not None:
            group, mode = None, None
            node.used = node.used - model.ONE_POD  # the group's reservation pod goes with its last share
        node.devices[index] = dataclasses.replace(
            device, allotted_milli_gpu=allotted, holders=holders, gpu_group=group, compute_mode=mode
        )


def _take(node: _NodeEdit, pod: model.Pod, placement: decisions.Placement) -> None:
    node.used = node.used + pod.requests
    for position, index in enumerate(placement.devices):
        device = node.devices[index]
        holders = tuple(sorted((*device.holders, pod.uid)))
        if not placement.share_milli:
            node.devices[index] = dataclasses.replace(device, allotted_milli_gpu=FULL, holders=holders, whole=True)
            continue
        mode = device.compute_mode
        # A group this plan's evictions emptied and a placement of the same plan joined opens again here.
        if placement.opens_groups[position] or device.gpu_group is None:
            node.used = node.used + model.ONE_POD
            mode = pod.share.compute_mode if pod.share is not None else model.ComputeMode.TIME_SLICING
        node.devices[index] = dataclasses.replace(
            device,
            allotted_milli_gpu=device.allotted_milli_gpu + placement.share_milli[position],
            holders=holders,
            gpu_group=placement.gpu_groups[position],
            compute_mode=mode,
        )

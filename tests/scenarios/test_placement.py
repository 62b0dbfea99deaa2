"""Scenario tables for the placement core: nodes, queues and groups in; placements, evictions and reasons out.

Each file in ``tests/scenarios/placement/`` holds a list of scenarios. A scenario describes a cluster in the units
people write (KAI's: queue GPU in devices, CPU in millicores, memory in MB; pods in Kubernetes quantities), runs
one cycle of a fresh engine, checks ``expect``, and, when it has a ``then``, applies the plan (as the binder
would), advances the clock by ``then.advance`` seconds and checks ``then.expect`` on the next cycle.

Keys (all optional unless said):

- ``nodes``: ``name`` (required), ``gpus``, ``gpu_model`` (A100), ``gpu_memory`` (40Gi), ``cpu`` (64),
  ``memory`` (256Gi), ``pods`` (110), ``labels``, ``taints`` [{key, value, effect}], ``ready``, ``devices``
  [{index, peak_used, stale, unattributed, healthy, memory}]. Node usage comes from the running pods below.
- ``queues``: ``name``, ``parent``, ``priority``, ``gpu``/``cpu``/``memory``: {quota, limit, weight} (a resource
  left out is KAI's unset: quota 0, limit 0, weight 0), ``open: true`` (every resource not given -1/-1/1),
  ``preempt_min_runtime``, ``reclaim_min_runtime`` (durations).
- ``groups``: ``id``, ``queue``, ``min``, ``priority`` (50), ``preemptible`` (priority below 100), ``created``
  (s), ``below_min_since`` (s), ``stale_grace`` (s, the group's own), ``evictions_from`` (s: its preemption
  delay ends), ``subgroups`` [{name, min, parent, min_subgroup}], ``min_subgroup`` (of its top-level subgroups),
  ``pods`` [{name, count, gpu | fraction | gpu_memory, mode (a share's compute mode), devices, cpu, memory,
  node_selector, affinity [[{key, operator, values}]], tolerations, gpu_models, phase, node, held (device indexes,
  every pod of ``count``), started (s), subgroup, created (s), nominated (node), task_priority (an integer, or
  text: an unreadable label)}].
- ``config``: ``gpu_strategy``, ``cpu_strategy``, ``device_strategy``, ``margin``, ``reclaim_multiple``,
  ``stale_grace``, ``actions``. ``now``: seconds.
- ``expect``: ``placed`` {pod: node | node/dev+dev}, ``only`` (nothing else placed), ``not_placed`` [pods],
  ``placed_count``, ``evicted`` {pod: reason}, ``evicted_count``, ``status`` {group: reason},
  ``message`` {group: [substrings]}, ``same_device`` [[pods]], ``no_status`` [groups], ``fair_gpu``
  {queue: GPUs}, ``share`` {pod: milli per device}, ``nominated`` {pod: node}, ``moved`` {pod: node} (evicted
  and placed again there), ``not_evicted`` [pods], ``message_absent`` {group: [substrings]}.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import quantities
from common.resources import Resources
from scheduler.placement import applying, engine, model, plan

TABLES = Path(__file__).resolve().parent / "placement"
NS = quantities.NS_PER_S


# --- loading -----------------------------------------------------------------------------------------------------


def _seconds(value: Any) -> int:
    return int(decimal.Decimal(str(value)) * NS)


def _queue_resource(spec: Mapping[str, Any] | None, *, scale: int) -> model.QueueResource:
    if spec is None:
        return model.QueueResource()

    def amount(key: str) -> int:
        raw = spec.get(key, 0)
        if raw == -1:
            return model.UNLIMITED
        return int(decimal.Decimal(str(raw)) * scale)

    return model.QueueResource(
        quota=amount("quota"), limit=amount("limit"), over_quota_weight=int(spec.get("weight", 0))
    )


def load_queue(spec: Mapping[str, Any]) -> model.Queue:
    scales = {"gpu": 1000, "cpu": 1, "memory": 10**6}
    resources = {
        kind: model.OPEN if spec.get("open") and kind not in spec else _queue_resource(spec.get(kind), scale=scale)
        for kind, scale in scales.items()
    }
    return model.Queue(
        name=model.QueueName(spec["name"]),
        parent=model.QueueName(spec["parent"]) if spec.get("parent") else None,
        priority=int(spec.get("priority", 100)),
        created_ns=_seconds(spec.get("created", 0)),
        gpu=resources["gpu"],
        cpu=resources["cpu"],
        memory=resources["memory"],
        preempt_min_runtime_ns=quantities.parse_duration_ns(spec.get("preempt_min_runtime", 0)),
        reclaim_min_runtime_ns=quantities.parse_duration_ns(spec.get("reclaim_min_runtime", 0)),
    )


def _pods(spec: Mapping[str, Any], group_created: int) -> Iterator[model.Pod]:
    count = int(spec.get("count", 1))
    for index in range(count):
        name = spec["name"] if count == 1 else f"{spec['name']}-{index}"
        share = None
        gpus = int(spec.get("gpu", 0))
        mode = model.ComputeMode(spec.get("mode", model.ComputeMode.TIME_SLICING))
        if "fraction" in spec:
            share = model.GpuShare(
                milli_gpu=quantities.parse_milli_gpu(str(spec["fraction"])),
                devices=int(spec.get("devices", 1)),
                compute_mode=mode,
            )
        elif "gpu_memory" in spec:
            share = model.GpuShare(
                memory_bytes=quantities.parse_bytes(str(spec["gpu_memory"])),
                devices=int(spec.get("devices", 1)),
                compute_mode=mode,
            )
        phase = model.PodPhase(spec.get("phase", "Running" if "node" in spec else "Pending"))
        node = model.NodeName(spec["node"]) if "node" in spec else None
        on = tuple(int(device) for device in spec.get("held", ()))
        allotted = 0
        groups: tuple[model.GpuGroupId, ...] = ()
        if share is not None and node is not None:
            allotted = share.milli_gpu or int(spec["allotted"])
            groups = tuple(model.GpuGroupId(spec.get("gpu_group", f"{node}-gpu{device}")) for device in on)
        yield model.Pod(
            uid=model.PodUid(name),
            name=name,
            requests=Resources(
                milli_cpu=quantities.parse_millicores(str(spec.get("cpu", "1"))),
                memory_bytes=quantities.parse_bytes(str(spec.get("memory", "1Gi"))),
                milli_gpu=gpus * 1000,
                pods=1,
            ),
            share=share,
            node_selector=tuple(sorted((str(k), str(v)) for k, v in spec.get("node_selector", {}).items())),
            affinity=tuple(
                model.AffinityTerm(
                    expressions=tuple(
                        model.Requirement(
                            key=expression["key"],
                            operator=model.Operator(expression["operator"]),
                            values=tuple(str(value) for value in expression.get("values", ())),
                        )
                        for expression in term
                    )
                )
                for term in spec.get("affinity", ())
            ),
            tolerations=tuple(
                model.Toleration(
                    key=toleration.get("key", ""),
                    operator=model.TolerationOperator(toleration.get("operator", "Equal")),
                    value=toleration.get("value", ""),
                    effect=model.TaintEffect(toleration["effect"]) if "effect" in toleration else None,
                )
                for toleration in spec.get("tolerations", ())
            ),
            gpu_models=tuple(spec.get("gpu_models", ())),
            created_ns=_seconds(spec.get("created", 0)) or group_created,
            phase=phase,
            subgroup=spec.get("subgroup"),
            node=node,
            devices=on,
            gpu_groups=groups,
            allotted_milli_gpu=allotted,
            started_ns=_seconds(spec["started"]) if "started" in spec else None,
            nominated_node=model.NodeName(spec["nominated"]) if "nominated" in spec else None,
            task_order=_task_order(spec.get("task_priority")),
        )


def _task_order(value: Any) -> int:
    if value is None:
        return model.task_order(None)
    if isinstance(value, int):
        return model.task_order(value)
    return model.task_order(None, unreadable=True)


def load_group(spec: Mapping[str, Any]) -> model.Group:
    priority = int(spec.get("priority", 50))
    created = _seconds(spec.get("created", 0))
    members = tuple(pod for pod_spec in spec.get("pods", ()) for pod in _pods(pod_spec, created))
    return model.Group(
        id=model.GroupId(spec["id"]),
        queue=model.QueueName(spec.get("queue", "test")),
        min_member=int(spec.get("min", 1)),
        subgroups=tuple(
            model.SubGroup(
                name=sub["name"],
                min_member=int(sub.get("min", 0)),
                parent=sub.get("parent"),
                min_subgroup=int(sub["min_subgroup"]) if "min_subgroup" in sub else None,
            )
            for sub in spec.get("subgroups", ())
        ),
        min_subgroup=int(spec["min_subgroup"]) if "min_subgroup" in spec else None,
        priority=priority,
        preemptible=bool(spec.get("preemptible", priority < 100)),
        created_ns=created,
        members=members,
        below_min_since_ns=_seconds(spec["below_min_since"]) if "below_min_since" in spec else None,
        stale_grace_ns=_seconds(spec["stale_grace"]) if "stale_grace" in spec else None,
        evictions_from_ns=_seconds(spec["evictions_from"]) if "evictions_from" in spec else None,
    )


def load_node(spec: Mapping[str, Any], running: Sequence[model.Pod]) -> model.Node:
    """A node with its usage computed from the pods running on it (reservation pods counted for shared GPUs)."""
    name = model.NodeName(spec["name"])
    gpus = int(spec.get("gpus", 0))
    overrides = {int(device["index"]): device for device in spec.get("devices", ())}
    gpu_model = str(spec.get("gpu_model", "A100"))
    devices: list[model.Device] = []
    for index in range(gpus):
        extra = overrides.get(index, {})
        devices.append(
            model.Device(
                index=index,
                uuid=model.GpuUuid(f"GPU-{name}-{index}"),
                model=str(extra.get("model", gpu_model)),
                memory_bytes=quantities.parse_bytes(str(extra.get("memory", spec.get("gpu_memory", "40Gi")))),
                peak_used_bytes=quantities.parse_bytes(str(extra["peak_used"])) if "peak_used" in extra else None,
                telemetry_stale=bool(extra.get("stale", False)),
                unattributed_bytes=quantities.parse_bytes(str(extra.get("unattributed", 0))),
                healthy=bool(extra.get("healthy", True)),
            )
        )
    used = Resources()
    allotted = [0] * gpus
    holders: list[list[model.PodUid]] = [[] for _ in range(gpus)]
    whole = [False] * gpus
    groups: list[model.GpuGroupId | None] = [None] * gpus
    modes: list[model.ComputeMode | None] = [None] * gpus
    for pod in running:
        used = used + pod.requests
        for position, device in enumerate(pod.devices):
            holders[device].append(pod.uid)
            if pod.share is None:
                allotted[device] = 1000
                whole[device] = True
            else:
                if groups[device] is None:
                    used = used + model.ONE_POD
                allotted[device] += pod.allotted_milli_gpu
                groups[device] = pod.gpu_groups[position]
                modes[device] = modes[device] or pod.share.compute_mode
    devices = [
        device.__class__(
            index=device.index,
            uuid=device.uuid,
            model=device.model,
            memory_bytes=device.memory_bytes,
            allotted_milli_gpu=allotted[device.index],
            holders=tuple(sorted(holders[device.index])),
            whole=whole[device.index],
            gpu_group=groups[device.index],
            compute_mode=modes[device.index],
            peak_used_bytes=device.peak_used_bytes,
            telemetry_stale=device.telemetry_stale,
            unattributed_bytes=device.unattributed_bytes,
            healthy=device.healthy,
        )
        for device in devices
    ]
    held = sum(1 for index in range(gpus) if allotted[index] or groups[index])
    return model.Node(
        name=name,
        allocatable=Resources(
            milli_cpu=quantities.parse_millicores(str(spec.get("cpu", "64"))),
            memory_bytes=quantities.parse_bytes(str(spec.get("memory", "256Gi"))),
            milli_gpu=gpus * 1000,
            pods=int(spec.get("pods", 110)),
        ),
        used=Resources(milli_cpu=used.milli_cpu, memory_bytes=used.memory_bytes, milli_gpu=held * 1000, pods=used.pods),
        labels={str(k): str(v) for k, v in spec.get("labels", {}).items()},
        taints=tuple(
            model.Taint(
                key=taint["key"],
                value=str(taint.get("value", "")),
                effect=model.TaintEffect(taint.get("effect", "NoSchedule")),
            )
            for taint in spec.get("taints", ())
        ),
        ready=bool(spec.get("ready", True)),
        devices=tuple(devices),
    )


def load_config(spec: Mapping[str, Any]) -> model.Config:
    defaults = model.Config()
    return model.Config(
        gpu_strategy=model.Strategy(spec.get("gpu_strategy", defaults.gpu_strategy)),
        cpu_strategy=model.Strategy(spec.get("cpu_strategy", defaults.cpu_strategy)),
        device_strategy=model.Strategy(spec.get("device_strategy", defaults.device_strategy)),
        headroom_margin_bytes=quantities.parse_bytes(str(spec.get("margin", defaults.headroom_margin_bytes))),
        reclaim_eviction_multiple=int(spec.get("reclaim_multiple", defaults.reclaim_eviction_multiple)),
        stale_gang_grace_ns=quantities.parse_duration_ns(spec.get("stale_grace", "60s")),
        actions=tuple(model.Action(action) for action in spec.get("actions", [a.value for a in defaults.actions])),
    )


def load(spec: Mapping[str, Any]) -> model.Snapshot:
    groups = [load_group(group) for group in spec.get("groups", ())]
    running: dict[str, list[model.Pod]] = {}
    for group in groups:
        for pod in group.members:
            if pod.phase is model.PodPhase.RUNNING and pod.node is not None:
                running.setdefault(pod.node, []).append(pod)
    return model.snapshot(
        nodes=[load_node(node, running.get(node["name"], [])) for node in spec.get("nodes", ())],
        queues=[load_queue(queue) for queue in spec.get("queues", ())],
        groups=groups,
        now_ns=_seconds(spec.get("now", 1000)),
        config=load_config(spec.get("config", {})),
    )


# --- checking ----------------------------------------------------------------------------------------------------


def check(result: plan.Plan, expect: Mapping[str, Any]) -> None:
    placed = {placement.pod: placement for placement in result.placements}
    for pod, where in expect.get("placed", {}).items():
        assert pod in placed, f"{pod} was not placed; placed: {sorted(placed)}; statuses: {dict(result.statuses)}"
        node, _, devices = str(where).partition("/")
        assert placed[pod].node == node, f"{pod} on {placed[pod].node}, expected {node}"
        if devices:
            wanted = tuple(int(device) for device in devices.split("+"))
            assert placed[pod].devices == wanted, f"{pod} on devices {placed[pod].devices}, expected {wanted}"
    if expect.get("only"):
        assert set(placed) == set(expect.get("placed", {})), f"placed {sorted(placed)}"
    for pod in expect.get("not_placed", ()):
        assert pod not in placed, f"{pod} was placed on {placed[pod].node}"
    if "placed_count" in expect:
        assert len(placed) == expect["placed_count"], f"placed {sorted(placed)}"
    evicted = {eviction.pod: eviction for eviction in result.evictions}
    for pod, reason in expect.get("evicted", {}).items():
        assert pod in evicted, f"{pod} was not evicted; evicted: {sorted(evicted)}; statuses: {dict(result.statuses)}"
        assert evicted[pod].reason.value == reason
    if "evicted_count" in expect:
        assert len(evicted) == expect["evicted_count"], f"evicted {sorted(evicted)}"
    for group, reason in expect.get("status", {}).items():
        assert group in result.statuses, f"{group} has no status; statuses: {dict(result.statuses)}"
        assert result.statuses[group].reason.value == reason, result.statuses[group]
    for group, parts in expect.get("message", {}).items():
        message = result.statuses[group].message
        for part in parts:
            assert part in message, f"{part!r} not in {message!r}"
    for group in expect.get("no_status", ()):
        assert group not in result.statuses, result.statuses.get(group)
    for pods in expect.get("same_device", ()):
        spots = {(placed[pod].node, placed[pod].devices) for pod in pods}
        assert len(spots) == 1, f"{pods} landed on {spots}"
    for queue, gpus in expect.get("fair_gpu", {}).items():
        fair = result.queues[model.QueueName(queue)].fair.milli_gpu
        assert fair == quantities.parse_milli_gpu(str(gpus)), f"{queue} fair share {fair} milli-GPU"
    nominated = {nomination.pod: nomination.node for nomination in result.nominations}
    for pod, node in expect.get("nominated", {}).items():
        assert nominated.get(pod) == node, f"{pod} nominated to {nominated.get(pod)}"
    for pod, node in expect.get("moved", {}).items():
        assert pod in evicted, f"{pod} was not moved; evicted: {sorted(evicted)}"
        assert evicted[pod].moved_to == node, f"{pod} moved to {evicted[pod].moved_to}, expected {node}"
    for pod in expect.get("not_evicted", ()):
        assert pod not in evicted, f"{pod} was evicted ({evicted[pod].reason.value})"
    for group, parts in expect.get("message_absent", {}).items():
        message = result.statuses[group].message
        for part in parts:
            assert part not in message, f"{part!r} in {message!r}"
    for pod, milli in expect.get("share", {}).items():
        assert placed[pod].share_milli == tuple(milli if isinstance(milli, list) else [milli])


def _scenarios() -> Iterator[Any]:
    for path in sorted(TABLES.glob("*.yaml")):
        for spec in yaml.safe_load(path.read_text()):
            yield pytest.param(spec, id=f"{path.stem}: {spec['name']}")


@pytest.mark.parametrize("spec", list(_scenarios()))
def test_scenario(spec: Mapping[str, Any]) -> None:
    snapshot = load(spec)
    result = engine.Engine().run(snapshot)
    check(result, spec.get("expect", {}))
    assert engine.Engine().run(snapshot) == result, "the same snapshot gave a different plan"
    then = spec.get("then")
    if then is not None:
        following = applying.apply(snapshot, result, now_ns=snapshot.now_ns + _seconds(then.get("advance", 0)))
        check(engine.Engine().run(following), then.get("expect", {}))

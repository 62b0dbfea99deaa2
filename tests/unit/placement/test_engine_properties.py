"""Properties of whole cycles on random small clusters: nothing over-committed, gangs all or nothing, shares of
different compute modes never on one device, queue limits and non-preemptible quotas respected, plans deterministic
(fresh or warm engine), the indexed search placing exactly as the scored search with the same built-in scorer, and
the scored search, which scores each distinct node look once, placing exactly as a search that scores every node."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.resources import Resources
from scheduler.placement import applying, engine, fairshare, model, plan, scoring
from tests.unit.placement import builders

GIB = builders.GIB


@st.composite
def _pods(draw: st.DrawFn, prefix: str) -> tuple[model.Pod, ...]:
    count = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["whole", "fraction", "memory", "cpu"]))
    mode = draw(st.sampled_from(list(model.ComputeMode)))
    pods = []
    for index in range(count):
        uid = f"{prefix}-{index}"
        cpu = draw(st.sampled_from([0, 500, 1000, 3000]))
        memory = draw(st.sampled_from([0, GIB, 8 * GIB]))
        if kind == "whole":
            pods.append(builders.pod(uid, gpus=draw(st.integers(1, 2)), cpu=cpu, memory=memory, created=index))
        elif kind == "fraction":
            pods.append(
                builders.pod(
                    uid,
                    fraction=draw(st.sampled_from([250, 500, 750])),
                    devices=draw(st.sampled_from([1, 1, 2])),
                    cpu=cpu,
                    memory=memory,
                    created=index,
                )
            )
        elif kind == "memory":
            pods.append(
                builders.pod(uid, gpu_memory=draw(st.sampled_from([4 * GIB, 10 * GIB])), cpu=cpu, memory=memory)
            )
        else:
            pods.append(builders.pod(uid, cpu=cpu or 500, memory=memory, created=index))
        share = pods[-1].share
        pods[-1] = dataclasses.replace(
            pods[-1],
            share=dataclasses.replace(share, compute_mode=mode) if share is not None else None,
            task_order=model.task_order(draw(st.sampled_from([None, None, 0, 3]))),
        )
    return tuple(pods)


@st.composite
def _groups(draw: st.DrawFn, leaves: list[str], prefix: str, created: int) -> list[model.Group]:
    groups = []
    for index in range(draw(st.integers(1, 7))):
        members = draw(_pods(f"{prefix}{index}"))
        groups.append(
            builders.group(
                f"{prefix}{index}",
                *members,
                queue=draw(st.sampled_from(leaves)),
                min_member=draw(st.integers(0 if len(members) > 1 else 1, len(members))),
                priority=draw(st.sampled_from([50, 75, 125])),
                created=created + index,
            )
        )
    return groups


def _queue_resource(draw: st.DrawFn) -> model.QueueResource:
    return model.QueueResource(
        quota=draw(st.sampled_from([-1, 0, 1000, 2500])),
        limit=draw(st.sampled_from([-1, -1, 0, 1500, 4000])),
        over_quota_weight=draw(st.integers(0, 3)),
    )


@st.composite
def _snapshots(draw: st.DrawFn) -> tuple[model.Snapshot, list[model.Group]]:
    nodes = [
        builders.node(
            f"n{index}",
            gpus=draw(st.integers(0, 4)),
            gpu_memory=draw(st.sampled_from([16 * GIB, 40 * GIB])),
            cpu=draw(st.sampled_from([4000, 16000])),
            memory=draw(st.sampled_from([16 * GIB, 64 * GIB])),
            pods=draw(st.integers(2, 12)),
            labels={"zone": draw(st.sampled_from(["a", "b"]))},
        )
        for index in range(draw(st.integers(1, 4)))
    ]
    leaves = [f"leaf{index}" for index in range(draw(st.integers(1, 3)))]
    queues = [model.Queue(name=model.QueueName("org"), gpu=_queue_resource(draw))]
    queues += [
        model.Queue(
            name=model.QueueName(leaf),
            parent=model.QueueName("org"),
            gpu=_queue_resource(draw),
            priority=draw(st.sampled_from([50, 100])),
        )
        for leaf in leaves
    ]
    first = draw(_groups(leaves, "g", 0))
    later = draw(_groups(leaves, "h", 100))
    config = model.Config(
        gpu_strategy=draw(st.sampled_from(list(model.Strategy))),
        device_strategy=draw(st.sampled_from(list(model.Strategy))),
    )
    return model.snapshot(nodes=nodes, queues=queues, groups=first, now_ns=10**12, config=config), later


def _assert_nothing_over_committed(snapshot: model.Snapshot) -> None:
    for node in snapshot.nodes.values():
        assert node.used.milli_cpu <= node.allocatable.milli_cpu
        assert node.used.memory_bytes <= node.allocatable.memory_bytes
        assert node.used.pods <= node.allocatable.pods
        for device in node.devices:
            assert 0 <= device.allotted_milli_gpu <= 1000
            if device.whole:
                assert len(device.holders) == 1 and device.gpu_group is None


def _assert_modes_apart(snapshot: model.Snapshot) -> None:
    """Shares of different compute modes never hold one device, and a shared device carries its shares' mode."""
    shares = {pod.uid: pod.share for group in snapshot.groups.values() for pod in group.members if pod.share}
    for node in snapshot.nodes.values():
        for device in node.devices:
            modes = {shares[uid].compute_mode for uid in device.holders if uid in shares}
            assert len(modes) <= 1, f"{node.name} device {device.index} holds shares of modes {modes}"
            if modes and device.gpu_group is not None:
                assert (device.compute_mode or model.ComputeMode.TIME_SLICING) in modes


def _assert_gangs_whole(snapshot: model.Snapshot, result: model.Snapshot) -> None:
    placed = {uid for group in result.groups.values() for uid in _running(group)}
    for group in snapshot.groups.values():
        before = _running(group)
        new = [pod for pod in group.members if pod.uid in placed and pod.uid not in before]
        if new:
            satisfied = (
                len(before) + len(new) + sum(1 for pod in group.members if pod.phase is model.PodPhase.SUCCEEDED)
            )
            assert satisfied >= group.min_member, f"{group.id}: {len(new)} placed, minimum {group.min_member}"


def _touch_telemetry(snapshot: model.Snapshot) -> model.Snapshot:
    """Every device reports a higher measured peak: nothing pending can gain from that."""
    nodes = {
        name: dataclasses.replace(
            node,
            devices=tuple(
                dataclasses.replace(device, peak_used_bytes=(device.peak_used_bytes or 0) + GIB)
                for device in node.devices
            ),
        )
        for name, node in snapshot.nodes.items()
    }
    return dataclasses.replace(snapshot, nodes=nodes)


def _running(group: model.Group) -> set[str]:
    return {pod.uid for pod in group.members if pod.phase is model.PodPhase.RUNNING}


def _assert_queues_within_limits(snapshot: model.Snapshot) -> None:
    tree = fairshare.tree(snapshot.queues)
    held: dict[str, list[int]] = {}
    fixed: dict[str, list[int]] = {}
    for group in snapshot.groups.values():
        if group.queue not in snapshot.queues:
            continue
        for pod in group.members:
            if pod.phase is not model.PodPhase.RUNNING:
                continue
            gpu = pod.allotted_milli_gpu * len(pod.devices) if pod.share else pod.requests.milli_gpu
            amounts = (gpu, pod.requests.milli_cpu, pod.requests.memory_bytes)
            for queue_name in tree.ancestors(group.queue):
                name = str(queue_name)
                totals = held.setdefault(name, [0, 0, 0])
                for i in range(3):
                    totals[i] += amounts[i]
                if not group.preemptible:
                    totals = fixed.setdefault(name, [0, 0, 0])
                    for i in range(3):
                        totals[i] += amounts[i]
    for name, totals in held.items():
        queue = snapshot.queues[model.QueueName(name)]
        for i, kind in enumerate(fairshare.KINDS):
            setting = fairshare.setting(queue, kind)
            if setting.limit != model.UNLIMITED:
                assert totals[i] <= setting.limit, f"queue {name} holds {totals[i]} {kind}, limit {setting.limit}"
            if setting.quota != model.UNLIMITED and name in fixed:
                assert fixed[name][i] <= setting.quota, f"queue {name} non-preemptible over quota"


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_snapshots())
def test_cycles_never_over_commit_and_keep_gangs_and_limits(case: tuple[model.Snapshot, list[model.Group]]) -> None:
    snapshot, later = case
    warm = engine.Engine()
    first = warm.run(snapshot)
    after = applying.apply(snapshot, first)
    _assert_nothing_over_committed(after)
    _assert_modes_apart(after)
    _assert_gangs_whole(snapshot, after)
    _assert_queues_within_limits(after)

    groups = dict(after.groups)
    groups.update((group.id, group) for group in later)
    second_snapshot = dataclasses.replace(after, groups=groups, now_ns=after.now_ns + 10**12)
    second = warm.run(second_snapshot)
    # The fragmentation strategy places by the workload it learned from the pods it saw arrive: a warm engine saw the
    # first wave arrive before the second, a fresh one sees both at once, so their plans may differ by design.
    learns = snapshot.config.gpu_strategy is model.Strategy.FRAGMENTATION
    if not learns:
        assert second == engine.Engine().run(second_snapshot), "a warm engine planned differently from a fresh one"
    assert warm.run(second_snapshot) == second, "a group not tried again got a different outcome"
    if not learns:
        idle = _touch_telemetry(second_snapshot)
        assert warm.run(idle) == engine.Engine().run(idle), "a change that frees nothing changed the plan"
    running = {pod.uid for group in second_snapshot.groups.values() for pod in group.members if pod.is_active}
    preemptible = {pod.uid for group in second_snapshot.groups.values() if group.preemptible for pod in group.members}
    for eviction in second.evictions:
        assert eviction.pod in running
        if eviction.reason.value != "stale-gang":
            assert eviction.pod in preemptible
    final = applying.apply(second_snapshot, second)
    _assert_nothing_over_committed(final)
    _assert_modes_apart(final)
    _assert_gangs_whole(second_snapshot, final)
    _assert_queues_within_limits(final)


@_SETTINGS
@given(_snapshots())
def test_the_same_snapshot_always_gives_the_same_plan(case: tuple[model.Snapshot, list[model.Group]]) -> None:
    snapshot, _ = case
    warm = engine.Engine()
    first = warm.run(snapshot)
    assert warm.run(snapshot) == first
    reordered = dataclasses.replace(
        snapshot,
        nodes=dict(reversed(list(snapshot.nodes.items()))),
        groups=dict(reversed(list(snapshot.groups.items()))),
    )
    assert engine.Engine().run(reordered) == first


@_SETTINGS
@given(_snapshots(), st.sampled_from([model.Strategy.BINPACK, model.Strategy.SPREAD]))
def test_the_indexed_search_places_as_the_scored_search_with_the_same_scorer(
    case: tuple[model.Snapshot, list[model.Group]], nodes: model.Strategy
) -> None:
    snapshot, _ = case
    snapshot = dataclasses.replace(
        snapshot,
        config=dataclasses.replace(
            # A configured scorer places CPU-only pods too: the same node strategy for them.
            snapshot.config,
            gpu_strategy=nodes,
            cpu_strategy=nodes,
            device_strategy=model.Strategy.BINPACK,
        ),
    )
    demanded = sorted(
        {
            pod.share.milli_gpu
            for group in snapshot.groups.values()
            for pod in group.members
            if pod.share is not None and pod.share.milli_gpu and pod.phase is model.PodPhase.PENDING
        }
    )
    scored = dataclasses.replace(
        snapshot,
        config=dataclasses.replace(
            snapshot.config,
            scorer=scoring.builtin(node=nodes, device=model.Strategy.BINPACK, demanded=demanded),
        ),
    )
    got, want = engine.Engine().run(scored), engine.Engine().run(snapshot)
    assert got.placements == want.placements, (got.statuses, want.statuses, snapshot.nodes, snapshot.queues)


class _Coarse:
    """A scorer that reads every part of the state and ties often, as the simulator's policies do."""

    def __call__(self, state: scoring.NodeState, request: scoring.GpuRequest, devices: tuple[int, ...]) -> int:
        return (
            7 * (sum(state.device_free_milli) // 500)
            + state.free_milli_cpu // 8000
            + 3 * sum(state.device_pod_gpus)
            + sum(state.device_shared)
            + len(set(state.device_models))
            + (devices[0] if devices else 0)
        )


class _Drawing(_Coarse):
    """The same scores, ties drawn from a seeded source (``scoring.DrawsTies``)."""

    def __init__(self, seed: int) -> None:
        self._source = random.Random(seed)

    def draw_tie(self, count: int) -> int:
        return self._source.randrange(count)


def _two_cycles(warm: engine.Engine, snapshot: model.Snapshot, later: list[model.Group]) -> list[plan.Plan]:
    first = warm.run(snapshot)
    after = applying.apply(snapshot, first)
    groups = dict(after.groups)
    groups.update((group.id, group) for group in later)
    return [first, warm.run(dataclasses.replace(after, groups=groups, now_ns=after.now_ns + 10**12))]


@_SETTINGS
@given(_snapshots(), st.booleans())
def test_the_scored_search_places_by_look_exactly_as_node_by_node(
    case: tuple[model.Snapshot, list[model.Group]], drawing: bool
) -> None:
    snapshot, later = case
    plans = []
    for group_alike in (True, False):
        scorer = _Drawing(7) if drawing else _Coarse()
        configured = dataclasses.replace(snapshot, config=dataclasses.replace(snapshot.config, scorer=scorer))
        warm = engine.Engine()
        warm.searcher.group_alike = group_alike
        plans.append(_two_cycles(warm, configured, later))
    by_look, by_node = plans
    assert [p.placements for p in by_look] == [p.placements for p in by_node]


def test_a_cycle_reads_only_what_changed_and_still_answers_like_a_fresh_engine() -> None:
    nodes = [builders.node(f"n{i}", gpus=2) for i in range(3)]
    groups = [builders.group(f"g{i}", builders.pod(f"p{i}", gpus=2), created=i) for i in range(5)]
    snapshot = model.snapshot(nodes=nodes, queues=builders.open_queues(), groups=groups, now_ns=0)
    warm = engine.Engine()
    first = warm.run(snapshot)
    assert len(first.placements) == 3
    after = applying.apply(snapshot, first)
    blocked = warm.run(after)
    assert blocked == engine.Engine().run(after)
    # A telemetry change that frees nothing: the blocked groups keep their statuses without being retried.
    node = after.nodes[model.NodeName("n0")]
    touched = dataclasses.replace(
        node, devices=(dataclasses.replace(node.devices[0], peak_used_bytes=GIB), *node.devices[1:])
    )
    nodes_now = dict(after.nodes)
    nodes_now[touched.name] = touched
    idle = dataclasses.replace(after, nodes=nodes_now)
    assert warm.run(idle) == engine.Engine().run(idle)
    # A node that frees its GPUs: the blocked groups are tried again.
    emptied = dataclasses.replace(
        after,
        nodes={**nodes_now, model.NodeName("n3"): builders.node("n3", gpus=2)},
    )
    assert len(warm.run(emptied).placements) == 1
    assert warm.run(emptied) == engine.Engine().run(emptied)


def test_resources_sum_as_vectors() -> None:
    assert Resources(milli_gpu=1000) + Resources(milli_cpu=1) == Resources(milli_gpu=1000, milli_cpu=1)

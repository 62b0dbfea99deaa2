"""Properties of the room-making actions on random small clusters (issue 15), and of queues that no longer exist
(issue 12).

Each example places a first wave of groups (allocate only), applies the plan, then adds a second wave and runs every
action; sometimes a queue that held work in the first wave is deleted before the second. After that cycle:

- no queue is pushed below its deserved quota by reclaim (in a resource with a set quota, where it held at least
  that much before);
- no non-preemptible pod is a victim (stale gangs aside);
- no pod is evicted when moving it would do: every pod evicted to make room and not moved finds no place in the
  state the plan leaves (its whole gang, when the gang goes whole);
- no gang or subgroup is left below its minimum by the plan: a gang keeps its minimum (and its subgroup tree, and
  each subgroup that held its own minimum keeps it or goes whole) or goes whole;
- groups of a queue that does not exist are never placed and wait with ``QueueDoesNotExist``, and nothing raises;
- room-making's precheck (``roommaking._Search.could_gain``), asked before every attempt, refuses only attempts whose
  scan fails, and changes nothing that is placed, evicted, moved or nominated;
- the walk's first step found node by node (``roommaking._Search._first_step``, ``earliest``) ends where the walk's
  first step ends (the same evictions and reservation, or the same failure), and the cycle decides and explains as
  with the walk alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from common.resources import Resources
from scheduler.placement import (
    applying,
    capacity,
    decisions,
    earliest,
    engine,
    evictions,
    fairshare,
    gangs,
    model,
    plan,
    roommaking,
    roomscene,
    search,
    shapes,
    status,
    subgroups,
    victims,
)
from tests.unit.placement import builders

MAKING_ROOM = (
    decisions.EvictionReason.RECLAIM,
    decisions.EvictionReason.PREEMPT,
    decisions.EvictionReason.CONSOLIDATE,
)
GHOST = model.QueueName("ghost")


@st.composite
def _group(draw: st.DrawFn, gid: str, leaves: list[str], created: int) -> model.Group:
    """A group of 1 to 4 pods of one kind in one of ``leaves``, maybe elastic (or of minMember 0), maybe in two
    subgroups or in two replicas of which ``minSubGroup`` may need one, maybe bound to a zone; shares in either
    compute mode, pods with or without a task priority."""
    count = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "cpu"]))
    mode = draw(st.sampled_from(list(model.ComputeMode)))
    pods = []
    for index in range(count):
        uid = f"{gid}-{index}"
        cpu = draw(st.sampled_from([500, 1000, 3000]))
        if kind == "whole":
            pod = builders.pod(uid, gpus=draw(st.integers(1, 2)), cpu=cpu, created=created)
        elif kind == "fraction":
            pod = builders.pod(uid, fraction=draw(st.sampled_from([250, 500, 750])), cpu=cpu, created=created)
            assert pod.share is not None
            pod = dataclasses.replace(pod, share=dataclasses.replace(pod.share, compute_mode=mode))
        else:
            pod = builders.pod(uid, cpu=cpu, created=created)
        priority_label = draw(st.sampled_from([None, None, 1, 5]))
        pods.append(dataclasses.replace(pod, task_order=model.task_order(priority_label)))
    minimum = draw(st.integers(0 if count > 1 else 1, count))
    tree: tuple[model.SubGroup, ...] = ()
    min_subgroup: int | None = None
    shape = draw(st.sampled_from(["flat", "flat", "head", "replicas"])) if count >= 2 else "flat"
    if shape == "replicas":
        # Two replicas (half the pods each, at least one); minSubGroup may need only one of them.
        pods = [dataclasses.replace(pod, subgroup=f"r{index % 2}") for index, pod in enumerate(pods)]
        sizes = [sum(1 for pod in pods if pod.subgroup == name) for name in ("r0", "r1")]
        tree = tuple(
            model.SubGroup(name=name, min_member=draw(st.integers(1, size)))
            for name, size in zip(("r0", "r1"), sizes, strict=True)
        )
        min_subgroup = draw(st.sampled_from([None, 1]))
        minimum = 0
    elif shape == "head":
        # Two subgroups: the first pod alone in "head", the rest in "workers".
        pods = [
            dataclasses.replace(pod, subgroup="head" if index == 0 else "workers") for index, pod in enumerate(pods)
        ]
        tree = (
            model.SubGroup(name="head", min_member=1),
            model.SubGroup(name="workers", min_member=draw(st.integers(0, count - 1))),
        )
        minimum = max(minimum, 1 + tree[1].min_member)
    if draw(st.booleans()):
        # Bound to one zone: room made there may leave its victims room to move to in the other.
        zone = (("zone", draw(st.sampled_from(["a", "b"]))),)
        pods = [dataclasses.replace(pod, node_selector=zone) for pod in pods]
    priority = draw(st.sampled_from([50, 50, 75, 125]))
    return dataclasses.replace(
        builders.group(gid, *pods, queue=draw(st.sampled_from(leaves)), min_member=minimum, priority=priority),
        created_ns=created,
        subgroups=tree,
        min_subgroup=min_subgroup,
    )


def _resource(draw: st.DrawFn, quotas: list[int]) -> model.QueueResource:
    return model.QueueResource(
        quota=draw(st.sampled_from(quotas)), limit=model.UNLIMITED, over_quota_weight=draw(st.integers(0, 2))
    )


@st.composite
def _case(draw: st.DrawFn) -> tuple[model.Snapshot, list[model.Group], bool]:
    nodes = [
        builders.node(
            f"n{index}",
            gpus=draw(st.integers(1, 4)),
            cpu=draw(st.sampled_from([4000, 16000])),
            pods=20,
            labels={"zone": draw(st.sampled_from(["a", "b"]))},
        )
        for index in range(draw(st.integers(1, 5)))
    ]
    departments = ["d0", "d1"]
    leaves = ["q0", "q1", "q2", str(GHOST)]
    queues = [
        model.Queue(name=model.QueueName(name), gpu=_resource(draw, [-1, 0, 2000]), created_ns=index)
        for index, name in enumerate(departments)
    ]
    queues += [
        model.Queue(
            name=model.QueueName(leaf),
            parent=model.QueueName(draw(st.sampled_from(departments))),
            gpu=_resource(draw, [-1, 0, 1000, 2000]),
            cpu=_resource(draw, [-1, -1, 2000]),
            priority=draw(st.sampled_from([50, 100])),
            created_ns=index,
        )
        for index, leaf in enumerate(leaves)
    ]
    # The first wave mostly fills q0 and the ghost queue, the second mostly asks for q1 and q2: room to reclaim.
    first = [draw(_group(f"g{index}", ["q0", "q0", "ghost", "q1"], index)) for index in range(draw(st.integers(1, 8)))]
    later = [draw(_group(f"h{index}", ["q1", "q2", "q0"], 100 + index)) for index in range(draw(st.integers(1, 5)))]
    config = model.Config(
        gpu_strategy=draw(st.sampled_from(list(model.Strategy))),
        device_strategy=draw(st.sampled_from(list(model.Strategy))),
        reclaim_eviction_multiple=draw(st.sampled_from([0, 0, 2])),
    )
    snapshot = model.snapshot(nodes=nodes, queues=queues, groups=first, now_ns=10**12, config=config)
    return snapshot, later, draw(st.booleans())


def _second_cycle(case: tuple[model.Snapshot, list[model.Group], bool]) -> tuple[model.Snapshot, plan.Plan]:
    """The snapshot before the cycle under test, and its plan."""
    snapshot, later, delete_ghost = case
    allocate_only = dataclasses.replace(snapshot.config, actions=(model.Action.ALLOCATE,))
    first = engine.Engine().run(dataclasses.replace(snapshot, config=allocate_only))
    after = applying.apply(snapshot, first)
    groups = dict(after.groups)
    groups.update((group.id, group) for group in later)
    queues = dict(after.queues)
    if delete_ghost:
        del queues[GHOST]
    second = dataclasses.replace(after, groups=groups, queues=queues, now_ns=after.now_ns + 10**12)
    return second, engine.Engine().run(second)


def _usage(tree: fairshare.Tree, held: list[tuple[model.Group, Resources]]) -> dict[model.QueueName, Resources]:
    totals: dict[model.QueueName, Resources] = {}
    for group, amounts in held:
        for name in tree.ancestors(group.queue):
            totals[name] = totals.get(name, model.ZERO) + amounts
    return totals


def _placed(pod: model.Pod, placement: decisions.Placement) -> Resources:
    gpu = sum(placement.share_milli) or len(placement.devices) * model.MILLI_GPU_PER_DEVICE
    return Resources(milli_gpu=gpu, milli_cpu=pod.requests.milli_cpu, memory_bytes=pod.requests.memory_bytes)


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_case())
def test_reclaim_never_pushes_a_queue_below_its_deserved_quota(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    snapshot, result = _second_cycle(case)
    named = {group.queue for group in snapshot.groups.values()}
    queues = dict(snapshot.queues)
    queues.update((name, engine.orphan(name)) for name in named if name not in queues)
    tree = fairshare.tree(queues)
    members = {pod.uid: (group, pod) for group in snapshot.groups.values() for pod in group.members}
    running = [
        (pod.uid, group, plan.pod_amounts(pod))
        for group, pod in members.values()
        if pod.phase is model.PodPhase.RUNNING
    ]

    def nominated(reason: status.Reason) -> list[tuple[model.PodUid, model.Group, Resources]]:
        waiting = {group_id for group_id, state in result.statuses.items() if state.reason is reason}
        return [
            (nomination.pod, members[nomination.pod][0], _placed(members[nomination.pod][1], nomination))
            for nomination in result.nominations
            if nomination.group in waiting
        ]

    # The reclaim phase starts from what runs, what allocate placed and what consolidation made room for (its moves
    # change no usage; the group it made room for holds what it was nominated to, and reclaim may take from that
    # group's running pods against it).
    start = running + [
        (placement.pod, members[placement.pod][0], _placed(members[placement.pod][1], placement))
        for placement in result.placements
    ]
    start += nominated(status.Reason.WAITING_FOR_CONSOLIDATION)
    reclaimed = {
        eviction.pod
        for eviction in result.evictions
        if eviction.reason is decisions.EvictionReason.RECLAIM and eviction.moved_to is None
    }
    end = [entry for entry in start if entry[0] not in reclaimed]
    end += nominated(status.Reason.WAITING_FOR_RECLAIM)
    before = _usage(tree, [(group, amounts) for _, group, amounts in start])
    after = _usage(tree, [(group, amounts) for _, group, amounts in end])
    for name, share in result.queues.items():
        queue = queues[name]
        for kind in fairshare.KINDS:
            if fairshare.setting(queue, kind).quota == model.UNLIMITED:
                continue
            held_before = fairshare.amount(before.get(name, model.ZERO), kind)
            held_after = fairshare.amount(after.get(name, model.ZERO), kind)
            floor = min(held_before, fairshare.amount(share.deserved, kind))
            assert held_after >= floor, f"reclaim took queue {name} to {held_after} {kind}, floor {floor}"


@_SETTINGS
@given(_case())
def test_no_non_preemptible_pod_is_a_victim_and_every_gang_keeps_its_minimum_or_goes_whole(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    snapshot, result = _second_cycle(case)
    evicted = {eviction.pod: eviction for eviction in result.evictions}
    for group in snapshot.groups.values():
        running = [pod for pod in group.members if pod.phase is model.PodPhase.RUNNING]
        gone = [pod for pod in running if pod.uid in evicted]
        for pod in gone:
            assert evicted[pod.uid].reason in (*MAKING_ROOM, decisions.EvictionReason.STALE_GANG)
            if evicted[pod.uid].reason is not decisions.EvictionReason.STALE_GANG:
                assert group.preemptible, f"non-preemptible {pod.uid} of {group.id} evicted"
        if not gone or len(gone) == len(running) or gangs.below_minimum(group) is not None:
            continue
        assert gangs.below_minimum(group, evicted) is None, f"{group.id} left below its minimum by the plan"
        if group.subgroups:
            shape = subgroups.of(group)
            before = subgroups.leaf_counts(shape, group.members)
            after = subgroups.leaf_counts(shape, group.members, evicted)
            assert subgroups.keeps(shape, before, after), f"{group.id} left a subgroup running below its minimum"


@_SETTINGS
@given(_case())
def test_no_pod_is_evicted_where_moving_it_would_do(case: tuple[model.Snapshot, list[model.Group], bool]) -> None:
    snapshot, result = _second_cycle(case)
    # The state the plan leaves: bound pods, the room reserved for the groups it was made for, moved pods moved.
    taken = dataclasses.replace(result, placements=(*result.placements, *result.nominations, *result.moves))
    after = applying.apply(snapshot, taken)
    cap = capacity.Capacity()
    cap.sync(after.nodes, margin_bytes=snapshot.config.headroom_margin_bytes, label_keys=frozenset())
    searcher = search.Searcher(cap)
    searcher.configure(snapshot.config, ())
    draft = plan.Draft(cap, plan.Usage({}))
    evicted = {eviction.pod: eviction for eviction in result.evictions}
    stayed: dict[model.GroupId, list[model.Pod]] = {}
    for eviction in result.evictions:
        if eviction.reason in MAKING_ROOM and eviction.moved_to is None:
            group = snapshot.groups[eviction.group]
            pod = next(pod for pod in group.members if pod.uid == eviction.pod)
            stayed.setdefault(group.id, []).append(pod)
    for group_id, pods in stayed.items():
        group = snapshot.groups[group_id]
        for unit in evictions.move_batches(group, pods, evicted):
            failure = gangs.try_place(
                draft=draft,
                searcher=searcher,
                group=group,
                pods=unit,
                pod_shapes={pod.uid: shapes.shape_of(pod) for pod in unit},
            )
            assert failure is not None, f"{[pod.uid for pod in unit]} evicted though they fit after the plan"


@_SETTINGS
@given(_case())
def test_groups_of_a_queue_that_does_not_exist_wait_and_nothing_raises(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    snapshot, result = _second_cycle(case)
    placed = {placement.group for placement in (*result.placements, *result.nominations)}
    for group in snapshot.groups.values():
        if group.queue in snapshot.queues:
            continue
        assert group.id not in placed, f"{group.id} of missing queue {group.queue} placed"
        if any(pod.phase is model.PodPhase.PENDING for pod in group.members):
            assert result.statuses[group.id].reason is status.Reason.QUEUE_DOES_NOT_EXIST
    assert set(result.queues) <= set(snapshot.queues), "a missing queue got a Queue status"
    warm = engine.Engine()
    warm.run(snapshot)
    assert warm.run(snapshot) == result, "a warm engine planned differently from a fresh one"


@_SETTINGS
@given(_case())
def test_the_room_precheck_refuses_only_attempts_the_scan_would_fail_and_changes_no_decision(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    """The precheck asked before every attempt (not only after a failure of the same shapes): each time it refuses,
    the scan it spares must fail too, and the cycle decides as without the precheck."""
    snapshot, checked = _second_cycle(case)
    could_gain, scan = roommaking._Search.could_gain, roommaking._Search.run
    refused = 0

    def checked_precheck(self: roommaking._Search) -> bool:
        nonlocal refused
        answer = could_gain(self)
        if not answer:
            refused += 1
            assert not scan(self), "the precheck refused an attempt that the scan made room for"
        return answer

    with (
        mock.patch.object(roomscene.Scene, "shapes_failed", lambda self, key: True),
        mock.patch.object(roommaking._Search, "could_gain", checked_precheck),
    ):
        prechecked = engine.Engine().run(snapshot)
    event("the precheck refused an attempt" if refused else "the precheck refused nothing")
    assert builders.decisions(prechecked) == builders.decisions(checked)


@st.composite
def _one_pod(draw: st.DrawFn, gid: str, leaves: list[str], created: int) -> model.Group:
    """A group of one pod: one or two whole GPUs, a share, or CPU only."""
    kind = draw(st.sampled_from(["whole", "whole", "fraction", "cpu"]))
    cpu = draw(st.sampled_from([500, 1000, 3000]))
    if kind == "whole":
        pod = builders.pod(f"{gid}-0", gpus=draw(st.integers(1, 2)), cpu=cpu, created=created)
    elif kind == "fraction":
        pod = builders.pod(f"{gid}-0", fraction=draw(st.sampled_from([250, 500, 750])), cpu=cpu, created=created)
    else:
        pod = builders.pod(f"{gid}-0", cpu=cpu, created=created)
    group = builders.group(gid, pod, queue=draw(st.sampled_from(leaves)), priority=draw(st.sampled_from([50, 125])))
    return dataclasses.replace(group, created_ns=created)


@st.composite
def _reclaim_case(draw: st.DrawFn) -> tuple[model.Snapshot, list[model.Group], bool]:
    """A full cluster of up to 8 nodes, mostly one queue's work (some of it gangs), and a second wave of one-pod
    groups of queues below their share: one-pod reclaims, which take their first step node by node."""
    nodes = [
        builders.node(f"n{index}", gpus=draw(st.integers(1, 4)), cpu=16000, pods=20)
        for index in range(draw(st.integers(2, 8)))
    ]
    queues = [model.Queue(name=model.QueueName("d0"), created_ns=0)]
    queues += [
        model.Queue(
            name=model.QueueName(leaf),
            parent=model.QueueName("d0"),
            gpu=_resource(draw, [0, 1000, 2000, 4000]),
            created_ns=index,
        )
        for index, leaf in enumerate(["q0", "q1", "q2", "q3"])
    ]
    first = [
        draw(st.one_of(_one_pod(f"g{index}", ["q0", "q0", "q3"], index), _group(f"g{index}", ["q0", "q3"], index)))
        for index in range(draw(st.integers(4, 24)))
    ]
    later = [draw(_one_pod(f"h{index}", ["q1", "q2"], 100 + index)) for index in range(draw(st.integers(1, 8)))]
    config = model.Config(
        gpu_strategy=draw(st.sampled_from(list(model.Strategy))),
        device_strategy=draw(st.sampled_from(list(model.Strategy))),
    )
    snapshot = model.snapshot(nodes=nodes, queues=queues, groups=first, now_ns=10**12, config=config)
    return snapshot, later, False


@_SETTINGS
@given(st.one_of(_case(), _reclaim_case()))
def test_the_first_step_found_node_by_node_is_the_walks_and_changes_no_decision(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    """Every attempt that may take the first step node by node takes it, then walks from the start: where the first
    step made room the walk makes the same room (the same evictions and reservation), where it found no node ready
    the walk fails; and a cycle with the first step decides, and explains in its statuses, as one without it."""
    snapshot, _ = _second_cycle(case)
    run, first_step = roommaking._Search.run, roommaking._Search._first_step
    outcomes: list[bool | None] = []
    steps_past_a_failed_try: list[bool | None] = []

    def drafted(draft: plan.Draft, mark: plan.Checkpoint) -> tuple[object, ...]:
        return (
            [(e.pod, e.node) for e in draft.evictions[mark.evictions :]],
            [(p.pod, p.node, p.devices, p.share_milli) for p in draft.placements[mark.placements :]],
        )

    def checked_run(self: roommaking._Search) -> bool:
        if self.listed is None:
            return run(self)
        mark = self.draft.checkpoint()
        step = first_step(self)
        outcomes.append(step)
        if self.failed_settles:
            steps_past_a_failed_try.append(step)
        stepped = drafted(self.draft, mark)
        self._restart()
        walked = self._scan()
        if step is None:
            assert not walked, "the first step found no node ready where the walk made room"
        elif step:
            assert walked, "the first step made room where the walk did not"
            assert drafted(self.draft, mark) == stepped, "the first step made other room than the walk"
        self._restart()
        return run(self)

    with mock.patch.object(roommaking._Search, "run", checked_run):
        stepped = engine.Engine().run(snapshot)
    with mock.patch.object(roommaking._Search, "_first_step", lambda self: False):
        walked = engine.Engine().run(snapshot)
    event("a first step made room" if True in outcomes else "no first step made room")
    event("a first step found no node" if None in outcomes else "every first step found a node")
    event(
        "steps past a failed try made room"
        if True in steps_past_a_failed_try
        else "no step past a failed try made room"
    )
    event("steps past a failed try failed" if None in steps_past_a_failed_try else "no step past a failed try failed")
    assert builders.decisions(stepped) == builders.decisions(walked)
    assert stepped.statuses == walked.statuses


@_SETTINGS
@given(st.one_of(_case(), _reclaim_case()))
def test_a_walk_that_skips_the_nodes_its_window_cannot_make_ready_changes_no_decision(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    """A room-making walk (consolidation, or a reclaim that walks) pools no victim on a node that every candidate of
    its window on it gone would not make ready: the cycle decides, and explains, as one that pools on every node."""
    snapshot, _ = _second_cycle(case)
    hopeless = roommaking._Search._hopeless
    skipped: list[model.NodeName] = []

    def counted(self: roommaking._Search, window: tuple[roomscene.Listed, int], name: model.NodeName) -> bool:
        found = hopeless(self, window, name)
        if found:
            skipped.append(name)
        return found

    with mock.patch.object(roommaking._Search, "_hopeless", counted):
        skipping = engine.Engine().run(snapshot)
    with mock.patch.object(roommaking._Search, "_hopeless", lambda self, window, name: False):
        pooling = engine.Engine().run(snapshot)
    event("a walk skipped a node" if skipped else "no node skipped")
    assert builders.decisions(skipping) == builders.decisions(pooling)
    assert skipping.statuses == pooling.statuses


@_SETTINGS
@given(st.one_of(_case(), _reclaim_case()))
def test_passing_the_queues_that_could_leave_no_reason_changes_no_status(
    case: tuple[model.Snapshot, list[model.Group], bool],
) -> None:
    """A reclaim that finds no node ready leaves the walk's last reason; the search for it passes the queues whose
    largest unit would break no floor (``Listed.quiet``). Each search finds the unit one reading every queue's units
    finds, and the cycle decides and explains itself as one without ``quiet``."""
    snapshot, _ = _second_cycle(case)
    leave = roommaking._Search._leave_reasons
    found: list[tuple[victims.Unit | None, victims.Unit | None]] = []

    def last_reason(
        search: roommaking._Search, listed: roomscene.Listed, positions: earliest.Positions, end: int
    ) -> victims.Unit | None:
        given: list[victims.Unit] = []
        reasons = listed.reasons
        assert reasons is not None

        def recording(unit: victims.Unit) -> bool:
            answer = reasons(unit)
            if answer:
                given.append(unit)
            return answer

        search.listed = dataclasses.replace(listed, reasons=recording)
        try:
            leave(search, positions, end)
        finally:
            search.listed = listed
        return given[-1] if given else None

    def compared(self: roommaking._Search, positions: earliest.Positions, end: int) -> None:
        listed = self.listed
        if listed is not None and listed.reasons is not None:
            quiet = last_reason(self, listed, positions, end)
            reading = last_reason(self, dataclasses.replace(listed, quiet=None), positions, end)
            found.append((quiet, reading))
        leave(self, positions, end)  # last: the reason it leaves stays

    with mock.patch.object(roommaking._Search, "_leave_reasons", compared):
        passing = engine.Engine().run(snapshot)
    with mock.patch.object(roomscene.Listed, "__init__", _without_quiet(roomscene.Listed.__init__)):
        reading = engine.Engine().run(snapshot)
    event("a search found a reason" if any(pair[1] is not None for pair in found) else "no search found a reason")
    for quiet, every in found:
        assert quiet is every, "passing quiet queues found another last reason"
    assert builders.decisions(passing) == builders.decisions(reading)
    assert passing.statuses == reading.statuses


def _without_quiet(init: Callable[..., None]) -> Callable[..., None]:
    """``Listed``'s constructor, every ``quiet`` given dropped."""

    def replaced(self: roomscene.Listed, *args: object, **kwargs: object) -> None:
        kwargs["quiet"] = None
        init(self, *args, **kwargs)

    return replaced

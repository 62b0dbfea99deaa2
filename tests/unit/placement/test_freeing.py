"""What evicting pods would free on a node (``freeing``): a pod frees its room once, however often it is named.

Victim units overlap (a gang's extras one by one, then together, then the whole gang), so a pool may list a pod
twice. Counting its room twice made a node look ready that was not: the walk evicted a gang's two pods for a pod
that needs more CPU than both free (found by ``test_eviction_properties``, where the walk then disagreed with the
node-by-node first step, which counted each pod once)."""

from __future__ import annotations

from scheduler.placement import applying, capacity, engine, freeing, model, search, shapes
from tests.unit.placement import builders

NS = 1_000_000_000


def _one_node_with_a_running_gang() -> tuple[capacity.Capacity, freeing.Room, list[model.Pod]]:
    """One node of 2 GPUs and 4 CPUs, held by a gang of two 1-GPU, 1.5-CPU pods (1 CPU free); the room of a pod
    of 1 GPU and 3.5 CPUs, which fits once both gang pods are gone and not before."""
    gang = builders.group(
        "gang", builders.pod("gang-0", gpus=1, cpu=1500), builders.pod("gang-1", gpus=1, cpu=1500), queue="test"
    )
    snapshot = model.snapshot(
        nodes=[builders.node("n0", gpus=2, cpu=4000)], queues=builders.open_queues(), groups=[gang], now_ns=NS
    )
    snapshot = applying.apply(snapshot, engine.Engine().run(snapshot), now_ns=2 * NS)
    cap = capacity.Capacity()
    cap.sync(snapshot.nodes, margin_bytes=0, label_keys=frozenset())
    searcher = search.Searcher(cap)
    searcher.configure(model.Config(), ())
    running = sorted(snapshot.groups[model.GroupId("gang")].members, key=lambda pod: pod.uid)
    assert all(pod.node == "n0" and pod.phase is model.PodPhase.RUNNING for pod in running)
    return cap, freeing.Room(searcher, [shapes.shape_of(builders.pod("x", gpus=1, cpu=3500))]), running


def test_a_pod_named_twice_frees_its_room_once() -> None:
    cap, room, (first, second) = _one_node_with_a_running_gang()
    work = cap.by_name[model.NodeName("n0")]
    assert freeing.free_after(work, [first, first]) == freeing.free_after(work, [first])
    node = model.NodeName("n0")
    assert not room.gains(node, [first, first])
    assert room.gains(node, [first, second, first, second])  # both gone, each named twice: 4 CPUs free


def test_a_pod_already_pooled_helps_no_more() -> None:
    _, room, (first, second) = _one_node_with_a_running_gang()
    node = model.NodeName("n0")
    assert room.helps(node, [], [first])
    assert not room.helps(node, [first], [first])  # the gang's extras together, after the first alone
    assert room.helps(node, [first], [first, second])  # the second is new


def test_the_leaving_room_kept_pod_by_pod_counts_each_pod_once() -> None:
    cap, _, (first, second) = _one_node_with_a_running_gang()
    leaving = freeing.Leaving(cap.by_name[model.NodeName("n0")])
    assert leaving.add(first)
    assert not leaving.add(first)
    assert leaving.add(second)
    assert leaving.free.cpu == 4000

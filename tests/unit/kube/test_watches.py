"""scheduler.kube.watches: the relist diff, event bookkeeping, and the reflector's list/watch/relist loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.kube import kubeapi, watches
from scheduler.kube.errors import KubeForbidden, KubeGone, KubeUnavailable
from scheduler.kube.watches import Added, Deleted, Modified, Reflector, ReflectorEvent, Synced
from tests.unit.kube.fakes import MemoryKube, VirtualClock, obj

ADDED, MODIFIED, DELETED, BOOKMARK = (
    kubeapi.WatchType.ADDED,
    kubeapi.WatchType.MODIFIED,
    kubeapi.WatchType.DELETED,
    kubeapi.WatchType.BOOKMARK,
)


def event(kind: kubeapi.WatchType, o: dict[str, object]) -> kubeapi.WatchEvent:
    return kubeapi.WatchEvent(type=kind, object=o)


def bookmark(rv: str) -> kubeapi.WatchEvent:
    return event(BOOKMARK, {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """A record as the tests decode it: its identity, and the object itself to look at."""

    name: str
    uid: str
    resource_version: str
    obj: Mapping[str, Any]


def item(o: Mapping[str, Any]) -> Item | None:
    meta = o.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    return Item(name=meta["name"], uid=meta.get("uid", ""), resource_version=meta.get("resourceVersion", ""), obj=o)


def cache_of(*objects: dict[str, object]) -> dict[watches.Key, Item]:
    found = {}
    for o in objects:
        key, record = watches.key_of(o), item(o)
        assert key is not None and record is not None
        found[key] = record
    return found


def names(changes: list[tuple[watches.Key, watches.Change[Item]]] | None) -> list[tuple[str, str]]:
    assert changes is not None
    return [(type(change).__name__, change.record.name) for _, change in changes]


# --- the pure diff ---


def test_a_relist_emits_the_deletes_the_gap_hid_then_adds_and_updates() -> None:
    cache = cache_of(obj("kept", rv="1"), obj("changed", rv="1"), obj("gone", rv="1"))
    listed = [obj("kept", rv="1"), obj("changed", rv="5"), obj("new", rv="6")]

    found = watches.diff(cache, listed, item)

    assert names(found.changes) == [("Deleted", "gone"), ("Modified", "changed"), ("Added", "new")]
    assert found.malformed == 0


def test_a_namesake_recreated_in_the_gap_is_a_delete_of_the_old_and_an_add_of_the_new() -> None:
    cache = cache_of(obj("p", uid="old", rv="1"))

    found = watches.diff(cache, [obj("p", uid="new", rv="9")], item)

    assert [(type(c).__name__, c.record.uid) for _, c in found.changes] == [
        ("Deleted", "old"),
        ("Added", "new"),
    ]


def test_malformed_listed_objects_are_counted_and_left_out() -> None:
    found = watches.diff({}, [obj("good"), {"metadata": {}}, "junk", {"metadata": {"name": 7}}, {"no": "meta"}], item)

    assert names(found.changes) == [("Added", "good")]
    assert found.malformed == 4


def test_objects_in_different_namespaces_with_one_name_are_different_objects() -> None:
    found = watches.diff({}, [obj("p", namespace="a"), obj("p", namespace="b"), obj("node-1", namespace="")], item)

    assert len(found.changes) == 3
    assert watches.key_of(obj("node-1", namespace="")) == ("", "node-1")


objects_strategy = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.tuples(st.sampled_from(["u1", "u2"]), st.sampled_from(["1", "2", "3"])),
    max_size=5,
)


@given(objects_strategy, objects_strategy)
def test_committing_the_diff_makes_the_cache_equal_to_the_list(
    before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]
) -> None:
    cache = cache_of(*(obj(name, uid=uid, rv=rv) for name, (uid, rv) in before.items()))
    listed = [obj(name, uid=uid, rv=rv) for name, (uid, rv) in after.items()]

    watches.commit(cache, watches.diff(cache, listed, item).changes)

    assert cache == cache_of(*listed)


# --- the pure per-event bookkeeping ---


def test_watch_events_become_changes_against_the_cache() -> None:
    cache = cache_of(obj("known", rv="1"))

    assert names(watches.apply(cache, ADDED, obj("new", rv="2"), item)) == [("Added", "new")]
    assert names(watches.apply(cache, ADDED, obj("known", rv="3"), item)) == [("Modified", "known")]
    assert names(watches.apply(cache, MODIFIED, obj("unknown", rv="3"), item)) == [("Added", "unknown")]
    assert names(watches.apply(cache, DELETED, obj("known", rv="4"), item)) == [("Deleted", "known")]
    assert watches.apply(cache, DELETED, obj("never-seen", rv="4"), item) == []
    assert watches.apply(cache, MODIFIED, obj("known", rv="1"), item) == [], "a replay of the same version"
    assert watches.apply(cache, BOOKMARK, {"metadata": {"resourceVersion": "9"}}, item) == []
    assert watches.apply(cache, ADDED, {"metadata": {"resourceVersion": "9"}}, item) is None, "malformed"


def test_a_modified_event_carries_the_state_it_replaces() -> None:
    old = obj("p", rv="1", spec={"nodeName": ""})
    change = watches.apply(cache_of(old), MODIFIED, obj("p", rv="2", spec={"nodeName": "n1"}), item)

    assert change == [
        (("default", "p"), Modified(record=item(obj("p", rv="2", spec={"nodeName": "n1"})), old=item(old)))
    ]


# --- the reflector ---


class Recorder:
    def __init__(self) -> None:
        self.events: list[ReflectorEvent[Item]] = []

    async def __call__(self, reflector_event: ReflectorEvent[Item]) -> None:
        self.events.append(reflector_event)

    def summary(self) -> list[str]:
        out = []
        for e in self.events:
            if isinstance(e, Synced):
                out.append(f"Synced@{e.resource_version}" + (" relist" if e.relist else ""))
            else:
                out.append(f"{type(e).__name__}:{e.record.name}")
        return out


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def start(tasks: list[asyncio.Task[None]], reflector: Reflector[Item]) -> None:
    tasks.append(asyncio.create_task(reflector.run()))


def reflector_for(api: MemoryKube, recorder: Recorder, clock: VirtualClock) -> Reflector[Item]:
    return Reflector(
        api, kubeapi.PODS, decode=item, handler=recorder, watch_timeout_s=60, sleep=clock.sleep, uniform=lambda: 0.5
    )


async def test_a_reflector_lists_emits_synced_then_follows_the_watch_from_the_lists_version(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.append(kubeapi.ObjectList(items=[obj("a", rv="4"), obj("b", rv="5")], resource_version="10"))
    api.watches.append([event(ADDED, obj("c", rv="11")), event(DELETED, obj("a", rv="12")), bookmark("15")])
    recorder = Recorder()
    reflector = reflector_for(api, recorder, clock)

    start(running, reflector)
    await clock.advance(0)
    await api.idle_watch.wait()

    assert recorder.summary() == ["Added:a", "Added:b", "Synced@10", "Added:c", "Deleted:a"]
    assert api.watch_calls == ["10", "15"], "the second watch resumes from the bookmark"
    assert set(reflector.cache) == {("default", "b"), ("default", "c")}
    assert reflector.has_synced


async def test_after_a_410_the_reflector_relists_and_emits_the_deletes_it_missed(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.append(kubeapi.ObjectList(items=[obj("a"), obj("b"), obj("c")], resource_version="10"))
    api.watches.append([event(MODIFIED, obj("a", rv="11")), KubeGone("too old", status=410, reason="Expired")])
    # In the gap: b deleted, c deleted and recreated under the same name, d created.
    api.lists.append(
        kubeapi.ObjectList(
            items=[obj("a", rv="11"), obj("c", uid="c2", rv="20"), obj("d", rv="21")], resource_version="30"
        )
    )
    recorder = Recorder()
    reflector = reflector_for(api, recorder, clock)

    start(running, reflector)
    await clock.advance(0)
    await api.idle_watch.wait()

    assert recorder.summary()[5:] == ["Deleted:b", "Deleted:c", "Added:c", "Added:d", "Synced@30 relist"]
    assert api.watch_calls == ["10", "30"]
    assert reflector.stats.gone == 1
    assert reflector.stats.relists == 1
    assert {key: record.uid for key, record in reflector.cache.items()} == {
        ("default", "a"): "uid-a",
        ("default", "c"): "c2",
        ("default", "d"): "uid-d",
    }


async def test_a_broken_watch_resumes_from_the_last_version_without_relisting_after_a_backoff(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.append(kubeapi.ObjectList(items=[], resource_version="10"))
    api.watches.append([event(ADDED, obj("a", rv="11")), KubeUnavailable("connection reset")])
    api.watches.append([KubeUnavailable("connection refused")])
    recorder = Recorder()
    reflector = reflector_for(api, recorder, clock)

    start(running, reflector)
    await clock.advance(0)
    assert api.watch_calls == ["10"]
    await clock.advance(0.2)
    assert api.watch_calls == ["10", "11"], "retried after the first backoff step (0.2 s x 0.75 = 0.15 s)"
    await clock.advance(0.2)
    assert api.watch_calls == ["10", "11"], "the second retry waits twice as long (0.3 s)"
    await clock.advance(0.1)
    await api.idle_watch.wait()

    assert api.watch_calls == ["10", "11", "11"]
    assert reflector.stats.lists == 1
    assert reflector.stats.errors == 2


async def test_a_failing_list_is_retried_with_backoff_and_nothing_is_emitted_until_it_succeeds(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.extend([KubeForbidden("pods is forbidden", status=403), KubeUnavailable("down")])
    api.lists.append(kubeapi.ObjectList(items=[obj("a")], resource_version="3"))
    recorder = Recorder()
    reflector = reflector_for(api, recorder, clock)

    start(running, reflector)
    await clock.advance(0)
    assert recorder.events == []
    assert not reflector.has_synced
    await clock.advance(5)

    assert recorder.summary() == ["Added:a", "Synced@3"]
    assert reflector.stats.errors == 2
    assert "forbidden" in reflector.stats.last_error or "down" in reflector.stats.last_error


async def test_repeated_410s_without_progress_back_off_instead_of_relisting_in_a_tight_loop(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    for _ in range(10):
        api.lists.append(kubeapi.ObjectList(items=[obj("a")], resource_version="10"))
        api.watches.append([KubeGone("expired", status=410)])
    reflector = reflector_for(api, Recorder(), clock)

    start(running, reflector)
    await clock.advance(0)
    first = reflector.stats.lists
    await clock.advance(1.0)

    assert first == 2, "the first 410 relists at once, the second waits"
    assert reflector.stats.lists < 6


async def test_malformed_watch_objects_and_failing_handlers_are_counted_and_never_stop_the_stream(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.append(kubeapi.ObjectList(items=[], resource_version="1"))
    api.watches.append(
        [
            event(ADDED, {"metadata": {"resourceVersion": "2"}}),
            event(ADDED, obj("boom", rv="3")),
            event(ADDED, obj("fine", rv="4")),
        ]
    )
    seen: list[str] = []

    async def handler(reflector_event: ReflectorEvent[Item]) -> None:
        if isinstance(reflector_event, Added):
            if reflector_event.record.name == "boom":
                raise RuntimeError("handler bug")
            seen.append(reflector_event.record.name)

    reflector = Reflector(api, kubeapi.PODS, decode=item, handler=handler, sleep=clock.sleep, uniform=lambda: 0.5)
    start(running, reflector)
    await clock.advance(0)
    await api.idle_watch.wait()

    assert seen == ["fine"]
    assert reflector.stats.malformed == 1
    assert reflector.stats.handler_errors == 1
    assert api.watch_calls[-1] == "4"


async def test_deleted_events_leave_the_last_state_in_the_event_and_nothing_in_the_cache(
    clock: VirtualClock, running: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    api.lists.append(kubeapi.ObjectList(items=[obj("a", rv="1", spec={"nodeName": "n1"})], resource_version="1"))
    api.watches.append([event(DELETED, obj("a", rv="2", spec={"nodeName": "n1"}, status={"phase": "Succeeded"}))])
    recorder = Recorder()
    reflector = reflector_for(api, recorder, clock)

    start(running, reflector)
    await clock.advance(0)
    await api.idle_watch.wait()

    deleted = recorder.events[-1]
    assert isinstance(deleted, Deleted)
    assert deleted.record.obj["status"] == {"phase": "Succeeded"}
    assert reflector.cache == {}


def test_a_watch_timeout_below_one_second_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 second"):
        Reflector(MemoryKube(), kubeapi.PODS, decode=item, handler=Recorder(), watch_timeout_s=0)

"""scheduler.kube.leases: validated durations, the pure lease decisions, and handover between electors.

The electors run on a virtual clock over an in-memory API, so "the leader stops renewing for 10 s" takes no time.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from common.errors import ConfigError
from scheduler.kube import kubeapi, leases
from scheduler.kube.errors import KubeUnavailable
from scheduler.kube.leases import ElectionConfig, LeaderElector
from tests.unit.kube.fakes import MemoryKube, VirtualClock

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
LEASE_S, RENEW_S, RETRY_S = 15.0, 10.0, 2.0


def config(identity: str) -> ElectionConfig:
    return ElectionConfig(
        namespace="quotient-system",
        name="quotient-scheduler",
        identity=identity,
        lease_duration_s=LEASE_S,
        renew_deadline_s=RENEW_S,
        retry_period_s=RETRY_S,
    )


# --- configuration ---


@pytest.mark.parametrize(
    ("durations", "message"),
    [
        ((10.0, 10.0, 2.0), "lease duration .* must be longer than the renew deadline"),
        ((15.0, 2.0, 2.0), r"renew deadline .* must be longer than 1.2 x the retry period"),
        ((15.0, 10.0, 0.0), "retry period must be positive"),
    ],
)
def test_durations_out_of_order_are_refused_with_a_message_that_says_why(
    durations: tuple[float, float, float], message: str
) -> None:
    lease_s, renew_s, retry_s = durations
    with pytest.raises(ConfigError, match=message):
        ElectionConfig(
            namespace="ns",
            name="lease",
            identity="me",
            lease_duration_s=lease_s,
            renew_deadline_s=renew_s,
            retry_period_s=retry_s,
        )


def test_an_empty_identity_is_refused() -> None:
    with pytest.raises(ConfigError, match="identity must not be empty"):
        ElectionConfig(namespace="ns", name="lease", identity="")


def test_a_fractional_lease_duration_is_written_rounded_up() -> None:
    short = ElectionConfig(
        namespace="ns", name="l", identity="me", lease_duration_s=1.5, renew_deadline_s=1.0, retry_period_s=0.2
    )
    assert short.lease_duration_seconds == 2


# --- pure decisions ---


def lease(holder: str, *, duration: int = 15, transitions: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "quotient-scheduler", "namespace": "quotient-system", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": "2026-01-01T11:00:00.000000Z",
            "renewTime": "2026-01-01T11:59:58.000000Z",
            "leaseTransitions": transitions,
        },
    }


def test_a_lease_that_nobody_holds_or_that_we_hold_may_be_taken_at_once() -> None:
    for record in (None, lease(""), lease("me")):
        assert leases.may_acquire(record, identity="me", observed_at_s=100.0, now_s=100.0, default_duration_s=15.0)


def test_another_holders_lease_may_be_taken_only_after_it_stayed_unchanged_for_its_duration() -> None:
    record = lease("other", duration=15)

    assert not leases.may_acquire(record, identity="me", observed_at_s=100.0, now_s=114.9, default_duration_s=1.0)
    assert leases.may_acquire(record, identity="me", observed_at_s=100.0, now_s=115.0, default_duration_s=1.0)


def test_a_record_without_a_duration_uses_ours() -> None:
    record = lease("other")
    del record["spec"]["leaseDurationSeconds"]

    assert not leases.may_acquire(record, identity="me", observed_at_s=0.0, now_s=4.0, default_duration_s=5.0)
    assert leases.may_acquire(record, identity="me", observed_at_s=0.0, now_s=5.0, default_duration_s=5.0)


def test_claiming_a_new_lease_writes_us_as_holder_with_the_duration_and_times() -> None:
    claimed = leases.claimed(None, config=config("me"), now=NOW)

    assert claimed["metadata"] == {"name": "quotient-scheduler", "namespace": "quotient-system"}
    assert claimed["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T12:00:00.000000Z",
        "renewTime": "2026-01-01T12:00:00.000000Z",
        "leaseTransitions": 0,
    }


def test_renewing_keeps_the_acquire_time_and_sends_the_version_it_read() -> None:
    renewed = leases.claimed(lease("me", transitions=3), config=config("me"), now=NOW)

    assert renewed["spec"]["acquireTime"] == "2026-01-01T11:00:00.000000Z"
    assert renewed["spec"]["renewTime"] == "2026-01-01T12:00:00.000000Z"
    assert renewed["spec"]["leaseTransitions"] == 3
    assert renewed["metadata"]["resourceVersion"] == "7"


def test_taking_over_counts_a_transition_and_restarts_the_acquire_time() -> None:
    taken = leases.claimed(lease("other", transitions=3), config=config("me"), now=NOW)

    assert taken["spec"]["holderIdentity"] == "me"
    assert taken["spec"]["leaseTransitions"] == 4
    assert taken["spec"]["acquireTime"] == "2026-01-01T12:00:00.000000Z"


def test_a_released_lease_has_no_holder() -> None:
    released = leases.released(lease("me", transitions=2), now=NOW)

    assert released["spec"]["holderIdentity"] == ""
    assert released["spec"]["leaseTransitions"] == 2
    assert released["metadata"]["resourceVersion"] == "7"


# --- electors on a virtual clock ---


class Partition:
    """One elector's view of the API, which the test can cut off (every call fails as a dead network would)."""

    def __init__(self, api: MemoryKube) -> None:
        self.api = api
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.api, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise KubeUnavailable("connection refused")
            return await target(*args, **kwargs)

        return call


class Candidate:
    """An elector plus a record of when it led, on the shared clock."""

    def __init__(self, identity: str, api: MemoryKube, clock: VirtualClock) -> None:
        self.view = Partition(api)
        self.clock = clock
        self.elector = LeaderElector(
            self.view,
            config(identity),
            monotonic=clock.monotonic,
            wall=clock.wall,
            sleep=clock.sleep,
            uniform=lambda: 0.0,
        )
        self.started_s: list[float] = []
        self.stopped_s: list[float] = []
        self.finish = asyncio.Event()

    async def lead(self) -> None:
        self.started_s.append(self.clock.now_s)
        await self.finish.wait()

    def stopped(self) -> None:
        self.stopped_s.append(self.clock.now_s)

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.elector.run(self.lead, on_stopped_leading=self.stopped))


def holder(api: MemoryKube) -> str:
    found = api.of(kubeapi.LEASES)
    return str(found[0]["spec"]["holderIdentity"]) if found else "(no lease)"


def intervals_overlap(
    first: tuple[Sequence[float], Sequence[float]], second: tuple[Sequence[float], Sequence[float]]
) -> bool:
    (a_start, a_stop), (b_start, b_stop) = first, second
    a = list(zip(a_start, [*a_stop, float("inf")], strict=False))
    b = list(zip(b_start, [*b_stop, float("inf")], strict=False))
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[None]]]:
    started: list[asyncio.Task[None]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


async def test_the_first_candidate_creates_the_lease_and_leads_and_keeps_renewing(
    clock: VirtualClock, tasks: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    a = Candidate("a", api, clock)
    tasks.append(a.start())

    await clock.advance(0)
    assert a.elector.is_leader
    assert a.started_s == [clock.now_s]
    first_renew = api.of(kubeapi.LEASES)[0]["spec"]["renewTime"]
    await clock.advance(RETRY_S)

    assert api.of(kubeapi.LEASES)[0]["spec"]["renewTime"] != first_renew
    assert holder(api) == "a"


async def test_a_standby_takes_over_within_the_lease_duration_when_the_leader_stops_renewing_and_never_both_lead(
    clock: VirtualClock, tasks: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    a, b = Candidate("a", api, clock), Candidate("b", api, clock)
    tasks.append(a.start())
    await clock.advance(0)
    tasks.append(b.start())
    await clock.advance(3 * RETRY_S)
    assert (a.elector.is_leader, b.elector.is_leader) == (True, False)
    assert b.elector.leader == "a"
    last_renew_s = clock.now_s

    a.view.cut = True
    for _ in range(int((LEASE_S + 3 * RETRY_S) / 0.5)):
        await clock.advance(0.5)
        assert not (a.elector.is_leader and b.elector.is_leader), f"two leaders at t={clock.now_s}"

    assert b.started_s, "b took over"
    assert a.stopped_s[0] <= last_renew_s + RENEW_S + RETRY_S, "a stopped by its renew deadline"
    assert b.started_s[0] - last_renew_s <= LEASE_S + 2 * RETRY_S, "b took over about one lease duration later"
    assert not intervals_overlap((a.started_s, a.stopped_s), (b.started_s, b.stopped_s))
    assert holder(api) == "b"
    assert api.of(kubeapi.LEASES)[0]["spec"]["leaseTransitions"] == 1


async def test_a_leader_that_shuts_down_releases_the_lease_and_the_standby_takes_it_at_its_next_retry(
    clock: VirtualClock, tasks: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    a, b = Candidate("a", api, clock), Candidate("b", api, clock)
    a_task = a.start()
    tasks.append(a_task)
    await clock.advance(0)
    tasks.append(b.start())
    await clock.advance(RETRY_S)

    a_task.cancel()
    await clock.advance(0)
    assert holder(api) == "", "released: no holder"
    assert a.stopped_s == [clock.now_s]
    released_at_s = clock.now_s
    await clock.advance(RETRY_S * 1.5)

    assert b.elector.is_leader
    assert b.started_s[0] - released_at_s <= RETRY_S * 1.2


async def test_a_leader_that_sees_another_holder_stops_at_once(
    clock: VirtualClock, tasks: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    a = Candidate("a", api, clock)
    tasks.append(a.start())
    await clock.advance(0)

    record = api.of(kubeapi.LEASES)[0]
    record["spec"]["holderIdentity"] = "intruder"
    await clock.advance(RETRY_S)

    assert not a.elector.is_leader
    assert a.stopped_s == [clock.now_s]
    assert tasks[0].done(), "run returns when leadership is lost"


async def test_of_two_candidates_racing_for_a_free_lease_exactly_one_wins(
    clock: VirtualClock, tasks: list[asyncio.Task[None]]
) -> None:
    api = MemoryKube()
    candidates = [Candidate(name, api, clock) for name in ("a", "b", "c")]
    tasks.extend(candidate.start() for candidate in candidates)

    for _ in range(10):
        await clock.advance(RETRY_S)
        assert sum(candidate.elector.is_leader for candidate in candidates) == 1


async def test_when_lead_fails_the_elector_releases_the_lease_and_raises_its_error(clock: VirtualClock) -> None:
    api = MemoryKube()
    elector = LeaderElector(api, config("a"), monotonic=clock.monotonic, wall=clock.wall, sleep=clock.sleep)

    async def lead() -> None:
        raise RuntimeError("the scheduler broke")

    with pytest.raises(RuntimeError, match="the scheduler broke"):
        await elector.run(lead)
    assert holder(api) == ""
    assert not elector.is_leader


async def test_new_leaders_are_reported(clock: VirtualClock, tasks: list[asyncio.Task[None]]) -> None:
    api = MemoryKube()
    seen: list[str] = []
    a = Candidate("a", api, clock)
    tasks.append(a.start())
    await clock.advance(0)
    watcher = LeaderElector(
        api, config("w"), on_new_leader=seen.append, monotonic=clock.monotonic, wall=clock.wall, sleep=clock.sleep
    )

    async def never() -> None:
        await asyncio.Event().wait()

    tasks.append(asyncio.create_task(watcher.run(never)))
    await clock.advance(RETRY_S * 2)

    assert seen == ["a"]


def test_records_of_other_shapes_are_read_defensively() -> None:
    odd: Mapping[str, Any] = {"spec": "not a mapping"}
    assert leases.holder_of(odd) == ""
    assert leases.may_acquire(odd, identity="me", observed_at_s=0.0, now_s=0.0, default_duration_s=1.0)

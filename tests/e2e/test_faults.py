"""Faults end to end: the scheduler killed in the middle of a gang, watches that all expire, bindings that fail for a
while, and a leader that dies; through the real scheduler processes and the emulator's fault hooks.

Each test ends on the same two checks: the cluster reached the state it should (every pod that fits is bound, the
gang whole), and the emulator's store saw each pod get a node exactly once (``BindLedger``), so no restart, relist
or retry ever bound a pod twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quotient.emulator.faults import Fault
from tests import polling
from tests.e2e import harness
from tests.e2e.harness import BindLedger, World

pytestmark = pytest.mark.integration

# The harness's leader-election timings (SchedulerProcess(leader_elect=True)).
LEASE_DURATION_S = 3.0
RETRY_PERIOD_S = 0.5
LEASE_NAMESPACE = "default"
LEASE_NAME = "quotient-scheduler"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with harness.world("1x4xA100-80GB", tmp_path) as current:
        yield current


@pytest.fixture
def big_world(tmp_path: Path) -> Iterator[World]:
    with harness.world("4x4xA100-80GB", tmp_path) as current:
        yield current


def _no_device_given_twice(world: World, names: list[str]) -> None:
    """No GPU of a node went to two pods: neither in the device plugin's view (what the pods run on) nor in the
    scheduler's (the ``quotient.dev/gpu-devices`` annotation it rebuilds its state from after a restart)."""
    current = harness.pods(world.kubectl)
    plugin: dict[tuple[str, int], str] = {}
    chosen: dict[tuple[str, int], str] = {}
    for name in names:
        node = current[name]["spec"]["nodeName"]
        for index in _devices(world, name):
            assert (node, index) not in plugin, f"GPU {index} of {node} runs {plugin[(node, index)]} and {name}"
            plugin[(node, index)] = name
        annotation = current[name]["metadata"]["annotations"]["quotient.dev/gpu-devices"]
        for index in (int(part) for part in annotation.split(",")):
            assert (node, index) not in chosen, f"GPU {index} of {node} placed {chosen[(node, index)]} and {name}"
            chosen[(node, index)] = name


def _devices(world: World, name: str) -> tuple[int, ...]:
    """The GPU indices the emulated device plugin gave a running pod (empty when it is not running)."""
    return world.emulator.call(lambda: world.emulator.emulator.devices_of("default", name)) or ()


def _running_with_gpus(world: World, names: list[str]) -> bool:
    return all(_devices(world, name) for name in names)


def _gang(name: str, size: int) -> list[dict[str, Any]]:
    """A PodGroup of ``size`` one-GPU pods (minMember ``size``) and its pods, which name it in ``pod-group-name``."""
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": size, "queue": "default-queue"},
    }
    members = [harness.gpu_pod(f"{name}-{index}", annotations={"pod-group-name": name}) for index in range(size)]
    return [group, *members]


def test_a_scheduler_killed_in_the_middle_of_a_gang_leaves_it_whole_and_bound_once_after_a_restart(
    big_world: World,
) -> None:
    world = big_world
    size = 16
    names = [f"gang-{index}" for index in range(size)]
    # Each binding takes 0.4 s and four go at a time, so the gang takes four rounds: the kill lands inside it.
    slow = harness.inject(world.emulator, Fault(verb="create", resource="pods", subresource="binding", delay_s=0.4))
    first = world.scheduler("--bind-concurrency", "4", identity="sched-a")
    world.apply("gang", *_gang("gang", size))
    polling.until_sync(
        lambda: len(world.ledger.bound_names() & set(names)) >= 4,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the first bindings",
    )
    first.kill()
    polling.until_sync(
        lambda: world.ledger.in_flight() == 0,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="every binding the killed scheduler sent answered or cancelled",
    )
    at_kill = world.ledger.bound_names() & set(names)
    assert 0 < len(at_kill) < size, f"the kill should land mid-gang, {len(at_kill)} of {size} were bound"
    harness.remove_fault(world.emulator, slow)

    world.scheduler(identity="sched-b")
    polling.until_sync(
        lambda: world.bound(names), timeout_s=harness.STEP_TIMEOUT_S, what="the whole gang bound by the new scheduler"
    )
    world.ledger.assert_each_bound_once()
    assert world.ledger.bound_names() == set(names)
    polling.until_sync(
        lambda: _running_with_gpus(world, names),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="every member running with its GPU",
    )
    _no_device_given_twice(world, names)
    print(f"killed with {len(at_kill)} of {size} bound; binding answers: {_codes(world.ledger)}")


def _codes(ledger: BindLedger) -> dict[int, int]:
    counts: dict[int, int] = {}
    for _, _, _, code in ledger.answers():
        counts[code] = counts.get(code, 0) + 1
    return counts


def test_state_stays_exact_when_every_watch_expires_while_pods_come_and_go(world: World) -> None:
    kubectl = world.kubectl
    world.scheduler(identity="sched-a")
    world.apply("warm", harness.gpu_pod("warm"))
    polling.until_sync(
        lambda: world.bound(["warm"]), timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler synced and binding"
    )

    # From now on every watch ends at once with 410 Gone; the scheduler sees the cluster only through relists.
    storm = harness.inject(world.emulator, Fault(verb="watch", code=410))
    harness.drop_watches(world.emulator)
    world.apply("first", *(harness.gpu_pod(f"first-{index}") for index in range(3)))
    polling.until_sync(
        lambda: world.bound([f"first-{index}" for index in range(3)]),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="first pods bound",
    )
    harness.compact(world.emulator)
    # The cluster is full (4 GPUs). Two pods go; two new ones fit only if the scheduler saw the deletions.
    kubectl("delete", "pod", "warm", "first-0", "--wait=true")
    harness.compact(world.emulator)
    world.apply("second", *(harness.gpu_pod(f"second-{index}") for index in range(2)))
    polling.until_sync(
        lambda: world.bound(["second-0", "second-1"]),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="new pods bound into the freed GPUs",
    )
    harness.remove_fault(world.emulator, storm)
    harness.compact(world.emulator)

    # After the storm: the cluster is full again, so one more pod waits until one of the others goes.
    world.apply("late", harness.gpu_pod("late"))
    polling.until_sync(
        lambda: any(event["reason"] == "Unschedulable" for event in harness.events_about(kubectl, "default", "late")),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the late pod reported as waiting for room",
    )
    assert not world.bound(["late"])
    kubectl("delete", "pod", "first-1", "--wait=true")
    polling.until_sync(
        lambda: world.bound(["late"]),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the late pod bound into the GPU first-1 freed",
    )

    running = ["first-2", "second-0", "second-1", "late"]
    world.ledger.assert_each_bound_once()
    polling.until_sync(
        lambda: _running_with_gpus(world, running),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="every pod running with its GPU",
    )
    _no_device_given_twice(world, running)
    # The pods were seen through relists that found changes (deletions included), not through a watch.
    log = world.schedulers["sched-a"].log()
    assert "event=watch_expired reflector=pods" in log
    assert any(int(changes) > 0 for changes in re.findall(r"event=relisted reflector=pods .*?changes=(\d+)", log))


def test_pods_bind_once_bindings_recover_from_a_run_of_server_errors(world: World) -> None:
    world.scheduler(identity="sched-a")
    world.apply("warm", harness.gpu_pod("warm"))
    polling.until_sync(
        lambda: world.bound(["warm"]), timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler synced and binding"
    )

    failing = harness.inject(
        world.emulator,
        Fault(verb="create", resource="pods", subresource="binding", code=500, message="etcd is unhappy"),
    )
    names = [f"retry-{index}" for index in range(3)]
    world.apply("pods", *(harness.gpu_pod(name) for name in names))
    log = world.schedulers["sched-a"].log
    polling.until_sync(lambda: "event=api_retry" in log(), timeout_s=harness.STEP_TIMEOUT_S, what="the binder retrying")
    # The binder gives up after six attempts (about 1.6 s of backoff) and hands the pods back to the cycle, which
    # places them afresh; those attempts fail too for a while.
    polling.until_sync(
        lambda: "event=bind_failed" in log(),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the binder giving up on the first placements",
    )
    retries = log().count("event=api_retry")
    polling.until_sync(
        lambda: log().count("event=api_retry") > retries,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the pods placed afresh and their bindings failing again",
    )
    assert not world.ledger.bound_names() & set(names), "nothing binds while bindings answer 500"
    harness.remove_fault(world.emulator, failing)  # checked before: a retry may bind the moment the fault is gone
    recovered = time.monotonic()
    polling.until_sync(
        lambda: world.bound(names), timeout_s=harness.STEP_TIMEOUT_S, what="every pod bound once the API recovered"
    )
    last_s = max(binding.at_s for binding in world.ledger.bindings()) - recovered
    world.ledger.assert_each_bound_once()
    polling.until_sync(
        lambda: _running_with_gpus(world, ["warm", *names]),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="every pod running with its GPU",
    )
    _no_device_given_twice(world, ["warm", *names])
    print(f"all bound {last_s:.2f} s after the API recovered; {log().count('event=bind_failed')} placements given up")


def test_a_standby_takes_over_from_a_killed_leader_within_the_lease_and_binds_new_pods(world: World) -> None:
    first = world.scheduler(identity="sched-a", leader_elect=True)
    polling.until_sync(
        lambda: harness.lease_holder(world.emulator, LEASE_NAMESPACE, LEASE_NAME) == "sched-a",
        timeout_s=harness.STEP_TIMEOUT_S,
        what="sched-a elected",
    )
    second = world.scheduler(identity="sched-b", leader_elect=True)
    polling.until_sync(
        lambda: "leader_observed" in second.log(), timeout_s=harness.STEP_TIMEOUT_S, what="sched-b standing by"
    )
    world.apply("before", harness.gpu_pod("before-0"), harness.gpu_pod("before-1"))
    polling.until_sync(
        lambda: world.bound(["before-0", "before-1"]), timeout_s=harness.STEP_TIMEOUT_S, what="the leader binding"
    )
    assert "leading_started" not in second.log()

    first.kill()
    killed = time.monotonic()
    world.apply("after", harness.gpu_pod("after-0"), harness.gpu_pod("after-1"))
    polling.until_sync(
        lambda: harness.lease_holder(world.emulator, LEASE_NAMESPACE, LEASE_NAME) == "sched-b",
        timeout_s=LEASE_DURATION_S * 3,
        what="sched-b taking the lease",
    )
    takeover_s = time.monotonic() - killed
    # The standby may take the lease once the record has not changed for the lease duration, counted from when it
    # last saw it change (at most one renewal period before the kill), and it tries every retry period (+20%).
    assert takeover_s <= LEASE_DURATION_S + 2 * RETRY_PERIOD_S * 1.2 + 0.5, f"took over after {takeover_s:.2f} s"
    polling.until_sync(
        lambda: world.bound(["after-0", "after-1"]),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the new leader binding new pods",
    )
    world.ledger.assert_each_bound_once()
    assert {binding.name for binding in world.ledger.bindings()} == {"before-0", "before-1", "after-0", "after-1"}
    everyone = ["before-0", "before-1", "after-0", "after-1"]
    polling.until_sync(
        lambda: _running_with_gpus(world, everyone),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="every pod running with its GPU",
    )
    _no_device_given_twice(world, everyone)
    print(f"standby took over {takeover_s:.2f} s after the leader was killed")

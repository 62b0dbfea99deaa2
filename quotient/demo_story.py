"""The story ``quotient demo`` plays, step by step, in the users' guides' order, each step with what KAI shows instead.

The guides each ran on their own cluster; on the demo's one cluster the order makes each pair form as its guide
shows (the manifests unchanged): the AI-ready guide's vLLM pair first (0.7, then 0.2, which has only the 0.7 pod's
GPU group to join), then the talk's 0.5 and 0.25 pods (0.5 opens a group, 0.25 joins it; the vLLM group has 0.1
left). Each step starts no earlier than its time (scaled to ``--duration``) and waits, bounded, for what it shows
(the pair bound, the gang bound, the reclaim done) before the next one starts. What the story saw is kept in
``Facts`` for the summary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import names
from quotient import demo_scenario
from quotient.demo_plugin import Kubectl, guide_columns
from quotient.demo_view import meta_of
from quotient.emulator.emulator import Emulator
from quotient.explain import facts

WAIT_S = 45.0
"""The longest a step waits for what it shows before the story goes on (and the summary says it did not happen)."""

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    at_s: float
    note: str
    kai: str
    """What a KAI user would have seen instead, in one line."""
    action: Callable[[], Awaitable[None]]


@dataclasses.dataclass(slots=True)
class Facts:
    """What the story saw, for the summary."""

    pairs: dict[str, list[Obj]] = dataclasses.field(default_factory=dict)
    """Each guide's pair (``talk``, ``vllm``): its pods as they were bound."""
    gang_bound: int = 0
    gang_size: int = 0
    queues_before: dict[str, int] = dataclasses.field(default_factory=dict)
    queues_after: dict[str, int] = dataclasses.field(default_factory=dict)
    """Allocated milli-GPU of team-a and team-b before and after team-b's reclaim."""
    reclaimed_for: str = ""
    evicted: list[str] = dataclasses.field(default_factory=list)
    explained: str = ""
    """The pending pod ``kubectl quotient explain`` was asked about, and the reason it gave (one line)."""
    plugin_codes: list[int] = dataclasses.field(default_factory=list)
    failed: list[tuple[str, int]] = dataclasses.field(default_factory=list)


def bound(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def pods_named(emulator: Emulator, namespace: str, prefix: str) -> list[Obj]:
    return [p for p in emulator.list("v1", "Pod", namespace) if str(meta_of(p).get("name", "")).startswith(prefix)]


def group_of(pod: Obj) -> str:
    """The pod's GPU group (KAI's ``runai-gpu-group`` label), "" when it has none."""
    return str((meta_of(pod).get("labels") or {}).get(names.GPU_GROUP_LABEL) or "")


def queue_gpus(emulator: Emulator, *queues: str) -> dict[str, int]:
    """The queues' allocated milli-GPU as their status says."""
    found = {}
    for obj in emulator.list(names.QUEUE_API_VERSION, "Queue"):
        read = facts.queue(obj)
        if read is not None and read.name in queues:
            found[read.name] = read.allocated.milli_gpu if read.allocated else 0
    return found


async def until(check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll ``check`` until it is truthy (its value) or ``timeout_s`` passes (its last value)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.2) + 1):
        if (value := check()) or time.monotonic() >= deadline:
            return value
        await asyncio.sleep(0.2)
    return check()


class Story:
    """The steps, over the demo's running cluster; ``note`` says a line, ``show`` a command and its output."""

    def __init__(
        self,
        emulator: Emulator,
        kubectl: Kubectl,
        *,
        note: Callable[[str], None],
        show: Callable[[str, str], None],
        fail_a_gpu: Callable[[], list[tuple[str, int]]],
        nats_stop: Callable[[], object],
        nats_start: Callable[[], object],
    ) -> None:
        self.emulator = emulator
        self.kubectl = kubectl
        self.note = note
        self.show = show
        self.fail_a_gpu = fail_a_gpu
        self.nats_stop = nats_stop
        self.nats_start = nats_start
        self.facts = Facts()

    async def apply(self, text: str) -> None:
        for line in await demo_scenario.apply(self.emulator, text):
            if "refused" in line:
                self.note(line)

    async def quotient(self, *args: str) -> str:
        code, text = await self.kubectl.quotient(*args)
        self.facts.plugin_codes.append(code)
        self.show(self.kubectl.line("quotient", *args), text if code == 0 else f"{text}\n(exit {code})")
        return text

    def steps(self, scale: float) -> list[Step]:
        return [
            Step(
                at_s=3 * scale,
                note="the AI-ready guide: vLLM Deployments at gpu-fraction 0.7, then 0.2, in ai-workloads (queue test)",
                kai="KAI: the same pair on one GPU group; nothing watches that each vLLM stays within its share",
                action=self.vllm_pair,
            ),
            Step(
                at_s=8 * scale,
                note="the talk: gpu-sharing (0.5) and inference-api (0.25) share one GPU; the reservation pods",
                kai="KAI: the same pair; its reservation pods are listed in namespace kai-resource-reservation",
                action=self.talk_pair,
            ),
            Step(
                at_s=14 * scale,
                note=f"team-a submits a PyTorchJob of {demo_scenario.GANG_SIZE} one-GPU workers: a gang, all or "
                "nothing; 2 GPUs are free, so it waits; kubectl quotient explain says why",
                kai="KAI: the same wait; why: one PodGroup condition, and LLM agent skills (kai-pending) to read it",
                action=self.gang_waits,
            ),
            Step(
                at_s=22 * scale,
                note='team-b submits a pod with gpu-fraction "1.7": refused with the reason',
                kai="KAI: also refuses a fraction outside (0, 1)",
                action=lambda: self.apply(demo_scenario.INVALID),
            ),
            Step(
                at_s=26 * scale,
                note="gpu-pod ends: a GPU frees, the gang fits and binds whole",
                kai="KAI: the same (gang scheduling is KAI's)",
                action=self.gang_binds,
            ),
            Step(
                at_s=34 * scale,
                note="team-b (4 GPUs of quota, using less) asks for 2 whole GPUs on a full cluster: it reclaims them "
                "from team-a, over its quota of 3 (kubectl quotient queues before and after)",
                kai="KAI: the same reclaim; no command shows deserved and fair share (KAI ships LLM skills for it)",
                action=self.reclaim,
            ),
            Step(
                at_s=46 * scale,
                note="team-b's pod 'greedy' gets 0.25 of a GPU and grows to 30 GiB: GpuMemoryOverconsumption names it",
                kai="KAI: no alert; by default nothing limits GPU memory (the guide asks each process to limit "
                "itself), and its opt-in enforcement makes the process's own allocation fail",
                action=lambda: self.apply(demo_scenario.GREEDY),
            ),
            Step(
                at_s=60 * scale,
                note="inject Xid 79 (GPU fell off the bus) on a GPU a pod uses: GpuUnhealthy takes it out of placement",
                kai="KAI: no GPU health of its own: only the device plugin hides the GPU from whole-GPU requests; "
                "no alert, and shares may still land on it",
                action=self.gpu_failure,
            ),
            Step(
                at_s=70 * scale,
                note="stop nats-server: agents keep sampling and keep only their newest sample",
                kai="KAI: no telemetry stream to lose",
                action=self._sync(self.nats_stop),
            ),
            Step(
                at_s=78 * scale,
                note="start nats-server again on the same port: agents reconnect by themselves",
                kai="KAI: nothing to reconnect",
                action=self._sync(self.nats_start),
            ),
        ]

    @staticmethod
    def _sync(action: Callable[[], object]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            action()

        return run

    async def run(self, steps: list[Step], start: float) -> None:
        for step in steps:
            await asyncio.sleep(max(0.0, start + step.at_s - time.monotonic()))
            self.note(step.note)
            self.note(f"  instead, {step.kai}")
            await step.action()

    async def _pair(self, key: str, namespace: str, first: tuple[str, str], second: tuple[str, str]) -> None:
        """Apply ``first`` (prefix, manifest), wait until it is bound, then ``second``; keep both as bound."""
        pods: list[Obj] = []
        for prefix, text in (first, second):

            def placed(prefix: str = prefix) -> list[Obj]:
                return [pod for pod in pods_named(self.emulator, namespace, prefix) if bound(pod)]

            await self.apply(text)
            found = await until(placed)
            pods += found[:1] if found else []
        self.facts.pairs[key] = pods

    async def vllm_pair(self) -> None:
        # Every share already asked for (the notebooks) placed first, so 0.2 has only 0.7's group to join.
        await until(self._shares_placed)
        seven, two = demo_scenario.seed_texts("vllm-test-07.yaml", "vllm-test-02.yaml")
        await self._pair("vllm", "ai-workloads", ("vllm-test-07", seven), ("vllm-test-02", two))
        columns = guide_columns()
        _, text = await self.kubectl.get_pods("ai-workloads", columns=columns)
        self.show(self.kubectl.line("-n", "ai-workloads", "get", "pods", "-o", f"custom-columns={columns}"), text)

    async def talk_pair(self) -> None:
        half, quarter = demo_scenario.seed_texts("gpu-sharing.yaml", "inference-pod.yaml")
        await self._pair("talk", "default", ("gpu-sharing", half), ("inference-api", quarter))
        _, text = await self.kubectl.get_pods(names.RESERVATION_NAMESPACE)
        self.show(self.kubectl.line("get", "pods", "-n", names.RESERVATION_NAMESPACE), text)

    def _shares_placed(self) -> bool:
        annotated = (names.GPU_FRACTION_ANNOTATION, names.GPU_MEMORY_ANNOTATION)
        shares = [
            pod
            for pod in self.emulator.list("v1", "Pod")
            if any(key in (meta_of(pod).get("annotations") or {}) for key in annotated)
        ]
        return all(bound(pod) for pod in shares)

    def _whole_gpu_pods(self) -> list[Obj]:
        return [*pods_named(self.emulator, "default", "gpu-pod"), *pods_named(self.emulator, "team-a", "llm-train")]

    def _gang(self) -> list[Obj]:
        return pods_named(self.emulator, "team-a", "big-train-worker")

    def _gang_reason(self) -> str:
        """The gang's PodGroup's structured reason, once the scheduler has recorded it."""
        workers = self._gang()
        if not workers:
            return ""
        group = (meta_of(workers[0]).get("annotations") or {}).get(names.POD_GROUP_ANNOTATION)
        found = self.emulator.get(names.POD_GROUP_API_VERSION, "PodGroup", str(group), "team-a") if group else None
        ours = ((found or {}).get("status") or {}).get("quotient") or {}
        return str(ours.get("reason") or "")

    async def gang_waits(self) -> None:
        self.facts.gang_size = demo_scenario.GANG_SIZE
        # The whole-GPU pods already asked for placed first, so the gang finds 2 GPUs free, not 3.
        await until(lambda: all(bound(pod) for pod in self._whole_gpu_pods()))
        await self.apply(demo_scenario.GANG)
        await until(self._gang_reason)
        name = f"team-a/{demo_scenario.GANG_NAME}-worker-0"
        text = await self.quotient("explain", name)
        reason = next((line.strip() for line in text.splitlines() if line.strip().startswith("Reason:")), "")
        self.facts.explained = f"{name}: {reason or 'no reason line'}"

    async def gang_binds(self) -> None:
        await self.apply_delete("default", "gpu-pod")
        bound_all = await until(lambda: len([pod for pod in self._gang() if bound(pod)]) >= self.facts.gang_size)
        self.facts.gang_bound = len([pod for pod in self._gang() if bound(pod)]) if bound_all else 0

    async def apply_delete(self, namespace: str, name: str) -> None:
        for line in await demo_scenario.delete_pod(self.emulator, namespace, name):
            self.note(line)

    async def reclaim(self) -> None:
        teams = ("team-a", "team-b")
        self.facts.queues_before = queue_gpus(self.emulator, *teams)
        before = {meta_of(pod).get("name") for pod in self.emulator.list("v1", "Pod", "team-a") if bound(pod)}
        await self.quotient("queues")
        await self.apply(demo_scenario.RECLAIMER)
        name = f"team-b/{demo_scenario.RECLAIMER_NAME}"
        placed = await until(lambda: [p for p in pods_named(self.emulator, "team-b", "finetune") if bound(p)])
        if not placed:
            self.note(f"  {name} was not placed within {WAIT_S:.0f} s")
            return
        self.facts.reclaimed_for = name
        after = {meta_of(pod).get("name") for pod in self.emulator.list("v1", "Pod", "team-a") if bound(pod)}
        self.facts.evicted = sorted(f"team-a/{pod}" for pod in before - after)
        wanted = self.facts.queues_before.get("team-b", 0) + demo_scenario.RECLAIMER_GPUS * 1000
        await until(lambda: queue_gpus(self.emulator, "team-b").get("team-b", 0) >= wanted, timeout_s=15)
        self.facts.queues_after = queue_gpus(self.emulator, *teams)
        await self.quotient("queues")

    async def gpu_failure(self) -> None:
        self.facts.failed.extend(self.fail_a_gpu())


def _gpu(milli: int | None) -> str:
    return "?" if milli is None else f"{milli / 1000:g}"


def _pair_line(emulator: Emulator, key: str, pods: list[Obj]) -> tuple[str, str | None]:
    """One pair's summary line and its GPU group when both pods share one (None otherwise)."""
    title = {"talk": "the talk's pair", "vllm": "the vLLM pair"}[key]
    current = [
        emulator.get("v1", "Pod", str(meta_of(pod).get("name")), str(meta_of(pod).get("namespace"))) or pod
        for pod in pods
    ]
    who = " + ".join(
        f"{meta_of(pod).get('namespace')}/{meta_of(pod).get('name')} "
        f"{(meta_of(pod).get('annotations') or {}).get(names.GPU_FRACTION_ANNOTATION)}"
        for pod in current
    )
    groups = {group_of(pod) for pod in current}
    if len(current) != 2 or len(groups) != 1 or "" in groups:
        return f"{title} did NOT form: {who or 'not placed'} (groups {sorted(groups)})", None
    pod = current[0]
    devices = (meta_of(pod).get("annotations") or {}).get(names.GPU_DEVICES_ANNOTATION)
    where = f"{(pod.get('spec') or {}).get('nodeName')} gpu {devices}"
    return f"{title} shares one GPU group: {who} in group {groups.pop()} ({where})", group_of(pod)


def summary(emulator: Emulator, found: Facts) -> tuple[list[str], bool]:
    """The story's facts as lines, and whether each of them happened."""
    lines = []
    groups = []
    for key in ("talk", "vllm"):
        line, group = _pair_line(emulator, key, found.pairs.get(key, []))
        lines.append(line)
        groups.append(group)
    pairs_ok = None not in groups and len(set(groups)) == 2
    if pairs_ok:
        lines.append("the two pairs are on different GPU groups, as each guide shows")
    gang_ok = found.gang_size > 0 and found.gang_bound == found.gang_size
    lines.append(
        f"the gang team-a/{demo_scenario.GANG_NAME} bound whole: {found.gang_bound} of {found.gang_size} workers"
        if gang_ok
        else f"the gang team-a/{demo_scenario.GANG_NAME} NOT bound whole ({found.gang_bound} of {found.gang_size})"
    )
    before, after = found.queues_before, found.queues_after
    reclaim_ok = bool(found.reclaimed_for and found.evicted)
    if reclaim_ok:
        lines.append(
            f"reclaim: {found.reclaimed_for} took its {demo_scenario.RECLAIMER_GPUS} GPUs from team-a "
            f"(evicted {', '.join(found.evicted)}); allocated GPUs team-a {_gpu(before.get('team-a'))} -> "
            f"{_gpu(after.get('team-a'))}, team-b {_gpu(before.get('team-b'))} -> {_gpu(after.get('team-b'))}"
        )
    else:
        lines.append(f"reclaim did NOT happen (placed: {found.reclaimed_for or 'no'}, evicted: {found.evicted})")
    lines.append(f"kubectl quotient explain {found.explained or '(not run)'}")
    plugin_ok = bool(found.plugin_codes) and all(code == 0 for code in found.plugin_codes)
    if not plugin_ok:
        lines.append(f"kubectl quotient exit codes: {found.plugin_codes}")
    return lines, pairs_ok and gang_ok and reclaim_ok and plugin_ok

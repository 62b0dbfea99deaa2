"""KAI v0.15-v0.18's workload surface end to end: the real scheduler process serving the admission webhooks (GPU
sharing, KAI's queue validation and KAI's PodGroup validation), the emulator calling them as an API server does and
holding custom resources to ``deploy/``'s CRD schemas, and kubectl.

An invalid Queue, and a PodGroup KAI's webhook refuses, are refused by ``kubectl apply`` with the reason (a PodGroup
KAI only warns of is admitted with kubectl's ``Warning:``); a JobSet becomes one PodGroup with KAI v0.16's two-level
tree, made by the grouper through the PodGroup webhook, and its pods are placed as the tree says (InOrder: the first
replicated job alone; the next waits whole for both its replicas, then runs); KAI v0.17/v0.18 manifests (a pod with a
preemption delay, per-container GPU memory with a limit above the request and SM sharing, a PodGroup with the new
spec fields) are admitted, grouped with their knobs in the PodGroup's spec, and scheduled as KAI would: shares of
different compute modes on different GPUs, a subgroup tree placed by its ``minSubGroup`` (the one replica of two
that fits runs, the other waits whole). A preemption delay holds a new job's eviction for its delay, then it preempts,
and the victim's PodGroup gets ``kai.scheduler/last-eviction-timestamp``. What each knob changes in placement is
tested in detail where the engine is (``tests/scenarios/placement/``).
"""

from __future__ import annotations

import datetime
import functools
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import names
from common.natsserver import free_port
from quotient.emulator import status as emulator_status
from quotient.emulator.emulator import EmulatorThread
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness
from tests.e2e.harness import Kubectl, SchedulerProcess

pytestmark = pytest.mark.integration

KAI = REPO / "tests" / "integration" / "emulator" / "kai"
NAMESPACE = "kai-demo"
QUEUE_WEBHOOK = "queue-validation.quotient.dev"
PODGROUP_WEBHOOK = "podgroup-validation.quotient.dev"
Obj = dict[str, Any]


def _configurations() -> list[Obj]:
    """The webhook configurations exactly as ``kubectl apply -k deploy/base`` would send them."""
    rendered = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    return [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] in kinds]


class World:
    def __init__(self, emulator: EmulatorThread, directory: Path) -> None:
        self.emulator = emulator
        self.directory = directory
        self.kubectl = Kubectl(emulator.url)
        self._certs = tempfile.TemporaryDirectory(prefix="quotient-webhook-")
        for configuration in _configurations():
            created = emulator.run(functools.partial(emulator.emulator.create, configuration))
            assert not isinstance(created, emulator_status.Failure), created
        port = free_port()
        emulator.call(
            lambda: emulator.emulator.route_service(
                "quotient-system", "quotient-scheduler-webhook", f"127.0.0.1:{port}"
            )
        )
        self.scheduler = SchedulerProcess(
            emulator.url,
            "--webhook",
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            self._certs.name,
            "--webhook-upkeep-interval",
            "0.2s",
            "--queue-parent-must-exist",
        )
        polling.until_sync(self._trusted, timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler's CA in every caBundle")

    def _trusted(self) -> bool:
        for kind, name in (
            ("MutatingWebhookConfiguration", "quotient-gpu-sharing"),
            ("ValidatingWebhookConfiguration", "quotient-queue-validation"),
            ("ValidatingWebhookConfiguration", "quotient-podgroup-validation"),
        ):
            stored = self.emulator.call(
                functools.partial(self.emulator.emulator.get, "admissionregistration.k8s.io/v1", kind, name)
            )
            if not (stored and stored["webhooks"][0]["clientConfig"].get("caBundle")):
                return False
        return True

    def apply(self, text: str) -> subprocess.CompletedProcess[str]:
        path = self.directory / "manifest.yaml"
        path.write_text(text)
        return self.kubectl("apply", "-f", str(path), check=False)

    def close(self) -> None:
        print(self.scheduler.log()[-8000:])  # pytest shows it only when the test failed
        self.scheduler.close()
        self.kubectl.close()
        self._certs.cleanup()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with harness.cluster("1x4xA100-80GB") as emulator:
        current = World(emulator, tmp_path)
        try:
            yield current
        finally:
            current.close()


def _queue(name: str, spec: Obj) -> str:
    return yaml.safe_dump(
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    )


def test_an_invalid_queue_is_refused_by_kubectl_apply_with_the_reason(world: World) -> None:
    without_resources = world.apply(_queue("team-a", {"parentQueue": "default-parent-queue"}))
    orphan = world.apply(_queue("team-b", {"parentQueue": "nowhere", "resources": {"gpu": {"quota": 1, "limit": 2}}}))
    not_a_number = world.apply(_queue("team-c", {"resources": {"gpu": {"quota": "lots"}}}))

    assert without_resources.returncode != 0
    assert (
        f'admission webhook "{QUEUE_WEBHOOK}" denied the request: resources must be specified'
        in without_resources.stderr
    )
    assert orphan.returncode != 0 and "parent queue 'nowhere' does not exist" in orphan.stderr
    assert not_a_number.returncode != 0
    assert "spec.resources.gpu.quota in body must be of type number" in not_a_number.stderr
    listed = world.kubectl.json("get", "queues")["items"]
    assert {queue["metadata"]["name"] for queue in listed} == {"default-parent-queue", "default-queue"}


def _podgroup(name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"queue": "default-queue", **spec},
    }


def _namespace() -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def test_a_podgroup_kais_webhook_refuses_is_refused_by_kubectl_apply_and_one_it_warns_of_is_admitted_with_it(
    world: World,
) -> None:
    assert world.apply(yaml.safe_dump(_namespace())).returncode == 0
    leaf_without_minimum = world.apply(yaml.safe_dump(_podgroup("no-minimum", {"subGroups": [{"name": "workers"}]})))
    both_minimums = world.apply(
        yaml.safe_dump(
            _podgroup("both", {"minMember": 2, "minSubGroup": 1, "subGroups": [{"name": "a", "minMember": 1}]})
        )
    )
    too_many = world.apply(
        yaml.safe_dump(_podgroup("too-many", {"minSubGroup": 3, "subGroups": [{"name": "a", "minMember": 1}]}))
    )

    assert leaf_without_minimum.returncode != 0
    assert (
        f'admission webhook "{PODGROUP_WEBHOOK}" denied the request: spec.subGroups[0].minMember: subgroup '
        "'workers': minMember is required on a leaf SubGroup" in leaf_without_minimum.stderr
    )
    assert both_minimums.returncode != 0 and "minMember and minSubGroup are mutually exclusive" in both_minimums.stderr
    assert too_many.returncode == 0, too_many.stderr
    assert (
        "Warning: spec.minSubGroup: minSubGroup (3) exceeds the number of direct child SubGroups (1)" in too_many.stderr
    )
    listed = world.kubectl.json("get", "podgroups", "-n", NAMESPACE)["items"]
    assert [group["metadata"]["name"] for group in listed] == ["too-many"]


def _jobset(name: str) -> Obj:
    """A JobSet whose replicated jobs start one after another (InOrder): ``prep``, one pod of one GPU, then ``train``,
    two replicas of two pods of one GPU each. Five GPUs in all, on a node of four."""

    def replicated(job: str, replicas: int, parallelism: int) -> Obj:
        pod_spec = {
            "schedulerName": "kai-scheduler",
            "restartPolicy": "Never",
            "containers": [{"name": job, "image": "ubuntu", "resources": {"limits": {names.GPU_RESOURCE: "1"}}}],
        }
        spec = {"parallelism": parallelism, "completions": parallelism, "template": {"spec": pod_spec}}
        return {"name": job, "replicas": replicas, "template": {"spec": spec}}

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {names.QUEUE_LABEL: "default-queue"}},
        "spec": {
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "replicatedJobs": [replicated("prep", 1, 1), replicated("train", 2, 2)],
        },
    }


def _jobs(jobset: Obj) -> list[Obj]:
    """The Jobs JobSet's controller makes, one per replica (the emulator runs no JobSet controller; its Job
    controller makes their pods), each pod labelled with its replicated job and index as JobSet's controller does."""
    meta = jobset["metadata"]
    owner = {
        "apiVersion": jobset["apiVersion"],
        "kind": "JobSet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    made = []
    for replicated in jobset["spec"]["replicatedJobs"]:
        for index in range(replicated["replicas"]):
            spec = json.loads(json.dumps(replicated["template"]["spec"]))
            spec["template"]["metadata"] = {
                "labels": {
                    names.JOBSET_REPLICATED_JOB_LABEL: replicated["name"],
                    names.JOBSET_JOB_INDEX_LABEL: str(index),
                    "jobset.sigs.k8s.io/jobset-name": meta["name"],
                }
            }
            made.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": f"{meta['name']}-{replicated['name']}-{index}",
                        "namespace": NAMESPACE,
                        "ownerReferences": [owner],
                    },
                    "spec": spec,
                }
            )
    return made


def test_a_jobset_is_one_podgroup_with_kais_tree_and_its_pods_are_placed_as_the_tree_says(world: World) -> None:
    assert world.apply(yaml.safe_dump_all([_namespace(), _jobset("pipeline")])).returncode == 0
    jobset = world.kubectl.json("get", "jobsets.jobset.x-k8s.io", "pipeline", "-n", NAMESPACE)
    result = world.apply(yaml.safe_dump_all(_jobs(jobset)))
    assert result.returncode == 0, result.stderr
    group = f"pg-pipeline-{jobset['metadata']['uid']}"

    def by_job() -> dict[str, list[Obj]]:
        current: dict[str, list[Obj]] = {}
        for pod in harness.pods(world.kubectl, NAMESPACE).values():
            job = pod["metadata"].get("labels", {}).get("job-name", "")
            current.setdefault(job, []).append(pod)
        return current

    polling.until_sync(
        lambda: any(harness.bound(pod) for pod in by_job().get("pipeline-prep-0", [])),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the prep replica bound: InOrder needs one replicated job",
    )
    stored = world.kubectl.json("get", "podgroup", group, "-n", NAMESPACE)
    assert "minMember" not in stored["spec"] and stored["spec"]["minSubGroup"] == 1
    assert stored["spec"]["subGroups"] == [
        {"name": "prep", "minSubGroup": 1},
        {"name": "prep-replica-0", "parent": "prep", "minMember": 1},
        {"name": "train", "minSubGroup": 2},
        {"name": "train-replica-0", "parent": "train", "minMember": 2},
        {"name": "train-replica-1", "parent": "train", "minMember": 2},
    ]
    assert stored["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    polling.until_sync(
        lambda: "train" in _condition_message(world, group),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the train replicas' reason on the PodGroup",
    )
    pods = by_job()
    for job, members in pods.items():
        for pod in members:
            labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations", {})
            assert annotations.get(names.POD_GROUP_ANNOTATION) == group, pod["metadata"]["name"]
            assert labels[names.SUBGROUP_LABEL] == job.removeprefix("pipeline-").replace("-", "-replica-")
    train = [pod for job in ("pipeline-train-0", "pipeline-train-1") for pod in pods.get(job, [])]
    assert len(train) == 4 and not any(harness.bound(pod) for pod in train), (
        "three GPUs are free and one replica would fit, but train needs both its replicas at once"
    )

    world.kubectl("delete", "job", "pipeline-prep-0", "-n", NAMESPACE)  # prep is done: its GPU is free
    polling.until_sync(
        lambda: sum(harness.bound(pod) for job in ("pipeline-train-0", "pipeline-train-1")
                    for pod in by_job().get(job, [])) == 4,
        timeout_s=harness.STEP_TIMEOUT_S,
        what="both train replicas bound together on the four GPUs",
    )  # fmt: skip


def test_a_kai_v018_manifest_with_the_new_fields_is_admitted_grouped_with_its_knobs_and_scheduled(world: World) -> None:
    manifests = ("00-queues.yaml", "01-preemption-delay.yaml", "06-nvfractions.yaml")
    for name in manifests:
        result = world.apply((KAI / name).read_text())
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert "Warning" not in result.stderr, f"{name}: {result.stderr}"
    pods = ("delayed-preemptor", "nv-fractions-request-limit", "nv-fractions-limit-only")

    def scheduled() -> bool:
        current = harness.pods(world.kubectl, NAMESPACE)
        return all(harness.bound(current.get(name, {})) for name in pods)

    polling.until_sync(scheduled, timeout_s=harness.STEP_TIMEOUT_S, what="the KAI v0.18 pods to be bound")
    current = harness.pods(world.kubectl, NAMESPACE)
    share = current["nv-fractions-request-limit"]
    env = {entry["name"]: entry for entry in share["spec"]["containers"][0].get("env", [])}
    assert "configMapKeyRef" in env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"], "wired by the GPU-sharing webhook"
    groups = {
        group["metadata"]["name"]: group for group in world.kubectl.json("get", "podgroups", "-n", NAMESPACE)["items"]
    }
    [made] = [
        group
        for name, group in groups.items()
        if name.startswith("pg-delayed-preemptor-") and group["spec"]["queue"] == "delay-queue"
    ]
    assert made["spec"]["preemptionDelay"] == "2m0s", "the pod's annotation, in its PodGroup's spec as KAI writes it"
    assert groups["delayed-group"]["spec"]["preemptionDelay"] == "5m"


def _placed_gpu_group(pod: Obj) -> str:
    return str(pod["metadata"].get("labels", {}).get(names.GPU_GROUP_LABEL, ""))


def _member(name: str, subgroup: str, *, gpus: int = 0, labels: dict[str, str] | None = None) -> Obj:
    """A pod of the user's PodGroup ``replicated`` (the grouper leaves it alone), in one of its subgroups."""
    resources: Obj = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {names.GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {names.QUEUE_LABEL: "default-queue", names.SUBGROUP_LABEL: subgroup, **(labels or {})},
            "annotations": {names.POD_GROUP_ANNOTATION: "replicated", names.SKIP_PODGROUPER_ANNOTATION: "true"},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9", "resources": resources}],
        },
    }


def test_kai_v018_compute_modes_keep_shares_apart_and_a_subgroup_tree_is_placed_by_its_min_subgroup(
    world: World,
) -> None:
    for name in ("00-queues.yaml", "06-nvfractions.yaml"):
        result = world.apply((KAI / name).read_text())
        assert result.returncode == 0, f"{name}: {result.stderr}"
    shares = ("nv-fractions-request-limit", "nv-fractions-limit-only")
    polling.until_sync(
        lambda: all(harness.bound(harness.pods(world.kubectl, NAMESPACE).get(name, {})) for name in shares),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="both shares bound",
    )
    current = harness.pods(world.kubectl, NAMESPACE)
    sm_sharing, time_slicing = (_placed_gpu_group(current[name]) for name in shares)
    assert sm_sharing and time_slicing and sm_sharing != time_slicing, "an SM-sharing and a time-slicing GPU"

    # Two GPUs are left: one replica of two GPUs fits, and minSubGroup 1 needs only one.
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "replicated", "namespace": NAMESPACE},
        "spec": {
            "queue": "default-queue",
            "minSubGroup": 1,
            "subGroups": [
                {"name": "replica-0"},
                {"name": "replica-0-leader", "parent": "replica-0", "minMember": 1},
                {"name": "replica-0-workers", "parent": "replica-0", "minMember": 2},
                {"name": "replica-1"},
                {"name": "replica-1-leader", "parent": "replica-1", "minMember": 1},
                {"name": "replica-1-workers", "parent": "replica-1", "minMember": 2},
            ],
        },
    }
    members = [
        _member("r0-leader", "replica-0-leader"),
        _member("r0-worker-0", "replica-0-workers", gpus=1),
        _member("r0-worker-1", "replica-0-workers", gpus=1, labels={names.TASK_PRIORITY_LABEL: "5"}),
        _member("r1-leader", "replica-1-leader"),
        _member("r1-worker-0", "replica-1-workers", gpus=1),
        _member("r1-worker-1", "replica-1-workers", gpus=1),
    ]
    result = world.apply(yaml.safe_dump_all([group, *members]))
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    first = {"r0-leader", "r0-worker-0", "r0-worker-1"}

    def placed() -> set[str]:
        current = harness.pods(world.kubectl, NAMESPACE)
        return {name for name in first | {"r1-leader", "r1-worker-0", "r1-worker-1"} if harness.bound(current[name])}

    polling.until_sync(lambda: first <= placed(), timeout_s=harness.STEP_TIMEOUT_S, what="one replica")
    polling.until_sync(
        lambda: "replica-1-leader, replica-1-workers" in _condition_message(world, "replicated"),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the second replica's reason on the PodGroup",
    )
    assert placed() == first, "replica-1 waits: its workers' GPUs are not there"


def _condition_message(world: World, group: str) -> str:
    stored = world.kubectl.json("get", "podgroup", group, "-n", NAMESPACE)
    conditions = (stored.get("status") or {}).get("schedulingConditions") or []
    return " ".join(str(condition.get("message", "")) for condition in conditions)


def _timestamp_s(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()


def test_a_preemption_delay_holds_a_new_job_for_its_delay_then_it_preempts_and_the_victim_is_stamped(
    world: World,
) -> None:
    delay_s = 6
    incumbent_group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "incumbent", "namespace": NAMESPACE},
        "spec": {"queue": "default-queue", "minMember": 1, "priorityClassName": "train"},
    }
    incumbent = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "incumbent",
            "namespace": NAMESPACE,
            "labels": {names.QUEUE_LABEL: "default-queue"},
            "annotations": {names.POD_GROUP_ANNOTATION: "incumbent", names.SKIP_PODGROUPER_ANNOTATION: "true"},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "priorityClassName": "train",
            "containers": [{"name": "main", "image": "ubuntu", "resources": {"limits": {names.GPU_RESOURCE: "4"}}}],
        },
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    assert world.apply(yaml.safe_dump_all([namespace, incumbent_group, incumbent])).returncode == 0
    polling.until_sync(
        lambda: harness.bound(harness.pods(world.kubectl, NAMESPACE).get("incumbent", {})),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the incumbent on every GPU",
    )

    preemptor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "preemptor",
            "namespace": NAMESPACE,
            "labels": {names.QUEUE_LABEL: "default-queue"},
            "annotations": {names.PREEMPTION_DELAY_ANNOTATION: f"{delay_s}s"},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "priorityClassName": "build-preemptible",
            "containers": [{"name": "main", "image": "ubuntu", "resources": {"limits": {names.GPU_RESOURCE: "4"}}}],
        },
    }
    assert world.apply(yaml.safe_dump(preemptor)).returncode == 0

    def preemptor_group() -> Obj | None:
        listed = world.kubectl.json("get", "podgroups", "-n", NAMESPACE)["items"]
        return next((g for g in listed if g["metadata"]["name"].startswith("pg-preemptor-")), None)

    polling.until_sync(
        lambda: (
            "preemption delay"
            in _condition_message(world, str((preemptor_group() or {"metadata": {"name": "x"}})["metadata"]["name"]))
        ),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the preemptor held by its delay, in its PodGroup's condition",
    )
    made = preemptor_group()
    assert made is not None and made["spec"]["preemptionDelay"] == f"{delay_s}s"
    created_s = _timestamp_s(made["metadata"]["creationTimestamp"])
    assert "incumbent" in harness.pods(world.kubectl, NAMESPACE), "not evicted within the delay"

    polling.until_sync(
        lambda: "incumbent" not in harness.pods(world.kubectl, NAMESPACE),
        timeout_s=harness.STEP_TIMEOUT_S + delay_s,
        what="the incumbent evicted once the delay is over",
    )
    gone_s = time.time()
    # The creation time is in whole seconds: the eviction came no sooner than the delay after it.
    assert gone_s - created_s >= delay_s - 1, f"evicted {gone_s - created_s:.1f}s after the preemptor's group"
    polling.until_sync(
        lambda: harness.bound(harness.pods(world.kubectl, NAMESPACE).get("preemptor", {})),
        timeout_s=harness.STEP_TIMEOUT_S,
        what="the preemptor bound in the room it made",
    )
    stamped = world.kubectl.json("get", "podgroup", "incumbent", "-n", NAMESPACE)["metadata"].get("annotations", {})
    stamp = stamped.get(names.LAST_EVICTION_ANNOTATION)
    assert stamp is not None, f"the evicted group carries no {names.LAST_EVICTION_ANNOTATION}: {stamped}"
    assert created_s + delay_s - 1 <= _timestamp_s(stamp) <= time.time() + 1

"""Least privilege, proven: the real scheduler works with exactly the rights ``deploy/base`` gives it, uses every one of
them, and is refused nothing but its start-up look at its own namespaces, against an API server that enforces RBAC.

The emulator holds requests that carry a token to RBAC over the stored roles, as a real API server does, and records
what each user was served and refused. Each test renders ``deploy/base`` with ``kubectl kustomize``, applies its
Namespaces, ServiceAccounts, roles, bindings, PriorityClasses, webhook configurations and Queues with ``kubectl`` (as
the cluster's administrator; the emulator installs the base's CRDs at start), takes a token for
``quotient-system/quotient-scheduler`` through the ServiceAccount's ``TokenRequest`` (``kubectl create token``), and
runs ``quotient scheduler`` with a kubeconfig that carries it: leader election on, in ``quotient-system``, and the
admission webhooks served as the Deployment serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import names
from common.natsserver import free_port
from quotient import reserve
from quotient.emulator import access, authn
from quotient.emulator.faults import Fault
from scheduler.kube.client import KubeClient
from scheduler.kube.errors import KubeForbidden
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e import harness

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
SYSTEM = "quotient-system"
RESERVATIONS = names.RESERVATION_NAMESPACE
ACCOUNT = "quotient-scheduler"
USER = authn.service_account_user(SYSTEM, ACCOUNT).name
WORK = "ml"
# What the run cannot make the scheduler do, with the reason (empty: every right granted is used).
NOT_EXERCISED: Mapping[tuple[str, str, str], str] = {
    ("create", "authentication.k8s.io", "tokenreviews"): "the NATS auth callout's TokenReview (callout-rbac.yaml): "
    "this run has no NATS; tests/e2e/test_nats_callout.py runs two schedulers under this same account and rights, "
    "and shows the right used and nothing refused for it",
}
# What the scheduler asks and is refused under the deployed role, by design: at start it reads the namespaces it
# writes into, to make them where it may (scheduler/kube/namespaces.py); a 403 there means "no namespace rights, the
# manifests made them", and it goes on.
EXPECTED_REFUSALS = {
    access.Asked(verb="get", api_group="", resource="namespaces", namespace=namespace)
    for namespace in (SYSTEM, RESERVATIONS)
}
# The RBAC and setup objects of the base the tests apply (the workloads of deploy/ itself, the scheduler's Deployment,
# NATS and the agent, are the processes the tests run, or not needed).
SETUP_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _render() -> list[Obj]:
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(REPO / "deploy" / "base")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _of_kinds(objects: Sequence[Obj], *kinds: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in kinds]


def _queue(name: str, *, quota: float, limit: float = -1) -> Obj:
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "resources": {
                "gpu": {"quota": quota, "limit": limit, "overQuotaWeight": 1},
                "cpu": unlimited,
                "memory": unlimited,
            }
        },
    }


def _labels(queue: str) -> Obj:
    return {"kai.scheduler/queue": queue}


def _container(gpus: int = 0) -> Obj:
    resources: Obj = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"name": "main", "image": "ubuntu", "resources": resources}


def _template(queue: str, *, gpus: int = 0, restart: str = "Always") -> Obj:
    return {
        "metadata": {"labels": _labels(queue)},
        "spec": {"schedulerName": "kai-scheduler", "restartPolicy": restart, "containers": [_container(gpus)]},
    }


def _pod(name: str, queue: str, *, gpus: int = 0, annotations: Mapping[str, str] | None = None) -> Obj:
    template = _template(queue, gpus=gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK, "labels": _labels(queue), "annotations": dict(annotations or {})},
        "spec": template["spec"],
    }


# Owners without a controller in the emulator: each gets one pod that names it as its controller, so the grouper
# follows the reference and reads the owner (a get of that resource).
_BARE_OWNERS: tuple[tuple[str, str, Obj], ...] = (
    ("apps/v1", "StatefulSet", {"serviceName": "db", "replicas": 0, "selector": {"matchLabels": {"app": "db"}},
                                "template": {"metadata": {"labels": {"app": "db"}},
                                             "spec": {"containers": [_container()]}}}),
    ("kubeflow.org/v1", "TFJob", {"tfReplicaSpecs": {}}),
    ("kubeflow.org/v1", "MPIJob", {"mpiReplicaSpecs": {}}),
    ("ray.io/v1", "RayCluster", {}),
    ("ray.io/v1", "RayJob", {}),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", {"replicatedJobs": []}),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {"leaderWorkerTemplate": {"size": 1}}),
)  # fmt: skip


def _owned_pod(owner: Obj, queue: str) -> Obj:
    meta = owner["metadata"]
    pod = _pod(f"{meta['name']}-0", queue)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
    ]
    return pod


def _pytorchjob(name: str, queue: str) -> Obj:
    """A gang of two one-GPU pods (master and worker): its PodGroup has minMember 2."""

    def replica() -> Obj:
        template = _template(queue, gpus=1, restart="OnFailure")
        template["spec"]["containers"][0]["name"] = "pytorch"
        return {"replicas": 1, "restartPolicy": "OnFailure", "template": template}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": WORK, "labels": _labels(queue)},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}},
    }


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


class Deployed:
    """A fresh cluster with ``deploy/base``'s RBAC applied, and the scheduler running under its account."""

    def __init__(self, world: harness.World, rendered: Sequence[Obj]) -> None:
        self.world = world
        self.rendered = rendered
        self.kubectl = world.kubectl
        self.metrics_port = free_port()
        self._certs = tempfile.TemporaryDirectory(prefix="quotient-webhook-")

    def apply_rbac(self, *, without_namespaces: Sequence[str] = ()) -> None:
        """The base's namespaces, accounts, roles and bindings (and the PriorityClasses), as ``kubectl apply -k``
        would create them, leaving out ``without_namespaces`` and everything in them."""
        chosen = [
            obj
            for obj in _of_kinds(self.rendered, *SETUP_KINDS, "PriorityClass")
            if obj["metadata"].get("namespace") not in without_namespaces
            and not (obj["kind"] == "Namespace" and obj["metadata"]["name"] in without_namespaces)
        ]
        self.world.apply("rbac", *chosen)

    def token(self) -> str:
        """A token for the scheduler's ServiceAccount, through its TokenRequest (``kubectl create token``)."""
        made = self.kubectl("create", "token", ACCOUNT, "-n", SYSTEM, "--duration", "2h")
        return made.stdout.strip()

    def start(self, token: str, *, webhook: bool = True) -> harness.SchedulerProcess:
        kubeconfig = self.world.directory / "scheduler.kubeconfig"
        self.world.emulator.emulator.write_kubeconfig(kubeconfig, token)
        args = [
            "--lease-namespace",
            SYSTEM,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--reservation-drain-grace",
            "0.5s",
        ]
        if webhook:
            port = free_port()
            args += [
                "--webhook",
                "--webhook-host",
                "127.0.0.1",
                "--webhook-port",
                str(port),
                "--webhook-cert-dir",
                self._certs.name,
                "--webhook-upkeep-interval",
                "0.2s",
            ]
            emulator = self.world.emulator
            emulator.call(
                lambda: emulator.emulator.route_service(SYSTEM, "quotient-scheduler-webhook", f"127.0.0.1:{port}")
            )
        return self.world.scheduler(*args, identity="rbac", leader_elect=True, kubeconfig=kubeconfig)

    def trust_webhooks(self) -> None:
        """Apply the webhook configurations and wait until the scheduler wrote its CA into each."""
        self.world.apply(
            "webhooks", *_of_kinds(self.rendered, "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        )

        def trusted() -> bool:
            configurations = [
                self.kubectl.json("get", kind, name)
                for kind, name in (
                    ("mutatingwebhookconfiguration", "quotient-gpu-sharing"),
                    ("validatingwebhookconfiguration", "quotient-queue-validation"),
                    ("validatingwebhookconfiguration", "quotient-podgroup-validation"),
                )
            ]
            return all(hook["clientConfig"].get("caBundle") for c in configurations for hook in c["webhooks"])

        polling.until_sync(trusted, timeout_s=harness.STEP_TIMEOUT_S, what="the scheduler's CA in every webhook")

    def record(self) -> access.Record:
        emulator = self.world.emulator
        return emulator.call(lambda: emulator.emulator.requests_of(USER))

    def pods(self, namespace: str = WORK) -> dict[str, Obj]:
        return harness.pods(self.kubectl, namespace)

    def close(self) -> None:
        self._certs.cleanup()


@contextlib.contextmanager
def deployed(tmp_path: Path, spec: str = "1x4xA100-80GB") -> Iterator[Deployed]:
    with harness.world(spec, tmp_path) as world:
        current = Deployed(world, _render())
        try:
            yield current
        finally:
            print("--- refused:", dict(current.record().refused))
            current.close()


def _granted(rendered: Sequence[Obj]) -> set[tuple[str, str, str, str]]:
    """Every (verb, API group, resource, namespace) a role bound to the scheduler's account grants; the namespace is
    "" for a ClusterRoleBinding's (everywhere)."""
    roles = {(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]): obj for obj in rendered}
    granted = set()
    for binding in _of_kinds(rendered, "ClusterRoleBinding", "RoleBinding"):
        if {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM} not in binding["subjects"]:
            continue
        namespace = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((verb, group, resource, namespace))
    return granted


def _unused(granted: set[tuple[str, str, str, str]], served: frozenset[access.Asked]) -> set[tuple[str, str, str]]:
    """The grants no served request used (a namespaced grant counts only where it holds)."""
    return {
        (verb, group, resource)
        for verb, group, resource, namespace in granted
        if (verb, group, resource) not in NOT_EXERCISED
        and not any(
            (asked.verb, asked.api_group, asked.resource) == (verb, group, resource)
            and (not namespace or asked.namespace == namespace)
            for asked in served
        )
    }


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def test_the_scheduler_places_everything_with_exactly_the_deployed_rights_and_uses_each_of_them(
    tmp_path: Path,
) -> None:
    with deployed(tmp_path) as cluster:
        world, kubectl = cluster.world, cluster.kubectl
        cluster.apply_rbac()
        scheduler = cluster.start(cluster.token())
        cluster.trust_webhooks()
        world.apply(
            "queues",
            *_of_kinds(cluster.rendered, "Queue"),
            _queue("team-a", quota=2),
            _queue("team-b", quota=2),
            # The share's queue admits nothing until its limit is raised: its ConfigMap exists before its bind.
            _queue("team-s", quota=0, limit=0),
        )
        kubectl("create", "namespace", WORK)

        # Owners of every kind the grouper follows (a get each): a Deployment and a CronJob's Job through the
        # emulator's controllers, the others named by one pod each.
        world.apply(
            "owners",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": WORK, "labels": _labels("team-b")},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {**_template("team-b"), "metadata": {"labels": {"app": "web", **_labels("team-b")}}},
                },
            },
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": "nightly", "namespace": WORK},
                "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": _template("team-b")}}},
            },
            *(
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": {"name": kind.lower(), "namespace": WORK},
                    "spec": spec,
                }
                for api_version, kind, spec in _BARE_OWNERS
            ),
        )
        cronjob = kubectl.json("get", "cronjob", "nightly", "-n", WORK)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "nightly-1",
                "namespace": WORK,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "CronJob",
                        "name": "nightly",
                        "uid": cronjob["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"template": _template("team-b", restart="Never")},
        }
        owners = [
            kubectl.json("get", f"{kind.lower()}.{api_version.split('/')[0]}", kind.lower(), "-n", WORK)
            for api_version, kind, _ in _BARE_OWNERS
        ]
        # One bind answers 409 once, as when another scheduler bound the pod first: the binder re-reads the pod.
        emulator = world.emulator
        emulator.call(
            lambda: emulator.emulator.inject(
                Fault(verb="create", resource="pods", subresource="binding", name="whole", code=409), count=1
            )
        )
        world.apply(
            "work",
            job,
            *(_owned_pod(owner, "team-b") for owner in owners),
            _pod("whole", "team-b", gpus=1),
            _pytorchjob("ddp", "team-b"),
            _pod("share", "team-s", annotations={"gpu-fraction": "0.5"}),
        )
        gang = ("ddp-master-0", "ddp-worker-0")
        expected_bound = {"whole", *gang, *(f"{kind.lower()}-0" for _, kind, _ in _BARE_OWNERS)}

        def placed() -> bool:
            pods = cluster.pods()
            owned = {
                ref["kind"]
                for pod in pods.values()
                if harness.bound(pod)
                for ref in pod["metadata"].get("ownerReferences") or []
            }
            return expected_bound <= {n for n, p in pods.items() if harness.bound(p)} and {"ReplicaSet", "Job"} <= owned

        polling.until_sync(placed, timeout_s=harness.STEP_TIMEOUT_S * 2, what="every pod but the share placed")

        # The share waits on its queue's limit; its ConfigMap (named by the webhook) is made now, so the binder
        # finds it and patches it.
        share = cluster.pods()["share"]
        assert not harness.bound(share)
        configmap = share["metadata"]["annotations"][names.GPU_CONFIGMAP_ANNOTATION]
        kubectl("create", "configmap", configmap, "-n", WORK, "--from-literal", "stale=yes")

        # Its reason changes and comes back: the second time, the first event's count goes up (an event patch).
        def over_limit() -> list[Obj]:
            return [
                event
                for event in harness.events_about(kubectl, WORK, "share")
                if event["reason"] == "Unschedulable" and "limit" in event["message"]
            ]

        def set_limit(limit: float) -> None:
            patch = json.dumps({"spec": {"resources": {"gpu": {"limit": limit}}}})
            kubectl("patch", "queue", "team-s", "--type", "merge", "-p", patch)

        polling.until_sync(over_limit, timeout_s=harness.STEP_TIMEOUT_S, what="the share's OverLimit event")
        set_limit(0.25)
        polling.until_sync(lambda: len(over_limit()) == 2, timeout_s=harness.STEP_TIMEOUT_S, what="a second reason")
        set_limit(0)
        polling.until_sync(
            lambda: any(event.get("count") == 2 for event in over_limit()),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="the first reason's event counted twice",
        )
        set_limit(-1)
        polling.until_sync(
            lambda: _phase(cluster.pods().get("share", {})) == "Running",
            timeout_s=harness.STEP_TIMEOUT_S,
            what="the share running on its reservation",
        )
        assert cluster.pods(RESERVATIONS), "a reservation pod holds the shared device"
        written = kubectl.json("get", "configmap", configmap, "-n", WORK)["data"]
        assert written.get(names.VISIBLE_DEVICES_ENV) and written.get(names.GPU_PORTION_ENV), written

        # Every device is taken: team-a's pod is owed one of team-b's (or the share's), so the scheduler evicts, and
        # stamps the victim's PodGroup with KAI's last-eviction-timestamp (the patch on podgroups).
        before = cluster.pods()
        world.apply("reclaim", _pod("claimer", "team-a", gpus=1))
        polling.until_sync(
            lambda: harness.bound(cluster.pods().get("claimer", {})),
            timeout_s=harness.STEP_TIMEOUT_S * 2,
            what="team-a's pod bound after a reclaim",
        )
        polling.until_sync(
            lambda: set(before) - set(cluster.pods()),
            timeout_s=harness.STEP_TIMEOUT_S,
            what="a pod of an over-quota queue evicted for team-a's",
        )
        victim = sorted(set(before) - set(cluster.pods()))[0]
        victim_group = before[victim]["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]

        def stamped() -> bool:
            # A bare pod's PodGroup is owned by the pod and may be gone with it; a workload's outlives its pods.
            found = kubectl("get", "podgroup", victim_group, "-n", WORK, "-o", "json", check=False)
            if found.returncode != 0:
                return "NotFound" in found.stderr
            group = json.loads(found.stdout)
            return names.LAST_EVICTION_ANNOTATION in (group["metadata"].get("annotations") or {})

        polling.until_sync(stamped, timeout_s=harness.STEP_TIMEOUT_S, what="the victim's PodGroup stamped (or gone)")

        # The record: every right used (events and status are written a moment after what they report).
        granted = _granted(cluster.rendered)
        with contextlib.suppress(AssertionError):
            polling.until_sync(
                lambda: not _unused(granted, cluster.record().served),
                timeout_s=harness.STEP_TIMEOUT_S,
                what="every right used",
            )
        unused = _unused(granted, cluster.record().served)
        assert unused == set(), "granted, never used: drop it, or say in NOT_EXERCISED why the run cannot"
        record = cluster.record()
        assert set(record.refused) == EXPECTED_REFUSALS, record.refused
        assert set(NOT_EXERCISED) <= {grant[:3] for grant in granted}, "an exception names a right no longer granted"
        assert scheduler.process.poll() is None
        assert "Traceback" not in scheduler.log()
        assert _readyz(cluster.metrics_port)[0] == 200


def test_on_a_fresh_cluster_without_its_namespaces_the_scheduler_says_which_is_missing_until_it_is_made(
    tmp_path: Path,
) -> None:
    """The cluster-wide rights as deployed, but neither namespace (nor, so, the Roles in them): the scheduler, with
    no right to read or make namespaces, is not ready and says which namespace is missing and what makes it, once;
    applying the base's namespaces and the roles in them is all it takes."""
    with deployed(tmp_path) as cluster:
        world, kubectl = cluster.world, cluster.kubectl
        cluster.apply_rbac(without_namespaces=(SYSTEM, RESERVATIONS))
        assert not {SYSTEM, RESERVATIONS} & {ns["metadata"]["name"] for ns in kubectl.json("get", "ns")["items"]}
        # Without its namespace the account cannot exist, so no TokenRequest: the token names the account as a
        # static token does (an out-of-cluster `quotient scheduler --kubeconfig` bound by the ClusterRoleBinding).
        emulator = world.emulator
        token = emulator.call(
            lambda: emulator.emulator.static_token(USER, authn.service_account_user(SYSTEM, ACCOUNT).groups)
        )
        scheduler = cluster.start(token, webhook=False)
        world.apply("pod", harness.gpu_pod("waiting"))

        def said() -> list[str]:
            # It may not read namespaces, so it learns of the missing one from its Lease: 403, its Role being there.
            return [line for line in scheduler.log().splitlines() if "event=lease_unusable" in line]

        polling.until_sync(said, timeout_s=harness.STEP_TIMEOUT_S, what="the reason in the log")
        status, body = _readyz(cluster.metrics_port)
        assert status == 503 and SYSTEM in body, body
        [line] = said()
        assert SYSTEM in line and "kubectl" in line, line
        assert not world.bound(["waiting"])
        assert scheduler.process.poll() is None

        cluster.apply_rbac()
        polling.until_sync(lambda: world.bound(["waiting"]), timeout_s=30, what="the pod bound once the namespaces are")
        polling.until_sync(
            lambda: _readyz(cluster.metrics_port)[0] == 200, timeout_s=harness.STEP_TIMEOUT_S, what="ready"
        )
        assert len(said()) == 1, "said once"


def test_a_reservation_pod_may_write_its_device_to_its_own_pod_and_nothing_else(tmp_path: Path) -> None:
    """``quotient reserve`` under the reservation pods' account as deployed (reservations/rbac.yaml): its one patch
    is allowed, a patch anywhere else is refused."""
    with deployed(tmp_path) as cluster:
        kubectl = cluster.kubectl
        cluster.apply_rbac()
        holder = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder", "namespace": RESERVATIONS},
                  "spec": {"containers": [_container()]}}  # fmt: skip
        cluster.world.apply("holder", holder, harness.gpu_pod("elsewhere"))
        token = kubectl("create", "token", "quotient-reservation", "-n", RESERVATIONS).stdout.strip()
        kubeconfig = cluster.world.emulator.emulator.write_kubeconfig(tmp_path / "reserve.kubeconfig", token)

        async def report() -> str:
            api = await KubeClient.from_kubeconfig(kubeconfig)
            try:
                await reserve.report_device(api, namespace=RESERVATIONS, name="holder", uuid="GPU-0000", index=0)
                with pytest.raises(KubeForbidden) as refused:
                    await reserve.report_device(api, namespace="default", name="elsewhere", uuid="GPU-0000", index=0)
                return str(refused.value)
            finally:
                await api.close()

        message = asyncio.run(report())
        assert 'cannot patch resource "pods" in API group "" in the namespace "default"' in message
        annotations = cluster.pods(RESERVATIONS)["holder"]["metadata"]["annotations"]
        assert annotations[names.RESERVATION_UUID_ANNOTATION] == "GPU-0000"
        user = authn.service_account_user(RESERVATIONS, "quotient-reservation").name
        emulator = cluster.world.emulator
        record = emulator.call(lambda: emulator.emulator.requests_of(user))
        patch = access.Asked(verb="patch", api_group="", resource="pods", namespace=RESERVATIONS)
        assert record.served == {patch}
        assert set(record.refused) == {dataclasses.replace(patch, namespace="default")}

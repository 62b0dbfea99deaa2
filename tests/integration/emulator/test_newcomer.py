"""What a newcomer types against the local stack, through the real kubectl: ``create deployment|job|...`` (protobuf
bodies), ``logs`` (what the emulated containers and the fake GPU processes print), ``explain`` (the CRDs' schemas),
``auth can-i``/``whoami`` (access reviews, impersonation), ``get events`` (the kubelet's and the stand-in
kube-scheduler's), and ``get --raw .../pods/NAME:PORT/proxy/...`` (the pod proxy)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from common import clusterspec, names
from quotient.emulator import status
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from quotient.nodes import EmulatedNodes
from quotient.nodes_runtime import GpuNodesRuntime
from tests.conftest import require_tool
from tests.integration.emulator.conftest import FAST, Kubectl, cluster, pod_manifest
from tests.polling import until_sync


@pytest.fixture
def scheduled() -> Iterator[EmulatorThread]:
    """An emulator with the stand-in kube-scheduler on, as the demo runs it under ``--keep``."""
    config = EmulatorConfig(kubelet=FAST.kubelet, server=FAST.server, default_scheduler=True)
    with EmulatorThread(cluster(), config=config) as running:
        yield running


def _kubectl(emulator: EmulatorThread, directory: Path) -> Kubectl:
    return Kubectl(binary=require_tool("kubectl"), server=emulator.url, cache_dir=directory / "kube-cache")


@pytest.fixture
def kube(scheduled: EmulatorThread, tmp_path: Path) -> Kubectl:
    return _kubectl(scheduled, tmp_path)


def _running_pods(kubectl: Kubectl, selector: str) -> list[dict[str, Any]]:
    items = json.loads(kubectl("get", "pods", "-l", selector, "-o", "json").stdout)["items"]
    return [pod for pod in items if pod["status"].get("phase") == "Running"]


def _create(emulator: EmulatorThread, manifest: dict[str, Any]) -> None:
    created = emulator.run(lambda: emulator.emulator.create(manifest))
    assert not isinstance(created, status.Failure), created


def _bind_and_wait(emulator: EmulatorThread, name: str, node: str) -> None:
    emulator.call(lambda: emulator.emulator.api.bind("default", name, {"target": {"name": node}}))

    def running() -> bool:
        pod = emulator.call(lambda: emulator.emulator.get("v1", "Pod", name, "default"))
        return pod is not None and pod["status"].get("phase") == "Running"

    until_sync(running, what=f"{name} running")


# --- kubectl create: protobuf bodies, controllers, the stand-in kube-scheduler ---


def test_kubectl_create_deployment_and_job_run_their_pods_with_the_events_a_cluster_writes(kube: Kubectl) -> None:
    assert kube("create", "deployment", "web", "--image=nginx:1.27", "--replicas=2", "--port=80").stdout.strip() == (
        "deployment.apps/web created"
    )
    assert kube("create", "job", "hello", "--image=busybox", "--", "echo", "hi").stdout.strip() == (
        "job.batch/hello created"
    )
    deployment = json.loads(kube("get", "deployment", "web", "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert (container["name"], container["image"], container["ports"][0]["containerPort"]) == (
        "nginx",
        "nginx:1.27",
        80,
    )
    job = json.loads(kube("get", "job", "hello", "-o", "json").stdout)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["echo", "hi"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"

    until_sync(lambda: len(_running_pods(kube, "app=web")) == 2, what="the Deployment's two pods running")
    until_sync(lambda: len(_running_pods(kube, "job-name=hello")) == 1, what="the Job's pod running")
    [pod] = _running_pods(kube, "job-name=hello")
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]

    def reasons() -> list[tuple[str, str, str]]:
        events = json.loads(
            kube("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        )["items"]
        return sorted((event["reason"], event["source"]["component"], event["message"]) for event in events)

    expected = [
        ("Created", "kubelet", "Created container: hello"),
        ("Pulled", "kubelet", 'Container image "busybox" already present on machine'),
        ("Scheduled", "default-scheduler", f"Successfully assigned default/{name} to {node}"),
        ("Started", "kubelet", "Started container hello"),
    ]
    until_sync(lambda: reasons() == expected, what="Scheduled, Pulled, Created, Started")
    table = kube("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    assert "Scheduled" in table and f"pod/{name}" in table
    # The honest part: no program runs in an emulated container.
    assert "its command (echo hi) does not run in the emulator" in kube("logs", "job/hello").stdout


def test_a_pod_that_fits_no_node_gets_failed_scheduling_in_kube_schedulers_words(kube: Kubectl) -> None:
    kube(
        "run",
        "huge",
        "--image=busybox",
        "--overrides",
        json.dumps(
            {"spec": {"containers": [{"name": "huge", "image": "busybox", "resources": {"requests": {"cpu": "100"}}}]}}
        ),
    )

    def said() -> list[str]:
        events = json.loads(kube("get", "events", "--field-selector", "involvedObject.name=huge", "-o", "json").stdout)
        return [event["message"] for event in events["items"] if event["reason"] == "FailedScheduling"]

    until_sync(lambda: said() == ["0/2 nodes are available: 2 Insufficient cpu."], what="FailedScheduling")


def test_every_common_kubectl_create_subcommand_stores_what_it_sent(kubectl: Kubectl) -> None:
    created = [
        ("cronjob", "nightly", "--image=busybox", "--schedule=0 3 * * *"),
        ("service", "clusterip", "web", "--tcp=80:8080"),
        ("role", "reader", "--verb=get,list", "--resource=pods,deployments.apps"),
        ("clusterrole", "viewer", "--verb=get", "--resource=nodes", "--non-resource-url=/logs"),
        ("rolebinding", "readers", "--role=reader", "--user=bob", "--serviceaccount=default:robot"),
        ("clusterrolebinding", "viewers", "--clusterrole=viewer", "--group=devs"),
        ("poddisruptionbudget", "web", "--selector=app=web", "--min-available=1"),
        ("configmap", "settings", "--from-literal=mode=fast"),
        ("secret", "generic", "token", "--from-literal=key=s3cret"),
        ("serviceaccount", "robot"),
        ("priorityclass", "batch-low", "--value=0", "--description=low"),
    ]
    for args in created:
        kubectl("create", *args)
    cronjob = json.loads(kubectl("get", "cronjob", "nightly", "-o", "json").stdout)
    assert cronjob["spec"]["schedule"] == "0 3 * * *"
    assert cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox"
    kubectl("create", "job", "now", "--from=cronjob/nightly")
    job = json.loads(kubectl("get", "job", "now", "-o", "json").stdout)
    assert job["metadata"]["annotations"] == {"cronjob.kubernetes.io/instantiate": "manual"}
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    service = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)
    assert service["spec"]["ports"] == [{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    role = json.loads(kubectl("get", "role", "reader", "-o", "json").stdout)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},  # the core group is "", kept
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
    ]
    viewer = json.loads(kubectl("get", "clusterrole", "viewer", "-o", "json").stdout)
    assert {"nonResourceURLs": ["/logs"], "verbs": ["get"]} in viewer["rules"]
    binding = json.loads(kubectl("get", "rolebinding", "readers", "-o", "json").stdout)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}
    assert {"kind": "ServiceAccount", "name": "robot", "namespace": "default"} in binding["subjects"]
    pdb = json.loads(kubectl("get", "pdb", "web", "-o", "json").stdout)
    assert pdb["spec"]["minAvailable"] == 1
    priority = json.loads(kubectl("get", "priorityclass", "batch-low", "-o", "json").stdout)
    assert priority["value"] == 0, "a zero that JSON always writes is kept"
    secret = json.loads(kubectl("get", "secret", "token", "-o", "json").stdout)
    assert secret["data"] == {"key": "czNjcmV0"}


# --- kubectl logs ---


@pytest.fixture
def gpu_emulator() -> Iterator[tuple[EmulatorThread, EmulatedNodes]]:
    """GPU nodes whose pods run fake GPU processes (the agents are not started: nothing here reads NATS)."""
    spec = clusterspec.resolve("1x2xA100-80GB")
    nodes = EmulatedNodes(spec, nats_url="nats://127.0.0.1:1")
    runtime = GpuNodesRuntime(nodes)
    with EmulatorThread(spec, config=FAST) as running:
        running.call(lambda: running.emulator.add_runtime(runtime))
        try:
            yield running, nodes
        finally:
            nodes.close()


def test_kubectl_logs_shows_what_the_fake_gpu_process_prints_as_its_script_comes_true(
    gpu_emulator: tuple[EmulatorThread, EmulatedNodes], tmp_path: Path
) -> None:
    emulator, nodes = gpu_emulator
    kube = _kubectl(emulator, tmp_path)
    pod = pod_manifest(
        "train",
        annotations={names.SIM_GPU_MEMORY_ANNOTATION: "2Gi@0s,30Gi@1500ms", names.SIM_DURATION_ANNOTATION: "3s"},
        resources={"limits": {names.GPU_RESOURCE: "1"}},
        restartPolicy="Never",
    )
    _create(emulator, pod)
    node = next(iter(nodes.fakes))
    _bind_and_wait(emulator, "train", node)
    # -f prints what was printed so far, then each line as its time comes, and ends when the container exits.
    follower = kube.popen("logs", "-f", "train")
    uuid = nodes.fakes[node].spec.gpus[0].uuid
    first = kube("logs", "train").stdout.splitlines()
    assert first[0].startswith(f"emulated container main (image busybox:1.36) started on node {node}, ")
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in first[0] and first[0].endswith("no program runs in it in the emulator")
    assert first[1].startswith("GPU process ") and first[1].endswith(f"started on GPU 0 ({uuid}) of {node}")
    assert first[2] == "holds 2.0 GiB of GPU memory on GPU 0"
    stamped = kube("logs", "train", "--timestamps", "-c", "main").stdout.splitlines()
    assert stamped[0].split(" ", 1)[0].endswith("Z") and stamped[0].split(" ", 1)[1] == first[0]
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert out.splitlines() == [*first[:3], "holds 30.0 GiB of GPU memory on GPU 0", "exited with code 0"]
    assert kube("logs", "train", "--tail=1").stdout == "exited with code 0\n"
    assert kube("logs", "train", "--previous", check=False).stderr.strip() == (
        'Error from server (BadRequest): previous terminated container "main" in pod "train" not found'
    )


def test_kubectl_logs_answers_as_the_api_server_for_containers_that_cannot_be_read(
    emulator: EmulatorThread, kubectl: Kubectl
) -> None:
    two = pod_manifest("two")
    two["spec"]["containers"].append({"name": "side", "image": "busybox:1.36"})  # type: ignore[index]
    _create(emulator, two)
    _create(emulator, pod_manifest("waiting"))
    assert kubectl("logs", "waiting").stdout == "", "a pod no node holds yet has an empty log"
    _bind_and_wait(emulator, "two", "node-0")
    assert kubectl("logs", "two", "-c", "side").stdout.startswith("emulated container side (image busybox:1.36)")
    assert "Defaulted container" in kubectl("logs", "two").stderr, "kubectl picks the first, as on a cluster"
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=emulator.url)))
    with pytest.raises(ApiException) as refused:
        api.read_namespaced_pod_log("two", "default")
    assert refused.value.status == 400
    assert json.loads(refused.value.body or "{}")["message"] == (
        "a container name must be specified for pod two, choose one of: [main side]"
    )
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod_log("nope", "default")
    assert missing.value.status == 404


# --- kubectl explain, auth ---


def test_kubectl_explain_finds_the_queue_and_podgroup_schemas(kubectl: Kubectl) -> None:
    spec = kubectl("explain", "queue.spec").stdout
    assert "KIND:       Queue" in spec and "parentQueue\t<string>" in spec and "resources\t<Object>" in spec
    gpu = kubectl("explain", "queue.spec.resources.gpu.quota").stdout
    assert "FIELD: quota <number>" in gpu
    assert "FIELD: minMember <integer>" in kubectl("explain", "podgroup.spec.minMember").stdout
    assert "apiVersion\t<string>" in kubectl("explain", "queue").stdout


def test_kubectl_auth_can_i_and_whoami_answer_from_rbac_for_the_admin_and_whom_it_impersonates(
    kubectl: Kubectl,
) -> None:
    assert kubectl("auth", "can-i", "create", "pods").stdout.strip() == "yes"
    assert "system:admin" in kubectl("auth", "whoami").stdout
    kubectl("create", "role", "reader", "--verb=get,list", "--resource=pods")
    kubectl("create", "rolebinding", "readers", "--role=reader", "--user=bob")
    assert kubectl("auth", "can-i", "list", "pods", "--as=bob").stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "create", "pods", "--as=bob", check=False).stdout.strip() == "no"
    assert kubectl("auth", "can-i", "list", "pods", "--as=bob", "-n", "kube-system", check=False).stdout.strip() == "no"
    listed = kubectl("auth", "can-i", "--list", "--as=bob").stdout
    assert any(line.split()[:1] == ["pods"] and "[get list]" in line for line in listed.splitlines())
    robot = kubectl("auth", "whoami", "--as=system:serviceaccount:default:robot").stdout
    assert "system:serviceaccount:default:robot" in robot and "system:serviceaccounts:default" in robot
    assert kubectl("get", "pods", "--as=bob").returncode == 0
    refused = kubectl("get", "nodes", "--as=bob", check=False)
    assert refused.returncode != 0 and 'User "bob" cannot list resource "nodes"' in refused.stderr
    kubectl("create", "clusterrolebinding", "broken", "--clusterrole=missing", "--user=carl")
    answer = kubectl("auth", "can-i", "get", "pods", "--as=carl", check=False).stdout.strip()
    assert answer == 'no - RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found'


# --- the pod proxy ---


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"# served {self.path}\nquotient_up 1\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def metrics_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_pod_proxy_forwards_to_where_the_pod_listens_and_holds_callers_to_rbac(
    emulator: EmulatorThread, kubectl: Kubectl, metrics_server: str
) -> None:
    _create(emulator, pod_manifest("leader", namespace="kube-system"))
    path = "/api/v1/namespaces/kube-system/pods/leader:9090/proxy/metrics"
    unrouted = kubectl("get", "--raw", path, check=False)
    assert "ServiceUnavailable" in unrouted.stderr and "Emulator.route_pod" in unrouted.stderr
    emulator.call(lambda: emulator.emulator.route_pod("kube-system", "leader", 9090, metrics_server))
    # The query reaches the pod as the client encoded it (kubectl writes a space as "+").
    assert kubectl("get", "--raw", f"{path}?name=a%20b").stdout == "# served /metrics?name=a+b\nquotient_up 1\n"
    missing = kubectl("get", "--raw", "/api/v1/namespaces/kube-system/pods/nobody:9090/proxy/metrics", check=False)
    assert 'pods "nobody" not found' in missing.stderr
    # A caller with a token is held to RBAC's pods/proxy, on the name as the URL gives it.
    token = emulator.call(lambda: emulator.emulator.static_token("alice"))
    configuration = client.Configuration(host=emulator.url)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    api = client.CoreV1Api(client.ApiClient(configuration))
    with pytest.raises(ApiException) as refused:
        api.connect_get_namespaced_pod_proxy_with_path("leader:9090", "kube-system", "metrics")
    assert refused.value.status == 403
    message = json.loads(refused.value.body or "{}")["message"]
    assert message == (
        'pods "leader:9090" is forbidden: User "alice" cannot get resource "pods/proxy" in API group "" in the '
        'namespace "kube-system"'
    )
    _create(
        emulator,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "metrics", "namespace": "kube-system"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"], "resourceNames": ["leader:9090"]}
            ],
        },
    )
    _create(
        emulator,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "metrics", "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "metrics"},
            "subjects": [{"kind": "User", "name": "alice"}],
        },
    )
    assert "quotient_up 1" in api.connect_get_namespaced_pod_proxy_with_path("leader:9090", "kube-system", "metrics")
    record = emulator.call(lambda: emulator.emulator.access_record("alice"))
    assert {"verb": "get", "api_group": "", "resource": "pods/proxy", "namespace": "kube-system"} in record["served"]

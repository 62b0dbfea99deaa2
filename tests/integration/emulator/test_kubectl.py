"""The real kubectl against the emulator: tables, custom columns, jsonpath, create/apply/delete, watch, errors,
and every manifest of the seeds' guides."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path
from typing import Any

import yaml

from quotient.emulator import status
from quotient.emulator.emulator import EmulatorThread
from tests.conftest import shared_path
from tests.integration.emulator.conftest import Kubectl, pod_manifest
from tests.polling import until_sync

APPLIED_LABEL = "quotient.dev/applied"


def _create(emulator: EmulatorThread, manifest: dict[str, Any]) -> None:
    created = emulator.run(lambda: emulator.emulator.create(manifest))
    assert not isinstance(created, status.Failure), created


def _bind_and_wait(emulator: EmulatorThread, name: str, node: str, namespace: str = "default") -> None:
    emulator.call(lambda: emulator.emulator.api.bind(namespace, name, {"target": {"name": node}}))

    def running() -> bool:
        pod = emulator.call(lambda: emulator.emulator.get("v1", "Pod", name, namespace))
        return pod is not None and pod["status"].get("phase") == "Running"

    until_sync(running, what=f"{name} to run")


def test_get_pods_prints_ready_status_restarts_and_age(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    _create(emulator, pod_manifest("web"))
    _create(emulator, pod_manifest("waiting"))
    _bind_and_wait(emulator, "web", "node-0")
    lines = kubectl("get", "pods").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    rows = {line.split()[0]: line.split()[1:4] for line in lines[1:]}
    assert rows == {"web": ["1/1", "Running", "0"], "waiting": ["0/1", "Pending", "0"]}
    wide = kubectl("get", "pods", "web", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:7] == ["IP", "NODE"] and wide[1].split()[6] == "node-0"
    labelled = kubectl("get", "pods", "--show-labels", "-l", "!missing").stdout
    assert "LABELS" in labelled.splitlines()[0]
    assert kubectl("get", "po", "-o", "name").stdout.split() == ["pod/waiting", "pod/web"]


def test_get_queues_nodes_and_priority_classes(kubectl: Kubectl) -> None:
    queues = kubectl("get", "queues").stdout.splitlines()
    assert queues[0].split()[:3] == ["NAME", "PRIORITY", "PARENT"]
    assert [line.split()[0] for line in queues[1:]] == ["default-parent-queue", "default-queue"]
    assert "default-parent-queue" in queues[2]
    nodes = kubectl("get", "nodes").stdout.splitlines()
    assert [line.split()[:2] for line in nodes[1:]] == [["node-0", "Ready"], ["node-1", "Ready"]]
    allocatable = kubectl("get", "node", "node-0", "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}").stdout
    assert allocatable == "4"
    assert "inference" in kubectl("get", "priorityclasses").stdout


def _seed_manifests() -> list[Path]:
    """Every Kubernetes manifest among the seeds (vcluster-values.yaml is Helm values, not an object)."""
    found = []
    for path in sorted(shared_path("seeds").glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        if documents and all(isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc for doc in documents):
            found.append(path)
    assert found, "no seed manifests"
    return found


def _namespace_for(path: Path) -> str | None:
    """None when the manifest names its namespace; the vCluster guide's pods go to a namespace of their own (its
    gpu-pod has the name of the talk's)."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    if all(doc.get("metadata", {}).get("namespace") for doc in documents):
        return None
    return "tenant" if path.name.startswith("vcluster-") else "default"


def _groups(paths: list[Path]) -> dict[str | None, list[Path]]:
    groups: dict[str | None, list[Path]] = {}
    for path in paths:
        groups.setdefault(_namespace_for(path), []).append(path)
    return groups


def _files(paths: list[Path], namespace: str | None) -> list[str]:
    args = [arg for path in paths for arg in ("-f", str(path))]
    return [*args, "-n", namespace] if namespace else args


def _relabelled(path: Path, directory: Path) -> Path:
    """The manifest with one more label: the second apply then has something to patch."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for doc in documents:
        doc.setdefault("metadata", {}).setdefault("labels", {})[APPLIED_LABEL] = "twice"
    target = directory / path.name
    target.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return target


def test_every_seed_manifest_creates_deletes_and_applies_twice(
    emulator: EmulatorThread, kubectl: Kubectl, tmp_path: Path
) -> None:
    paths = _seed_manifests()
    for namespace in sorted(
        {
            doc["metadata"]["namespace"]
            for path in paths
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("metadata", {}).get("namespace")
        }
        | {"tenant"}
    ):
        kubectl("create", "namespace", namespace)
    groups = _groups(paths)
    expected = sum(len([doc for doc in yaml.safe_load_all(path.read_text()) if doc]) for path in paths)
    created = [
        line for ns, group in groups.items() for line in kubectl("create", *_files(group, ns)).stdout.splitlines()
    ]
    assert len(created) == expected and all(line.endswith(" created") for line in created), created
    for namespace, group in groups.items():
        deleted = kubectl("delete", "--wait=true", *_files(group, namespace)).stdout.splitlines()
        assert all(line.endswith(" deleted") for line in deleted), deleted
    until_sync(lambda: not kubectl("get", "pods", "-A", "-o", "name").stdout.strip(), what="the seeds' pods to go")
    applied = [
        line for ns, group in groups.items() for line in kubectl("apply", *_files(group, ns)).stdout.splitlines()
    ]
    assert len(applied) == expected and all(line.endswith(" created") for line in applied), applied
    relabelled_dir = tmp_path / "relabelled"
    relabelled_dir.mkdir()
    second = [
        line
        for ns, group in groups.items()
        for line in kubectl(
            "apply", *_files([_relabelled(path, relabelled_dir) for path in group], ns)
        ).stdout.splitlines()
    ]
    assert len(second) == expected and all(line.endswith(" configured") for line in second), second
    labels = kubectl(
        "get",
        "pods,queues,deployments",
        "-A",
        "-o",
        "jsonpath={.items[*].metadata.labels." + APPLIED_LABEL.replace(".", "\\.") + "}",
    ).stdout.split()
    assert labels and set(labels) == {"twice"}
    # The strategic merge patch of a pod kept its container whole.
    container = kubectl("get", "pod", "cpu-pod", "-o", "jsonpath={.spec.containers[0].args}").stdout
    assert container == '["sleep","infinity"]'
    gpu = kubectl("get", "pod", "gpu-pod", "-n", "tenant", "-o", "jsonpath={.spec.containers[0].resources}").stdout
    assert '"nvidia.com/gpu":"1"' in gpu


def test_the_seeds_inspection_commands_work(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    seeds = shared_path("seeds")
    kubectl("create", "namespace", "ai-workloads")
    kubectl(
        "apply",
        "-f",
        str(seeds / "gpu-sharing.yaml"),
        "-f",
        str(seeds / "vllm-test-07.yaml"),
        "-f",
        str(seeds / "vllm-test-02.yaml"),
    )
    shown = kubectl(
        "get", "pod", "gpu-sharing", "-o", 'jsonpath={.metadata.annotations.gpu-fraction}{" "}{.spec.schedulerName}'
    )
    assert shown.stdout == "0.5 kai-scheduler"
    readme = (seeds / "README.md").read_text()
    match = re.search(r'-o custom-columns="([^"]+)"', readme)
    assert match is not None, "the guide's custom-columns command is no longer in the seeds' README"
    columns = match.group(1)

    def listed() -> list[list[str]]:
        out = kubectl("-n", "ai-workloads", "get", "pods", "-o", f"custom-columns={columns}").stdout
        return [line.split() for line in out.splitlines()]

    rows = until_sync(lambda: len(listed()) == 3 and listed(), what="the vLLM deployments' pods")
    assert isinstance(rows, list)
    assert rows[0] == ["NAME", "STATUS", "NODE", "GPU-FRACTION", "GPU-GROUP"]
    fractions = {row[0].rsplit("-", 2)[0]: row[1:] for row in rows[1:]}
    assert fractions == {
        "vllm-test-02": ["Pending", "<none>", "0.2", "<none>"],
        "vllm-test-07": ["Pending", "<none>", "0.7", "<none>"],
    }


def test_delete_waits_for_the_pod_and_errors_read_cleanly(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    _create(emulator, pod_manifest("doomed"))
    _bind_and_wait(emulator, "doomed", "node-1")
    assert kubectl("delete", "pod", "doomed").stdout.strip() == 'pod "doomed" deleted'
    missing = kubectl("get", "pod", "doomed", check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == 'Error from server (NotFound): pods "doomed" not found'
    invalid = kubectl(
        "create",
        "-f",
        "-",
        check=False,
        stdin=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {"containers": []}}
        ),
    )
    assert invalid.returncode == 1
    assert 'The Pod "empty" is invalid: spec.containers: Required value' in invalid.stderr
    exists = kubectl("create", "namespace", "default", check=False)
    assert 'Error from server (AlreadyExists): namespaces "default" already exists' in exists.stderr


def test_get_pods_watch_prints_changes_as_they_happen(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    process = kubectl.popen("get", "pods", "-w")
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        until_sync(lambda: emulator.call(emulator.emulator.hub.count) >= 1, what="kubectl to watch")
        _create(emulator, pod_manifest("watched"))
        until_sync(lambda: any(line.startswith("watched") for line in lines), what="kubectl to print the new pod")
        _bind_and_wait(emulator, "watched", "node-0")
        until_sync(lambda: any("Running" in line for line in lines), what="kubectl to print Running")
    finally:
        process.terminate()
        process.wait(10)
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    statuses = [line.split()[2] for line in lines[1:] if line.startswith("watched")]
    assert statuses[0] == "Pending" and statuses[-1] == "Running"


def test_kubectl_scale_uses_the_scale_subresource(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    seeds = shared_path("seeds")
    kubectl("create", "namespace", "ai-workloads")
    kubectl("apply", "-f", str(seeds / "vllm-test-02.yaml"))
    assert "scaled" in kubectl("-n", "ai-workloads", "scale", "deployment", "vllm-test-02", "--replicas=3").stdout
    until_sync(
        lambda: len(kubectl("-n", "ai-workloads", "get", "pods", "-o", "name").stdout.split()) == 3,
        what="three replicas",
    )
    assert shutil.which("kubectl")


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
            }
        ],
    },
}


def test_a_crd_applied_with_kubectl_serves_its_kind_with_its_printer_columns(
    emulator: EmulatorThread, kubectl: Kubectl
) -> None:
    assert "created" in kubectl("apply", "-f", "-", stdin=yaml.safe_dump(WIDGET_CRD)).stdout
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3}}
    assert "widget.example.com/w1 created" in kubectl("apply", "-f", "-", stdin=yaml.safe_dump(widget)).stdout
    lines = kubectl("get", "wd").stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE"] and lines[1].split() == ["w1", "3"]
    kubectl("delete", "crd", "widgets.example.com")
    assert emulator.call(lambda: emulator.emulator.registry.lookup("example.com", "v1", "widgets")) is None


def test_describe_pod_shows_its_events(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    _create(emulator, pod_manifest("explained"))
    pod = emulator.call(lambda: emulator.emulator.get("v1", "Pod", "explained", "default"))
    assert pod is not None
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "explained.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "explained", "namespace": "default", "uid": pod["metadata"]["uid"]},
        "reason": "Unschedulable",
        "message": "0/2 nodes are available",
        "type": "Warning",
        "source": {"component": "quotient"},
        "count": 1,
    }
    _create(emulator, event)
    described = kubectl("describe", "pod", "explained").stdout
    assert "Unschedulable" in described and "0/2 nodes are available" in described

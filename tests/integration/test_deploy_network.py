"""deploy/'s network, checked by rendering: NATS as a TLS cluster of three, and the NetworkPolicies around it all.

What ``test_deploy_render`` checks of the agent's and the scheduler's NATS flags is theirs; here: the NATS servers
serve TLS from the Secret ``quotient nats-keys`` makes (or cert-manager issues, with the same names) and route to
every pod; no client pod mounts the servers' key; every port a pod of the base listens on is covered by a policy that
selects the pod, every policy selects pods that exist and names ports they have; NATS's client port is open to the
agents, the scheduler and labelled readers only, its route port to NATS only, the webhook's to the control-plane
CIDR parameter only, and an overlay's parameters reach the policies.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from common import names
from quotient import natscerts, natskeys
from tests.conftest import REPO, require_tool

pytestmark = pytest.mark.integration

BASE = REPO / "deploy" / "base"
NAMESPACE = "quotient-system"
NATS_CONF = BASE / "nats" / "nats.conf"
PARAMETERS = BASE / "networkpolicies" / "parameters.yaml"
PARAMETERS_COMPONENT = BASE / "networkpolicies" / "parameters"
CERT_MANAGER = REPO / "deploy" / "overlays" / "cert-manager"
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")

Obj = dict[str, Any]


def render(path: Path) -> list[Obj]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return render(BASE)


def one(objects: Sequence[Obj], kind: str, name: str) -> Obj:
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj, name: str) -> Obj:
    [found] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return found


def flags(of: Obj) -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in of.get("args", []))


def workloads(objects: Sequence[Obj]) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in WORKLOAD_KINDS]


def policies(objects: Sequence[Obj]) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == "NetworkPolicy"]


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector with matchLabels only (the policies use no expressions: a test below says so)."""
    assert set(selector) <= {"matchLabels"}, f"unexpected selector {selector}"
    return dict(selector.get("matchLabels") or {}).items() <= dict(labels).items()


def pod_labels(workload: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def ports_of(workload: Obj) -> Iterator[Obj]:
    for each in pod_spec(workload)["containers"]:
        yield from each.get("ports", [])


def rules_for(objects: Sequence[Obj], workload: Obj, port: Obj) -> list[Obj]:
    """The ingress rules, of the policies selecting ``workload``'s pods, that open ``port``."""
    found = []
    for policy in policies(objects):
        if policy["metadata"]["namespace"] != workload["metadata"]["namespace"]:
            continue
        if not selects(policy["spec"]["podSelector"], pod_labels(workload)):
            continue
        for rule in policy["spec"].get("ingress", []):
            if any(p.get("port") in (port.get("name"), port["containerPort"]) for p in rule.get("ports", [])):
                found.append(rule)
    return found


def parameters() -> Mapping[str, str]:
    data: Mapping[str, str] = yaml.safe_load(PARAMETERS.read_text())["data"]
    return data


PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}


def from_prometheus(rule: Obj, namespace: str) -> bool:
    return rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": PROMETHEUS},
        }
    ]


# --- NATS: TLS and the cluster ---


def test_the_nats_servers_serve_tls_from_the_secret_nats_keys_makes_to_clients_and_routes(rendered: list[Obj]) -> None:
    nats = one(rendered, "StatefulSet", "quotient-nats")
    conf = NATS_CONF.read_text()
    server = container(nats, "nats")
    [mount] = [m for m in server["volumeMounts"] if m["name"] == "tls"]
    [volume] = [v for v in pod_spec(nats)["volumes"] if v["name"] == "tls"]
    files = set(re.findall(r"^\s*(?:cert_file|key_file|ca_file):\s*(\S+)\s*$", conf, flags=re.MULTILINE))

    assert volume["secret"]["secretName"] == natskeys.TLS_SECRET
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    assert mount["readOnly"] is True
    assert {PurePosixPath(path).parent for path in files} == {PurePosixPath(mount["mountPath"])}
    assert {PurePosixPath(path).name for path in files} == {"tls.crt", "tls.key", "ca.crt"}
    # Two tls blocks: the client port's (no client certificates: nkeys and the callout authenticate) and the routes'.
    assert re.search(r"^tls \{.*?verify: false.*?^\}", conf, flags=re.MULTILINE | re.DOTALL)
    # Quotient's clients start TLS before the server's first line (common/natstls.py): the server must expect it.
    assert re.search(r"^tls \{[^}]*^\s*handshake_first: auto\s*$", conf, flags=re.MULTILINE)
    assert re.search(r"^cluster \{.*?  tls \{.*?verify: true.*?^\}", conf, flags=re.MULTILINE | re.DOTALL)
    assert not re.search(r"^\s*allow_non_tls", conf, flags=re.MULTILINE)


def test_the_nats_servers_route_to_every_pod_by_the_names_their_certificate_carries(rendered: list[Obj]) -> None:
    nats = one(rendered, "StatefulSet", "quotient-nats")
    conf = NATS_CONF.read_text()
    cluster_port = next(p["containerPort"] for p in container(nats, "nats")["ports"] if p["name"] == "cluster")
    routes = re.findall(r"^\s*nats-route://(\S+):(\d+)\s*$", conf, flags=re.MULTILINE)
    headless = one(rendered, "Service", nats["spec"]["serviceName"])
    env = {entry["name"]: entry for entry in container(nats, "nats")["env"]}

    assert routes == [
        (f"quotient-nats-{i}.{headless['metadata']['name']}.{NAMESPACE}.svc", str(cluster_port))
        for i in range(nats["spec"]["replicas"])
    ]
    assert nats["spec"]["replicas"] == 3
    for host, _ in routes:
        assert f"*.{host.partition('.')[2]}" in natscerts.dns_names(NAMESPACE)
    assert {"name": "cluster", "port": cluster_port, "targetPort": "cluster", "protocol": "TCP"} in headless["spec"][
        "ports"
    ]
    # server_name: $POD_NAME, unique per pod as JetStream's clustering needs.
    assert re.search(r"^server_name:\s*\$POD_NAME\s*$", conf, flags=re.MULTILINE)
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert re.search(r"^\s*no_advertise:\s*true\s*$", conf, flags=re.MULTILINE)
    budget = one(rendered, "PodDisruptionBudget", "quotient-nats")
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects(budget["spec"]["selector"], pod_labels(nats))


def test_the_nats_servers_reload_a_renewed_certificate_without_a_restart(rendered: list[Obj]) -> None:
    nats = one(rendered, "StatefulSet", "quotient-nats")
    conf = NATS_CONF.read_text()
    reloader = container(nats, "reloader")
    args = reloader["args"]
    watched = {args[i + 1] for i, arg in enumerate(args) if arg == "-config"}
    pid_file = re.search(r"^pid_file:\s*(\S+)\s*$", conf, flags=re.MULTILINE)
    files = set(re.findall(r"^\s*(?:cert_file|key_file|ca_file):\s*(\S+)\s*$", conf, flags=re.MULTILINE))
    mounts = {m["name"]: m["mountPath"] for m in reloader["volumeMounts"]}

    assert pid_file and args[args.index("-pid") + 1] == pid_file.group(1)
    assert files <= watched
    assert PurePosixPath(pid_file.group(1)).parent == PurePosixPath(mounts["pid"])
    assert pod_spec(nats)["shareProcessNamespace"] is True
    assert reloader["securityContext"]["readOnlyRootFilesystem"] is True


def test_no_client_pod_mounts_the_nats_servers_key(rendered: list[Obj]) -> None:
    for objects in (rendered, render(CERT_MANAGER)):
        for workload in workloads(objects):
            if workload["metadata"]["name"] == "quotient-nats":
                continue
            secrets = {v["secret"]["secretName"] for v in pod_spec(workload).get("volumes", []) if "secret" in v} | {
                source["secret"]["name"]
                for v in pod_spec(workload).get("volumes", [])
                for source in (v.get("projected") or {}).get("sources", [])
                if "secret" in source
            }
            assert natskeys.TLS_SECRET not in secrets, workload["metadata"]["name"]


def test_the_cert_manager_overlay_issues_the_nats_certificate_nats_keys_would_make(rendered: list[Obj]) -> None:
    objects = render(CERT_MANAGER)
    certificate = one(objects, "Certificate", "quotient-nats")
    issuer = one(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = next(
        c
        for c in objects
        if c["kind"] == "Certificate" and c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
    )

    assert certificate["spec"]["secretName"] == natskeys.TLS_SECRET
    assert certificate["spec"]["dnsNames"] == list(natscerts.dns_names(NAMESPACE))
    assert certificate["spec"]["ipAddresses"] == list(natscerts.LOOPBACK_IPS)
    assert {"server auth", "client auth"} <= set(certificate["spec"]["usages"])
    assert ca["spec"]["isCA"] is True
    # Its own CA, not the webhook's: each signs one thing.
    assert ca["metadata"]["name"] != "quotient-webhook-ca"
    # The NATS pods are the base's: they mount the Secret by the same name.
    assert one(objects, "StatefulSet", "quotient-nats") == one(rendered, "StatefulSet", "quotient-nats")


# --- NetworkPolicies ---


def test_a_default_deny_policy_selects_every_pod_of_the_namespace(rendered: list[Obj]) -> None:
    [deny] = [p for p in policies(rendered) if p["spec"]["podSelector"] == {}]

    assert deny["metadata"]["namespace"] == NAMESPACE
    assert deny["spec"]["policyTypes"] == ["Ingress"] and not deny["spec"].get("ingress")
    assert {w["metadata"]["namespace"] for w in workloads(rendered)} == {NAMESPACE}


def test_every_port_a_pod_listens_on_is_opened_by_a_policy_that_selects_the_pod(rendered: list[Obj]) -> None:
    uncovered = [
        (workload["metadata"]["name"], port.get("name"), port["containerPort"])
        for workload in workloads(rendered)
        for port in ports_of(workload)
        if not rules_for(rendered, workload, port)
    ]

    assert uncovered == []


def test_every_policy_selects_pods_that_exist_and_opens_ports_they_have(rendered: list[Obj]) -> None:
    for policy in policies(rendered):
        selected = [w for w in workloads(rendered) if selects(policy["spec"]["podSelector"], pod_labels(w))]
        assert selected, f"{policy['metadata']['name']} selects no pod"
        named = {p.get("name") for w in selected for p in ports_of(w)} | {
            p["containerPort"] for w in selected for p in ports_of(w)
        }
        for rule in policy["spec"].get("ingress", []):
            for port in rule["ports"]:
                assert port["port"] in named, f"{policy['metadata']['name']}: no selected pod has port {port['port']}"
            for peer in rule["from"]:
                if "podSelector" in peer and "namespaceSelector" not in peer:  # pods of this namespace
                    assert any(selects(peer["podSelector"], pod_labels(w)) for w in workloads(rendered)), peer


def test_nats_clients_are_the_agents_the_scheduler_and_labelled_readers_and_routes_come_from_nats_only(
    rendered: list[Obj],
) -> None:
    nats = one(rendered, "StatefulSet", "quotient-nats")
    by_port = {port["name"]: rules_for(rendered, nats, port) for port in ports_of(nats)}
    [client] = by_port["client"]
    [cluster] = by_port["cluster"]
    [monitor] = by_port["monitor"]

    assert client["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "quotient-agent"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "quotient-scheduler"}}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {names.NATS_READER_LABEL: "true"}}},
    ]
    agent, scheduler = one(rendered, "DaemonSet", "quotient-agent"), one(rendered, "Deployment", "quotient-scheduler")
    assert selects(client["from"][0]["podSelector"], pod_labels(agent))
    assert selects(client["from"][1]["podSelector"], pod_labels(scheduler))
    assert cluster["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "quotient-nats"}}}]
    assert selects(cluster["from"][0]["podSelector"], pod_labels(nats))
    assert from_prometheus(monitor, parameters()["prometheusNamespace"])


def test_the_webhook_port_is_open_to_the_control_plane_cidr_only_and_metrics_ports_to_prometheus(
    rendered: list[Obj],
) -> None:
    scheduler = one(rendered, "Deployment", "quotient-scheduler")
    agent = one(rendered, "DaemonSet", "quotient-agent")
    webhook_service = one(rendered, "Service", "quotient-scheduler-webhook")
    [webhook_port] = [p for p in ports_of(scheduler) if p.get("name") == "webhook"]
    [webhook] = rules_for(rendered, scheduler, webhook_port)

    assert webhook_service["spec"]["ports"][0]["targetPort"] in (webhook_port["name"], webhook_port["containerPort"])
    assert webhook["from"] == [{"ipBlock": {"cidr": parameters()["controlPlaneCIDR"]}}]
    for workload in (scheduler, agent):
        [metrics] = [p for p in ports_of(workload) if p.get("name") == "metrics"]
        rules = rules_for(rendered, workload, metrics)
        assert any(from_prometheus(rule, parameters()["prometheusNamespace"]) for rule in rules)
        others = [rule for rule in rules if not from_prometheus(rule, parameters()["prometheusNamespace"])]
        # The scheduler's metrics port is open to the control plane too: the API server's pod proxy, which
        # `kubectl quotient explain|top` reads the leader's /metrics through.
        want = [{"ipBlock": {"cidr": parameters()["controlPlaneCIDR"]}}] if workload is scheduler else []
        assert [rule["from"][0] for rule in others] == want
    # Parameters, not objects: nothing of them is applied.
    assert not [obj for obj in rendered if obj["metadata"]["name"] == "quotient-network-parameters"]


def test_an_overlay_sets_the_control_plane_cidr_and_prometheus_namespace_through_the_component(
    rendered: list[Obj], tmp_path: Path
) -> None:
    values = tmp_path / "network"
    values.mkdir()
    (values / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1alpha1",
                "kind": "Component",
                "patches": [
                    {
                        "target": {"kind": "ConfigMap", "name": "quotient-network-parameters"},
                        "patch": yaml.safe_dump(
                            [
                                {"op": "replace", "path": "/data/controlPlaneCIDR", "value": "10.20.0.0/24"},
                                {"op": "replace", "path": "/data/prometheusNamespace", "value": "observability"},
                            ]
                        ),
                    }
                ],
            }
        )
    )
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                # kustomize takes no absolute path.
                "resources": [os.path.relpath(BASE, tmp_path)],
                "components": ["network", os.path.relpath(PARAMETERS_COMPONENT, tmp_path)],
            }
        )
    )

    overlaid = render(tmp_path)
    scheduler = one(overlaid, "Deployment", "quotient-scheduler")
    [webhook_port] = [p for p in ports_of(scheduler) if p.get("name") == "webhook"]
    [webhook] = rules_for(overlaid, scheduler, webhook_port)

    assert webhook["from"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]
    for workload in workloads(overlaid):
        for port in ports_of(workload):
            if port.get("name") in ("metrics", "monitor"):
                rules = rules_for(overlaid, workload, port)
                assert any(from_prometheus(rule, "observability") for rule in rules), (
                    workload["metadata"]["name"],
                    port,
                )
    # Everything else is the base's.
    assert [obj for obj in overlaid if obj["kind"] != "NetworkPolicy"] == [
        obj for obj in rendered if obj["kind"] != "NetworkPolicy"
    ]

"""deploy/base renders with kustomize, every object is valid Kubernetes 1.32, and the parts that matter say so.

Schema validity (strict: unknown fields fail, so a misspelt ``hostPid`` cannot pass) is necessary but says nothing
about intent; the semantic checks below pin what the agent and NATS need and why: the agent sees host pids through
a read-only /proc, knows its node from the downward API, reads its nkey seed from the Secret that ``quotient
nats-keys`` makes, and the NATS server gets its config and the users' keys from where the other pieces put them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from agent import app as agent_app
from common import config, quantities
from quotient import natskeys
from tests.conftest import REPO, require_tool

pytestmark = pytest.mark.integration

BASE = REPO / "deploy" / "base"
NAMESPACE = "quotient-system"
KUBERNETES_VERSION = "1.32"
# The flags of `quotient agent` that deploy may pass (agent/app.py accepts more: --fake-gpus is for emulated nodes).
AGENT_FLAGS = {"--node", "--nats", "--nats-nkey-seed", "--interval", "--metrics-port", "--proc-root", "--dcgm-names"}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(objects: Sequence[Obj], kind: str, name: str) -> Obj:
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _by_kind(objects: Sequence[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def _container(workload: Obj, name: str) -> Obj:
    containers: list[Obj] = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(containers) == 1
    return containers[0]


def _flags(container: Obj) -> dict[str, str]:
    """``--name=value`` arguments as a mapping; every argument must have that form."""
    flags: dict[str, str] = {}
    for arg in container["args"]:
        name, sep, value = arg.partition("=")
        assert sep and name.startswith("--"), f"argument {arg!r} is not --name=value"
        assert name not in flags, f"{name} given twice"
        flags[name] = value
    return flags


def _volume(workload: Obj, name: str) -> Obj:
    volumes: list[Obj] = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    assert len(volumes) == 1
    return volumes[0]


def _mount_of(container: Obj, volume: str) -> Obj:
    mounts: list[Obj] = [m for m in container["volumeMounts"] if m["name"] == volume]
    assert len(mounts) == 1
    return mounts[0]


def _env(container: Obj) -> Mapping[str, Obj]:
    return {entry["name"]: entry for entry in container.get("env", [])}


@pytest.fixture(scope="module")
def agent(rendered: list[Obj]) -> Obj:
    return _one(rendered, "DaemonSet", "quotient-agent")


@pytest.fixture(scope="module")
def nats(rendered: list[Obj]) -> Obj:
    return _one(rendered, "StatefulSet", "quotient-nats")


# --- the whole rendering ---


def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(rendered: list[Obj]) -> None:
    assert rendered
    for obj in rendered:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")


def test_every_object_lives_in_the_quotient_namespace_which_the_base_creates(rendered: list[Obj]) -> None:
    _one(rendered, "Namespace", NAMESPACE)
    for obj in rendered:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


def test_the_base_commits_no_secret(rendered: list[Obj]) -> None:
    assert _by_kind(rendered, "Secret") == []


# --- the agent ---


def test_the_agent_runs_on_gpu_nodes_with_the_nvidia_runtime(agent: Obj) -> None:
    pod = agent["spec"]["template"]["spec"]

    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    assert agent["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    env = _env(_container(agent, "agent"))
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    # Requesting a GPU would take it from the workloads; the runtime gives the agent every device without it.
    resources = _container(agent, "agent")["resources"]
    assert not any("nvidia.com" in name for part in resources.values() for name in part)


def test_the_agent_passes_only_flags_that_quotient_agent_accepts(agent: Obj) -> None:
    container = _container(agent, "agent")
    flags = _flags(container)
    settings = {setting.flag: setting for setting in agent_app.SETTINGS}
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_arguments(parser, agent_app.SETTINGS)

    assert container["command"] == ["quotient", "agent"]
    assert set(flags) <= AGENT_FLAGS
    assert "--dcgm-names" not in flags, "off by default: most GPU clusters already run dcgm-exporter"
    # Kubernetes expands $(NODE_NAME) before the agent sees it.
    _, unknown = parser.parse_known_args([arg.replace("$(NODE_NAME)", "gpu-node-1") for arg in container["args"]])
    assert unknown == []
    for flag, value in flags.items():
        parse = settings[flag].parse
        if parse in (config.parse_existing_file, config.parse_existing_dir):
            continue  # paths on the node, checked against the pod's mounts below
        parse(value.replace("$(NODE_NAME)", "gpu-node-1"))


def test_the_agent_sees_host_pids_through_a_read_only_host_proc(agent: Obj) -> None:
    container = _container(agent, "agent")
    pod = agent["spec"]["template"]["spec"]

    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork", False)
    volume = _volume(agent, "host-proc")
    assert volume["hostPath"]["path"] == "/proc"
    mount = _mount_of(container, "host-proc")
    assert mount["readOnly"] is True
    assert mount["mountPath"] == _flags(container)["--proc-root"]


def test_the_agent_knows_its_node_from_the_downward_api(agent: Obj) -> None:
    container = _container(agent, "agent")

    assert _env(container)["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert _flags(container)["--node"] == "$(NODE_NAME)"


def test_the_agent_reads_its_nkey_seed_from_the_secret_that_nats_keys_makes(agent: Obj) -> None:
    container = _container(agent, "agent")
    seed_path = PurePosixPath(_flags(container)["--nats-nkey-seed"])

    secret = _volume(agent, "nats-seed")["secret"]
    assert secret["secretName"] == natskeys.seed_secret_name("agent")
    assert secret["items"] == [{"key": natskeys.SEED_KEY, "path": seed_path.name}]
    # Readable by the agent's group (fsGroup), by no one else.
    assert secret["defaultMode"] & 0o007 == 0
    assert agent["spec"]["template"]["spec"]["securityContext"]["fsGroup"] is not None
    mount = _mount_of(container, "nats-seed")
    assert mount["readOnly"] is True
    assert PurePosixPath(mount["mountPath"]) == seed_path.parent


def test_the_agent_dials_the_nats_service(agent: Obj, rendered: list[Obj]) -> None:
    url = urlsplit(_flags(_container(agent, "agent"))["--nats"])
    service = _one(rendered, "Service", "quotient-nats")

    assert url.scheme == "nats"
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port in [port["port"] for port in service["spec"]["ports"] if port["name"] == "client"]


def test_the_agent_has_small_resource_requests_and_limits(agent: Obj) -> None:
    resources = _container(agent, "agent")["resources"]

    for kind, parse in [("cpu", quantities.parse_millicores), ("memory", quantities.parse_bytes)]:
        request = parse(resources["requests"][kind])
        limit = parse(resources["limits"][kind])
        assert 0 < request <= limit, kind
    # The agent's budget is < 80 MB RSS; the limit leaves headroom but stays small on every GPU node.
    assert 80 * 10**6 < quantities.parse_bytes(resources["limits"]["memory"]) <= 256 * quantities.MIB
    assert quantities.parse_millicores(resources["limits"]["cpu"]) <= 500


def test_the_agent_is_probed_and_scraped_on_its_metrics_port(agent: Obj) -> None:
    container = _container(agent, "agent")
    metrics_port = int(_flags(container)["--metrics-port"])

    assert {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    annotations = agent["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_agent_runs_unprivileged_with_a_read_only_root(agent: Obj) -> None:
    pod = agent["spec"]["template"]["spec"]
    context = _container(agent, "agent")["securityContext"]

    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0


def test_the_agent_has_no_kubernetes_credentials(agent: Obj, rendered: list[Obj]) -> None:
    pod = agent["spec"]["template"]["spec"]
    account = _one(rendered, "ServiceAccount", pod["serviceAccountName"])

    assert pod["automountServiceAccountToken"] is False
    assert account["automountServiceAccountToken"] is False
    bindings = _by_kind(rendered, "RoleBinding") + _by_kind(rendered, "ClusterRoleBinding")
    assert not any(
        subject.get("name") == account["metadata"]["name"]
        for binding in bindings
        for subject in binding.get("subjects", [])
    )


# --- NATS ---


def test_the_nats_config_map_holds_the_committed_config_files_unchanged(nats: Obj, rendered: list[Obj]) -> None:
    config_volume = _volume(nats, "config")
    config_map = _one(rendered, "ConfigMap", config_volume["configMap"]["name"])
    container = _container(nats, "nats")

    assert config_map["metadata"]["name"].startswith("quotient-nats-config-"), "the name carries a content hash"
    for name in ("nats.conf", "auth.conf"):
        assert config_map["data"][name] == (BASE / "nats" / name).read_text(), name
    mount = _mount_of(container, "config")
    assert container["args"] == ["--config", f"{mount['mountPath']}/nats.conf"]


def test_the_nats_server_gets_every_user_key_that_auth_conf_reads_from_the_users_secret(nats: Obj) -> None:
    auth_conf = (BASE / "nats" / "auth.conf").read_text()
    secrets = list(yaml.safe_load_all(natskeys.render_secrets(NAMESPACE)))
    users = _one(secrets, "Secret", natskeys.USERS_SECRET)

    read = set(re.findall(r"^\s*nkey:\s*\$(\w+)\s*$", auth_conf, flags=re.MULTILINE))
    assert read == {natskeys.env_name(role) for role in natskeys.ROLES}
    assert read == set(users["stringData"])
    assert {"secretRef": {"name": natskeys.USERS_SECRET}} in _container(nats, "nats")["envFrom"]


def test_the_nats_server_keeps_jetstream_on_its_volume_and_listens_where_the_service_points(
    nats: Obj, rendered: list[Obj]
) -> None:
    nats_conf = (BASE / "nats" / "nats.conf").read_text()
    container = _container(nats, "nats")
    store_dir = re.search(r"^\s*store_dir:\s*(\S+)\s*$", nats_conf, flags=re.MULTILINE)
    client_port = re.search(r"^port:\s*(\d+)\s*$", nats_conf, flags=re.MULTILINE)
    monitor_port = re.search(r"^http_port:\s*(\d+)\s*$", nats_conf, flags=re.MULTILINE)
    assert store_dir and client_port and monitor_port

    assert nats["spec"]["replicas"] == 1
    claims = [claim["metadata"]["name"] for claim in nats["spec"]["volumeClaimTemplates"]]
    assert claims == ["data"]
    assert _mount_of(container, "data")["mountPath"] == store_dir.group(1)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"client": int(client_port.group(1)), "monitor": int(monitor_port.group(1))}
    service = _one(rendered, "Service", "quotient-nats")
    assert service["spec"]["selector"].items() <= nats["spec"]["template"]["metadata"]["labels"].items()
    assert {(port["port"], port["targetPort"]) for port in service["spec"]["ports"]} == {
        (4222, "client"),
        (8222, "monitor"),
    }
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "monitor", probe


def test_the_nats_server_runs_unprivileged_with_a_read_only_root(nats: Obj) -> None:
    pod = nats["spec"]["template"]["spec"]
    context = _container(nats, "nats")["securityContext"]

    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert _container(nats, "nats")["resources"]["limits"]["memory"]

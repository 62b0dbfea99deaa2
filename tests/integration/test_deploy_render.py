"""deploy/base renders with kustomize, every object is valid Kubernetes 1.32, and the parts that matter say so.

Schema validity (strict: unknown fields fail, so a misspelt ``hostPid`` cannot pass) is necessary but says nothing
about intent; the semantic checks below pin what the agent and NATS need and why: the agent sees host pids through
a read-only /proc, knows its node from the downward API, sends NATS the projected token the auth callout checks (or,
in the static-nkeys overlay, reads its nkey seed from the Secret that ``quotient nats-keys`` makes), and the NATS
server gets its config and the keys from where the other pieces put them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from agent import app as agent_app
from common import config, names, quantities
from quotient import natskeys
from tests.conftest import REPO, require_tool

pytestmark = pytest.mark.integration

BASE = REPO / "deploy" / "base"
NAMESPACE = "quotient-system"
KUBERNETES_VERSION = "1.32"
# The flags of `quotient agent` that deploy may pass (agent/app.py accepts more: --fake-gpus is for emulated nodes).
AGENT_FLAGS = {
    "--node",
    "--nats",
    "--nats-token-file",
    "--nats-nkey-seed",
    "--nats-ca",
    "--interval",
    "--metrics-port",
    "--proc-root",
    "--dcgm-names",
}

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


def test_the_agent_sends_nats_a_projected_token_for_the_callouts_audience_from_where_it_reads_it(agent: Obj) -> None:
    from scheduler.natsauth import callout

    container = _container(agent, "agent")
    volume = _volume(agent, "nats-token")["projected"]
    [source] = [source["serviceAccountToken"] for source in volume["sources"]]
    mount = _mount_of(container, "nats-token")
    defaults = {setting.name: setting.default for setting in callout.SETTINGS}

    # No flag: the agent's default token path is where the volume is mounted, and the seed flag would override it.
    assert "--nats-token-file" not in _flags(container) and "--nats-nkey-seed" not in _flags(container)
    assert PurePosixPath(mount["mountPath"]) / source["path"] == PurePosixPath(str(agent_app.DEFAULT_TOKEN_FILE))
    assert mount["readOnly"] is True
    assert source["audience"] == defaults["nats_callout_audience"] == names.NATS_TOKEN_AUDIENCE
    assert 600 <= source["expirationSeconds"] <= 24 * 3600
    # Readable by the agent's group (fsGroup), by no one else.
    assert volume["defaultMode"] & 0o007 == 0
    assert agent["spec"]["template"]["spec"]["securityContext"]["fsGroup"] is not None
    namespace, _, account = str(defaults["nats_callout_agent_account"]).partition("/")
    assert (agent["metadata"]["namespace"], agent["spec"]["template"]["spec"]["serviceAccountName"]) == (
        namespace,
        account,
    )


def _assert_dials_every_nats_server_over_tls_with_the_ca_pinned(
    workload: Obj, container: Obj, rendered: list[Obj]
) -> None:
    """``--nats`` lists every pod of the NATS StatefulSet by its name under the headless Service, over TLS, on the
    client port; ``--nats-ca`` is the CA the ConfigMap of ``quotient nats-keys`` holds, mounted read-only."""
    from quotient import natscerts

    flags = _flags(container)
    nats = _one(rendered, "StatefulSet", "quotient-nats")
    headless = _one(rendered, "Service", nats["spec"]["serviceName"])
    namespace = nats["metadata"]["namespace"]
    client_port = next(p["containerPort"] for p in _container(nats, "nats")["ports"] if p["name"] == "client")
    urls = [urlsplit(url) for url in flags["--nats"].split(",")]

    assert [url.scheme for url in urls] == ["tls"] * nats["spec"]["replicas"]
    assert [url.hostname for url in urls] == [
        f"quotient-nats-{i}.{headless['metadata']['name']}.{namespace}.svc" for i in range(nats["spec"]["replicas"])
    ]
    assert {url.port for url in urls} == {client_port}
    # The certificate (quotient nats-keys's; cert-manager's carries the same names) covers every name dialled.
    patterns = natscerts.dns_names(namespace)
    for url in urls:
        assert f"*.{url.hostname.partition('.')[2]}" in patterns
    ca_path = PurePosixPath(flags["--nats-ca"])
    volume = _volume(workload, "nats-ca")
    mount = _mount_of(container, "nats-ca")
    assert volume["configMap"]["name"] == natskeys.CA_CONFIG_MAP
    assert volume["configMap"]["items"] == [{"key": "ca.crt", "path": ca_path.name}]
    assert mount["readOnly"] is True and PurePosixPath(mount["mountPath"]) == ca_path.parent


def test_the_agent_dials_every_nats_server_over_tls_with_the_ca_pinned(agent: Obj, rendered: list[Obj]) -> None:
    _assert_dials_every_nats_server_over_tls_with_the_ca_pinned(agent, _container(agent, "agent"), rendered)


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
    secrets = list(yaml.safe_load_all(natskeys.render_secrets(NAMESPACE)))
    users = _one(secrets, "Secret", natskeys.USERS_SECRET)

    read = {
        path.parent.name: set(re.findall(r"^\s*(?:nkey|issuer):\s*\$(\w+)\s*$", path.read_text(), flags=re.MULTILINE))
        for path in (BASE / "nats" / "auth.conf", OVERLAY_STATIC_NKEYS / "auth.conf")
    }
    # The base: the scheduler and readers, and the callout's issuer; the agents come through the callout.
    assert read["nats"] == {natskeys.env_name(role) for role in ("scheduler", "reader", natskeys.CALLOUT)}
    # Without the callout: the three users, the agents sharing one.
    assert read["static-nkeys"] == {natskeys.env_name(role) for role in natskeys.ROLES}
    assert read["nats"] | read["static-nkeys"] == set(users["stringData"])
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

    cluster_port = re.search(r"^cluster \{.*?^\s*port:\s*(\d+)\s*$", nats_conf, flags=re.MULTILINE | re.DOTALL)
    assert cluster_port

    assert nats["spec"]["replicas"] == 3
    claims = [claim["metadata"]["name"] for claim in nats["spec"]["volumeClaimTemplates"]]
    assert claims == ["data"]
    assert _mount_of(container, "data")["mountPath"] == store_dir.group(1)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "client": int(client_port.group(1)),
        "cluster": int(cluster_port.group(1)),
        "monitor": int(monitor_port.group(1)),
    }
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


# --- the scheduler, its CRDs, KAI's default queues, the kai-compat overlay and the examples ---
#
# Our custom resources have no schema in kubernetes_validate: they are checked against the openAPIV3Schema of our
# own CRDs (as rendered), made strict the way the API server's field validation is (an unknown field fails).

OVERLAY_KAI = REPO / "deploy" / "overlays" / "kai-compat"
OVERLAY_STATIC_NKEYS = REPO / "deploy" / "overlays" / "static-nkeys"
EXAMPLES = REPO / "deploy" / "examples"
DOCKERFILE_SCHEDULER = REPO / "docker" / "Dockerfile.scheduler"
OUR_GROUP = "scheduling.run.ai"
# Built-in kinds that have no namespace.
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}


def _render(path: object) -> list[Obj]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered_kai(rendered: list[Obj]) -> list[Obj]:
    return _render(OVERLAY_KAI)


def _strict(schema: Any) -> Any:
    """A CRD schema as the API server applies it to a create: unknown fields fail (except where preserved)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        strict["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


@pytest.fixture(scope="module")
def crd_validators(rendered: list[Obj]) -> dict[tuple[str, str], Any]:
    import jsonschema  # type: ignore[import-untyped]

    validators: dict[tuple[str, str], Any] = {}
    for crd in _by_kind(rendered, "CustomResourceDefinition"):
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            jsonschema.Draft7Validator.check_schema(schema)
            validators[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = jsonschema.Draft7Validator(
                schema
            )
    return validators


def _validate_objects(objects: Sequence[Obj], crd_validators: Mapping[tuple[str, str], Any], where: str) -> None:
    for obj in objects:
        label = f"{where}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].startswith(OUR_GROUP + "/"):
            validator = crd_validators.get((obj["apiVersion"], obj["kind"]))
            assert validator is not None, f"{label}: no CRD serves {obj['apiVersion']} {obj['kind']}"
            problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
            assert problems == [], f"{label}: {problems}"
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{label}: {'.'.join(str(part) for part in exc.path)}: {exc.message}")


def _examples() -> list[tuple[str, Obj]]:
    found = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((str(path.relative_to(EXAMPLES)), doc))
    return found


def _scheduler(objects: Sequence[Obj]) -> Obj:
    return _one(objects, "Deployment", "quotient-scheduler")


def _rules(objects: Sequence[Obj], kind: str, name: str) -> list[Obj]:
    rules: list[Obj] = _one(objects, kind, name)["rules"]
    return rules


def _allows(rules: Sequence[Obj], group: str, resource: str, verb: str) -> bool:
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules)


def test_the_base_and_the_kai_overlay_are_valid_built_in_objects_and_valid_custom_resources(
    rendered: list[Obj], rendered_kai: list[Obj], crd_validators: Mapping[tuple[str, str], Any]
) -> None:
    _validate_objects(rendered, crd_validators, "base")
    _validate_objects(rendered_kai, crd_validators, "kai-compat")


def test_namespaced_objects_live_in_the_quotient_namespace_and_cluster_scoped_ones_in_none(
    rendered: list[Obj],
) -> None:
    """The reservation pods' own objects (their ServiceAccount, the roles to make and report them) live in the
    reservation namespace, apart from the workloads and from quotient-system, as KAI keeps its own."""
    cluster_scoped_custom = {
        crd["spec"]["names"]["kind"]
        for crd in _by_kind(rendered, "CustomResourceDefinition")
        if crd["spec"]["scope"] == "Cluster"
    }
    for obj in rendered:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CLUSTER_SCOPED or obj["kind"] in cluster_scoped_custom:
            assert "namespace" not in obj["metadata"], label
        elif (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "gpu-reservation":
            assert obj["metadata"].get("namespace") == "quotient-reservation", label
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, label
    namespaces = {obj["metadata"]["name"] for obj in _by_kind(rendered, "Namespace")}
    assert namespaces == {NAMESPACE, "quotient-reservation"}


def test_the_queue_and_podgroup_crds_have_kais_names_scopes_status_and_printer_columns(rendered: list[Obj]) -> None:
    queue = _one(rendered, "CustomResourceDefinition", "queues.scheduling.run.ai")["spec"]
    group = _one(rendered, "CustomResourceDefinition", "podgroups.scheduling.run.ai")["spec"]

    assert (queue["group"], queue["scope"], queue["names"]["plural"]) == (OUR_GROUP, "Cluster", "queues")
    assert [v["name"] for v in queue["versions"]] == ["v2"]
    assert (group["group"], group["scope"], group["names"]["plural"]) == (OUR_GROUP, "Namespaced", "podgroups")
    assert "pg" in group["names"]["shortNames"]
    assert [v["name"] for v in group["versions"]] == ["v2alpha2"]
    for crd in (queue, group):
        [version] = crd["versions"]
        assert version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        schema = version["schema"]["openAPIV3Schema"]
        for column in version["additionalPrinterColumns"]:
            if column["jsonPath"].startswith(".metadata."):
                continue  # ObjectMeta: the API server's own schema
            node = schema
            for part in column["jsonPath"].strip(".").split("."):
                node = node["properties"][part]
            assert node["type"] == column["type"] or (column["type"] == "string" and node["type"] == "array"), column
    queue_spec = queue["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {"parentQueue", "priority", "displayName", "resources", "preemptMinRuntime", "reclaimMinRuntime"} <= set(
        queue_spec
    )
    for resource in ("gpu", "cpu", "memory"):
        assert set(queue_spec["resources"]["properties"][resource]["properties"]) == {
            "quota",
            "limit",
            "overQuotaWeight",
        }
    queue_status = queue["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"allocated", "allocatedNonPreemptible", "requested", "childQueues", "conditions"} <= set(queue_status)
    group_schema = group["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert {"minMember", "queue", "priorityClassName", "preemptibility", "subGroups"} <= set(
        group_schema["spec"]["properties"]
    )
    assert group_schema["spec"]["properties"]["preemptibility"]["enum"] == ["preemptible", "non-preemptible"]
    assert "schedulingConditions" in group_schema["status"]["properties"]


def test_kais_default_queues_give_unlabelled_pods_somewhere_to_go(rendered: list[Obj]) -> None:
    parent = _one(rendered, "Queue", "default-parent-queue")
    leaf = _one(rendered, "Queue", "default-queue")

    assert "parentQueue" not in parent["spec"]
    assert leaf["spec"]["parentQueue"] == "default-parent-queue"
    for queue in (parent, leaf):
        for resource in ("gpu", "cpu", "memory"):
            assert queue["spec"]["resources"][resource] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}


def test_the_seeds_queues_and_kais_podgroups_are_valid_against_our_crds(
    crd_validators: Mapping[tuple[str, str], Any],
) -> None:
    from tests.conftest import shared_path

    seeds = [doc for doc in yaml.safe_load_all(shared_path("seeds", "queues.yaml").read_text()) if doc]
    pod_group: Obj = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "pg-train-0-4a3c", "namespace": "ml", "annotations": {}},
        "spec": {
            "minMember": 4,
            "queue": "test",
            "priorityClassName": "train",
            "preemptibility": "preemptible",
            "subGroups": [{"name": "workers", "minMember": 3, "parent": "all"}],
        },
        "status": {
            "schedulingConditions": [
                {
                    "type": "UnschedulableOnNodePool",
                    "nodePool": "default",
                    "reason": "Unschedulable",
                    "message": "OverLimit: queue test is at its GPU limit",
                    "reasons": [{"reason": "OverLimit", "message": "queue test is at its GPU limit"}],
                    "transitionID": "3",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "status": "True",
                }
            ]
        },
    }

    assert [q["metadata"]["name"] for q in seeds] == ["default", "test"]
    _validate_objects([*seeds, pod_group], crd_validators, "seeds")
    misspelt = {**pod_group, "spec": {**pod_group["spec"], "minMembers": 4}}
    assert list(crd_validators[("scheduling.run.ai/v2alpha2", "PodGroup")].iter_errors(misspelt))


def test_the_scheduler_passes_only_flags_that_quotient_scheduler_accepts(rendered: list[Obj]) -> None:
    from scheduler import settings as scheduler_settings

    container = _container(_scheduler(rendered), "scheduler")
    flags = _flags(container)
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_arguments(parser, scheduler_settings.SETTINGS)
    settings = {setting.flag: setting for setting in scheduler_settings.SETTINGS}

    assert container["command"] == ["quotient", "scheduler"]
    env_names = set(_env(container))
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: m.group(1).lower(), arg) for arg in container["args"]]
    for arg in container["args"]:
        for variable in re.findall(r"\$\((\w+)\)", arg):
            assert variable in env_names, f"{arg} names ${variable}, which the container does not define"
    _, unknown = parser.parse_known_args(expanded)
    assert unknown == []
    for flag, value in flags.items():
        parse = settings[flag].parse
        if parse in (config.parse_existing_file, config.parse_existing_dir):
            continue  # paths in the pod, checked against its mounts
        parse(re.sub(r"\$\((\w+)\)", "x", value))
    assert flags["--scheduler-name"] == "quotient"
    assert int(flags["--metrics-port"]) == 8080


def test_the_scheduler_runs_two_leader_elected_replicas_named_by_the_downward_api(rendered: list[Obj]) -> None:
    deployment = _scheduler(rendered)
    container = _container(deployment, "scheduler")
    flags = _flags(container)
    env = _env(container)

    assert deployment["spec"]["replicas"] == 2
    assert flags["--identity"] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert flags["--lease-namespace"] == "$(POD_NAMESPACE)"
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = _one(rendered, "PodDisruptionBudget", "quotient-scheduler")
    assert budget["spec"]["minAvailable"] == 1
    assert (
        budget["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_the_lease_role_lets_the_scheduler_create_and_renew_only_its_own_lease(rendered: list[Obj]) -> None:
    role = _one(rendered, "Role", "quotient-scheduler-leader-election")
    binding = _one(rendered, "RoleBinding", "quotient-scheduler-leader-election")
    from scheduler import settings as scheduler_settings

    lease_name = next(s.default for s in scheduler_settings.SETTINGS if s.name == "lease_name")

    assert role["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "quotient-scheduler", "namespace": NAMESPACE}]
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"]
        assert rule["resources"] == ["leases"]
        if "resourceNames" in rule:
            assert rule["resourceNames"] == [lease_name]
            assert set(rule["verbs"]) == {"get", "update"}
        else:
            assert rule["verbs"] == ["create"], "create alone cannot be limited to a name"


# Every (API group, resource, verb) the scheduler's ClusterRole grants, each used by the scheduler
# (tests/e2e/test_rbac.py runs it with exactly these rights and checks each was used): a change here is a change of
# the scheduler's rights, to be made in clusterrole.yaml with its reason.
SCHEDULER_CLUSTER_RIGHTS = {
    *(("", "pods", verb) for verb in ("get", "list", "watch", "patch", "delete")),
    ("", "pods/binding", "create"),
    ("", "pods/status", "patch"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("scheduling.k8s.io", "priorityclasses", "list"),
    ("scheduling.k8s.io", "priorityclasses", "watch"),
    (OUR_GROUP, "queues", "list"),
    (OUR_GROUP, "queues", "watch"),
    (OUR_GROUP, "podgroups", "list"),
    (OUR_GROUP, "podgroups", "watch"),
    (OUR_GROUP, "podgroups", "create"),
    (OUR_GROUP, "podgroups", "patch"),
    (OUR_GROUP, "queues/status", "patch"),
    (OUR_GROUP, "podgroups/status", "patch"),
    *(("apps", owner, "get") for owner in ("deployments", "replicasets", "statefulsets")),
    *(("batch", owner, "get") for owner in ("jobs", "cronjobs")),
    *(("kubeflow.org", owner, "get") for owner in ("pytorchjobs", "tfjobs", "mpijobs")),
    *(("ray.io", owner, "get") for owner in ("rayclusters", "rayjobs")),
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
}


def _grants(rules: Sequence[Obj]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_cluster_role_grants_exactly_what_the_scheduler_uses(rendered: list[Obj]) -> None:
    rules = _rules(rendered, "ClusterRole", "quotient-scheduler")
    binding = _one(rendered, "ClusterRoleBinding", "quotient-scheduler")
    deployment = _scheduler(rendered)

    assert _grants(rules) == SCHEDULER_CLUSTER_RIGHTS
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "quotient-scheduler",
    }


def test_no_role_of_the_scheduler_grants_anything_on_namespaces_secrets_or_node_writes(rendered: list[Obj]) -> None:
    """deploy/ creates its namespaces itself, so the scheduler needs no right on them (issue 12)."""
    bound = [
        binding["roleRef"]
        for binding in _by_kind(rendered, "ClusterRoleBinding") + _by_kind(rendered, "RoleBinding")
        if {"kind": "ServiceAccount", "name": "quotient-scheduler", "namespace": NAMESPACE} in binding["subjects"]
    ]
    granted = set()
    for ref in bound:
        [role] = [obj for obj in _by_kind(rendered, ref["kind"]) if obj["metadata"]["name"] == ref["name"]]
        granted |= _grants(role["rules"])
    assert {resource for _, resource, _ in granted} & {"namespaces", "secrets", "pods/eviction"} == set()
    assert {verb for group, resource, verb in granted if (group, resource) == ("", "nodes")} == {"list", "watch"}
    assert not any(group in ("apps", "batch") and verb != "get" for group, _, verb in granted)


def test_every_rule_of_the_schedulers_roles_says_why_in_a_comment_beside_it() -> None:
    """A rule is justified by the comment lines right above it (clusterrole.yaml, the reservation roles, the webhook
    role; role.yaml says why for each verb)."""
    for path in (
        BASE / "scheduler" / "clusterrole.yaml",
        BASE / "scheduler" / "callout-rbac.yaml",
        BASE / "reservations" / "rbac.yaml",
        BASE / "webhook" / "rbac.yaml",
    ):
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                assert lines[index - 1].strip().startswith("#"), f"{path.name}:{index + 1} has no comment"
    role = (BASE / "scheduler" / "role.yaml").read_text()
    for verb in ("create", "get, update"):
        assert f"#   {verb}" in role, f"role.yaml does not say why it grants {verb}"


def test_the_base_makes_both_namespaces_the_scheduler_writes_into_before_anything_else(rendered: list[Obj]) -> None:
    from scheduler import settings as scheduler_settings

    defaults = {s.name: s.default for s in scheduler_settings.SETTINGS}
    namespaces = {obj["metadata"]["name"] for obj in _by_kind(rendered, "Namespace")}
    assert {defaults["lease_namespace"], defaults["reservation_namespace"]} <= namespaces
    kinds = [obj["kind"] for obj in rendered]
    assert kinds[: len(namespaces)] == ["Namespace"] * len(namespaces), "kubectl apply must create them first"


def test_the_scheduler_reads_its_nkey_seed_from_the_secret_that_nats_keys_makes_and_dials_nats(
    rendered: list[Obj],
) -> None:
    deployment = _scheduler(rendered)
    container = _container(deployment, "scheduler")
    flags = _flags(container)
    seed_path = PurePosixPath(flags["--nats-nkey-seed"])

    secret = _volume(deployment, "nats-seed")["secret"]
    assert secret["secretName"] == natskeys.seed_secret_name("scheduler") == "quotient-nats-scheduler"
    assert secret["items"] == [{"key": natskeys.SEED_KEY, "path": seed_path.name}]
    assert secret["defaultMode"] & 0o007 == 0
    mount = _mount_of(container, "nats-seed")
    assert mount["readOnly"] is True
    assert PurePosixPath(mount["mountPath"]) == seed_path.parent
    _assert_dials_every_nats_server_over_tls_with_the_ca_pinned(deployment, container, rendered)
    assert flags["--telemetry-stream-replicas"] == str(
        _one(rendered, "StatefulSet", "quotient-nats")["spec"]["replicas"]
    )


def test_the_scheduler_is_probed_on_its_metrics_port_and_runs_unprivileged(rendered: list[Obj]) -> None:
    deployment = _scheduler(rendered)
    container = _container(deployment, "scheduler")
    pod = deployment["spec"]["template"]["spec"]
    port = int(_flags(container)["--metrics-port"])

    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        # /healthz, not /readyz: a standby is healthy, and a never-ready standby would stall every rollout.
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not pod.get("hostPID", False) and not pod.get("hostNetwork", False)
    for kind, parse in [("cpu", quantities.parse_millicores), ("memory", quantities.parse_bytes)]:
        assert 0 < parse(container["resources"]["requests"][kind]) <= parse(container["resources"]["limits"][kind])


def test_the_scheduler_image_runs_the_command_and_port_the_deployment_expects(rendered: list[Obj]) -> None:
    dockerfile = DOCKERFILE_SCHEDULER.read_text()
    container = _container(_scheduler(rendered), "scheduler")
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, flags=re.MULTILINE)
    exposed = re.findall(r"^EXPOSE (\d+)$", dockerfile, flags=re.MULTILINE)

    assert entrypoint is not None
    assert yaml.safe_load(entrypoint.group(1)) == container["command"]
    assert exposed == [_flags(container)["--metrics-port"]]
    assert re.search(r"^USER 65532:65532$", dockerfile, flags=re.MULTILINE)
    assert container["image"].startswith("ghcr.io/quotient-sched/quotient-scheduler:")


def test_the_kai_compat_overlay_adds_kai_scheduler_to_the_names_and_changes_nothing_else(
    rendered: list[Obj], rendered_kai: list[Obj]
) -> None:
    base_args = _container(_scheduler(rendered), "scheduler")["args"]
    kai_args = _container(_scheduler(rendered_kai), "scheduler")["args"]

    assert _flags(_container(_scheduler(rendered_kai), "scheduler"))["--scheduler-name"] == "quotient,kai-scheduler"
    assert kai_args[1:] == base_args[1:]

    def changed(obj: Obj) -> bool:
        return (obj["kind"], obj["metadata"]["name"]) in {
            ("Deployment", "quotient-scheduler"),
            ("MutatingWebhookConfiguration", "quotient-gpu-sharing"),
        }

    assert [obj for obj in rendered_kai if not changed(obj)] == [obj for obj in rendered if not changed(obj)]
    hook = next(obj for obj in rendered_kai if obj["kind"] == "MutatingWebhookConfiguration")
    expression = hook["webhooks"][0]["matchConditions"][0]["expression"]
    assert "'kai-scheduler'" in expression and "'quotient'" in expression


def test_the_examples_are_valid_and_name_our_scheduler_and_queues_that_exist(
    rendered: list[Obj], crd_validators: Mapping[tuple[str, str], Any]
) -> None:
    examples = _examples()
    queues = {q["metadata"]["name"] for _, q in examples if q["kind"] == "Queue"} | {
        q["metadata"]["name"] for q in _by_kind(rendered, "Queue")
    }
    leaf_queues = (
        queues - {q["spec"].get("parentQueue") for _, q in examples if q["kind"] == "Queue"} - {"default-parent-queue"}
    )

    assert {path.split("/")[0] for path, _ in examples} >= {"queues.yaml", "talk", "vcluster", "vllm"}
    _validate_objects([doc for _, doc in examples], crd_validators, "examples")
    for path, doc in examples:
        template = doc["spec"]["template"] if doc["kind"] == "Deployment" else doc
        if doc["kind"] not in ("Pod", "Deployment"):
            continue
        scheduler = template["spec"].get("schedulerName")
        if path == "talk/research-pod.yaml":
            assert scheduler is None, "the research team keeps the default scheduler"
            continue
        assert scheduler == "quotient", path
        queue = template["metadata"].get("labels", {}).get("kai.scheduler/queue", "default-queue")
        assert queue in leaf_queues, f"{path}: queue {queue!r} is not a leaf queue of the examples or the base"
    namespaces = {doc["metadata"]["name"] for _, doc in examples if doc["kind"] == "Namespace"}
    for path, doc in examples:
        namespace = doc["metadata"].get("namespace")
        assert namespace is None or namespace in namespaces, f"{path}: namespace {namespace} is not created"


def test_the_examples_fractions_are_the_shares_of_the_seeds_workflows() -> None:
    fractions = {}
    for path, doc in _examples():
        template = doc["spec"]["template"] if doc["kind"] == "Deployment" else doc
        if doc["kind"] in ("Pod", "Deployment"):
            fraction = template["metadata"].get("annotations", {}).get("gpu-fraction")
            if fraction is not None:
                fractions[path] = fraction

    assert fractions == {
        "talk/gpu-sharing.yaml": "0.5",
        "talk/inference-pod.yaml": "0.25",
        "vllm/vllm-test-02.yaml": "0.2",
        "vllm/vllm-test-07.yaml": "0.7",
    }


# --- the admission webhook of GPU sharing, and the cert-manager overlay ---

OVERLAY_CERT_MANAGER = REPO / "deploy" / "overlays" / "cert-manager"
WEBHOOK_CONFIGURATION = "quotient-gpu-sharing"
QUEUE_WEBHOOK_CONFIGURATION = "quotient-queue-validation"
PODGROUP_WEBHOOK_CONFIGURATION = "quotient-podgroup-validation"
CERT_MANAGER_GROUP = "cert-manager.io"


def _webhook_entry(objects: Sequence[Obj]) -> Obj:
    [entry] = _one(objects, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)["webhooks"]
    result: Obj = entry
    return result


def _webhook_settings(container: Obj) -> Any:
    """The webhook settings the container's environment gives ``quotient scheduler`` (downward API values faked)."""
    from scheduler import settings as scheduler_settings

    environ = {
        entry["name"]: entry.get("value", NAMESPACE if "fieldRef" in entry.get("valueFrom", {}) else "")
        for entry in container.get("env", [])
    }
    values = config.resolve(scheduler_settings.WEBHOOK_SETTINGS, argparse.Namespace(), environ=environ, file_values={})
    return scheduler_settings.webhook_settings_from(values)


def test_the_webhook_configuration_calls_the_service_onto_the_port_every_scheduler_replica_serves(
    rendered: list[Obj],
) -> None:
    from scheduler.kube import webhook

    deployment = _scheduler(rendered)
    container = _container(deployment, "scheduler")
    settings = _webhook_settings(container)
    entry = _webhook_entry(rendered)
    service_ref = entry["clientConfig"]["service"]
    service = _one(rendered, "Service", service_ref["name"])
    [port] = [p for p in service["spec"]["ports"] if p["port"] == service_ref["port"]]

    assert settings.configuration == WEBHOOK_CONFIGURATION
    assert (service_ref["name"], service_ref["namespace"]) == (settings.service, settings.namespace)
    assert service["metadata"]["namespace"] == service_ref["namespace"] == NAMESPACE
    assert service_ref["path"] == webhook.MUTATE_PATH
    assert {"name": port["targetPort"], "containerPort": settings.port, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert _env(container)["QUOTIENT_WEBHOOK_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert "caBundle" not in entry["clientConfig"], "each replica writes its own CA; apply must not erase them"
    assert settings.certificates is webhook.CertificateSource.SELF_SIGNED


def test_the_webhook_is_sent_only_pod_creations_of_our_scheduler_names_that_ask_for_a_gpu_share(
    rendered: list[Obj],
) -> None:
    entry = _webhook_entry(rendered)
    conditions = {condition["name"]: condition["expression"] for condition in entry["matchConditions"]}
    scheduler_names = _flags(_container(_scheduler(rendered), "scheduler"))["--scheduler-name"].split(",")

    assert entry["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert entry["admissionReviewVersions"] == ["v1"] and entry["sideEffects"] == "None"
    # Fail: a share must never start without its GPU wiring; matchConditions keep everyone else out of reach.
    assert entry["failurePolicy"] == "Fail"
    assert 1 <= entry["timeoutSeconds"] <= 10
    excluded = {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["kube-system", "quotient-reservation"],
    }
    assert excluded in entry["namespaceSelector"]["matchExpressions"]
    assert "objectSelector" not in entry
    assert set(conditions) == {"scheduled-by-quotient", "asks-for-a-gpu-share"}
    assert re.findall(r"'([^']*)'", conditions["scheduled-by-quotient"]) == scheduler_names
    assert set(re.findall(r"'([^']*)'", conditions["asks-for-a-gpu-share"])) == {
        names.GPU_FRACTION_ANNOTATION,
        names.GPU_MEMORY_ANNOTATION,
        names.GPU_FRACTION_NUM_DEVICES_ANNOTATION,
        names.GPU_FRACTION_CONTAINER_ANNOTATION,
        names.GPU_COMPUTE_SHARING_MODE_ANNOTATION,
        names.CONTAINER_ANNOTATION_PREFIX,
    }
    # KAI v0.18's per-container keys (.gpu-memory.request, .gpu-memory.limit, .gpu-compute.mode and the binder's
    # .gpus.devices) carry the container's name: the condition matches every key under their prefix.
    assert (
        f"object.metadata.annotations.exists(key, key.startsWith('{names.CONTAINER_ANNOTATION_PREFIX}'))"
        in " ".join(conditions["asks-for-a-gpu-share"].split())
    )


def test_the_scheduler_may_read_and_update_its_own_webhook_configuration_and_no_other(rendered: list[Obj]) -> None:
    rules = _rules(rendered, "ClusterRole", "quotient-scheduler-webhook")
    binding = _one(rendered, "ClusterRoleBinding", "quotient-scheduler-webhook")

    assert rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [WEBHOOK_CONFIGURATION],
            "verbs": ["get", "update"],
        },
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [QUEUE_WEBHOOK_CONFIGURATION, PODGROUP_WEBHOOK_CONFIGURATION],
            "verbs": ["get", "update"],
        },
    ]
    assert binding["roleRef"]["name"] == "quotient-scheduler-webhook"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "quotient-scheduler", "namespace": NAMESPACE}]


@pytest.fixture(scope="module")
def rendered_cert_manager(rendered: list[Obj]) -> list[Obj]:
    return _render(OVERLAY_CERT_MANAGER)


def test_the_cert_manager_overlay_is_valid_and_changes_only_the_webhooks_certificate(
    rendered: list[Obj], rendered_cert_manager: list[Obj], crd_validators: Mapping[tuple[str, str], Any]
) -> None:
    def key(obj: Obj) -> tuple[str, str]:
        return (obj["kind"], obj["metadata"]["name"])

    built_in = [obj for obj in rendered_cert_manager if not obj["apiVersion"].startswith(CERT_MANAGER_GROUP + "/")]
    changed = {
        ("Deployment", "quotient-scheduler"),
        ("MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION),
        ("ValidatingWebhookConfiguration", QUEUE_WEBHOOK_CONFIGURATION),
        ("ValidatingWebhookConfiguration", PODGROUP_WEBHOOK_CONFIGURATION),
    }
    removed = {("ClusterRole", "quotient-scheduler-webhook"), ("ClusterRoleBinding", "quotient-scheduler-webhook")}

    _validate_objects(built_in, crd_validators, "cert-manager")
    assert {key(obj) for obj in rendered} - {key(obj) for obj in built_in} == removed
    assert [obj for obj in built_in if key(obj) not in changed] == [
        obj for obj in rendered if key(obj) not in changed | removed
    ]
    for obj in rendered_cert_manager:
        if obj["apiVersion"].startswith(CERT_MANAGER_GROUP + "/"):
            assert obj["apiVersion"] == "cert-manager.io/v1" and obj["kind"] in ("Issuer", "Certificate")
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_the_cert_manager_overlay_serves_the_certificate_whose_ca_it_injects(rendered_cert_manager: list[Obj]) -> None:
    from scheduler.kube import certs, webhook

    objects = rendered_cert_manager
    annotations = _one(objects, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)["metadata"]["annotations"]
    for validating in (QUEUE_WEBHOOK_CONFIGURATION, PODGROUP_WEBHOOK_CONFIGURATION):
        configuration = _one(objects, "ValidatingWebhookConfiguration", validating)
        assert configuration["metadata"]["annotations"] == annotations, "all trust the CA cert-manager injects"
    namespace, _, name = annotations["cert-manager.io/inject-ca-from"].partition("/")
    serving = _one(objects, "Certificate", name)
    deployment = _scheduler(objects)
    container = _container(deployment, "scheduler")
    settings = _webhook_settings(container)
    volume = _volume(deployment, "webhook-tls")
    mount = _mount_of(container, "webhook-tls")
    service_ref = _webhook_entry(objects)["clientConfig"]["service"]

    assert namespace == serving["metadata"]["namespace"] == NAMESPACE
    assert settings.certificates is webhook.CertificateSource.PROVIDED
    assert str(settings.cert_dir) == mount["mountPath"] and mount["readOnly"] is True
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    # The API server reaches the Service by these names; the certificate must carry them.
    assert set(serving["spec"]["dnsNames"]) == set(
        certs.dns_names(service=service_ref["name"], namespace=service_ref["namespace"])[:2]
    )
    assert "server auth" in serving["spec"]["usages"]
    # A CA of our own signs the serving certificate, so its renewals leave the injected caBundle alone.
    ca_issuer = _one(objects, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca_certificate = next(
        c for c in _by_kind(objects, "Certificate") if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
    )
    assert ca_certificate["spec"]["isCA"] is True
    assert _one(objects, "Issuer", ca_certificate["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    assert quantities.parse_duration_s(ca_certificate["spec"]["duration"]) > 2 * quantities.parse_duration_s(
        serving["spec"]["duration"]
    )


# --- KAI v0.15-v0.18: the PodGroup's new fields, KAI's PriorityClasses, the queue webhook ---

KAI_MANIFESTS = REPO / "tests" / "integration" / "emulator" / "kai"


def test_kais_four_priority_classes_ship_with_the_base_without_a_preemption_policy(rendered: list[Obj]) -> None:
    classes = {obj["metadata"]["name"]: obj for obj in _by_kind(rendered, "PriorityClass")}

    assert {name: obj["value"] for name, obj in classes.items()} == names.KAI_PRIORITY_CLASSES
    for name, obj in classes.items():
        # preemptionPolicy Never would mean "may not preempt"; KAI's chart leaves the API server's default.
        assert "preemptionPolicy" not in obj, name
        assert not obj.get("globalDefault"), name
        assert "namespace" not in obj["metadata"], name


def test_the_queue_webhook_is_sent_queue_creations_and_updates_on_the_path_the_scheduler_serves(
    rendered: list[Obj],
) -> None:
    from scheduler.kube import webhook

    [entry] = _one(rendered, "ValidatingWebhookConfiguration", QUEUE_WEBHOOK_CONFIGURATION)["webhooks"]
    settings = _webhook_settings(_container(_scheduler(rendered), "scheduler"))
    mutating = _webhook_entry(rendered)

    assert settings.queue_configuration == QUEUE_WEBHOOK_CONFIGURATION
    assert entry["clientConfig"]["service"] == {
        **mutating["clientConfig"]["service"],
        "path": webhook.VALIDATE_QUEUES_PATH,
    }
    assert "caBundle" not in entry["clientConfig"], "each replica writes its own CA; apply must not erase them"
    assert entry["rules"] == [
        {
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [OUR_GROUP],
            "apiVersions": ["v2"],
            "resources": ["queues"],
            "scope": "Cluster",
        }
    ]
    assert entry["admissionReviewVersions"] == ["v1"] and entry["sideEffects"] == "None"
    assert entry["failurePolicy"] == "Fail" and 1 <= entry["timeoutSeconds"] <= 10
    # kustomize orders the configurations after the Queues, so a first install's queues are not sent to a webhook
    # whose replicas do not run yet.
    kinds = [obj["kind"] for obj in rendered]
    assert kinds.index("ValidatingWebhookConfiguration") > max(i for i, kind in enumerate(kinds) if kind == "Queue")
    assert _allows(_rules(rendered, "ClusterRole", "quotient-scheduler"), OUR_GROUP, "queues", "list")


def test_the_podgroup_webhook_is_sent_podgroup_creations_and_updates_on_the_path_the_scheduler_serves(
    rendered: list[Obj],
) -> None:
    from scheduler.kube import webhook

    [entry] = _one(rendered, "ValidatingWebhookConfiguration", PODGROUP_WEBHOOK_CONFIGURATION)["webhooks"]
    settings = _webhook_settings(_container(_scheduler(rendered), "scheduler"))
    mutating = _webhook_entry(rendered)

    assert settings.podgroup_configuration == PODGROUP_WEBHOOK_CONFIGURATION
    assert entry["clientConfig"]["service"] == {
        **mutating["clientConfig"]["service"],
        "path": webhook.VALIDATE_PODGROUPS_PATH,
    }
    assert webhook.VALIDATE_PODGROUPS_PATH == "/validate-scheduling-run-ai-v2alpha2-podgroup", "KAI's path"
    assert "caBundle" not in entry["clientConfig"], "each replica writes its own CA; apply must not erase them"
    # KAI's rules: creations and updates of the PodGroup itself (status writes are a subresource, not sent).
    assert entry["rules"] == [
        {
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [OUR_GROUP],
            "apiVersions": ["v2alpha2"],
            "resources": ["podgroups"],
            "scope": "Namespaced",
        }
    ]
    assert entry["admissionReviewVersions"] == ["v1"] and entry["sideEffects"] == "None"
    assert entry["failurePolicy"] == "Fail" and 1 <= entry["timeoutSeconds"] <= 10


def test_the_podgroup_crd_has_kais_v018_fields_with_zero_minimums_at_both_levels(rendered: list[Obj]) -> None:
    crd = _one(rendered, "CustomResourceDefinition", "podgroups.scheduling.run.ai")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    item = spec["subGroups"]["items"]["properties"]

    assert {"minSubGroup", "preemptionDelay", "stalenessGracePeriod", "topologyConstraint"} <= set(spec)
    assert spec["minMember"]["minimum"] == spec["minSubGroup"]["minimum"] == 0
    assert item["minMember"]["minimum"] == item["minSubGroup"]["minimum"] == 0
    assert {"name", "parent", "minMember", "minSubGroup", "topologyConstraint"} <= set(item)
    assert spec["preemptionDelay"]["type"] == spec["stalenessGracePeriod"]["type"] == "string"


def _kai_manifests() -> list[tuple[str, Obj]]:
    found = []
    for path in sorted(KAI_MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((path.name, doc))
    assert found, "no KAI manifests"
    return found


def test_kais_v015_to_v018_manifests_are_valid_against_our_crds_and_misspelt_ones_are_not(
    crd_validators: Mapping[tuple[str, str], Any],
) -> None:
    documents = _kai_manifests()
    for where, doc in documents:
        _validate_objects([doc], crd_validators, where)
    podgroups = [doc for _, doc in documents if doc["kind"] == "PodGroup"]
    assert {"preemptionDelay", "stalenessGracePeriod", "minSubGroup"} <= {key for pg in podgroups for key in pg["spec"]}
    validator = crd_validators[("scheduling.run.ai/v2alpha2", "PodGroup")]
    [tree] = [pg for pg in podgroups if pg["metadata"]["name"] == "replicated-serving"]
    for broken in (
        {**tree["spec"], "minMember": -1},
        {**tree["spec"], "minSubGroups": 1},
        {**tree["spec"], "subGroups": [{"name": "Replica_0"}]},
        {**tree["spec"], "subGroups": [{"name": "a", "minMember": "2"}]},
    ):
        assert list(validator.iter_errors({**tree, "spec": broken})), broken


# --- the NATS auth callout, and the fallback without it ---


def test_every_scheduler_replica_serves_the_auth_callout_with_the_key_nats_keys_makes(rendered: list[Obj]) -> None:
    deployment = _scheduler(rendered)
    container = _container(deployment, "scheduler")
    seed_path = PurePosixPath(_flags(container)["--nats-callout-issuer-seed"])

    secret = _volume(deployment, "nats-callout")["secret"]
    assert secret["secretName"] == natskeys.seed_secret_name(natskeys.CALLOUT) == "quotient-nats-callout"
    assert secret["items"] == [{"key": natskeys.SEED_KEY, "path": seed_path.name}]
    assert secret["defaultMode"] & 0o007 == 0
    mount = _mount_of(container, "nats-callout")
    assert mount["readOnly"] is True
    assert PurePosixPath(mount["mountPath"]) == seed_path.parent
    # Every replica, not only the leader: agents connect while the leader changes.
    assert deployment["spec"]["replicas"] >= 2


def test_the_callout_role_grants_token_reviews_and_nothing_else_to_the_scheduler(rendered: list[Obj]) -> None:
    binding = _one(rendered, "ClusterRoleBinding", "quotient-scheduler-auth-callout")
    account = _scheduler(rendered)["spec"]["template"]["spec"]["serviceAccountName"]

    assert _grants(_rules(rendered, "ClusterRole", "quotient-scheduler-auth-callout")) == {
        ("authentication.k8s.io", "tokenreviews", "create")
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == "quotient-scheduler-auth-callout"
    # The node of a cluster before 1.30 comes from the pod: a get the scheduler's own role grants already.
    assert _allows(_rules(rendered, "ClusterRole", "quotient-scheduler"), "", "pods", "get")


@pytest.fixture(scope="module")
def rendered_static_nkeys(rendered: list[Obj]) -> list[Obj]:
    return _render(OVERLAY_STATIC_NKEYS)


def test_the_static_nkeys_overlay_gives_agents_the_shared_seed_and_nats_the_users_instead_of_the_callout(
    rendered: list[Obj], rendered_static_nkeys: list[Obj], crd_validators: Mapping[tuple[str, str], Any]
) -> None:
    def key(obj: Obj) -> tuple[str, str]:
        name = obj["metadata"]["name"]
        return (obj["kind"], "quotient-nats-config" if name.startswith("quotient-nats-config-") else name)

    changed = {
        ("DaemonSet", "quotient-agent"),
        ("ConfigMap", "quotient-nats-config"),
        ("StatefulSet", "quotient-nats"),  # the ConfigMap's new name (its content's hash)
    }
    removed = {
        ("ClusterRole", "quotient-scheduler-auth-callout"),
        ("ClusterRoleBinding", "quotient-scheduler-auth-callout"),
    }
    _validate_objects(rendered_static_nkeys, crd_validators, "static-nkeys")
    assert {key(obj) for obj in rendered} - {key(obj) for obj in rendered_static_nkeys} == removed
    assert [obj for obj in rendered_static_nkeys if key(obj) not in changed] == [
        obj for obj in rendered if key(obj) not in changed | removed
    ]
    [config_map] = [obj for obj in rendered_static_nkeys if key(obj) == ("ConfigMap", "quotient-nats-config")]
    assert config_map["data"]["auth.conf"] == (OVERLAY_STATIC_NKEYS / "auth.conf").read_text()
    assert config_map["data"]["nats.conf"] == (BASE / "nats" / "nats.conf").read_text()
    nats = _one(rendered_static_nkeys, "StatefulSet", "quotient-nats")
    assert _volume(nats, "config")["configMap"]["name"] == config_map["metadata"]["name"]

    agent = _one(rendered_static_nkeys, "DaemonSet", "quotient-agent")
    container = _container(agent, "agent")
    seed_path = PurePosixPath(_flags(container)["--nats-nkey-seed"])
    secret = _volume(agent, "nats-seed")["secret"]
    assert secret["secretName"] == natskeys.seed_secret_name("agent")
    assert secret["items"] == [{"key": natskeys.SEED_KEY, "path": seed_path.name}]
    assert secret["defaultMode"] & 0o007 == 0
    mount = _mount_of(container, "nats-seed")
    assert mount["readOnly"] is True
    assert PurePosixPath(mount["mountPath"]) == seed_path.parent
    # The seed given wins over the projected token the base still mounts.
    values = {"nats_token_file": None, "nats_nkey_seed": str(seed_path)}
    assert agent_app.nats_credentials(values, default_token=REPO / "pyproject.toml") == (None, Path(str(seed_path)))

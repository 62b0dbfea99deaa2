"""The pure parts behind what a newcomer types: protobuf bodies, container logs, access reviews, impersonation, the
stand-in kube-scheduler's choice, the pod proxy's paths, the log options and the kubelet's Events."""

from __future__ import annotations

import pytest

from quotient.emulator import (
    accessreviews,
    authn,
    containerlogs,
    defaultscheduler,
    impersonation,
    kubeletevents,
    podlogs,
    podproxy,
    protobuf,
    rbac,
    status,
)
from quotient.emulator.containerlogs import ContainerLogs, LogOptions

# --- protobuf: a tiny encoder, as gogo-protobuf writes ---


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bool | str | bytes) -> bytes:
    if isinstance(value, (bool, int)):
        return _varint(number << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _message(*fields: bytes) -> bytes:
    return b"".join(fields)


def _body(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _message(_field(1, api_version), _field(2, kind))
    return b"k8s\x00" + _message(_field(1, type_meta), _field(2, raw), _field(3, ""), _field(4, ""))


def _meta(name: str) -> bytes:
    # Go writes every non-pointer field, empty ones too: the decoder must leave them out as JSON's omitempty does.
    return _message(_field(1, name), _field(2, ""), _field(3, ""), _field(5, ""), _field(7, 0), _field(8, b""))


def test_a_deployment_body_decodes_to_its_json_with_zeros_left_out_but_pointer_zeros_kept() -> None:
    container = _message(
        _field(1, "web"),
        _field(2, "nginx:1.27"),
        _field(5, ""),
        _field(6, _message(_field(1, ""), _field(2, 0), _field(3, 80), _field(4, "TCP"))),
        _field(8, b""),  # resources: {}
        _field(13, ""),
        _field(16, False),
    )
    template = _message(_field(1, _meta("")), _field(2, _message(_field(2, container), _field(3, "Always"))))
    selector = _message(_field(1, _message(_field(1, "app"), _field(2, "web"))))
    strategy = _message(_field(1, ""))  # DeploymentStrategy{}: an empty type
    spec = _message(_field(1, 0), _field(2, selector), _field(3, template), _field(4, strategy), _field(5, 0))
    status_bytes = _message(_field(1, 0), _field(2, 0))  # a status the create ignores
    decoded = protobuf.decode(
        _body("apps/v1", "Deployment", _message(_field(1, _meta("web")), _field(2, spec), _field(3, status_bytes)))
    )
    assert decoded == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 0,  # a pointer: zero replicas is what was asked
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx:1.27",
                            "ports": [{"containerPort": 80, "protocol": "TCP"}],
                            "resources": {},
                        }
                    ],
                    "restartPolicy": "Always",
                },
            },
            "strategy": {},
        },
    }


def test_repeated_empty_strings_inline_structs_and_int_or_string_decode_as_json_has_them() -> None:
    rule = _message(_field(1, "get"), _field(2, ""), _field(3, "pods"))
    role = protobuf.decode(
        _body("rbac.authorization.k8s.io/v1", "Role", _message(_field(1, _meta("r")), _field(2, rule)))
    )
    assert role["rules"] == [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]
    percent = _message(_field(1, 1), _field(2, 0), _field(3, "50%"))
    zero = _message(_field(1, 0), _field(2, 0), _field(3, ""))
    pdb = protobuf.decode(
        _body(
            "policy/v1",
            "PodDisruptionBudget",
            _message(_field(1, _meta("p")), _field(2, _message(_field(1, percent), _field(3, zero)))),
        )
    )
    assert pdb["spec"] == {"minAvailable": "50%", "maxUnavailable": 0}
    key_ref = _message(_field(1, _message(_field(1, "settings"))), _field(2, "mode"), _field(3, False))
    env = _message(_field(1, "MODE"), _field(3, _message(_field(3, key_ref))))
    pod = protobuf.decode(
        _body(
            "v1",
            "Pod",
            _message(_field(1, _meta("p")), _field(2, _message(_field(2, _message(_field(1, "c"), _field(7, env)))))),
        )
    )
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": False}}}
    ]


def test_a_field_the_emulator_does_not_read_is_refused_with_its_path_when_it_holds_data() -> None:
    affinity = _message(_field(1, _message(_field(1, _message(_field(1, "x"))))))
    spec = _message(_field(2, _message(_field(1, "c"))), _field(18, affinity))
    body = _body("v1", "Pod", _message(_field(1, _meta("p")), _field(2, spec)))
    with pytest.raises(
        protobuf.ProtobufError, match=r"Pod \(v1\) in protobuf: spec: field 18 .* send the object as JSON"
    ):
        protobuf.decode(body)
    empty = _message(_field(2, _message(_field(1, "c"))), _field(18, _message(_field(1, b""))))
    assert protobuf.decode(_body("v1", "Pod", _message(_field(2, empty))))["spec"] == {"containers": [{"name": "c"}]}


def test_a_kind_the_emulator_does_not_read_in_protobuf_is_refused_naming_those_it_reads() -> None:
    with pytest.raises(protobuf.ProtobufError, match=r"Ingress \(networking.k8s.io/v1\) in protobuf is not supported"):
        protobuf.decode(_body("networking.k8s.io/v1", "Ingress", b""))
    with pytest.raises(protobuf.ProtobufError, match="truncated"):
        protobuf.decode(b"k8s\x00\n\x50\n")


# --- container logs ---


def test_a_line_written_ahead_shows_when_its_time_comes_and_never_if_the_container_stops_first() -> None:
    logs = ContainerLogs()
    logs.start("u", "main")
    logs.write("u", "main", "started", at_ns=100)
    logs.write("u", "main", "later", at_ns=500)
    logs.write("u", "main", "much later", at_ns=900)
    reading = logs.read("u", "main", LogOptions(), now_ns=200)
    assert [line.text for line in reading.lines] == ["started"]
    assert (reading.ended, reading.next_at_ns) == (False, 500)
    assert [line.text for line in logs.read("u", "main", LogOptions(), now_ns=600).lines] == ["started", "later"]
    logs.stop("u", at_ns=700)
    reading = logs.read("u", "main", LogOptions(), now_ns=10_000)
    assert [line.text for line in reading.lines] == ["started", "later"] and reading.ended


def test_a_restart_keeps_the_previous_run_and_options_shape_what_is_read() -> None:
    logs = ContainerLogs()
    logs.start("u", "main")
    for at_ns in range(1, 6):
        logs.write("u", "main", f"line {at_ns}", at_ns=at_ns * 1_000_000_000)
    logs.start("u", "main")
    logs.write("u", "main", "again", at_ns=7_000_000_000)
    now = 8_000_000_000
    assert [line.text for line in logs.read("u", "main", LogOptions(), now_ns=now).lines] == ["again"]
    previous = logs.read("u", "main", LogOptions(previous=True, tail_lines=2), now_ns=now)
    assert [line.text for line in previous.lines] == ["line 4", "line 5"]
    since = logs.read("u", "main", LogOptions(previous=True, since_ns=3_000_000_000), now_ns=now)
    assert [line.text for line in since.lines] == ["line 3", "line 4", "line 5"]
    text = containerlogs.render(previous.lines, LogOptions(timestamps=True))
    assert text == b"1970-01-01T00:00:04.000000000Z line 4\n1970-01-01T00:00:05.000000000Z line 5\n"
    logs.forget("u")
    assert not logs.has_run("u", "main")


def test_a_follower_position_holds_while_old_lines_rotate_out() -> None:
    logs = ContainerLogs(max_lines=3)
    logs.start("u", "main")
    for index in range(3):
        logs.write("u", "main", f"{index}", at_ns=index)
    position = logs.position("u", "main", now_ns=10)
    for index in range(3, 5):
        logs.write("u", "main", f"{index}", at_ns=index)
    after = logs.read("u", "main", LogOptions(), now_ns=10, after=position)
    assert [line.text for line in after.lines] == ["3", "4"]


def test_log_options_are_checked_as_the_api_server_checks_pod_log_options() -> None:
    options = podlogs.options_of({"tailLines": "5", "timestamps": "true", "sinceSeconds": "10"}, now_ns=20_000_000_000)
    assert options == LogOptions(timestamps=True, tail_lines=5, since_ns=10_000_000_000)
    refused = podlogs.options_of(
        {"tailLines": "-1", "sinceSeconds": "5", "sinceTime": "2024-01-01T00:00:00Z"}, now_ns=0
    )
    assert isinstance(refused, status.Failure) and refused.code == 422
    assert "at most one of `sinceTime` or `sinceSeconds` may be specified" in refused.message
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]},
    }
    chosen = podlogs.container_of(pod, "")
    assert isinstance(chosen, status.Failure)
    assert (
        chosen.message
        == "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
    )
    assert podlogs.container_of(pod, "i") == "i"
    assert isinstance(podlogs.container_of(pod, "z"), status.Failure)


# --- access reviews and impersonation ---

BOB = authn.User(name="bob", groups=("dev", authn.AUTHENTICATED))
POLICY = rbac.Policy(
    roles=(
        {
            "metadata": {"name": "reader", "namespace": "ml"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}],
        },
    ),
    role_bindings=(
        {
            "metadata": {"name": "readers", "namespace": "ml"},
            "roleRef": {"kind": "Role", "name": "reader"},
            "subjects": [{"kind": "Group", "name": "dev"}],
        },
    ),
    cluster_role_bindings=(
        {
            "metadata": {"name": "broken"},
            "roleRef": {"kind": "ClusterRole", "name": "gone"},
            "subjects": [{"kind": "User", "name": "bob"}],
        },
    ),
)


def _review(plural: str, spec: dict[str, object], *, requester: authn.User = BOB, namespace: str = "") -> object:
    group = accessreviews.AUTHENTICATION if plural == accessreviews.WHOAMI else accessreviews.AUTHORIZATION
    return accessreviews.answer(
        group, plural, {"spec": spec}, namespace=namespace, requester=requester, policy=POLICY, now_s=0
    )


def test_a_self_access_review_is_answered_from_rbac_with_its_reason() -> None:
    allowed = _review(
        accessreviews.SELF_ACCESS, {"resourceAttributes": {"namespace": "ml", "verb": "get", "resource": "pods"}}
    )
    assert isinstance(allowed, dict)
    assert allowed["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "readers/ml" of Role "reader" to Group "dev"',
    }
    denied = _review(
        accessreviews.SELF_ACCESS, {"resourceAttributes": {"namespace": "ml", "verb": "delete", "resource": "pods"}}
    )
    assert isinstance(denied, dict)
    assert denied["status"] == {
        "allowed": False,
        "reason": 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found',
    }
    admin = _review(
        accessreviews.SELF_ACCESS, {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}, requester=authn.ADMIN
    )
    assert isinstance(admin, dict) and admin["status"] == {"allowed": True}
    basic = _review(
        accessreviews.SELF_ACCESS,
        {
            "resourceAttributes": {
                "verb": "create",
                "group": "authorization.k8s.io",
                "resource": "selfsubjectaccessreviews",
            }
        },
    )
    assert isinstance(basic, dict) and basic["status"]["allowed"], "system:basic-user lets everyone ask"


def test_reviews_that_are_not_well_formed_are_refused_in_the_api_servers_words() -> None:
    neither = _review(accessreviews.SELF_ACCESS, {})
    assert isinstance(neither, status.Failure) and neither.code == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes must be specified" in neither.message
    nobody = _review(accessreviews.ACCESS, {"resourceAttributes": {"verb": "get", "resource": "pods"}})
    assert isinstance(nobody, status.Failure) and "at least one of user or group must be specified" in nobody.message
    elsewhere = _review(
        accessreviews.LOCAL_ACCESS,
        {"user": "bob", "resourceAttributes": {"namespace": "a", "verb": "get", "resource": "pods"}},
        namespace="ml",
    )
    assert isinstance(elsewhere, status.Failure) and elsewhere.code == 400
    assert elsewhere.message == "spec.resourceAttributes.namespace must match namespace: ml"
    subject = _review(
        accessreviews.ACCESS,
        {"user": "x", "groups": ["dev"], "resourceAttributes": {"namespace": "ml", "verb": "get", "resource": "pods"}},
        requester=authn.ADMIN,
    )
    assert isinstance(subject, dict) and subject["status"]["allowed"]


def test_a_rules_review_lists_what_applies_and_says_when_a_role_is_missing() -> None:
    answered = _review(accessreviews.SELF_RULES, {"namespace": "ml"})
    assert isinstance(answered, dict)
    rules = answered["status"]
    assert {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]} in rules["resourceRules"]
    assert any("/version" in rule["nonResourceURLs"] for rule in rules["nonResourceRules"]), "discovery, for all"
    assert rules["incomplete"] is True and "gone" in rules["evaluationError"]
    whoami = _review(accessreviews.WHOAMI, {})
    assert isinstance(whoami, dict) and whoami["status"]["userInfo"] == {
        "username": "bob",
        "groups": ["dev", authn.AUTHENTICATED],
    }


def test_impersonation_needs_the_right_to_impersonate_and_gives_a_service_account_its_groups() -> None:
    as_robot = impersonation.impersonated(
        user="system:serviceaccount:ml:robot", groups=(), uid="", extra={}, requester=authn.ADMIN, policy=POLICY
    )
    assert as_robot == authn.User(
        name="system:serviceaccount:ml:robot",
        groups=("system:serviceaccounts", "system:serviceaccounts:ml", authn.AUTHENTICATED),
    )
    refused = impersonation.impersonated(
        user="alice", groups=("admins",), uid="", extra={}, requester=BOB, policy=POLICY
    )
    assert isinstance(refused, status.Failure) and refused.code == 403
    assert refused.message.startswith('users "alice" is forbidden: User "bob" cannot impersonate resource "users"')
    alone = impersonation.impersonated(user="", groups=("x",), uid="", extra={}, requester=authn.ADMIN, policy=POLICY)
    assert isinstance(alone, status.Failure) and alone.code == 400
    assert impersonation.impersonated(user="", groups=(), uid="", extra={}, requester=BOB, policy=POLICY) is None


# --- the stand-in kube-scheduler, the pod proxy's paths, the kubelet's events ---


def _node(
    name: str, *, cpu: str = "4", taints: list[dict[str, str]] | None = None, ready: bool = True
) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "10"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _pod(cpu: str) -> dict[str, object]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


def test_the_stand_in_scheduler_picks_the_node_with_most_cpu_left_or_says_why_none_fits() -> None:
    nodes = [_node("a"), _node("b"), _node("tainted", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])]
    assert defaultscheduler.choose(_pod("1"), nodes, {"a": {"cpu (scored)": 3000}}) == "b"
    why = defaultscheduler.choose(_pod("8"), [*nodes, _node("down", ready=False)], {})
    assert isinstance(why, tuple)
    assert defaultscheduler.summary(why, 4) == (
        "0/4 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint {gpu: yes}, "
        "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }."
    )


def test_pod_proxy_paths_parse_as_the_api_server_reads_them() -> None:
    target = podproxy.parse("/api/v1/namespaces/ml/pods/https:leader:8443/proxy/metrics/x")
    assert target == podproxy.ProxyTarget(
        namespace="ml", name="leader", port="8443", scheme="https", identifier="https:leader:8443", path="/metrics/x"
    )
    bare = podproxy.parse("/api/v1/namespaces/ml/pods/leader/proxy")
    assert bare is not None and (bare.port, bare.path) == ("80", "/")
    assert podproxy.parse("/api/v1/namespaces/ml/pods/leader/log") is None
    assert podproxy.parse("/api/v1/namespaces/ml/services/web/proxy/x") is None
    assert podproxy.verb("POST") == "create" and podproxy.verb("CONNECT") is None


def test_the_kubelet_says_pulled_created_started_for_each_container_in_its_words() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "main", "image": "app:1"}],
        },
    }
    events = kubeletevents.started(pod, node="n1", now_ns=1_000_000_000)
    assert [(e["reason"], e["message"], e["involvedObject"]["fieldPath"]) for e in events] == [
        ("Pulled", 'Container image "busybox" already present on machine', "spec.initContainers{setup}"),
        ("Created", "Created container: setup", "spec.initContainers{setup}"),
        ("Started", "Started container setup", "spec.initContainers{setup}"),
        ("Pulled", 'Container image "app:1" already present on machine', "spec.containers{main}"),
        ("Created", "Created container: main", "spec.containers{main}"),
        ("Started", "Started container main", "spec.containers{main}"),
    ]
    assert len({e["metadata"]["name"] for e in events}) == len(events)
    assert events[0]["source"] == {"component": "kubelet", "host": "n1"}

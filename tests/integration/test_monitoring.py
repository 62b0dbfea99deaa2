"""deploy/monitoring: the alert rules are tested by promtool, agree across their three forms, and work in a real
Prometheus that scrapes the scheduler's metrics registry.

Grafana cannot run here, so its files are checked for structure (uids, datasources, references between queries,
panels and variables) and every PromQL expression they hold is evaluated by the real Prometheus instead, after the
dashboard's variables are substituted the way Grafana would. The Prometheus test serves a real
``scheduler.metrics.SchedulerMetrics`` registry set only through the methods the scheduler calls (``set_node_rows``,
``set_alert``, ``set_queue``, ``count_telemetry``...), so Prometheus sees exactly the series, names and labels the
scheduler serves. It loads a copy of the rule file with every ``for`` set to 0s (``tests.prometheus``), so the alerts
fire at the first evaluation after the first scrape instead of minutes later; the alerts' own ``for`` durations are
covered by the promtool unit tests. ``tests/e2e/test_prometheus.py`` does the same against the scheduler process.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.resources import Resources
from scheduler.metrics import CONTENT_TYPE, SchedulerMetrics
from scheduler.telemetry import live
from tests.conftest import REPO, require_tool
from tests.prometheus import Prometheus, running

pytestmark = pytest.mark.integration

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules" / "quotient.rules.yaml"
RULE_TESTS = MONITORING / "tests" / "quotient.rules.test.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
GRAFANA_RULES = MONITORING / "grafana" / "alert-rules.yaml"
DASHBOARD = MONITORING / "grafana" / "dashboard-quotient.json"

DATASOURCE_UID = "prometheus"
"""The Grafana alert rules' datasource: kube-prometheus-stack's default Prometheus uid (README.md, "Install")."""
EXPRESSION_UID = "__expr__"
DASHBOARD_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB = "quotient-scheduler"
GIB = 1 << 30

# What Grafana would put in place of the dashboard's variables: every queue, node and namespace (the variables are
# multi-valued with "All" = .*, always used with =~), one resource, and a rate window that spans several scrapes.
DASHBOARD_VARIABLES = {
    "$__rate_interval": "1m",
    "$queue": ".*",
    "$node": ".*",
    "$namespace": ".*",
    "$resource": "gpu",
}

Obj = dict[str, Any]


def _yaml(path: Path) -> Obj:
    loaded: Obj = yaml.safe_load(path.read_text())
    return loaded


def _prometheus_rules() -> list[Obj]:
    return [rule for group in _yaml(RULES)["groups"] for rule in group["rules"]]


def _grafana_rules() -> list[Obj]:
    return [rule for group in _yaml(GRAFANA_RULES)["groups"] for rule in group["rules"]]


def _dashboard() -> Obj:
    loaded: Obj = json.loads(DASHBOARD.read_text())
    return loaded


def _data_panels(dashboard: Mapping[str, Any]) -> list[Obj]:
    """Every panel that shows data: rows are only headings (collapsed rows keep theirs inside)."""
    found: list[Obj] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def _grafana_queries(rule: Mapping[str, Any]) -> list[Obj]:
    return [item for item in rule["data"] if item["datasourceUid"] != EXPRESSION_UID]


def _substitute(expr: str) -> str:
    for name, value in DASHBOARD_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _label_values_selector(definition: str) -> tuple[str, str]:
    """``label_values(metric, label)`` (a Grafana function, not PromQL) as the selector it reads and the label."""
    match = re.fullmatch(r"label_values\((?P<selector>[^,]+),\s*(?P<label>\w+)\)", definition)
    assert match, f"unexpected variable query {definition!r}"
    return match["selector"].strip(), match["label"]


def _expressions() -> list[tuple[str, str]]:
    """Every PromQL expression of the three files, each with where it comes from."""
    found = [(f"rule {rule['alert']}", rule["expr"]) for rule in _prometheus_rules()]
    for rule in _grafana_rules():
        found += [
            (f"grafana {rule['title']} {query['refId']}", query["model"]["expr"]) for query in _grafana_queries(rule)
        ]
    dashboard = _dashboard()
    for panel in _data_panels(dashboard):
        found += [
            (f"panel {panel['id']} {panel['title']!r} {target['refId']}", _substitute(target["expr"]))
            for target in panel["targets"]
        ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}", _label_values_selector(variable["definition"])[0]))
    return found


# --- promtool ------------------------------------------------------------------------------------------------


def test_promtool_accepts_the_rule_file() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_prometheus_rules())} rules found" in result.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS.relative_to(MONITORING))],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {test["alertname"] for case in _yaml(RULE_TESTS)["tests"] for test in case.get("alert_rule_test", [])}
    assert tested == {rule["alert"] for rule in _prometheus_rules()}


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    outcomes: dict[str, set[bool]] = {}
    for case in _yaml(RULE_TESTS)["tests"]:
        for test in case.get("alert_rule_test", []):
            outcomes.setdefault(test["alertname"], set()).add(bool(test["exp_alerts"]))
    assert outcomes == {rule["alert"]: {True, False} for rule in _prometheus_rules()}


# --- the three forms agree -------------------------------------------------------------------------------------


def test_the_prometheusrule_carries_the_rule_file_unchanged() -> None:
    rule = _yaml(PROMETHEUS_RULE)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == _yaml(RULES)["groups"], (
        "prometheusrule.yaml drifted from rules/quotient.rules.yaml: run deploy/monitoring/render-prometheusrule.sh"
    )
    # The comments come along too, so the file reads the same wherever it is opened.
    spec = PROMETHEUS_RULE.read_text().split("\nspec:\n", 1)[1]
    indented = "".join(f"  {line}" if line.strip() else line for line in RULES.read_text().splitlines(keepends=True))
    assert spec == indented, "run deploy/monitoring/render-prometheusrule.sh"


def test_every_prometheus_rule_has_a_grafana_rule_with_its_expression_for_and_labels_and_back() -> None:
    grafana = {rule["title"]: rule for rule in _grafana_rules()}
    prometheus = {rule["alert"]: rule for rule in _prometheus_rules()}
    assert set(grafana) == set(prometheus)
    for name, rule in prometheus.items():
        twin = grafana[name]
        assert _grafana_queries(twin)[0]["refId"] == "A"
        assert _grafana_queries(twin)[0]["model"]["expr"] == rule["expr"], name
        assert twin["for"] == rule["for"], name
        assert twin.get("labels", {}) == rule.get("labels", {}), name
        assert set(twin["annotations"]) == set(rule["annotations"]) == {"summary", "description"}, name
    prometheus_groups = [[rule["alert"] for rule in group["rules"]] for group in _yaml(RULES)["groups"]]
    grafana_groups = [[rule["title"] for rule in group["rules"]] for group in _yaml(GRAFANA_RULES)["groups"]]
    assert grafana_groups == prometheus_groups


def test_every_alert_has_a_severity_and_says_what_to_do() -> None:
    for rule in _prometheus_rules():
        # Either set here, or carried from the scheduler's series: `max by (..., severity, ...)`.
        carried = re.search(r"by \([^)]*\bseverity\b", rule["expr"]) is not None
        assert carried != ("severity" in rule.get("labels", {})), rule["alert"]
        assert rule.get("labels", {}).get("severity", "warning") in {"warning", "critical"}
        assert "What to do:" in rule["annotations"]["description"], rule["alert"]
    for rule in _grafana_rules():
        assert "What to do:" in rule["annotations"]["description"], rule["title"]


def test_the_grafana_rules_are_well_formed_provisioning() -> None:
    document = _yaml(GRAFANA_RULES)
    assert document["apiVersion"] == 1
    dashboard = _dashboard()
    panel_ids = {panel["id"] for panel in _data_panels(dashboard)}
    uids: list[str] = []
    for group in document["groups"]:
        assert group["orgId"] == 1
        assert group["folder"] and group["name"]
        assert re.fullmatch(r"\d+[smh]", group["interval"])
        for rule in group["rules"]:
            uids.append(rule["uid"])
            assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", rule["uid"])
            refs = [item["refId"] for item in rule["data"]]
            assert len(refs) == len(set(refs)) and rule["condition"] in refs
            for item in rule["data"]:
                model = item["model"]
                assert model["refId"] == item["refId"]
                if item["datasourceUid"] == EXPRESSION_UID:
                    assert model["datasource"] == {"type": EXPRESSION_UID, "uid": EXPRESSION_UID}
                    assert model["type"] in {"reduce", "math", "threshold"}
                    # Expressions refer only to refIds of this rule.
                    used = re.findall(r"\$([A-Z])", model["expression"]) if model["type"] == "math" else []
                    used += [model["expression"]] if model["type"] != "math" else []
                    assert set(used) <= set(refs), (rule["title"], model)
                else:
                    assert item["datasourceUid"] == DATASOURCE_UID
                    assert model["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}
                    assert model["instant"] is True and item["relativeTimeRange"]["to"] == 0
            assert rule["noDataState"] in {"OK", "NoData", "Alerting"}
            assert rule["execErrState"] in {"OK", "Error", "Alerting"}
            assert rule["dashboardUid"] == dashboard["uid"] and rule["panelId"] in panel_ids, rule["title"]
            # File provisioning expands environment variables in labels: a `$` there would be eaten.
            assert all("$" not in value for value in rule.get("labels", {}).values())
    assert len(uids) == len(set(uids))


# --- the dashboard ---------------------------------------------------------------------------------------------


def test_every_dashboard_panel_has_a_datasource_and_queries_and_a_unique_id() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "quotient" and dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    ids = [panel["id"] for panel in dashboard["panels"]] + [
        inner["id"] for panel in dashboard["panels"] for inner in panel.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    for panel in _data_panels(dashboard):
        assert panel["datasource"] == DASHBOARD_DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == DASHBOARD_DATASOURCE
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0


def test_the_dashboard_declares_every_variable_its_queries_use() -> None:
    dashboard = _dashboard()
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert {"datasource", "queue", "node", "namespace"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("queue", "node", "namespace"):
        assert variables[name]["datasource"] == DASHBOARD_DATASOURCE
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    builtin = {"__rate_interval", "__interval", "__range"}
    for panel in _data_panels(dashboard):
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= set(variables) | builtin, (panel["title"], used)
            assert "$" not in _substitute(target["expr"]), target["expr"]


# --- kustomize -------------------------------------------------------------------------------------------------


def test_kustomize_renders_the_rule_the_monitor_and_the_sidecar_configmaps() -> None:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for obj in yaml.safe_load_all(result.stdout) if obj}
    assert set(objects) == {
        ("PrometheusRule", "quotient"),
        ("PodMonitor", "quotient-scheduler"),
        ("ConfigMap", "quotient-grafana-dashboard"),
        ("ConfigMap", "quotient-grafana-alert-rules"),
    }
    assert all(obj["metadata"]["namespace"] == "quotient-system" for obj in objects.values())
    assert objects["PrometheusRule", "quotient"]["spec"]["groups"] == _yaml(RULES)["groups"]
    dashboard = objects["ConfigMap", "quotient-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    alerts = objects["ConfigMap", "quotient-grafana-alert-rules"]
    assert alerts["metadata"]["labels"]["grafana_alert"] == "1"
    assert alerts["data"] == {GRAFANA_RULES.name: GRAFANA_RULES.read_text()}
    monitor = objects["PodMonitor", "quotient-scheduler"]["spec"]
    assert monitor["selector"]["matchLabels"] == {"app.kubernetes.io/name": JOB}
    (endpoint,) = monitor["podMetricsEndpoints"]
    # The scheduler's own `namespace` and `pod` labels name the pod an alert is about: no target label may clash.
    assert {"action": "labeldrop", "regex": "namespace|pod|container"} in endpoint["relabelings"]
    deployment = yaml.safe_load((REPO / "deploy" / "base" / "scheduler" / "deployment.yaml").read_text())
    ports = {port["name"] for port in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] in ports
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == JOB


# --- a real Prometheus -----------------------------------------------------------------------------------------


def _scheduler_metrics() -> SchedulerMetrics:
    """The scheduler's registry, set through the methods the scheduler itself calls: one node with two H100s where
    pod trainer-0 uses 30 GiB of its 20 GiB share on GPU 0 beside infer-1, and 70 GiB of GPU 1 belong to no pod; a
    ghost on gpu-node-2, stale telemetry from gpu-node-3, queue research over its GPU limit with a group pending for
    20 minutes; GPU 1 of gpu-node-1 and all of gpu-node-5 out of placement; one engine fault survived (its series
    created by it, at 1) and one group quarantined. The server adds a watch fault per scrape."""
    metrics = SchedulerMetrics()
    metrics.leader.set(1)
    metrics.set_queue(
        "research",
        fair=Resources(milli_gpu=2000, milli_cpu=32_000, memory_bytes=256 * GIB),
        deserved=Resources(milli_gpu=2000, milli_cpu=32_000, memory_bytes=256 * GIB),
        quota=Resources(milli_gpu=2000, milli_cpu=32_000, memory_bytes=256 * GIB),
        limit=Resources(milli_gpu=4000, milli_cpu=-1, memory_bytes=-1),
        allocated=Resources(milli_gpu=6000, milli_cpu=48_000, memory_bytes=200 * GIB),
        requested=Resources(milli_gpu=8000, milli_cpu=64_000, memory_bytes=300 * GIB),
    )
    metrics.set_queue(
        "batch",
        fair=Resources(milli_gpu=0, milli_cpu=0, memory_bytes=0),
        deserved=Resources(milli_gpu=0, milli_cpu=0, memory_bytes=0),
        quota=Resources(milli_gpu=0, milli_cpu=0, memory_bytes=0),
        allocated=Resources(milli_gpu=500, milli_cpu=4000, memory_bytes=16 * GIB),
        requested=Resources(milli_gpu=500, milli_cpu=4000, memory_bytes=16 * GIB),
    )
    metrics.set_oldest_pending({"research": 1200.0, "batch": 0.0})
    metrics.set_pending({"OverQuota": 3, "GangDoesNotFit": 1})
    metrics.rejected_pods.labels("InvalidGpuFraction").set(1)
    metrics.binds.labels("bound").inc()
    metrics.evictions.labels("GpuMemoryOverconsumption").inc()
    metrics.set_cluster_gpus(total_milli=2000, allocated_milli=500)

    def share(uid: str, name: str, used_bytes: int) -> live.PodRow:
        return live.PodRow(
            uid=uid,
            namespace="team-a",
            name=name,
            node="gpu-node-1",
            queue="research",
            gpu_index=0,
            allotted_bytes=20 * GIB,
            used_bytes=used_bytes,
        )

    def h100(gpu_index: int, *, used_bytes: int, allotted_milli: int, unattributed_bytes: int) -> live.DeviceRow:
        return live.DeviceRow(
            node="gpu-node-1",
            gpu_index=gpu_index,
            model="NVIDIA H100 80GB HBM3",
            total_bytes=80 * GIB,
            used_bytes=used_bytes,
            allotted_milli=allotted_milli,
            unattributed_bytes=unattributed_bytes,
        )

    metrics.set_node_rows(
        "gpu-node-1",
        live.NodeRows(
            pods=(share("uid-trainer-0", "trainer-0", 30 * GIB), share("uid-infer-1", "infer-1", 10 * GIB)),
            devices=(
                h100(0, used_bytes=40 * GIB, allotted_milli=500, unattributed_bytes=0),
                h100(1, used_bytes=70 * GIB, allotted_milli=0, unattributed_bytes=70 * GIB),
            ),
        ),
    )
    for labels in (
        ("GpuMemoryOverconsumption", "warning", "team-a", "trainer-0", "gpu-node-1", "0"),
        ("GhostAllocation", "warning", "team-b", "notebook-7", "gpu-node-2", "0"),
        ("UnattributedGpuMemory", "warning", "", "", "gpu-node-1", "1"),
        ("TelemetryStale", "warning", "", "", "gpu-node-3", ""),
        ("GpuUnhealthy", "critical", "", "", "gpu-node-1", "1"),
        ("GpuUnhealthy", "critical", "", "", "gpu-node-5", ""),
        ("TelemetryConflict", "critical", "", "", "gpu-node-4", ""),
    ):
        metrics.set_alert(labels, firing=True)
    metrics.set_alerts_firing(
        {
            "GpuMemoryOverconsumption": 1,
            "GhostAllocation": 1,
            "UnattributedGpuMemory": 1,
            "TelemetryStale": 1,
            "GpuUnhealthy": 2,
            "TelemetryConflict": 1,
        }
    )
    metrics.set_telemetry_ages({"gpu-node-1": 0.5, "gpu-node-3": 42.0})
    metrics.internal_error("engine", RuntimeError("a bug"))
    metrics.quarantined_groups.set(1)
    return metrics


class _MetricsServer:
    """A /metrics endpoint on loopback serving the scheduler registry. Every scrape also runs a cycle and a bind,
    counts telemetry and survives a watch fault, as a live scheduler does between scrapes, so rates are not all
    zero."""

    def __init__(self) -> None:
        self.metrics = _scheduler_metrics()
        owner = self
        scrapes = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                nonlocal scrapes
                scrapes += 1
                metrics = owner.metrics
                metrics.cycles.inc()
                metrics.cycle_seconds.observe(0.004)
                metrics.bind_seconds.observe(0.03)
                # Cumulative totals, the way the app hands over the consumer's counters.
                metrics.count_telemetry(
                    accepted=1000 * scrapes, rejected={"not_msgpack": 2 * scrapes, "unknown_version": scrapes}
                )
                metrics.count_rejected("foreign_claim", 1)
                metrics.internal_error("watch")
                body = metrics.render()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)

    def __enter__(self) -> _MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def prometheus() -> Iterator[Prometheus]:
    binary = require_tool("prometheus")
    with (
        _MetricsServer() as server,
        running(binary, job=JOB, targets=[f"127.0.0.1:{server.port}"], rules=RULES) as instance,
    ):
        # Three scrapes: enough samples for every rate() and histogram_quantile() of the dashboard.
        instance.wait_for(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 3')
        instance.wait_for(f'up{{job="{JOB}"}} == 1')
        yield instance


def test_prometheus_answers_every_expression_of_the_rules_the_grafana_alerts_and_the_dashboard(
    prometheus: Prometheus,
) -> None:
    failures = []
    for source, expr in _expressions():
        answer = prometheus.query(expr)
        if answer["status"] != "success":
            failures.append(f"{source}: {expr}\n    {answer.get('errorType')}: {answer.get('error')}")
    assert not failures, "\n".join(failures)


def test_every_dashboard_query_shows_data_from_the_scheduler_metrics(prometheus: Prometheus) -> None:
    empty = []
    for source, expr in _expressions():
        if source.startswith(("panel", "variable")) and not prometheus.query(expr).get("data", {}).get("result"):
            empty.append(f"{source}: {expr}")
    assert not empty, "queries that found no series (a metric or label name that does not exist?):\n" + "\n".join(empty)


def test_every_grafana_detail_query_finds_the_series_its_annotations_print(prometheus: Prometheus) -> None:
    """The queries beyond A end in a fallback (`or on () vector(-1)`) that hides a wrong name: evaluate them without."""
    empty = []
    for rule in _grafana_rules():
        for query in _grafana_queries(rule)[1:]:
            expr = re.sub(r"\s+or on \(\) vector\(-?\d+\)$", "", query["model"]["expr"])
            assert expr != query["model"]["expr"], f"{rule['title']} {query['refId']} has no fallback"
            if not prometheus.query(expr).get("data", {}).get("result"):
                empty.append(f"{rule['title']} {query['refId']}: {expr}")
    assert not empty, "\n".join(empty)


def test_the_dashboard_variables_find_their_values(prometheus: Prometheus) -> None:
    expected = {"queue": {"research", "batch"}, "node": {"gpu-node-1"}, "namespace": {"team-a"}}
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = _label_values_selector(variable["definition"])
        values = {series["metric"][label] for series in prometheus.query(selector)["data"]["result"]}
        assert values == expected[variable["name"]], variable["name"]


def test_prometheus_fires_the_scheduler_alerts_it_scrapes_with_the_pod_and_its_memory(prometheus: Prometheus) -> None:
    expected = {rule["alert"] for rule in _prometheus_rules()} - {"QuotientSchedulerDown"}
    firing = prometheus.wait_for_firing(
        lambda alerts: {alert["labels"]["alertname"] for alert in alerts} == expected,
        what="every alert but QuotientSchedulerDown",
    )
    (over,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientGpuMemoryOverconsumption"]
    assert over["labels"] == {
        "alertname": "QuotientGpuMemoryOverconsumption",
        "alert": "GpuMemoryOverconsumption",
        "severity": "warning",
        "namespace": "team-a",
        "pod": "trainer-0",
        "node": "gpu-node-1",
        "gpu": "0",
    }
    assert over["annotations"]["description"].startswith(
        "Pod team-a/trainer-0 (queue research) uses 30GiB of GPU memory on GPU 0 of node gpu-node-1; "
        "it was allotted 20GiB."
    )
    (limit,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientQueueOverLimit"]
    assert (limit["labels"]["queue"], limit["labels"]["resource"]) == ("research", "gpu")
    assert "holds 6 GPUs, above its limit of 4." in limit["annotations"]["description"]
    (stale,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientTelemetryStale"]
    assert "pod" not in stale["labels"] and "namespace" not in stale["labels"]
    assert "is 42s old." in stale["annotations"]["description"]
    (stray,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientUnattributedGpuMemory"]
    assert stray["annotations"]["description"].startswith(
        "70GiB of the 80GiB of the NVIDIA H100 80GB HBM3 at GPU 1 of node gpu-node-1 is used by processes"
    )


def test_prometheus_fires_gpu_unhealthy_for_a_device_and_for_a_whole_node(prometheus: Prometheus) -> None:
    firing = prometheus.wait_for_firing(
        lambda alerts: sum(alert["labels"]["alertname"] == "QuotientGpuUnhealthy" for alert in alerts) == 2,
        what="QuotientGpuUnhealthy for GPU 1 of gpu-node-1 and for gpu-node-5",
    )
    unhealthy = {
        alert["labels"]["node"]: alert for alert in firing if alert["labels"]["alertname"] == "QuotientGpuUnhealthy"
    }
    assert unhealthy["gpu-node-1"]["labels"] == {
        "alertname": "QuotientGpuUnhealthy",
        "alert": "GpuUnhealthy",
        "severity": "critical",
        "node": "gpu-node-1",
        "gpu": "1",
    }
    device = unhealthy["gpu-node-1"]["annotations"]
    assert device["summary"] == "GPU 1 of node gpu-node-1 failed a health check and gets no new work"
    assert "`nvidia-smi -q -i 1`" in device["description"]
    assert "kubectl annotate node gpu-node-1 --overwrite quotient.dev/gpu-health-cleared-at=" in device["description"]
    # The scheduler leaves gpu empty for a node-level fault; Prometheus drops an empty label.
    assert unhealthy["gpu-node-5"]["labels"] == {
        "alertname": "QuotientGpuUnhealthy",
        "alert": "GpuUnhealthy",
        "severity": "critical",
        "node": "gpu-node-5",
    }
    node = unhealthy["gpu-node-5"]["annotations"]
    assert node["summary"] == "Every GPU of node gpu-node-5 failed a health check and gets no new work"
    assert node["description"].startswith("Every GPU of node gpu-node-5 is out of placement: the node's agent reported")
    assert "`nvidia-smi -q`" in node["description"]


def test_prometheus_fires_telemetry_conflict_for_the_node_two_publishers_claim(prometheus: Prometheus) -> None:
    firing = prometheus.wait_for_firing(
        lambda alerts: any(alert["labels"]["alertname"] == "QuotientTelemetryConflict" for alert in alerts),
        what="QuotientTelemetryConflict for gpu-node-4",
    )
    (conflict,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientTelemetryConflict"]
    assert conflict["labels"] == {
        "alertname": "QuotientTelemetryConflict",
        "alert": "TelemetryConflict",
        "severity": "critical",
        "node": "gpu-node-4",
    }
    assert conflict["annotations"]["summary"] == "Two publishers send telemetry as node gpu-node-4"
    assert "`kubectl describe node gpu-node-4`" in conflict["annotations"]["description"]


def test_prometheus_fires_for_a_first_internal_fault_and_for_quarantined_groups(prometheus: Prometheus) -> None:
    """The engine fault's series appears at 1 and never changes, which `increase` alone never sees; the watch
    faults grow with every scrape, which it does."""
    firing = prometheus.wait_for_firing(
        lambda alerts: (
            {
                alert["labels"].get("where")
                for alert in alerts
                if alert["labels"]["alertname"] == "QuotientInternalErrors"
            }
            == {"engine", "watch"}
            and any(alert["labels"]["alertname"] == "QuotientPodGroupsQuarantined" for alert in alerts)
        ),
        what="QuotientInternalErrors at engine and watch, and QuotientPodGroupsQuarantined",
    )
    internal = {
        alert["labels"]["where"]: alert for alert in firing if alert["labels"]["alertname"] == "QuotientInternalErrors"
    }
    assert internal["engine"]["labels"] == {
        "alertname": "QuotientInternalErrors",
        "severity": "warning",
        "where": "engine",
    }
    assert internal["engine"]["annotations"]["summary"] == (
        "The scheduler survived internal faults at engine in the last hour (1 counted)"
    )
    description = internal["engine"]["annotations"]["description"]
    assert "`kubectl get events -A --field-selector reason=Unschedulable | grep SchedulingError`" in description
    (quarantined,) = [alert for alert in firing if alert["labels"]["alertname"] == "QuotientPodGroupsQuarantined"]
    assert quarantined["labels"] == {"alertname": "QuotientPodGroupsQuarantined", "severity": "warning"}
    assert quarantined["annotations"]["summary"] == (
        "The scheduler leaves pod groups out because its placement engine fails with them (1 now)"
    )

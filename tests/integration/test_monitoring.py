"""deploy/monitoring: the alert rules are tested by promtool, agree across their three forms, and work in a real
Prometheus that scrapes the scheduler's metrics registry.

Grafana cannot run here, so its files are checked for structure (uids, datasources, references between queries,
panels and variables) and every PromQL expression they hold is evaluated by the real Prometheus instead, after the
dashboard's variables are substituted the way Grafana would. The Prometheus test serves a real
``scheduler.metrics.SchedulerMetrics`` registry, set through its methods, plus stand-in series for the telemetry and
alert metrics whose names issue 7 fixed (they replace the class's own families of those names, if any). It loads a
copy of the rule file with every ``for`` set to 0s, so the alerts fire at the first evaluation after the first scrape
instead of minutes later; the alerts' own ``for`` durations are covered by the promtool unit tests.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.natsserver import free_port
from scheduler.metrics import SchedulerMetrics
from tests.conftest import REPO, require_tool

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


class _StandIns(Collector):
    """The scheduler registry's families, with the telemetry and alert families replaced by fixed stand-ins.

    Counters grow on every scrape, as a live scheduler's do, so rates are not all zero."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._scrapes = 0

    def collect(self) -> Iterable[Metric]:
        self._scrapes += 1
        stand_ins = _stand_in_families(self._scrapes)
        replaced = {family.name for family in stand_ins}
        yield from (family for family in self._registry.collect() if family.name not in replaced)
        yield from stand_ins


def _gauge(name: str, labels: Sequence[str], rows: Sequence[tuple[Sequence[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, f"stand-in for {name}", labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def _counter(name: str, label: str, rows: Sequence[tuple[str, float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, f"stand-in for {name}", labels=[label])
    for value_label, value in rows:
        family.add_metric([value_label], value)
    return family


def _stand_in_families(scrape: int) -> list[Metric]:
    """One node with two H100s: pod trainer-0 uses 30 GiB of its 20 GiB share on GPU 0 beside infer-1, and 70 GiB of
    GPU 1 belong to no pod; a ghost on gpu-node-2, stale telemetry from gpu-node-3, queue research over its GPU limit
    with a group pending for 20 minutes."""
    pod = ("namespace", "pod", "node", "gpu", "queue")
    trainer = ("team-a", "trainer-0", "gpu-node-1", "0", "research")
    infer = ("team-a", "infer-1", "gpu-node-1", "0", "research")
    alert = ("alert", "severity", "namespace", "pod", "node", "gpu")
    return [
        _gauge(
            "quotient_queue_limit",
            ("queue", "resource"),
            [(("research", "gpu"), 4), (("research", "cpu"), -1), (("research", "memory"), -1)]
            + [(("batch", resource), -1) for resource in ("gpu", "cpu", "memory")],
        ),
        _gauge("quotient_queue_oldest_pending_seconds", ("queue",), [(("research",), 1200), (("batch",), 0)]),
        _gauge("quotient_pod_gpu_memory_allotted_bytes", pod, [(trainer, 20 * GIB), (infer, 20 * GIB)]),
        _gauge("quotient_pod_gpu_memory_used_bytes", pod, [(trainer, 30 * GIB), (infer, 10 * GIB)]),
        _gauge(
            "quotient_device_gpu_memory_total_bytes",
            ("node", "gpu", "model"),
            [(("gpu-node-1", gpu, "NVIDIA H100 80GB HBM3"), 80 * GIB) for gpu in ("0", "1")],
        ),
        _gauge(
            "quotient_device_gpu_memory_used_bytes",
            ("node", "gpu"),
            [(("gpu-node-1", "0"), 40 * GIB), (("gpu-node-1", "1"), 70 * GIB)],
        ),
        _gauge(
            "quotient_device_gpu_allotted_milli",
            ("node", "gpu"),
            [(("gpu-node-1", "0"), 500), (("gpu-node-1", "1"), 0)],
        ),
        _gauge(
            "quotient_device_unattributed_gpu_memory_bytes",
            ("node", "gpu"),
            [(("gpu-node-1", "0"), 0), (("gpu-node-1", "1"), 70 * GIB)],
        ),
        _gauge("quotient_cluster_gpus", ("state",), [(("total",), 2), (("allocated",), 0.5)]),
        _gauge(
            "quotient_alerts_firing",
            ("alert",),
            [((name,), 1) for name in ("GpuMemoryOverconsumption", "GhostAllocation", "UnattributedGpuMemory")]
            + [(("TelemetryStale",), 1)],
        ),
        _gauge(
            "quotient_alert",
            alert,
            [
                (("GpuMemoryOverconsumption", "warning", "team-a", "trainer-0", "gpu-node-1", "0"), 1),
                (("GhostAllocation", "warning", "team-b", "notebook-7", "gpu-node-2", "0"), 1),
                (("UnattributedGpuMemory", "warning", "", "", "gpu-node-1", "1"), 1),
                (("TelemetryStale", "warning", "", "", "gpu-node-3", ""), 1),
            ],
        ),
        _gauge("quotient_node_telemetry_age_seconds", ("node",), [(("gpu-node-1",), 0.5), (("gpu-node-3",), 42)]),
        _counter(
            "quotient_telemetry_messages_total", "outcome", [("accepted", 1000 * scrape), ("rejected", 3 * scrape)]
        ),
        _counter("quotient_telemetry_rejected_total", "reason", [("malformed", 2 * scrape), ("foreign_pod", scrape)]),
    ]


def _scheduler_metrics() -> SchedulerMetrics:
    """The series that exist today, through the class's own methods."""
    metrics = SchedulerMetrics()
    metrics.leader.set(1)
    metrics.set_queue(
        "research",
        fair=(2000, 32_000, 256 * GIB),
        deserved=(2000, 32_000, 256 * GIB),
        quota=(2000, 32_000, 256 * GIB),
        allocated=(6000, 48_000, 200 * GIB),
        requested=(8000, 64_000, 300 * GIB),
    )
    metrics.set_queue(
        "batch",
        fair=(0, 0, 0),
        deserved=(0, 0, 0),
        quota=(0, 0, 0),
        allocated=(500, 4000, 16 * GIB),
        requested=(500, 4000, 16 * GIB),
    )
    metrics.set_pending({"OverQuota": 3, "GangDoesNotFit": 1})
    metrics.rejected_pods.labels("InvalidGpuFraction").set(1)
    metrics.binds.labels("bound").inc()
    metrics.evictions.labels("GpuMemoryOverconsumption").inc()
    return metrics


class _MetricsServer:
    """A /metrics endpoint on loopback serving the scheduler registry; every scrape also runs a cycle and a bind."""

    def __init__(self) -> None:
        self.metrics = _scheduler_metrics()
        exposition = CollectorRegistry()
        exposition.register(_StandIns(self.metrics.registry))
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.metrics.cycles.inc()
                owner.metrics.cycle_seconds.observe(0.004)
                owner.metrics.bind_seconds.observe(0.03)
                body = generate_latest(exposition)
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
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


class _Prometheus:
    """A Prometheus on a free loopback port: scrapes ``target`` and evaluates ``rules`` every second."""

    def __init__(self, binary: str, *, workdir: Path, target: int, rules: Path) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": JOB, "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.command = [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 20.0) -> None:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready after {timeout_s}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def get(self, path: str, **params: str) -> Obj:
        """The API's JSON answer, errors included (a bad query answers 400 with status "error")."""
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body: Obj = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read())
        return body

    def query(self, expr: str) -> Obj:
        return self.get("/api/v1/query", query=expr)

    def wait_for(self, expr: str, *, timeout_s: float = 20.0) -> None:
        """Until the instant query ``expr`` returns a series."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = self.query(expr)
            if answer["status"] == "success" and answer["data"]["result"]:
                return
            time.sleep(0.2)
        raise AssertionError(f"{expr} stayed empty for {timeout_s}s")

    def firing(self) -> list[Obj]:
        return [alert for alert in self.get("/api/v1/alerts")["data"]["alerts"] if alert["state"] == "firing"]


def _without_for(rules: Obj) -> Obj:
    """The rule file with every ``for`` at 0s: alerts fire at the first evaluation that sees their series."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    return rules


@pytest.fixture(scope="module")
def prometheus() -> Iterator[_Prometheus]:
    binary = require_tool("prometheus")
    with tempfile.TemporaryDirectory(prefix="quotient-prometheus-") as tmp, _MetricsServer() as server:
        workdir = Path(tmp)
        rules = workdir / "quotient.rules.yaml"
        rules.write_text(yaml.safe_dump(_without_for(_yaml(RULES)), sort_keys=False))
        instance = _Prometheus(binary, workdir=workdir, target=server.port, rules=rules)
        try:
            instance.start()
            # Three scrapes: enough samples for every rate() and histogram_quantile() of the dashboard.
            instance.wait_for(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 3')
            instance.wait_for(f'up{{job="{JOB}"}} == 1')
            yield instance
        finally:
            instance.stop()


def test_prometheus_answers_every_expression_of_the_rules_the_grafana_alerts_and_the_dashboard(
    prometheus: _Prometheus,
) -> None:
    failures = []
    for source, expr in _expressions():
        answer = prometheus.query(expr)
        if answer["status"] != "success":
            failures.append(f"{source}: {expr}\n    {answer.get('errorType')}: {answer.get('error')}")
    assert not failures, "\n".join(failures)


def test_every_dashboard_query_shows_data_from_the_scheduler_metrics(prometheus: _Prometheus) -> None:
    empty = []
    for source, expr in _expressions():
        if source.startswith(("panel", "variable")) and not prometheus.query(expr).get("data", {}).get("result"):
            empty.append(f"{source}: {expr}")
    assert not empty, "queries that found no series (a metric or label name that does not exist?):\n" + "\n".join(empty)


def test_every_grafana_detail_query_finds_the_series_its_annotations_print(prometheus: _Prometheus) -> None:
    """The queries beyond A end in a fallback (`or on () vector(-1)`) that hides a wrong name: evaluate them without."""
    empty = []
    for rule in _grafana_rules():
        for query in _grafana_queries(rule)[1:]:
            expr = re.sub(r"\s+or on \(\) vector\(-?\d+\)$", "", query["model"]["expr"])
            assert expr != query["model"]["expr"], f"{rule['title']} {query['refId']} has no fallback"
            if not prometheus.query(expr).get("data", {}).get("result"):
                empty.append(f"{rule['title']} {query['refId']}: {expr}")
    assert not empty, "\n".join(empty)


def test_the_dashboard_variables_find_their_values(prometheus: _Prometheus) -> None:
    expected = {"queue": {"research", "batch"}, "node": {"gpu-node-1"}, "namespace": {"team-a"}}
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = _label_values_selector(variable["definition"])
        values = {series["metric"][label] for series in prometheus.query(selector)["data"]["result"]}
        assert values == expected[variable["name"]], variable["name"]


def test_prometheus_fires_the_scheduler_alerts_it_scrapes_with_the_pod_and_its_memory(prometheus: _Prometheus) -> None:
    expected = {rule["alert"] for rule in _prometheus_rules()} - {"QuotientSchedulerDown"}
    deadline = time.monotonic() + 20
    firing = prometheus.firing()
    while {alert["labels"]["alertname"] for alert in firing} != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        firing = prometheus.firing()
    assert {alert["labels"]["alertname"] for alert in firing} == expected
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

"""Proof of issue 7: a real Prometheus scrapes the real scheduler process and fires the over-consumption rule.

The world is the telemetry proofs' (``telemetry_harness``): the emulator, one emulated A100-80GB node whose real
agent reports its fake GPU to a real nats-server, and the scheduler as its own process with ``--nats``, a 0.25 s
agent interval and a 1 s grace. Debian's ``prometheus`` (``tests.prometheus``) runs on a free loopback port,
scrapes the scheduler's ``/metrics`` every second, and evaluates the real rule file,
``deploy/monitoring/rules/quotient.rules.yaml``, from a temporary copy in which every ``for:`` is shortened to 0s:
the scheduler has already applied its grace period, the rule's ``for`` only rides out a missed scrape, and the
promtool unit tests cover it. So nothing here is a stand-in: the series, their labels and the annotations' detail
queries are the scheduler's own, and the alert is read back from Prometheus' ``/api/v1/alerts``.

A pod given 0.25 of the 80 GiB device grows to 30 GiB and later drops to 6 GiB (its memory script): the alert must
fire naming the pod's namespace, name, node and GPU, say what it uses and was allotted, and leave the active alerts
once the pod is back under its share.
"""

from __future__ import annotations

import time

import pytest

from common import quantities
from tests import polling
from tests.conftest import REPO, require_tool
from tests.e2e.telemetry_harness import GRACE_S, INTERVAL_S, share_pod, telemetry_world
from tests.prometheus import Obj, running

pytestmark = pytest.mark.integration

RULES = REPO / "deploy" / "monitoring" / "rules" / "quotient.rules.yaml"
JOB = "quotient-scheduler"
ALERT = "QuotientGpuMemoryOverconsumption"
NODE = "gpu-alert"
SPEC = f"""
nodes:
  - {{name: {NODE}, gpus: {{count: 1, model: A100-80GB}}}}
"""
# Over its 20 GiB share from 2 s to 10 s after it starts: past the 1 s grace the scheduler raises the alert, and
# the 7 s left leave room for several 1 s scrapes and evaluations before it clears.
MEMORY = "2Gi@0s,30Gi@2s,6Gi@10s"


def _about_grower(alerts: list[Obj]) -> list[Obj]:
    return [
        alert for alert in alerts if alert["labels"].get("alertname") == ALERT and alert["labels"]["pod"] == "grower"
    ]


def _between(seen: dict[str, float], first: str, then: str) -> str:
    return f"{seen[then] - seen[first]:.2f}s" if first in seen and then in seen else "not seen"


def test_a_real_prometheus_fires_over_consumption_for_the_pod_over_its_share_and_drops_it_once_under() -> None:
    binary = require_tool("prometheus")
    started_wall, started_cpu = time.monotonic(), time.process_time()
    with (
        telemetry_world(SPEC) as world,
        running(binary, job=JOB, targets=[f"127.0.0.1:{world.metrics_port}"], rules=RULES) as prometheus,
    ):
        prometheus.wait_for(f'quotient_scheduler_leader{{job="{JOB}"}} == 1', timeout_s=15)
        world.apply("grower", share_pod("grower", fraction="0.25", node=NODE, memory=MEMORY))
        seen: dict[str, float] = {}

        def note(event: str, happened: bool) -> bool:
            if happened:
                seen.setdefault(event, time.monotonic())
            return happened

        def firing_in_prometheus() -> bool:
            on_metrics = world.value("quotient_alert", alert="GpuMemoryOverconsumption", pod="grower") == 1.0
            note("on /metrics", on_metrics)
            return note("firing in Prometheus", bool(_about_grower(prometheus.firing())))

        polling.until_sync(firing_in_prometheus, timeout_s=25, what=f"{ALERT} firing")
        firing = prometheus.firing()
        (alert,) = _about_grower(firing)
        assert alert["labels"] == {
            "alertname": ALERT,
            "alert": "GpuMemoryOverconsumption",
            "severity": "warning",
            "namespace": "default",
            "pod": "grower",
            "node": NODE,
            "gpu": "0",
        }
        print("description:", alert["annotations"]["description"])
        # The annotation's detail queries read the scheduler's per-pod series: its queue, used and allotted memory.
        assert alert["annotations"]["description"].startswith(
            f"Pod default/grower (queue default-queue) uses 30GiB of GPU memory on GPU 0 of node {NODE}; "
            "it was allotted 20GiB."
        )
        # Nothing else fires: in particular the scheduler is seen leading (no QuotientSchedulerDown).
        assert {active["labels"]["alertname"] for active in firing} == {ALERT}

        def resolved_in_prometheus() -> bool:
            cleared = world.value("quotient_alert", alert="GpuMemoryOverconsumption", pod="grower") is None
            note("cleared on /metrics", cleared)
            return note("gone from Prometheus", not _about_grower(prometheus.alerts()))

        polling.until_sync(resolved_in_prometheus, timeout_s=20, what=f"{ALERT} leaving the active alerts")
        assert world.running("grower")
        assert world.value("quotient_pod_gpu_memory_used_bytes", pod="grower", node=NODE, gpu="0") == 6 * quantities.GIB
    print(
        f"/metrics to firing in Prometheus: {_between(seen, 'on /metrics', 'firing in Prometheus')}, "
        f"cleared on /metrics to gone from Prometheus: {_between(seen, 'cleared on /metrics', 'gone from Prometheus')} "
        f"(agent interval {INTERVAL_S}s, grace {GRACE_S}s, scrape and evaluation every 1s, polled every 0.1s); "
        f"whole test {time.monotonic() - started_wall:.1f}s wall, {time.process_time() - started_cpu:.1f}s CPU "
        "in the test process"
    )

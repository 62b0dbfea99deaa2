"""``quotient bench telemetry`` end to end at a small scale: a publisher process, a real nats-server, the consumer
and the detector. Timings are printed by the bench, never asserted; what is checked is that every crossing raised
its alert, that nothing was rejected or lost, and that the report has every figure issue 7 asks for."""

from __future__ import annotations

import json

import pytest

from quotient.bench import telemetry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_the_bench_reports_rate_cpu_latency_and_memory_with_every_crossing_alerted() -> None:
    result = telemetry.run(
        ["--nodes=40", "--hz=10", "--warmup-s=0.5", "--window-s=2", "--grace-s=0.3", "--crossings=4"]
    )
    json.dumps(result)  # one JSON object
    for figure in (
        "msgs_per_second",
        "consumer_cpu_us_per_msg",
        "msgs_per_second_one_core",
        "sample_to_alert_p99_s",
        "consumer_rss_bytes",
    ):
        assert isinstance(result[figure], int | float), figure
    assert result["grace_s"] == 0.3 and result["interval_s"] == 0.1
    assert result["alerts_expected"] == 4 and result["alerts_missing"] == 0
    # An alert fires at the first sample at least the grace after the first one over: never before the grace.
    assert isinstance(result["sample_to_alert_p99_s"], float) and result["sample_to_alert_p99_s"] >= 0
    assert result["rejected_total"] == 0 and result["lost_in_transport"] == 0
    assert result["nodes_held"] == 40


def test_a_window_too_short_for_the_grace_is_refused_before_anything_starts() -> None:
    with pytest.raises(SystemExit, match="too short"):
        telemetry.run(["--window-s=1", "--grace-s=2"])


def test_the_bench_over_tls_reports_the_same_figures_with_every_crossing_alerted() -> None:
    result = telemetry.run(
        ["--nodes=40", "--hz=10", "--warmup-s=0.5", "--window-s=2", "--grace-s=0.3", "--crossings=4", "--tls"]
    )

    assert result["tls"] is True
    assert isinstance(result["msgs_per_second_one_core"], int)
    assert result["alerts_expected"] == 4 and result["alerts_missing"] == 0
    assert result["rejected_total"] == 0 and result["lost_in_transport"] == 0
    assert result["nodes_held"] == 40

"""agent.metrics: the exposition text rendered from the latest NodeTelemetry, read back with prometheus' own parser."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import CONTENT_TYPE, AgentMetrics
from common import wire

GiB = 1024**3
MiB = 1024**2
NODE = "ip-10-0-0-1.ec2.internal"
UID_A = "6f3c1a2e-9b4d-4e8a-a1f0-3c5d7e9b2a41"
UID_B = "c8bad552-5c99-4d4f-b71c-c426c0cde014"
CID_A = "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
CID_A2 = "611a8d133d2c636e777745e4dbb1d5866a068fe0f6cc87033e52fe139fca5ba1"
CID_B = "d61328552873b5145655fa7918c7fbbce53dbe076d6c2b5fc95d660709af29c2"

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def gpu(
    index: int,
    processes: tuple[wire.ProcessReport, ...] = (),
    **overrides: object,
) -> wire.GpuReport:
    fields: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_total_bytes": 80 * GiB,
        "memory_reserved_bytes": 512 * MiB,
        "memory_used_bytes": 10 * GiB + 5 * MiB + 123,
        "memory_free_bytes": 69 * GiB,
        "gpu_util_pct": 55,
        "memory_util_pct": 20,
        "temperature_c": 61,
        "power_mw": 250_500,
        "ecc_corrected": 3,
        "ecc_uncorrected": 1,
        "mig_mode": False,
        "processes": processes,
    }
    fields.update(overrides)
    return wire.GpuReport(**fields)  # type: ignore[arg-type]


def process(
    pid: int, used: int | None, pod_uid: str | None = None, container_id: str | None = None
) -> wire.ProcessReport:
    return wire.ProcessReport(pid=pid, used_memory_bytes=used, pod_uid=pod_uid, container_id=container_id)


def telemetry(*gpus: wire.GpuReport) -> wire.NodeTelemetry:
    return wire.NodeTelemetry(
        v=1, node=NODE, boot="b00t", seq=1, ts_ns=1, interval_ms=1000, driver_version="550.54.15", gpus=gpus
    )


def scrape(metrics: AgentMetrics) -> Series:
    series: Series = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in series, f"duplicate series {key}"
            series[key] = sample.value
    return series


def named(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (series_name, labels), value in series.items() if series_name == name}


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def dev(index: int = 0, **extra: str) -> frozenset[tuple[str, str]]:
    return labels(node=NODE, gpu=str(index), uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd", **extra)


def observed(*gpus: wire.GpuReport, dcgm_names: bool = False) -> Series:
    metrics = AgentMetrics(node=NODE, dcgm_names=dcgm_names)
    metrics.observe_sample(telemetry(*gpus), 0.001)
    return scrape(metrics)


def test_every_device_series_has_node_gpu_and_uuid_labels_and_base_units() -> None:
    series = observed(gpu(0))
    assert named(series, "quotient_gpu_memory_total_bytes") == {dev(0): 80 * GiB}
    assert named(series, "quotient_gpu_memory_used_bytes") == {dev(0): 10 * GiB + 5 * MiB + 123}
    assert named(series, "quotient_gpu_memory_reserved_bytes") == {dev(0): 512 * MiB}
    assert named(series, "quotient_gpu_memory_free_bytes") == {dev(0): 69 * GiB}
    assert named(series, "quotient_gpu_utilization_ratio") == {dev(0): 0.55}
    assert named(series, "quotient_gpu_memory_utilization_ratio") == {dev(0): 0.2}
    assert named(series, "quotient_gpu_temperature_celsius") == {dev(0): 61}
    assert named(series, "quotient_gpu_power_watts") == {dev(0): 250.5}
    assert named(series, "quotient_gpu_ecc_errors") == {
        dev(0, kind="corrected"): 3,
        dev(0, kind="uncorrected"): 1,
    }
    assert named(series, "quotient_gpu_info") == {dev(0, model="NVIDIA A100-SXM4-80GB", mig_mode="disabled"): 1}
    assert named(series, "quotient_gpu_unattributed_memory_bytes") == {dev(0): 0}


def test_each_device_gets_its_own_series() -> None:
    series = observed(gpu(0), gpu(1, memory_used_bytes=GiB))
    assert named(series, "quotient_gpu_memory_used_bytes") == {dev(0): 10 * GiB + 5 * MiB + 123, dev(1): GiB}


def test_gauges_a_device_does_not_support_are_absent_not_zero() -> None:
    series = observed(
        gpu(
            0,
            gpu_util_pct=None,
            memory_util_pct=None,
            temperature_c=None,
            power_mw=None,
            ecc_corrected=None,
            ecc_uncorrected=None,
            mig_mode=None,
        )
    )
    for name in (
        "quotient_gpu_utilization_ratio",
        "quotient_gpu_memory_utilization_ratio",
        "quotient_gpu_temperature_celsius",
        "quotient_gpu_power_watts",
        "quotient_gpu_ecc_errors",
    ):
        assert named(series, name) == {}, name
    assert named(series, "quotient_gpu_info") == {dev(0, model="NVIDIA A100-SXM4-80GB", mig_mode="unknown"): 1}
    assert named(series, "quotient_gpu_memory_total_bytes") == {dev(0): 80 * GiB}


def test_mig_mode_reads_enabled_on_the_info_series() -> None:
    series = observed(gpu(0, mig_mode=True))
    assert named(series, "quotient_gpu_info") == {dev(0, model="NVIDIA A100-SXM4-80GB", mig_mode="enabled"): 1}


def test_process_memory_is_summed_per_pod_container_and_device() -> None:
    series = observed(
        gpu(
            0,
            (
                process(100, 2 * GiB, UID_A, CID_A),
                process(101, 3 * GiB, UID_A, CID_A),
                process(102, 1 * GiB, UID_A, CID_A2),
                process(200, 5 * GiB, UID_B, CID_B),
            ),
        ),
        gpu(1, (process(100, 7 * GiB, UID_A, CID_A),)),
    )
    assert named(series, "quotient_gpu_process_memory_bytes") == {
        labels(node=NODE, gpu="0", pod_uid=UID_A, container_id=CID_A): 5 * GiB,
        labels(node=NODE, gpu="0", pod_uid=UID_A, container_id=CID_A2): 1 * GiB,
        labels(node=NODE, gpu="0", pod_uid=UID_B, container_id=CID_B): 5 * GiB,
        labels(node=NODE, gpu="1", pod_uid=UID_A, container_id=CID_A): 7 * GiB,
    }


def test_a_process_in_a_pod_but_no_container_is_counted_with_an_empty_container_label() -> None:
    series = observed(gpu(0, (process(100, GiB, UID_A, None),)))
    assert named(series, "quotient_gpu_process_memory_bytes") == {
        labels(node=NODE, gpu="0", pod_uid=UID_A, container_id=""): GiB
    }


def test_memory_of_processes_of_no_pod_is_unattributed_per_device() -> None:
    series = observed(
        gpu(0, (process(100, 2 * GiB), process(101, 3 * GiB), process(102, GiB, UID_A, CID_A))),
        gpu(1, (process(103, GiB),)),
    )
    assert named(series, "quotient_gpu_unattributed_memory_bytes") == {dev(0): 5 * GiB, dev(1): GiB}
    assert len(named(series, "quotient_gpu_process_memory_bytes")) == 1


def test_a_process_whose_memory_is_unknown_counts_as_zero() -> None:
    series = observed(gpu(0, (process(100, None, UID_A, CID_A), process(101, None))))
    assert named(series, "quotient_gpu_process_memory_bytes") == {
        labels(node=NODE, gpu="0", pod_uid=UID_A, container_id=CID_A): 0
    }
    assert named(series, "quotient_gpu_unattributed_memory_bytes") == {dev(0): 0}


def test_a_pods_series_vanish_when_its_processes_are_gone() -> None:
    metrics = AgentMetrics(node=NODE)
    metrics.observe_sample(telemetry(gpu(0, (process(100, GiB, UID_A, CID_A), process(200, GiB, UID_B, CID_B)))), 0)
    assert len(named(scrape(metrics), "quotient_gpu_process_memory_bytes")) == 2
    metrics.observe_sample(telemetry(gpu(0, (process(200, GiB, UID_B, CID_B),))), 0)
    assert set(named(scrape(metrics), "quotient_gpu_process_memory_bytes")) == {
        labels(node=NODE, gpu="0", pod_uid=UID_B, container_id=CID_B)
    }


def test_dcgm_names_are_absent_by_default() -> None:
    assert not any(name.startswith("DCGM_") for name, _ in observed(gpu(0)))


def test_dcgm_names_carry_dcgm_units_and_labels() -> None:
    series = observed(gpu(0), gpu(1, gpu_util_pct=100, power_mw=70_000), dcgm_names=True)

    def dcgm(index: int) -> frozenset[tuple[str, str]]:
        return labels(
            gpu=str(index),
            UUID=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
            modelName="NVIDIA A100-SXM4-80GB",
            Hostname=NODE,
        )

    assert named(series, "DCGM_FI_DEV_FB_USED") == {dcgm(0): 10 * 1024 + 5, dcgm(1): 10 * 1024 + 5}
    assert named(series, "DCGM_FI_DEV_FB_FREE") == {dcgm(0): 69 * 1024, dcgm(1): 69 * 1024}
    assert named(series, "DCGM_FI_DEV_GPU_UTIL") == {dcgm(0): 55, dcgm(1): 100}
    assert named(series, "DCGM_FI_DEV_POWER_USAGE") == {dcgm(0): 250.5, dcgm(1): 70.0}
    assert named(series, "DCGM_FI_DEV_GPU_TEMP") == {dcgm(0): 61, dcgm(1): 61}
    # Our own series stay.
    assert len(named(series, "quotient_gpu_memory_used_bytes")) == 2


def test_dcgm_series_a_device_does_not_support_are_absent() -> None:
    series = observed(gpu(0, gpu_util_pct=None, power_mw=None, temperature_c=None), dcgm_names=True)
    assert named(series, "DCGM_FI_DEV_GPU_UTIL") == {}
    assert named(series, "DCGM_FI_DEV_POWER_USAGE") == {}
    assert named(series, "DCGM_FI_DEV_GPU_TEMP") == {}
    assert len(named(series, "DCGM_FI_DEV_FB_USED")) == 1


def test_before_any_sample_there_are_no_device_series() -> None:
    series = scrape(AgentMetrics(node=NODE, dcgm_names=True))
    assert not any(name.startswith(("quotient_gpu_", "DCGM_")) for name, _ in series)


def test_clear_sample_removes_every_device_series() -> None:
    metrics = AgentMetrics(node=NODE, dcgm_names=True)
    metrics.observe_sample(telemetry(gpu(0, (process(100, GiB, UID_A, CID_A),))), 0.002)
    assert named(scrape(metrics), "quotient_gpu_memory_used_bytes")
    metrics.clear_sample()
    series = scrape(metrics)
    assert not any(name.startswith(("quotient_gpu_", "DCGM_")) for name, _ in series)
    # The agent's own counters survive: they are not about the devices' current state.
    assert named(series, "quotient_agent_samples_total") == {labels(node=NODE): 1}


def test_a_node_without_gpus_renders_no_device_samples() -> None:
    series = observed()
    assert not any(name.startswith("quotient_gpu_") for name, _ in series)


def test_observe_sample_counts_samples_and_their_duration() -> None:
    metrics = AgentMetrics(node=NODE)
    metrics.observe_sample(telemetry(gpu(0)), 0.0015)
    metrics.observe_sample(telemetry(gpu(0)), 0.003)
    series = scrape(metrics)
    assert named(series, "quotient_agent_samples_total") == {labels(node=NODE): 2}
    assert named(series, "quotient_agent_sample_duration_seconds_count") == {labels(node=NODE): 2}
    assert named(series, "quotient_agent_sample_duration_seconds_sum") == {labels(node=NODE): pytest.approx(0.0045)}
    buckets = named(series, "quotient_agent_sample_duration_seconds_bucket")
    assert buckets[labels(node=NODE, le="0.001")] == 0
    assert buckets[labels(node=NODE, le="0.002")] == 1
    assert buckets[labels(node=NODE, le="0.005")] == 2


def test_the_agents_own_counters_and_gauges_render_with_their_labels() -> None:
    metrics = AgentMetrics(node=NODE)
    metrics.sample_errors.labels(NODE, "gpu_lost").inc()
    metrics.published.labels(NODE, "telemetry").inc(3)
    metrics.unpublished.labels(NODE, "health").inc()
    metrics.nats_connected.labels(NODE).set(1)
    metrics.healthy.labels(NODE).set(0)
    series = scrape(metrics)
    assert named(series, "quotient_agent_sample_errors_total") == {labels(node=NODE, kind="gpu_lost"): 1}
    assert named(series, "quotient_agent_messages_published_total") == {labels(node=NODE, kind="telemetry"): 3}
    assert named(series, "quotient_agent_messages_unpublished_total") == {labels(node=NODE, kind="health"): 1}
    assert named(series, "quotient_agent_nats_connected") == {labels(node=NODE): 1}
    assert named(series, "quotient_agent_gpu_healthy") == {labels(node=NODE): 0}


def test_metrics_live_on_their_own_registry_so_two_agents_do_not_collide() -> None:
    first, second = AgentMetrics(node="a"), AgentMetrics(node="b")
    first.observe_sample(telemetry(gpu(0)), 0)
    assert first.registry is not second.registry
    assert not named(scrape(second), "quotient_gpu_memory_used_bytes")


def test_a_given_registry_is_used() -> None:
    registry = CollectorRegistry()
    metrics = AgentMetrics(node=NODE, registry=registry)
    assert metrics.registry is registry


def test_the_content_type_is_prometheus_text_format() -> None:
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")

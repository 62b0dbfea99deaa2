"""The scheduler's settings: every flag, environment variable and config-file key of ``quotient scheduler``.

One table (``SETTINGS``, read by ``common.config``: flags win over ``QUOTIENT_*`` variables, which win over the
``--config`` file) and one function that turns the resolved values into the typed ``Settings`` the parts are built
from, refusing what cannot work with a ``ConfigError`` that names the flag. The parts keep their own typed settings
(``reservations.Settings``, ``webhook.WebhookSettings``, ``live.LiveSettings``, ``model.Config``); this module is the
only place that knows how flags map onto them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from common import config, names, quantities
from common.config import Setting
from common.errors import ConfigError
from scheduler.kube import leases, reservations, webhook
from scheduler.natsauth import callout
from scheduler.placement import model
from scheduler.telemetry import live, overuse
from scheduler.telemetry.feed import consumer


def _names(raw: object) -> tuple[str, ...]:
    names = tuple(part.strip() for part in str(raw).split(",") if part.strip())
    if not names:
        raise ValueError("at least one scheduler name is needed")
    return names


def _whole(text: str, low: int, high: int) -> int | None:
    """``text`` as a whole number within ``low..high``; None when it is not one."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        return None
    return int(text)


def _stream_replicas(raw: object) -> int:
    value = _whole(str(raw), 1, 5)
    if value is None:
        raise ValueError(f"{raw!r} is not a replica count within 1..5 (JetStream's limit)")
    return value


def _bytes(raw: object) -> int:
    value = quantities.parse_bytes(raw if isinstance(raw, int) else str(raw))
    if value < 0:
        raise ValueError(f"{raw!r} must not be negative")
    return value


def _eviction_multiple(raw: object) -> int:
    value = _whole(str(raw), 0, 100)
    if value is None:
        raise ValueError(f"{raw!r} is not a whole multiple within 0..100 (0: no budget)")
    return value


def _percent(raw: object) -> int:
    value = _whole(str(raw).strip().removesuffix("%"), 0, 100)
    if value is None:
        raise ValueError(f"{raw!r} is not a whole percentage within 0..100")
    return value


TELEMETRY_SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="overuse_policy",
        parse=config.choice(*(policy.value for policy in overuse.OverusePolicy)),
        default=overuse.OverusePolicy.ALERT.value,
        help="what a pod over its GPU memory allotment gets, unless its Queue's quotient.dev/overuse-policy says",
    ),
    Setting(
        name="overuse_grace",
        parse=config.parse_positive_duration_s,
        default=30.0,
        help="how long a pod stays over its allotment (or memory of no pod stays) before the alert fires",
    ),
    Setting(
        name="overuse_evict_grace",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="under the evict policy, how long the over-consumption alert fires before the pod is evicted",
    ),
    Setting(
        name="overuse_tolerance",
        parse=_bytes,
        default=512 * quantities.MIB,
        help="bytes a pod may use above its allotment without alerting (allocators round up, CUDA contexts)",
    ),
    Setting(
        name="overuse_tolerance_percent",
        parse=_percent,
        default=5,
        help="the same slack as a percentage of the allotment; the larger of the two applies",
    ),
    Setting(
        name="unattributed_threshold",
        parse=_bytes,
        default=quantities.GIB,
        help="GPU memory of processes of no pod on one device above which UnattributedGpuMemory fires",
    ),
    Setting(
        name="ghost_grace",
        parse=config.parse_positive_duration_s,
        default=300.0,
        help="how long a Running pod may hold a GPU with no process on it before GhostAllocation fires",
    ),
    Setting(
        name="telemetry_stale_floor",
        parse=config.parse_positive_duration_s,
        default=10.0,
        help="a node's telemetry is stale after max(3 x its interval, this floor)",
    ),
    Setting(
        name="telemetry_max_skew",
        parse=config.parse_positive_duration_s,
        default=consumer.DEFAULT_MAX_SKEW_S,
        help="telemetry stamped further than this from the scheduler's clock, ahead or behind, is rejected",
    ),
    Setting(
        name="headroom_window",
        parse=config.parse_positive_duration_s,
        default=30.0,
        help="window of the peak of used GPU memory that placement subtracts from a device",
    ),
    Setting(
        name="headroom_margin",
        parse=_bytes,
        default=model.DEFAULT_CONFIG.headroom_margin_bytes,
        help="GPU memory kept free on top of the measured peak",
    ),
)


def _ns(seconds: object) -> int:
    return int(float(str(seconds)) * quantities.NS_PER_S)


def live_settings_from(values: Mapping[str, object], *, queue_label: str) -> live.LiveSettings:
    """The telemetry analysis' settings from resolved ``TELEMETRY_SETTINGS`` values."""
    detector = overuse.Settings(
        tolerance_bytes=int(str(values["overuse_tolerance"])),
        tolerance_percent=int(str(values["overuse_tolerance_percent"])),
        grace_ns=_ns(values["overuse_grace"]),
        evict_grace_ns=_ns(values["overuse_evict_grace"]),
        ghost_threshold_ns=_ns(values["ghost_grace"]),
        unattributed_threshold_bytes=int(str(values["unattributed_threshold"])),
        default_policy=overuse.OverusePolicy(str(values["overuse_policy"])),
        headroom_margin_bytes=int(str(values["headroom_margin"])),
    )
    return live.LiveSettings(
        detector=detector,
        stale_floor_ns=_ns(values["telemetry_stale_floor"]),
        headroom_window_ns=_ns(values["headroom_window"]),
        queue_label=queue_label,
    )


WEBHOOK_SETTINGS: tuple[Setting[object], ...] = (
    Setting(name="webhook", parse=config.parse_bool, default=True, help="serve the GPU-sharing admission webhook"),
    Setting(name="webhook_host", parse=config.parse_str, default="0.0.0.0", help="address the webhook listens on"),
    Setting(
        name="webhook_port", parse=config.parse_port, default=webhook.DEFAULT_PORT, help="HTTPS port of the webhook"
    ),
    Setting(
        name="webhook_certs",
        parse=config.choice(*webhook.CertificateSource),
        default=webhook.CertificateSource.SELF_SIGNED.value,
        help="self-signed (made at start, CA written into the caBundle) or provided (cert-manager's Secret)",
    ),
    Setting(
        name="webhook_cert_dir",
        parse=config.parse_str,
        default=None,
        help="where tls.crt and tls.key are written (self-signed; default: a private temporary directory) or read "
        "(provided)",
    ),
    Setting(
        name="webhook_service", parse=config.parse_str, default="quotient-scheduler-webhook", help="the webhook Service"
    ),
    Setting(
        name="webhook_namespace",
        parse=config.parse_str,
        default="quotient-system",
        help="the webhook Service's namespace",
    ),
    Setting(
        name="webhook_configuration",
        parse=config.parse_str,
        default="quotient-gpu-sharing",
        help="the MutatingWebhookConfiguration whose caBundle is kept",
    ),
    Setting(
        name="webhook_queue_configuration",
        parse=config.parse_str,
        default="quotient-queue-validation",
        help="the ValidatingWebhookConfiguration of the queue webhook whose caBundle is kept",
    ),
    Setting(
        name="webhook_podgroup_configuration",
        parse=config.parse_str,
        default="quotient-podgroup-validation",
        help="the ValidatingWebhookConfiguration of the PodGroup webhook whose caBundle is kept",
    ),
    Setting(
        name="queue_parent_must_exist",
        parse=config.parse_bool,
        default=False,
        help="refuse a Queue whose parent queue does not exist (KAI's --enable-quota-validation)",
    ),
    Setting(
        name="webhook_cert_validity",
        parse=config.parse_positive_duration_s,
        default=365 * 24 * 3600.0,
        help="validity of a self-signed certificate (renewed after two thirds)",
    ),
    Setting(
        name="webhook_upkeep_interval",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="how often the caBundle is checked and the certificate renewed or reloaded",
    ),
)


def webhook_settings_from(values: Mapping[str, object]) -> webhook.WebhookSettings:
    """The webhook's settings from :data:`WEBHOOK_SETTINGS` as ``common.config.resolve`` returns them."""
    source = webhook.CertificateSource(str(values["webhook_certs"]))
    cert_dir = Path(str(values["webhook_cert_dir"])) if values["webhook_cert_dir"] else None
    if source is webhook.CertificateSource.PROVIDED and cert_dir is None:
        raise ConfigError("--webhook-cert-dir: provided certificates need the directory that holds tls.crt and tls.key")
    return webhook.WebhookSettings(
        enabled=bool(values["webhook"]),
        host=str(values["webhook_host"]),
        port=int(str(values["webhook_port"])),
        certificates=source,
        cert_dir=cert_dir,
        service=str(values["webhook_service"]),
        namespace=str(values["webhook_namespace"]),
        configuration=str(values["webhook_configuration"]),
        queue_configuration=str(values["webhook_queue_configuration"]),
        podgroup_configuration=str(values["webhook_podgroup_configuration"]),
        queue_parent_must_exist=bool(values["queue_parent_must_exist"]),
        cert_validity_s=float(str(values["webhook_cert_validity"])),
        upkeep_interval_s=float(str(values["webhook_upkeep_interval"])),
    )


RESERVATION_SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="reservation_namespace",
        parse=config.parse_str,
        default=names.RESERVATION_NAMESPACE,
        help="namespace of the reservation pods that hold shared GPUs",
    ),
    Setting(
        name="reservation_image",
        parse=config.parse_str,
        default=reservations.DEFAULT_IMAGE,
        help="image of the reservation pods (runs `quotient reserve`; the scheduler's own image)",
    ),
    Setting(
        name="reservation_timeout",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="how long a reservation pod may take to report its GPU's UUID before it is deleted",
    ),
    Setting(
        name="reservation_drain_grace",
        parse=config.parse_positive_duration_s,
        default=2.0,
        help="how long a reservation pod without sharing pods is kept before it is deleted",
    ),
    Setting(
        name="orphaned_share_policy",
        parse=config.choice("evict", "report"),
        default="evict",
        help="a running sharing pod whose reservation pod vanished: deleted (evict) or only reported",
    ),
)


def reservation_settings_from(values: Mapping[str, object]) -> reservations.Settings:
    """The reservation settings from :data:`RESERVATION_SETTINGS` as ``common.config.resolve`` returns them."""
    return reservations.Settings(
        namespace=str(values["reservation_namespace"]),
        image=str(values["reservation_image"]),
        uuid_timeout_s=float(str(values["reservation_timeout"])),
        drain_grace_s=float(str(values["reservation_drain_grace"])),
        evict_orphans=str(values["orphaned_share_policy"]) == "evict",
    )


SETTINGS: tuple[Setting[object], ...] = (
    Setting(
        name="kubeconfig", parse=config.parse_existing_file, default=None, help="kubeconfig file (default: in-cluster)"
    ),
    Setting(
        name="kube_server",
        parse=config.parse_str,
        default=None,
        help="API server URL without credentials (the emulator)",
    ),
    Setting(
        name="scheduler_name",
        parse=_names,
        default=("quotient",),
        help="the spec.schedulerName values this scheduler serves, comma-separated (e.g. quotient,kai-scheduler)",
    ),
    Setting(
        name="queue_label",
        parse=config.parse_str,
        default=names.QUEUE_LABEL,
        help="the pod/owner label naming the queue",
    ),
    Setting(name="nats", parse=config.parse_nats_url, default=None, help="NATS server URL(s) for telemetry and alerts"),
    Setting(
        name="nats_nkey_seed", parse=config.parse_existing_file, default=None, help="the scheduler's nkey seed file"
    ),
    Setting(
        name="nats_ca",
        parse=config.parse_existing_file,
        default=None,
        help="the CA that NATS servers' certificates must be signed by (PEM); TLS is used whatever the URL says",
    ),
    Setting(
        name="telemetry_stream_replicas",
        parse=_stream_replicas,
        default=1,
        help="copies of the QUOTIENT_TELEMETRY stream the scheduler declares: 1 for one NATS server, 3 for a "
        "cluster of three (deploy)",
    ),
    *TELEMETRY_SETTINGS,
    *callout.SETTINGS,
    Setting(name="metrics_port", parse=config.parse_port, default=8080, help="port of /metrics and /healthz (0: off)"),
    Setting(name="metrics_host", parse=config.parse_str, default="0.0.0.0", help="address /metrics listens on"),
    Setting(name="leader_elect", parse=config.parse_bool, default=True, help="elect a leader through a Lease"),
    Setting(name="lease_namespace", parse=config.parse_str, default="quotient-system", help="namespace of the Lease"),
    Setting(name="lease_name", parse=config.parse_str, default="quotient-scheduler", help="name of the Lease"),
    Setting(name="lease_duration", parse=config.parse_positive_duration_s, default=15.0, help="Lease duration"),
    Setting(name="renew_deadline", parse=config.parse_positive_duration_s, default=10.0, help="Lease renew deadline"),
    Setting(name="retry_period", parse=config.parse_positive_duration_s, default=2.0, help="Lease retry period"),
    Setting(
        name="identity", parse=config.parse_str, default=None, help="this replica's identity (default: hostname-pid)"
    ),
    Setting(
        name="cycle_debounce", parse=config.parse_positive_duration_s, default=0.02, help="coalescing window of cycles"
    ),
    Setting(name="bind_concurrency", parse=config.parse_str, default="32", help="API calls of the binder in flight"),
    Setting(
        name="watch_timeout", parse=config.parse_positive_duration_s, default=300.0, help="server-side watch timeout"
    ),
    Setting(
        name="stale_gang_grace",
        parse=config.parse_positive_duration_s,
        default=60.0,
        help="grace of a gang below minMember",
    ),
    Setting(
        name="gpu_strategy",
        parse=config.choice("fragmentation", "binpack", "spread"),
        default="fragmentation",
        help="placement of GPU pods: fragmentation (learned from the workload; binpack without history), or KAI's "
        "binpack or spread",
    ),
    Setting(
        name="cpu_strategy", parse=config.choice("binpack", "spread"), default="binpack", help="node order for CPU pods"
    ),
    Setting(
        name="reclaim_eviction_multiple",
        parse=_eviction_multiple,
        default=0,
        help="when positive, one reclaim for GPU work never evicts more GPU than this multiple of what it frees "
        "(0: no budget, as KAI)",
    ),
    *WEBHOOK_SETTINGS,
    *RESERVATION_SETTINGS,
    *config.LOG_SETTINGS,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    kubeconfig: str | None
    kube_server: str | None
    scheduler_names: tuple[str, ...]
    queue_label: str
    metrics_host: str
    metrics_port: int
    leader_elect: bool
    election: leases.ElectionConfig
    cycle_debounce_s: float
    bind_concurrency: int
    watch_timeout_s: int
    nats: str | None
    nats_seed: Path | None
    engine_config: model.Config
    webhook: webhook.WebhookSettings
    reservation: reservations.Settings = dataclasses.field(default_factory=reservations.Settings)
    telemetry: live.LiveSettings | None = None
    """The telemetry analysis (over-consumption, staleness, headroom); used when ``nats`` is set."""
    telemetry_feed: consumer.ConsumerConfig = dataclasses.field(default_factory=consumer.ConsumerConfig)
    """The telemetry consumer: the clock skew it allows, how long a publisher counts as live (the staleness floor)."""
    nats_callout: callout.CalloutSettings | None = None
    """The NATS auth callout this replica serves (``--nats-callout-issuer-seed``), or None."""
    nats_ca: Path | None = None
    """The CA pinned for TLS to NATS (``--nats-ca``)."""
    telemetry_stream_replicas: int = 1
    """The ``QUOTIENT_TELEMETRY`` stream's replicas (``--telemetry-stream-replicas``)."""


def settings_from(values: Mapping[str, object]) -> Settings:
    try:
        concurrency = int(str(values["bind_concurrency"]))
    except ValueError:
        raise ConfigError(f"--bind-concurrency: {values['bind_concurrency']!r} is not a whole number") from None
    if not 1 <= concurrency <= 1024:
        raise ConfigError(f"--bind-concurrency: {concurrency} must be within 1..1024")
    identity = str(values["identity"] or f"{socket.gethostname()}-{os.getpid()}")
    election = leases.ElectionConfig(
        namespace=str(values["lease_namespace"]),
        name=str(values["lease_name"]),
        identity=identity,
        lease_duration_s=float(str(values["lease_duration"])),
        renew_deadline_s=float(str(values["renew_deadline"])),
        retry_period_s=float(str(values["retry_period"])),
    )
    names = values["scheduler_name"]
    assert isinstance(names, tuple)
    engine_config = dataclasses.replace(
        model.DEFAULT_CONFIG,
        gpu_strategy=model.Strategy(str(values["gpu_strategy"])),
        cpu_strategy=model.Strategy(str(values["cpu_strategy"])),
        stale_gang_grace_ns=int(float(str(values["stale_gang_grace"])) * 1_000_000_000),
        headroom_margin_bytes=int(str(values["headroom_margin"])),
        reclaim_eviction_multiple=int(str(values["reclaim_eviction_multiple"])),
    )
    return Settings(
        kubeconfig=str(values["kubeconfig"]) if values["kubeconfig"] else None,
        kube_server=str(values["kube_server"]) if values["kube_server"] else None,
        scheduler_names=tuple(str(name) for name in names),
        queue_label=str(values["queue_label"]),
        metrics_host=str(values["metrics_host"]),
        metrics_port=int(str(values["metrics_port"])),
        leader_elect=bool(values["leader_elect"]),
        election=election,
        cycle_debounce_s=float(str(values["cycle_debounce"])),
        bind_concurrency=concurrency,
        watch_timeout_s=max(1, int(float(str(values["watch_timeout"])))),
        nats=str(values["nats"]) if values["nats"] else None,
        nats_seed=Path(str(values["nats_nkey_seed"])) if values["nats_nkey_seed"] else None,
        nats_ca=Path(str(values["nats_ca"])) if values.get("nats_ca") else None,
        telemetry_stream_replicas=int(str(values.get("telemetry_stream_replicas") or 1)),
        engine_config=engine_config,
        webhook=webhook_settings_from(values),
        nats_callout=callout.settings_from(values),
        reservation=reservation_settings_from(values),
        telemetry=live_settings_from(values, queue_label=str(values["queue_label"])),
        telemetry_feed=consumer.ConsumerConfig(
            max_skew_s=float(str(values["telemetry_max_skew"])),
            live_floor_s=float(str(values["telemetry_stale_floor"])),
        ),
    )

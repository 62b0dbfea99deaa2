"""TLS on NATS, the decisions without a server: when a client upgrades, which servers the fast path reaches itself,
the names the certificate carries, and the settings that ask for TLS and for the stream's replicas."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from common import config, natsbatches, natstls
from common.errors import BusUnavailable, ConfigError
from common.natsconn import NatsBus
from quotient import natscerts
from scheduler import settings as scheduler_settings

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("info", "wanted", "upgrade"),
    [
        ({"tls_required": True}, False, True),  # the server's TLS is never declined (as nats-py does)
        ({"tls_required": True}, True, True),
        ({"tls_available": True}, True, True),  # allow_non_tls: TLS when the client asks for it
        ({"tls_available": True}, False, False),
        ({}, False, False),
    ],
)
def test_a_client_upgrades_when_the_server_requires_tls_or_it_wants_tls_and_the_server_offers_it(
    info: dict[str, bool], wanted: bool, upgrade: bool
) -> None:
    assert natstls.upgrade_needed(info, wanted=wanted, url="nats://x:4222") is upgrade


def test_a_client_that_wants_tls_refuses_a_server_that_offers_none_instead_of_talking_in_clear() -> None:
    with pytest.raises(BusUnavailable, match="does not offer TLS"):
        natstls.upgrade_needed({}, wanted=True, url="nats://x:4222")


def test_a_tls_url_or_a_pinned_ca_asks_for_tls(tmp_path: Path) -> None:
    assert natstls.wants_tls(urls=["tls://a:4222", "nats://b:4222"], ca=None)
    assert natstls.wants_tls(urls=["nats://a:4222"], ca=tmp_path / "ca.crt")
    assert not natstls.wants_tls(urls=["nats://a:4222"], ca=None)


def test_the_fast_path_reaches_nats_and_tls_urls_but_not_credentials_in_the_url_or_websockets() -> None:
    assert natsbatches.speaks("nats://127.0.0.1:4222")
    assert natsbatches.speaks("tls://quotient-nats-0.quotient-nats-headless.ns.svc:4222")
    assert natsbatches.speaks("127.0.0.1:4222")
    assert not natsbatches.speaks("tls://user:secret@127.0.0.1:4222")
    assert not natsbatches.speaks("ws://127.0.0.1:8080")


def test_the_certificate_names_the_service_and_every_pod_and_serves_both_ends_of_a_route() -> None:
    material = natscerts.generate(names=natscerts.dns_names("gpu-system"), now=NOW)
    leaf = x509.load_pem_x509_certificate(material.cert_pem)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value

    assert "quotient-nats.gpu-system.svc" in names.get_values_for_type(x509.DNSName)
    assert "*.quotient-nats-headless.gpu-system.svc" in names.get_values_for_type(x509.DNSName)
    assert {usage.dotted_string for usage in usages} == {"1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"}
    assert "PRIVATE KEY" not in repr(material)
    assert leaf.not_valid_before_utc < NOW < leaf.not_valid_after_utc


def test_a_rotation_bundle_trusts_the_new_ca_and_the_one_in_use_only() -> None:
    first = natscerts.generate(names=("localhost",), now=NOW)
    second = natscerts.generate(names=("localhost",), now=NOW, previous_ca=first.ca_pem)
    third = natscerts.generate(names=("localhost",), now=NOW, previous_ca=second.ca_pem)

    assert second.ca_pem.endswith(first.ca_pem)
    # The oldest drops out: the bundle is the new CA and the first of the previous bundle (the CA in use).
    assert len(x509.load_pem_x509_certificates(third.ca_pem)) == 2
    assert first.ca_pem not in third.ca_pem


def test_a_client_context_pins_the_ca_checks_the_name_and_refuses_old_tls(tmp_path: Path) -> None:
    files = natscerts.for_loopback(tmp_path / "tls", now=NOW)
    context = natstls.client_context(files.ca)

    assert context.check_hostname and context.verify_mode is ssl.CERT_REQUIRED
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert len(context.get_ca_certs()) == 1  # ours alone: no system CA


def test_nats_ca_and_the_stream_replicas_are_settings_of_the_scheduler_refused_clearly_when_wrong(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(natscerts.generate(names=("localhost",), now=NOW).ca_pem)
    by_name = {setting.name: setting for setting in scheduler_settings.SETTINGS}

    assert by_name["nats_ca"].parse(str(ca)) == ca
    assert by_name["telemetry_stream_replicas"].parse("3") == 3
    assert by_name["telemetry_stream_replicas"].default == 1
    for wrong in ("0", "6", "three"):
        with pytest.raises(ValueError, match=r"1\.\.5"):
            by_name["telemetry_stream_replicas"].parse(wrong)
    with pytest.raises(ValueError):
        config.parse_existing_file(str(tmp_path / "missing.crt"))


def test_a_bus_refuses_a_replica_count_jetstream_does_not_take() -> None:
    with pytest.raises(ValueError, match=r"1\.\.5"):
        NatsBus(servers="nats://127.0.0.1:4222", name="scheduler", stream_replicas=7)


def test_a_ca_file_without_a_certificate_names_the_flag(tmp_path: Path) -> None:
    empty = tmp_path / "ca.crt"
    empty.write_text("")

    with pytest.raises(ConfigError, match="--nats-ca"):
        natstls.client_context(empty)

"""The webhook's certificates, and the caBundle that must trust every live replica's CA at once."""

from __future__ import annotations

import base64
import datetime
import ssl
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from common.errors import ConfigError
from scheduler.kube import certs
from scheduler.kube.errors import KubeConflict
from tests.unit.kube.fakes import MemoryKube

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
YEAR = datetime.timedelta(days=365)
CONFIGURATION = "quotient-gpu-sharing"


def make(
    directory: Path, *, now: datetime.datetime = NOW, validity: datetime.timedelta = YEAR
) -> certs.ServingCertificate:
    return certs.generate(
        directory, service="quotient-scheduler-webhook", namespace="quotient-system", validity=validity, now=now
    )


def leaf_of(certificate: certs.ServingCertificate) -> x509.Certificate:
    return x509.load_pem_x509_certificate(certificate.cert_path.read_bytes())


def ca_of(certificate: certs.ServingCertificate) -> x509.Certificate:
    assert certificate.ca_pem is not None
    return x509.load_pem_x509_certificate(certificate.ca_pem)


def configuration(*bundles: bytes | None) -> dict[str, Any]:
    hooks = []
    for index, bundle in enumerate(bundles):
        client_config: dict[str, Any] = {
            "service": {"namespace": "quotient-system", "name": "quotient-scheduler-webhook"}
        }
        if bundle is not None:
            client_config["caBundle"] = base64.b64encode(bundle).decode()
        hooks.append({"name": f"hook-{index}.quotient.dev", "clientConfig": client_config})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION, "resourceVersion": "1"},
        "webhooks": hooks,
    }


def stored_bundles(kube: MemoryKube) -> list[bytes]:
    [stored] = kube.of(certs.WEBHOOK_CONFIGURATIONS)
    return [base64.b64decode(hook["clientConfig"]["caBundle"]) for hook in stored["webhooks"]]


def fingerprints(bundle: bytes) -> list[bytes]:
    return [cert.fingerprint(hashes.SHA256()) for cert in x509.load_pem_x509_certificates(bundle)]


def fingerprint_of(certificate: certs.ServingCertificate) -> bytes:
    return ca_of(certificate).fingerprint(hashes.SHA256())


# --- making and loading ---


def test_a_generated_certificate_names_the_service_and_loopback_and_is_signed_by_its_ca(tmp_path: Path) -> None:
    certificate = make(tmp_path / "tls")
    leaf, ca = leaf_of(certificate), ca_of(certificate)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value

    assert set(names.get_values_for_type(x509.DNSName)) >= {
        "quotient-scheduler-webhook.quotient-system.svc",
        "quotient-scheduler-webhook.quotient-system.svc.cluster.local",
        "localhost",
    }
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert (tmp_path / "tls" / "ca.crt").read_bytes() == certificate.ca_pem


def test_the_private_key_is_readable_by_its_owner_only_and_the_cas_key_is_nowhere(tmp_path: Path) -> None:
    certificate = make(tmp_path / "tls")

    assert certificate.key_path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tls").stat().st_mode & 0o777 == 0o700
    assert sorted(path.name for path in (tmp_path / "tls").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_the_validity_is_the_configured_one_with_a_margin_for_skewed_clocks(tmp_path: Path) -> None:
    certificate = make(tmp_path, validity=datetime.timedelta(hours=2))
    leaf = leaf_of(certificate)

    assert leaf.not_valid_before_utc == NOW - datetime.timedelta(minutes=5)
    assert leaf.not_valid_after_utc == NOW + datetime.timedelta(hours=2)
    assert (certificate.not_before, certificate.not_after) == (leaf.not_valid_before_utc, leaf.not_valid_after_utc)


def test_renewal_is_due_after_two_thirds_of_the_validity(tmp_path: Path) -> None:
    certificate = make(tmp_path, validity=datetime.timedelta(hours=3) - datetime.timedelta(minutes=5))
    # not_before is 5 minutes early, so the whole span is 3 h and two thirds of it end 1 h 55 min after NOW.

    assert not certificate.renewal_due(NOW + datetime.timedelta(minutes=114))
    assert certificate.renewal_due(NOW + datetime.timedelta(minutes=115))


def test_a_zero_validity_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="validity"):
        make(tmp_path, validity=datetime.timedelta(0))


def test_an_unwritable_directory_is_a_configuration_error_that_names_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")

    with pytest.raises(ConfigError, match=str(blocker)):
        make(blocker / "tls")


def test_a_provided_pair_is_read_as_cert_manager_mounts_it(tmp_path: Path) -> None:
    made = make(tmp_path)
    provided = certs.load_provided(tmp_path)

    assert provided == made
    (tmp_path / "ca.crt").unlink()
    assert certs.load_provided(tmp_path).ca_pem is None


def test_a_provided_directory_without_a_key_or_a_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    make(tmp_path)
    (tmp_path / "tls.key").unlink()
    with pytest.raises(ConfigError, match="private key"):
        certs.load_provided(tmp_path)
    make(tmp_path)
    (tmp_path / "tls.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match="no PEM certificate"):
        certs.load_provided(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        certs.load_provided(tmp_path / "missing")


def test_a_server_context_serves_the_pair_and_refuses_a_mismatched_key(tmp_path: Path) -> None:
    first, second = make(tmp_path / "a"), make(tmp_path / "b")
    context = certs.server_context(first)
    mismatched = certs.ServingCertificate(
        cert_path=first.cert_path, key_path=second.key_path, ca_pem=None, not_before=NOW, not_after=NOW
    )

    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(ConfigError, match="cannot load"):
        certs.load_into(context, mismatched)


def test_a_changed_file_changes_the_fingerprint(tmp_path: Path) -> None:
    certificate = make(tmp_path)
    before = certs.fingerprint(certificate)
    make(tmp_path)

    assert before is not None and certs.fingerprint(certificate) != before
    (tmp_path / "tls.key").unlink()
    assert certs.fingerprint(certificate) is None


# --- the bundle ---


def test_merging_keeps_every_unexpired_ca_once_and_drops_expired_and_broken_ones(tmp_path: Path) -> None:
    ours = make(tmp_path / "ours")
    other = make(tmp_path / "other", now=NOW - datetime.timedelta(days=1))
    expired = make(tmp_path / "expired", now=NOW - YEAR - datetime.timedelta(days=1))
    assert ours.ca_pem and other.ca_pem and expired.ca_pem
    broken = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    existing = other.ca_pem + expired.ca_pem + broken + other.ca_pem

    merged = certs.merge_bundle([existing, ours.ca_pem], ours.ca_pem, now=NOW)

    assert fingerprints(merged) == [fingerprint_of(ours), fingerprint_of(other)]
    assert certs.check_bundle(existing, ours.ca_pem, now=NOW) == certs.BundleCheck(trusted=False, stale=True)
    assert certs.check_bundle(merged, ours.ca_pem, now=NOW) == certs.BundleCheck(trusted=True, stale=False)


def test_two_replicas_merging_the_same_cas_write_the_same_bytes(tmp_path: Path) -> None:
    first, second = make(tmp_path / "a"), make(tmp_path / "b", now=NOW + datetime.timedelta(seconds=1))
    assert first.ca_pem and second.ca_pem

    assert certs.merge_bundle([second.ca_pem], first.ca_pem, now=NOW) == certs.merge_bundle(
        [first.ca_pem], second.ca_pem, now=NOW
    )


def test_over_the_bound_the_oldest_cas_go_but_ours_stays(tmp_path: Path) -> None:
    ours = make(tmp_path / "ours", now=NOW - datetime.timedelta(days=30))
    others = [make(tmp_path / str(day), now=NOW - datetime.timedelta(days=day)) for day in range(1, 11)]
    assert ours.ca_pem
    bundle = b"".join(other.ca_pem or b"" for other in others)

    merged = certs.merge_bundle([bundle], ours.ca_pem, now=NOW, limit=4)

    assert fingerprints(merged) == [fingerprint_of(c) for c in others[:3]] + [fingerprint_of(ours)]


# --- writing it into the configuration ---


async def test_the_ca_is_written_into_every_webhook_and_a_second_call_changes_nothing(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = configuration(None, b"")
    ours = make(tmp_path)
    assert ours.ca_pem

    first = await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW)
    second = await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW)

    assert (first, second) == (certs.BundleOutcome.WRITTEN, certs.BundleOutcome.UNCHANGED)
    assert stored_bundles(kube) == [ours.ca_pem, ours.ca_pem]
    assert [call for call in kube.calls if call[0] == "replace"] == [("replace", CONFIGURATION)]


async def test_a_second_replica_adds_its_ca_beside_the_first(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = configuration(None)
    first, second = make(tmp_path / "a"), make(tmp_path / "b", now=NOW + datetime.timedelta(minutes=1))
    assert first.ca_pem and second.ca_pem

    await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=first.ca_pem, now=NOW)
    await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=second.ca_pem, now=NOW)
    again = await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=first.ca_pem, now=NOW)

    [bundle] = stored_bundles(kube)
    assert fingerprints(bundle) == [fingerprint_of(second), fingerprint_of(first)]
    assert again is certs.BundleOutcome.UNCHANGED


async def test_a_conflicting_writer_makes_it_read_again_and_keep_what_the_other_wrote(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = configuration(None)
    ours = make(tmp_path)
    assert ours.ca_pem
    kube.fail["replace"] = deque([KubeConflict("the object has been modified", status=409, reason="Conflict")])

    outcome = await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW)

    assert outcome is certs.BundleOutcome.WRITTEN
    assert [call[0] for call in kube.calls] == ["get", "replace", "get", "replace"]


async def test_endless_conflicts_are_a_fault_after_the_attempts(tmp_path: Path) -> None:
    kube = MemoryKube()
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = configuration(None)
    ours = make(tmp_path)
    assert ours.ca_pem
    kube.fail["replace"] = deque(KubeConflict("modified", status=409, reason="Conflict") for _ in range(3))

    with pytest.raises(KubeConflict, match="3 conflicts"):
        await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW, attempts=3)


async def test_a_missing_configuration_is_an_outcome_not_an_error(tmp_path: Path) -> None:
    kube = MemoryKube()
    ours = make(tmp_path)
    assert ours.ca_pem

    outcome = await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW)

    assert outcome is certs.BundleOutcome.NO_CONFIGURATION


async def test_a_ca_bundle_that_is_not_base64_is_replaced(tmp_path: Path) -> None:
    kube = MemoryKube()
    stored = configuration(None)
    stored["webhooks"][0]["clientConfig"]["caBundle"] = "%%% not base64 %%%"
    kube.objects[("mutatingwebhookconfigurations", "", CONFIGURATION)] = stored
    ours = make(tmp_path)
    assert ours.ca_pem

    await certs.patch_ca_bundle(kube, configuration_name=CONFIGURATION, ca_pem=ours.ca_pem, now=NOW)

    assert stored_bundles(kube) == [ours.ca_pem]

"""Custom resources against ``deploy/``'s CRD schemas, through the real kubectl, as a real API server answers.

The emulator installs Quotient's CRDs at start and holds every Queue and PodGroup to their schemas: unknown fields
are refused under kubectl's strict field validation (its default) or pruned with a warning, and types, minimums,
enums, patterns and required fields are refused with the API server's 422 causes, which kubectl prints. KAI's
v0.15-v0.18 manifests (``kai/``) apply as they are, and the scheduler's decoders read what was stored; the seeds'
v0.13 manifests go through the same schemas in ``test_kubectl.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common import names
from quotient.emulator.emulator import EmulatorThread
from scheduler.objects import gpurequest, podgroups, pods
from tests.integration.emulator.conftest import Kubectl

KAI = Path(__file__).parent / "kai"
S = 1_000_000_000
GIB = 1024**3


def _stored(emulator: EmulatorThread, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
    found = emulator.call(lambda: emulator.emulator.get(api_version, kind, name, namespace))
    assert found is not None, f"{kind} {namespace}/{name} was not stored"
    return found


def _apply(kubectl: Kubectl, document: dict[str, Any], *args: str) -> Any:
    return kubectl("apply", *args, "-f", "-", stdin=yaml.safe_dump(document), check=False)


def _podgroup(spec: dict[str, Any], name: str = "pg") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def test_kais_v015_to_v018_manifests_apply_unchanged_and_read_back_with_their_meaning(
    emulator: EmulatorThread, kubectl: Kubectl
) -> None:
    for path in sorted(KAI.glob("*.yaml")):
        result = kubectl("apply", "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        assert "Warning" not in result.stderr, f"{path.name}: {result.stderr}"

    delayed = podgroups.decode(_stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "delayed-group", "kai-demo"))
    stale = podgroups.decode(_stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "stale-gang", "kai-demo"))
    tree = podgroups.decode(
        _stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "replicated-serving", "kai-demo")
    )
    assert delayed is not None and stale is not None and tree is not None
    assert (delayed.preemption_delay_ns, delayed.problems) == (300 * S, ())
    assert (stale.staleness_grace_ns, stale.min_member, stale.problems) == (30 * S, 2, ())
    assert tree.problems == () and tree.min_subgroup == 1 and len(tree.subgroup_tree) == 7
    share = pods.decode(_stored(emulator, "v1", "Pod", "nv-fractions-request-limit", "kai-demo"))
    assert share is not None and isinstance(share.gpu, gpurequest.GpuRequest)
    assert (share.gpu.memory_bytes, share.gpu.memory_limit_bytes, share.gpu.compute_mode) == (
        4 * GIB,
        8 * GIB,
        names.SM_SHARING,
    )
    queue = _stored(emulator, "scheduling.run.ai/v2", "Queue", "delay-queue")
    assert queue["spec"]["priority"] == 100, "the schema's default"


def test_a_podgroup_the_schema_refuses_is_refused_with_each_field_as_kubectl_prints_it(kubectl: Kubectl) -> None:
    broken = _podgroup(
        {
            "minMember": -1,
            "preemptibility": "sometimes",
            "subGroups": [{"name": "Workers", "minMember": "2"}, {"minMember": 1}],
        }
    )

    result = _apply(kubectl, broken)

    assert result.returncode != 0
    assert 'The PodGroup "pg" is invalid: ' in result.stderr
    for cause in (
        "spec.minMember: Invalid value: -1: spec.minMember in body should be greater than or equal to 0",
        'spec.preemptibility: Unsupported value: "sometimes": supported values: "preemptible", "non-preemptible"',
        'spec.subGroups[0].name: Invalid value: "Workers": spec.subGroups[0].name in body should match '
        "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
        'spec.subGroups[0].minMember: Invalid value: "string": spec.subGroups[0].minMember in body must be of type '
        'integer: "string"',
        "spec.subGroups[1].name: Required value",
    ):
        assert cause in result.stderr, result.stderr
    assert kubectl("get", "podgroup", "pg", check=False).returncode != 0, "nothing was stored"


def test_min_member_zero_is_accepted_at_both_levels(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    result = _apply(kubectl, _podgroup({"minMember": 0, "subGroups": [{"name": "tools", "minMember": 0}]}))

    assert result.returncode == 0, result.stderr
    stored = _stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "pg", "default")
    assert stored["spec"]["minMember"] == 0 and stored["spec"]["subGroups"][0]["minMember"] == 0


def test_an_unknown_field_is_refused_under_kubectls_strict_validation_and_pruned_with_a_warning_otherwise(
    emulator: EmulatorThread, kubectl: Kubectl
) -> None:
    misspelt = _podgroup({"minMembers": 4, "queue": "default-queue"})

    strict = _apply(kubectl, misspelt)
    warned = _apply(kubectl, misspelt, "--validate=warn")

    assert strict.returncode != 0
    assert 'strict decoding error: unknown field "spec.minMembers"' in strict.stderr
    assert warned.returncode == 0, warned.stderr
    assert 'Warning: unknown field "spec.minMembers"' in warned.stderr
    stored = _stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "pg", "default")
    assert stored["spec"] == {"queue": "default-queue"}, "pruned as the schema prunes"


def test_a_queue_with_a_quota_that_is_not_a_number_or_below_minus_one_is_refused(kubectl: Kubectl) -> None:
    queue = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {"resources": {"gpu": {"quota": "lots", "limit": -2}}},
    }

    result = _apply(kubectl, queue)

    assert result.returncode != 0
    assert 'The Queue "team-a" is invalid: ' in result.stderr
    assert (
        'spec.resources.gpu.quota: Invalid value: "string": spec.resources.gpu.quota in body must be of type number'
        in result.stderr
    )
    limit = "spec.resources.gpu.limit"
    assert f"{limit}: Invalid value: -2: {limit} in body should be greater than or equal to -1" in result.stderr


def test_a_status_write_is_pruned_to_the_schema_too(emulator: EmulatorThread, kubectl: Kubectl) -> None:
    assert _apply(kubectl, _podgroup({"minMember": 1})).returncode == 0
    patch = '{"status": {"schedulingConditions": [{"type": "UnschedulableOnNodePool", "status": "True"}], "bogus": 1}}'

    result = kubectl("patch", "podgroup", "pg", "--subresource=status", "--type=merge", "-p", patch, check=False)

    assert result.returncode == 0, result.stderr
    assert 'Warning: unknown field "status.bogus"' in result.stderr
    stored = _stored(emulator, "scheduling.run.ai/v2alpha2", "PodGroup", "pg", "default")
    assert "bogus" not in stored["status"] and stored["status"]["schedulingConditions"][0]["status"] == "True"

"""The GPU-sharing webhook with KAI v0.18's per-container keys: a valid NvFractions share is wired like any share,
a bad one is refused with the scheduler's own message, and a pod may not be created with the binder's
``nvidia.com/container.<c>.gpus.devices``."""

from __future__ import annotations

from common import names
from scheduler.objects import gpurequest
from tests.unit.kube_webhook.reviews import pod
from tests.unit.kube_webhook.test_review import env_of, patched, respond

REQUEST = f"{names.CONTAINER_ANNOTATION_PREFIX}trainer{names.GPU_MEMORY_REQUEST_SUFFIX}"
LIMIT = f"{names.CONTAINER_ANNOTATION_PREFIX}trainer{names.GPU_MEMORY_LIMIT_SUFFIX}"
DEVICES = f"{names.CONTAINER_ANNOTATION_PREFIX}trainer{names.GPU_DEVICES_SUFFIX}"


def test_a_share_by_per_container_keys_is_wired_to_the_container_the_keys_name() -> None:
    obj = pod({REQUEST: "4Gi", LIMIT: "8Gi"}, containers=("sidecar", "trainer"))

    result = patched(obj, respond(obj))

    assert "valueFrom" in env_of(result, "trainer")[names.VISIBLE_DEVICES_ENV]
    assert env_of(result, "sidecar")[names.VISIBLE_DEVICES_ENV]["value"] == names.NO_DEVICES
    assert result["spec"]["runtimeClassName"] == names.NVIDIA_RUNTIME_CLASS


def test_a_request_above_its_limit_is_refused_with_the_schedulers_message() -> None:
    obj = pod({REQUEST: "8Gi", LIMIT: "4Gi"}, containers=("trainer",))
    problem = gpurequest.parse(obj)
    assert isinstance(problem, gpurequest.AnnotationProblem)

    response = respond(obj)

    assert response["allowed"] is False
    assert response["status"] == {"code": 422, "reason": "Invalid", "message": problem.message}


def test_a_pod_created_with_the_binders_device_key_is_refused() -> None:
    response = respond(pod({REQUEST: "4Gi", DEVICES: "GPU-3f1c"}, containers=("trainer",)))

    assert response["allowed"] is False and response["status"]["code"] == 422
    assert response["status"]["message"].startswith(f"{DEVICES} is the binder's")


def test_another_schedulers_pods_are_not_policed() -> None:
    response = respond(pod({DEVICES: "GPU-3f1c"}, containers=("trainer",), scheduler="default-scheduler"))

    assert response["allowed"] is True and "patch" not in response

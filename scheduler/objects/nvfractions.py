"""KAI v0.18's per-container GPU-sharing annotations (NvFractions), read strictly. Pure.

The keys carry the container's name: ``nvidia.com/container.<name>.gpu-memory.request`` (the GPU memory the
container is placed with), ``.gpu-memory.limit`` (the most it may use: KAI's "dynamic fractions", use between the
two is allowed while the device has room) and ``.gpu-compute.mode`` (``time-slicing``, the default, or
``sm-sharing``: pods of different modes never share a device). KAI's documentation also spells the mode as the pod
annotation ``kai.scheduler/gpu-compute-sharing-mode``; both are read, and they must agree.

KAI's admission rules, as its GPU-sharing guide states them (v0.18): values are Kubernetes quantities of at least
1 MiB (the NvFractions runtime's minimum); the request is at most the limit; a limit alone sets the request equal to
it (and a request alone the limit: the runtime caps the container at its request); only one container of a pod may
carry them, and it must be one of the pod's containers. ``nvidia.com/container.<name>.gpus.devices`` is written by
KAI's binder and read by the NvFractions runtime: it is not a request, so it is not read here; the admission webhook
refuses a pod created with it (``scheduler.kube.admission``), since a pod bound by KAI before Quotient took over may
carry it legitimately.

:func:`read` returns what the keys ask of the one container that carries them, or the problem with them;
``gpurequest.parse`` combines it with the pod's other GPU annotations.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from common import names, quantities
from common.errors import QuantityError

# The NvFractions runtime refuses less than 1 MiB; no device sold holds more than 1 TiB.
MIN_BYTES = quantities.MIB
MAX_BYTES = 1024**4
MEMORY_FORMS = 'a Kubernetes quantity of at least 1Mi, such as "512Mi", "4Gi" or "7680Mi"'
COMPUTE_MODES = (names.TIME_SLICING, names.SM_SHARING)
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUFFIXES = (
    names.GPU_MEMORY_REQUEST_SUFFIX,
    names.GPU_MEMORY_LIMIT_SUFFIX,
    names.GPU_COMPUTE_MODE_SUFFIX,
    names.GPU_DEVICES_SUFFIX,
)
# A key under the prefix whose suffix starts like one of ours but is none of them is a typo ("gpu-memory.requests");
# any other key under the prefix is left alone (NVIDIA may add keys there).
_OUR_FAMILIES = (".gpu-memory.", ".gpu-compute.")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContainerShare:
    """What the per-container keys ask for the one container that carries them."""

    container: str
    request_bytes: int = 0
    """0 when only a compute mode is given (the share itself then comes from ``gpu-fraction`` or ``gpu-memory``)."""
    limit_bytes: int = 0
    compute_mode: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KeyProblem:
    """Why the per-container keys are refused: ``field`` is the annotation at fault."""

    field: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Key:
    """One per-container key, taken apart."""

    key: str
    container: str
    suffix: str


def split(key: str) -> Key | None:
    """``nvidia.com/container.<name><suffix>`` taken apart; None for a key that is not one of the four."""
    if not key.startswith(names.CONTAINER_ANNOTATION_PREFIX):
        return None
    rest = key[len(names.CONTAINER_ANNOTATION_PREFIX) :]
    for suffix in _SUFFIXES:
        if rest.endswith(suffix) and len(rest) > len(suffix):
            return Key(key=key, container=rest[: -len(suffix)], suffix=suffix)
    return None


def _typo(key: str) -> bool:
    if not key.startswith(names.CONTAINER_ANNOTATION_PREFIX) or split(key) is not None:
        return False
    return any(family in key[len(names.CONTAINER_ANNOTATION_PREFIX) :] for family in _OUR_FAMILIES)


def device_keys(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The binder-owned ``nvidia.com/container.<name>.gpus.devices`` keys present."""
    found = (split(key) for key in annotations)
    return tuple(key.key for key in found if key is not None and key.suffix == names.GPU_DEVICES_SUFFIX)


def parse_memory(key: str, text: str) -> int | KeyProblem:
    """A per-container memory value in bytes (a quantity, rounded up as Kubernetes does)."""
    try:
        value = quantities.parse_bytes(text.strip())
    except QuantityError:
        return KeyProblem(field=key, message=f"{key} {text!r} is not {MEMORY_FORMS}")
    if value < MIN_BYTES:
        return KeyProblem(field=key, message=f"{key} {text!r} is less than 1Mi; use {MEMORY_FORMS}")
    if value > MAX_BYTES:
        return KeyProblem(field=key, message=f"{key} {text!r} is more than any GPU holds (at most 1Ti per device)")
    return value


def _compute_mode(key: str, text: str) -> str | KeyProblem:
    value = text.strip()
    if value in COMPUTE_MODES:
        return value
    return KeyProblem(
        field=key, message=f"{key} {text!r} is not one of {', '.join(repr(mode) for mode in COMPUTE_MODES)}"
    )


def read(annotations: Mapping[str, str], containers: Sequence[str]) -> ContainerShare | KeyProblem | None:
    """The share the per-container keys (and the pod-level compute mode) ask for; None when there are none."""
    for name in sorted(annotations):
        if _typo(name):
            return KeyProblem(
                field=name,
                message=f"{name} is not a key KAI reads; the per-container keys are "
                f"{names.CONTAINER_ANNOTATION_PREFIX}<container>{{{', '.join(_SUFFIXES[:3])}}}",
            )
    keys = [split(name) for name in sorted(annotations)]
    asking = [found for found in keys if found is not None and found.suffix != names.GPU_DEVICES_SUFFIX]
    pod_mode_text = annotations.get(names.GPU_COMPUTE_SHARING_MODE_ANNOTATION)
    if not asking and pod_mode_text is None:
        return None
    named = sorted({found.container for found in asking})
    if len(named) > 1:
        return KeyProblem(
            field=asking[-1].key,
            message=f"containers {', '.join(repr(name) for name in named)} each carry "
            f"{names.CONTAINER_ANNOTATION_PREFIX}<container> GPU keys; only one container of a pod may have a GPU "
            "share",
        )
    values: dict[str, int | str] = {}
    for found in asking:
        if not _CONTAINER_NAME.match(found.container):
            return KeyProblem(field=found.key, message=f"{found.key}: {found.container!r} is not a container name")
        if found.container not in containers:
            known = ", ".join(repr(name) for name in containers) or "none"
            return KeyProblem(
                field=found.key, message=f"{found.key} names no container of the pod (containers: {known})"
            )
        text = annotations[found.key]
        parsed: int | str | KeyProblem
        if found.suffix == names.GPU_COMPUTE_MODE_SUFFIX:
            parsed = _compute_mode(found.key, text)
        else:
            parsed = parse_memory(found.key, text)
        if isinstance(parsed, KeyProblem):
            return parsed
        values[found.suffix] = parsed
    mode = values.get(names.GPU_COMPUTE_MODE_SUFFIX)
    if pod_mode_text is not None:
        pod_mode = _compute_mode(names.GPU_COMPUTE_SHARING_MODE_ANNOTATION, pod_mode_text)
        if isinstance(pod_mode, KeyProblem):
            return pod_mode
        if mode is not None and mode != pod_mode:
            return KeyProblem(
                field=names.GPU_COMPUTE_SHARING_MODE_ANNOTATION,
                message=f"{names.GPU_COMPUTE_SHARING_MODE_ANNOTATION} {pod_mode!r} disagrees with "
                f"{names.CONTAINER_ANNOTATION_PREFIX}{named[0]}{names.GPU_COMPUTE_MODE_SUFFIX} {mode!r}",
            )
        mode = pod_mode
    request = values.get(names.GPU_MEMORY_REQUEST_SUFFIX)
    limit = values.get(names.GPU_MEMORY_LIMIT_SUFFIX)
    assert request is None or isinstance(request, int)
    assert limit is None or isinstance(limit, int)
    assert mode is None or isinstance(mode, str)
    if request is not None and limit is not None and request > limit:
        stem = f"{names.CONTAINER_ANNOTATION_PREFIX}{named[0]}"
        return KeyProblem(
            field=stem + names.GPU_MEMORY_REQUEST_SUFFIX,
            message=f"{stem}{names.GPU_MEMORY_REQUEST_SUFFIX} ({quantities.format_bytes(request)}) is more than "
            f"{stem}{names.GPU_MEMORY_LIMIT_SUFFIX} ({quantities.format_bytes(limit)}); the request must be at most "
            "the limit",
        )
    # A limit alone sets the request equal to it; a request alone caps the container at the request.
    request = request if request is not None else limit
    limit = limit if limit is not None else request
    return ContainerShare(
        container=named[0] if named else "",
        request_bytes=request or 0,
        limit_bytes=limit or 0,
        compute_mode=mode,
    )

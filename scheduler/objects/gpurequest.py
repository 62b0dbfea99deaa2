"""KAI's GPU-sharing annotations on a pod, read strictly: a valid GPU request, or a problem that says what to fix.

The same reading serves the admission webhook (which rejects a bad pod at creation, with this message) and the
scheduler (which, where no webhook runs, leaves the pod pending with the message as its ``Unschedulable`` reason).
One function, so the two can never disagree. Pure: a pod is a JSON dict in, a value out.

Accepted (KAI-COMPAT.md, "GPU sharing"):
- ``gpu-fraction``: a decimal strictly between 0 and 1 (``"0.5"``), resolved to a milli-GPU;
- ``gpu-memory``: an integer of MiB (KAI's form, ``"3000"``), a Kubernetes quantity (``3Gi``, ``3000Mi``, ``3G``)
  or a spelled unit (``3GiB``, ``3Gib``, ``3 GB``, case-insensitive);
- ``gpu-fraction-num-devices``: a whole number >= 1 (the share is taken on that many devices);
- ``gpu-fraction-container-name``: the container that gets the GPU (default: the first container);
- KAI v0.18's per-container keys (``nvidia.com/container.<name>.gpu-memory.request`` / ``.limit``,
  ``.gpu-compute.mode``, and the pod's ``kai.scheduler/gpu-compute-sharing-mode``), read by ``nvfractions``: the
  request is reserved like ``gpu-memory``, the limit is carried beside it (``memory_limit_bytes``).
Refused: a share together with a whole-GPU request or limit (``nvidia.com/gpu``), two ways of asking for a share
at once (``gpu-fraction``, ``gpu-memory``, the per-container memory keys), the sharing-only annotations (and a
compute mode) without a share, two container names that disagree, and anything unparseable.
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from collections.abc import Mapping, Sequence
from typing import Any

from common import names, quantities
from common.errors import QuantityError
from scheduler.objects import nvfractions

FRACTION_FORMS = 'a decimal strictly between 0 and 1, such as "0.5" or "0.25"'
MEMORY_FORMS = (
    'an integer number of MiB such as "3000", a Kubernetes quantity such as "3Gi", "3000Mi" or "3G", or a spelled '
    'unit such as "3GiB" or "3Gib"'
)
# The largest devices sold hold 141 GiB (H200) to 192 GiB (B200); a request above 1 TiB per device is a typo.
_MAX_MEMORY_BYTES = 1024**4
_MAX_DEVICES = 64
_SPELLED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp])(i?)b\s*$", re.IGNORECASE)
_DECIMAL_TEXT = re.compile(r"^\s*(?:[0-9]+\.?[0-9]*|\.[0-9]+)\s*$")
_ASCII_INTEGER = re.compile(r"^[0-9]+$")  # str.isdigit() would accept "²" and other Unicode digits
_PER_CONTAINER_MEMORY = f"{names.CONTAINER_ANNOTATION_PREFIX}<container>{names.GPU_MEMORY_REQUEST_SUFFIX}/limit"
_SHARE_ANNOTATIONS = f"{names.GPU_FRACTION_ANNOTATION}, {names.GPU_MEMORY_ANNOTATION} or {_PER_CONTAINER_MEMORY}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuRequest:
    """What a pod asks of GPUs. ``whole`` devices, or a share (``milli_gpu`` or ``memory_bytes``) on ``devices``."""

    whole: int = 0
    milli_gpu: int = 0
    memory_bytes: int = 0
    """Per device: ``gpu-memory``, or the NvFractions request (``nvidia.com/container.<c>.gpu-memory.request``,
    else its limit). Placement and accounting reserve this."""
    devices: int = 0
    container: str | None = None
    memory_limit_bytes: int = 0
    """Per device: the NvFractions limit (``.gpu-memory.limit``, else the request), at least ``memory_bytes``; the
    most the pod may use while the device has room. 0 for the other shares: they are held to their allotment."""
    compute_mode: str = names.TIME_SLICING
    """``time-slicing`` or ``sm-sharing`` (``.gpu-compute.mode`` or ``kai.scheduler/gpu-compute-sharing-mode``):
    shares of different modes never share a device."""

    @property
    def is_share(self) -> bool:
        return self.milli_gpu > 0 or self.memory_bytes > 0


NO_GPU = GpuRequest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AnnotationProblem:
    """Why the pod's GPU annotations are refused; ``field`` names the annotation or resource at fault."""

    field: str
    message: str


def parse_fraction(text: str) -> int | AnnotationProblem:
    """``gpu-fraction`` as milli-GPU in 1..999."""
    if not _DECIMAL_TEXT.match(text):
        return AnnotationProblem(
            field=names.GPU_FRACTION_ANNOTATION, message=f"gpu-fraction {text!r} is not {FRACTION_FORMS}"
        )
    value = decimal.Decimal(text.strip())
    if not 0 < value < 1:
        return AnnotationProblem(
            field=names.GPU_FRACTION_ANNOTATION,
            message=f"gpu-fraction {text!r} is out of range: it must be {FRACTION_FORMS}; for whole GPUs request "
            f"{names.GPU_RESOURCE} instead",
        )
    milli = int((value * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    if milli == 0:
        return AnnotationProblem(
            field=names.GPU_FRACTION_ANNOTATION,
            message=f"gpu-fraction {text!r} is below the smallest share, 0.001 of a GPU",
        )
    return min(milli, 999)


def parse_gpu_memory(text: str) -> int | AnnotationProblem:
    """``gpu-memory`` in bytes, from any accepted form."""
    raw = text.strip()
    try:
        if _ASCII_INTEGER.match(raw):
            value = int(raw) * quantities.MIB
        else:
            spelled = _SPELLED.match(raw)
            if spelled is not None:
                number, unit, binary = spelled.groups()
                letter = unit.upper()
                # "GiB"/"Gib" are binary (Gi); "GB" is decimal (G), whose kilo Kubernetes spells "k".
                raw = f"{number}{letter}i" if binary else f"{number}{'k' if letter == 'K' else letter}"
            value = quantities.parse_bytes(raw)
    except QuantityError:
        return AnnotationProblem(
            field=names.GPU_MEMORY_ANNOTATION, message=f"gpu-memory {text!r} is not {MEMORY_FORMS}"
        )
    if value <= 0:
        return AnnotationProblem(
            field=names.GPU_MEMORY_ANNOTATION, message=f"gpu-memory {text!r} must be more than 0; use {MEMORY_FORMS}"
        )
    if value > _MAX_MEMORY_BYTES:
        return AnnotationProblem(
            field=names.GPU_MEMORY_ANNOTATION,
            message=f"gpu-memory {text!r} is more than any GPU holds (at most 1Ti per device)",
        )
    return value


def _whole_gpus(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | AnnotationProblem:
    resources = container.get("resources") or {}
    amounts = []
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if names.GPU_RESOURCE in values:
            try:
                amounts.append(quantities.parse_count(str(values[names.GPU_RESOURCE])))
            except QuantityError:
                return AnnotationProblem(
                    field=names.GPU_RESOURCE,
                    message=f"{names.GPU_RESOURCE} {section} {values[names.GPU_RESOURCE]!r} in container "
                    f"{container.get('name')!r} is not a whole number",
                )
    return max(amounts, default=0)


def parse(pod: Mapping[str, Any]) -> GpuRequest | AnnotationProblem:
    """The pod's GPU request from its containers' ``nvidia.com/gpu`` and its sharing annotations."""
    metadata = pod.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    container_names = [str(c.get("name")) for c in containers]
    whole = 0
    for container in containers:
        amount = _whole_gpus(pod, container)
        if isinstance(amount, AnnotationProblem):
            return amount
        whole += amount
    per_container = nvfractions.read(annotations, container_names)
    if isinstance(per_container, nvfractions.KeyProblem):
        return AnnotationProblem(field=per_container.field, message=per_container.message)
    fraction_text = annotations.get(names.GPU_FRACTION_ANNOTATION)
    memory_text = annotations.get(names.GPU_MEMORY_ANNOTATION)
    asked = [
        name
        for name, present in (
            (names.GPU_FRACTION_ANNOTATION, fraction_text is not None),
            (names.GPU_MEMORY_ANNOTATION, memory_text is not None),
            (_PER_CONTAINER_MEMORY, per_container is not None and per_container.request_bytes > 0),
        )
        if present
    ]
    if not asked:
        return _no_share(annotations, whole, per_container)
    if len(asked) > 1:
        return AnnotationProblem(
            field=asked[-1] if asked[-1] != _PER_CONTAINER_MEMORY else names.GPU_MEMORY_ANNOTATION,
            message=f"{' and '.join(asked)} are both set; ask for a share one way only",
        )
    if whole:
        return AnnotationProblem(
            field=names.GPU_RESOURCE,
            message=f"the pod asks for {whole} whole GPU(s) through {names.GPU_RESOURCE} and for a share through "
            f"{asked[0]}; a shared pod must not request {names.GPU_RESOURCE}",
        )
    milli = memory = limit = 0
    if fraction_text is not None:
        parsed = parse_fraction(fraction_text)
        if isinstance(parsed, AnnotationProblem):
            return parsed
        milli = parsed
    elif memory_text is not None:
        parsed = parse_gpu_memory(memory_text)
        if isinstance(parsed, AnnotationProblem):
            return parsed
        memory = parsed
    else:
        assert per_container is not None
        memory, limit = per_container.request_bytes, per_container.limit_bytes
    devices = _devices(annotations.get(names.GPU_FRACTION_NUM_DEVICES_ANNOTATION))
    if isinstance(devices, AnnotationProblem):
        return devices
    chosen = _container(annotations.get(names.GPU_FRACTION_CONTAINER_ANNOTATION), container_names, per_container)
    if isinstance(chosen, AnnotationProblem):
        return chosen
    mode = per_container.compute_mode if per_container is not None else None
    return GpuRequest(
        milli_gpu=milli,
        memory_bytes=memory,
        memory_limit_bytes=limit,
        devices=devices,
        container=chosen,
        compute_mode=mode or names.TIME_SLICING,
    )


def _no_share(
    annotations: Mapping[str, str], whole: int, per_container: nvfractions.ContainerShare | None
) -> GpuRequest | AnnotationProblem:
    """A pod without a share: whole GPUs or none, unless a sharing-only annotation is set without a share."""
    for name in (names.GPU_FRACTION_NUM_DEVICES_ANNOTATION, names.GPU_FRACTION_CONTAINER_ANNOTATION):
        if annotations.get(name) is not None:
            return AnnotationProblem(
                field=name,
                message=f"{name} is set but the pod asks for no GPU share ({_SHARE_ANNOTATIONS})",
            )
    if per_container is not None:
        field = (
            f"{names.CONTAINER_ANNOTATION_PREFIX}{per_container.container}{names.GPU_COMPUTE_MODE_SUFFIX}"
            if per_container.container
            else names.GPU_COMPUTE_SHARING_MODE_ANNOTATION
        )
        return AnnotationProblem(
            field=field,
            message=f"{field} sets a compute mode but the pod asks for no GPU share ({_SHARE_ANNOTATIONS})",
        )
    return GpuRequest(whole=whole, devices=whole) if whole else NO_GPU


def _devices(text: str | None) -> int | AnnotationProblem:
    if text is None:
        return 1
    if not _ASCII_INTEGER.match(text.strip()) or not 1 <= int(text.strip()) <= _MAX_DEVICES:
        return AnnotationProblem(
            field=names.GPU_FRACTION_NUM_DEVICES_ANNOTATION,
            message=f"{names.GPU_FRACTION_NUM_DEVICES_ANNOTATION} {text!r} must be a whole number from 1 to "
            f"{_MAX_DEVICES}",
        )
    return int(text.strip())


def _container(
    named: str | None, containers: Sequence[str], per_container: nvfractions.ContainerShare | None
) -> str | AnnotationProblem | None:
    """The container that gets the share: the one the per-container keys name, else ``gpu-fraction-container-name``,
    else the first; the two names must agree where both are given (KAI's rule)."""
    if named is not None and named not in containers:
        known = ", ".join(containers) or "none"
        return AnnotationProblem(
            field=names.GPU_FRACTION_CONTAINER_ANNOTATION,
            message=f"{names.GPU_FRACTION_CONTAINER_ANNOTATION} {named!r} names no container of the pod "
            f"(containers: {known})",
        )
    chosen = named or (containers[0] if containers else None)
    keyed = per_container.container if per_container is not None else ""
    if keyed and chosen != keyed:
        if named is None and per_container is not None and per_container.request_bytes > 0:
            return keyed  # the per-container memory keys name the share's container themselves
        return AnnotationProblem(
            field=names.GPU_FRACTION_CONTAINER_ANNOTATION,
            message=f"the share goes to container {chosen!r} but the {names.CONTAINER_ANNOTATION_PREFIX}{keyed}.* "
            f"keys name container {keyed!r}; name one container",
        )
    return chosen

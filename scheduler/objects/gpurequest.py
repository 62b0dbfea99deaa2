"""KAI's GPU-sharing annotations on a pod, read strictly: a valid GPU request, or a problem that says what to fix.

The same reading serves the admission webhook (which rejects a bad pod at creation, with this message) and the
scheduler (which, where no webhook runs, leaves the pod pending with the message as its ``Unschedulable`` reason).
One function, so the two can never disagree. Pure: a pod is a JSON dict in, a value out.

Accepted (KAI-COMPAT.md, "GPU sharing"):
- ``gpu-fraction``: a decimal strictly between 0 and 1 (``"0.5"``), resolved to a milli-GPU;
- ``gpu-memory``: an integer of MiB (KAI's form, ``"3000"``), a Kubernetes quantity (``3Gi``, ``3000Mi``, ``3G``)
  or a spelled unit (``3GiB``, ``3Gib``, ``3 GB``, case-insensitive);
- ``gpu-fraction-num-devices``: a whole number >= 1 (the share is taken on that many devices);
- ``gpu-fraction-container-name``: the container that gets the GPU (default: the first container).
Refused: a share together with a whole-GPU request or limit (``nvidia.com/gpu``), ``gpu-fraction`` together with
``gpu-memory``, the sharing-only annotations without a share, and anything unparseable.
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from collections.abc import Mapping
from typing import Any

from common import names, quantities
from common.errors import QuantityError

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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuRequest:
    """What a pod asks of GPUs. ``whole`` devices, or a share (``milli_gpu`` or ``memory_bytes``) on ``devices``."""

    whole: int = 0
    milli_gpu: int = 0
    memory_bytes: int = 0
    devices: int = 0
    container: str | None = None

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
    whole = 0
    for container in containers:
        amount = _whole_gpus(pod, container)
        if isinstance(amount, AnnotationProblem):
            return amount
        whole += amount
    fraction_text = annotations.get(names.GPU_FRACTION_ANNOTATION)
    memory_text = annotations.get(names.GPU_MEMORY_ANNOTATION)
    devices_text = annotations.get(names.GPU_FRACTION_NUM_DEVICES_ANNOTATION)
    container_name = annotations.get(names.GPU_FRACTION_CONTAINER_ANNOTATION)
    if fraction_text is None and memory_text is None:
        for name, text in (
            (names.GPU_FRACTION_NUM_DEVICES_ANNOTATION, devices_text),
            (names.GPU_FRACTION_CONTAINER_ANNOTATION, container_name),
        ):
            if text is not None:
                return AnnotationProblem(
                    field=name,
                    message=f"{name} is set but the pod asks for no GPU share "
                    f"({names.GPU_FRACTION_ANNOTATION} or {names.GPU_MEMORY_ANNOTATION})",
                )
        return GpuRequest(whole=whole, devices=whole) if whole else NO_GPU
    if fraction_text is not None and memory_text is not None:
        return AnnotationProblem(
            field=names.GPU_MEMORY_ANNOTATION,
            message=f"{names.GPU_FRACTION_ANNOTATION} and {names.GPU_MEMORY_ANNOTATION} are both set; ask for a share "
            "one way only",
        )
    if whole:
        return AnnotationProblem(
            field=names.GPU_RESOURCE,
            message=f"the pod asks for {whole} whole GPU(s) through {names.GPU_RESOURCE} and for a share through "
            f"{names.GPU_FRACTION_ANNOTATION if fraction_text is not None else names.GPU_MEMORY_ANNOTATION}; a shared "
            f"pod must not request {names.GPU_RESOURCE}",
        )
    milli = 0
    memory = 0
    if fraction_text is not None:
        parsed = parse_fraction(fraction_text)
        if isinstance(parsed, AnnotationProblem):
            return parsed
        milli = parsed
    else:
        assert memory_text is not None
        parsed = parse_gpu_memory(memory_text)
        if isinstance(parsed, AnnotationProblem):
            return parsed
        memory = parsed
    devices = 1
    if devices_text is not None:
        if not _ASCII_INTEGER.match(devices_text.strip()) or not 1 <= int(devices_text.strip()) <= _MAX_DEVICES:
            return AnnotationProblem(
                field=names.GPU_FRACTION_NUM_DEVICES_ANNOTATION,
                message=f"{names.GPU_FRACTION_NUM_DEVICES_ANNOTATION} {devices_text!r} must be a whole number from 1 "
                f"to {_MAX_DEVICES}",
            )
        devices = int(devices_text.strip())
    if container_name is not None and container_name not in {c.get("name") for c in containers}:
        known = ", ".join(str(c.get("name")) for c in containers) or "none"
        return AnnotationProblem(
            field=names.GPU_FRACTION_CONTAINER_ANNOTATION,
            message=f"{names.GPU_FRACTION_CONTAINER_ANNOTATION} {container_name!r} names no container of the pod "
            f"(containers: {known})",
        )
    chosen = container_name or (str(containers[0].get("name")) if containers else None)
    return GpuRequest(milli_gpu=milli, memory_bytes=memory, devices=devices, container=chosen)

"""Human units for everything the operator's view prints: GPUs as decimals, memory in GiB, ages in s/m/h/d.

Accounting stays in integers (milli-GPU, millicores, bytes) until this module turns a number into words.
"""

from __future__ import annotations

from common import quantities
from scheduler.placement import status

Resource = status.Resource

UNLIMITED = -1


def gpus(milli: int) -> str:
    """``0.5 GPU``, ``1 GPU``, ``9 GPUs``."""
    plural = milli > quantities.MILLI_GPU_PER_GPU or milli == 0
    return f"{gpu_number(milli)} GPU{'s' if plural else ''}"


def gpu_number(milli: int) -> str:
    """The number alone, for table cells: ``0.5``, ``8``."""
    whole, rest = divmod(milli, quantities.MILLI_GPU_PER_GPU)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


def cpus(milli: int) -> str:
    cores, rest = divmod(milli, quantities.MILLICORES_PER_CORE)
    if rest == 0:
        return f"{cores} CPU" if cores == 1 else f"{cores} CPUs"
    return f"{milli}m CPU"


def gib(value: int) -> str:
    """Memory in GiB (``12.5 GiB``); below 1 GiB in MiB (``512 MiB``), so small amounts do not read as 0.0."""
    if abs(value) >= quantities.GIB or value == 0:
        return f"{value / quantities.GIB:.1f} GiB"
    return f"{value / quantities.MIB:.0f} MiB"


def amount(resource: Resource, value: int) -> str:
    """An amount of ``resource`` in its unit (milli-GPU, millicores, bytes, pod slots) as a person reads it."""
    if resource is Resource.GPU:
        return gpus(value)
    if resource is Resource.CPU:
        return cpus(value)
    if resource in (Resource.MEMORY, Resource.GPU_MEMORY):
        return gib(value)
    return f"{value} pod slot{'' if value == 1 else 's'}"


def setting(resource: Resource, value: int | None) -> str:
    """A quota or limit: ``-1`` is unlimited, None unknown."""
    if value is None:
        return "?"
    if value == UNLIMITED:
        return "unlimited"
    return amount(resource, value)


def cell(resource: Resource, value: int | None) -> str:
    """A table cell: the number in the resource's display unit (GPUs, cores, GiB), ``-`` for unknown, ``∞``
    for unlimited."""
    if value is None:
        return "-"
    if value == UNLIMITED:
        return "unlimited"
    if resource is Resource.GPU:
        return gpu_number(value)
    if resource is Resource.CPU:
        return gpu_number(value)  # millicores read as cores the same way
    if resource in (Resource.MEMORY, Resource.GPU_MEMORY):
        return f"{value / quantities.GIB:.1f}Gi"
    return str(value)


def parse(resource: Resource, text: object) -> int | None:
    """A quantity as Quotient's status fields write it (``0.5``, ``500m``, ``16Gi``, ``3``), in the resource's
    unit; None when it cannot be read."""
    if not isinstance(text, str | int | float) or isinstance(text, bool):
        return None
    try:
        if resource is Resource.GPU:
            return quantities.parse_milli_gpu(text)
        if resource is Resource.CPU:
            return quantities.parse_millicores(text)
        if resource in (Resource.MEMORY, Resource.GPU_MEMORY):
            return quantities.parse_bytes(text if not isinstance(text, float) else int(text))
        return quantities.parse_count(text if not isinstance(text, float) else int(text))
    except ValueError:
        return None


def age(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h5m``, ``3d4h``, as kubectl prints ages."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs}s" if secs and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"

"""The GPU models a cluster spec may name, and the identity each fake device gets.

A model's memory is the total NVML reports (``nvidia-smi``, GPU Feature Discovery's ``nvidia.com/gpu.memory``), not
the size on the box, so that a pod that would not fit on the real card does not fit here either. Models are matched
case-insensitively by spec name, NVML name or that name's label form; a model not listed needs its memory given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import types
import uuid
from collections.abc import Mapping

from common import quantities
from common.clusterspec import checking

# Changing this changes every fake GPU's UUID; keep it.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://quotient.dev/fake-gpu")
_UUID_NAMESPACE_BYTES = _UUID_NAMESPACE.bytes


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel:
    """A kind of GPU: the name a spec uses, the name NVML reports, and the memory NVML reports."""

    name: str
    product: str
    memory_bytes: int

    @property
    def product_label(self) -> str:
        """The value of ``nvidia.com/gpu.product`` for this model."""
        return product_label(self.product)


def _model(name: str, product: str, memory_mib: int) -> GpuModel:
    return GpuModel(name=name, product=product, memory_bytes=memory_mib * quantities.MIB)


# Memory totals as NVML (nvidia-smi, GFD's nvidia.com/gpu.memory) reports them for the SXM/PCIe boards named.
KNOWN_GPU_MODELS: Mapping[str, GpuModel] = types.MappingProxyType(
    {
        model.name: model
        for model in (
            _model("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960),
            _model("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920),
            _model("H100-80GB", "NVIDIA H100 80GB HBM3", 81559),
            _model("H200", "NVIDIA H200", 143771),
            _model("L4", "NVIDIA L4", 23034),
            _model("A10", "NVIDIA A10", 23028),
            _model("T4", "Tesla T4", 15360),
            _model("V100-16GB", "Tesla V100-SXM2-16GB", 16160),
            _model("V100-32GB", "Tesla V100-SXM2-32GB", 32510),
            _model("V100M16", "Tesla V100-SXM2-16GB", 16160),  # the Alibaba trace's names
            _model("V100M32", "Tesla V100-SXM2-32GB", 32510),
            _model("P100", "Tesla P100-PCIE-16GB", 16280),
            _model("G1", "G1", 32768),  # undisclosed in the trace: see the docstring of common.clusterspec
            _model("G2", "G2", 32768),
            _model("G3", "G3", 32768),
        )
    }
)


def product_label(product: str) -> str:
    """GPU Feature Discovery's label form of an NVML product name: words joined by dashes, other characters dashed."""
    dashed = re.sub(r"[^A-Za-z0-9._-]", "-", "-".join(product.split()))
    return dashed[:63].strip("-._")


# Every spelling a spec may use for a known model: its name, its NVML name, and that name's label form, any case.
_MODEL_INDEX: Mapping[str, GpuModel] = {
    alias.lower(): model
    for model in tuple(KNOWN_GPU_MODELS.values())[::-1]  # the first of equal products wins
    for alias in (model.name, model.product, model.product_label)
}


def lookup_gpu_model(name: str) -> GpuModel | None:
    """The known model called ``name`` (spec name, NVML name or its label form; any case), or None."""
    return _MODEL_INDEX.get(name.strip().lower())


def resolve_model(name: str, memory_bytes: int | None) -> GpuModel:
    """The model a spec names, with its memory overridden when given; a model not known needs ``memory_bytes``."""
    known = lookup_gpu_model(name)
    if known is not None:
        return known if memory_bytes is None else dataclasses.replace(known, memory_bytes=memory_bytes)
    if memory_bytes is None:
        raise checking.Invalid(
            f"unknown GPU model {name!r}{checking.suggest(name, KNOWN_GPU_MODELS)}; give its memory, "
            f"or use one of {', '.join(KNOWN_GPU_MODELS)}"
        )
    if not product_label(name):
        raise checking.Invalid(f"GPU model name {name!r} needs a letter or digit")
    return GpuModel(name=name, product=name, memory_bytes=memory_bytes)


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of device ``index`` on ``node``: NVML's ``GPU-`` form, the same in every run.

    It is ``uuid.uuid5(_UUID_NAMESPACE, "<node>/<index>")``, computed with hashlib directly because the uuid module
    takes a second for the 40,000 devices of a 5,000-node cluster.
    """
    digest = bytearray(hashlib.sha1(_UUID_NAMESPACE_BYTES + f"{node}/{index}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

"""The inline form of a cluster spec, for the command line: ``2x8xA100-80GB+4x0:cpu=96``.

Groups ``NODESxGPUS[xMODEL][:KEY=VALUE,...]`` joined by ``+``; nodes are named PREFIX-0, PREFIX-1, ... (prefix
``node``), numbered on across the groups that share a prefix. It describes nodes only, never pods.
"""

from __future__ import annotations

import re

from common import quantities
from common.clusterspec import building, checking, spec
from common.errors import ClusterSpecError

INLINE_FORM = (
    "groups NODESxGPUS[xMODEL][:KEY=VALUE,...] joined by '+', such as 2x8xA100-80GB, 2x8xA100-80GB+4x0 or "
    "2x8xA100-80GB:cpu=96,mem=768Gi,pods=110,gpumem=80Gi,prefix=gpu-a"
)

_INLINE_GROUP = re.compile(r"([0-9]+)x([0-9]+)(?:x([^:]+))?(?::(.*))?", re.DOTALL)
_INLINE_KEYS = ("cpu", "mem", "pods", "gpumem", "prefix")


def parse_inline(text: str) -> spec.ClusterSpec:
    """Read the inline form (``2x8xA100-80GB+4x0:cpu=32``); see the module docstring."""
    allocator = building.NameAllocator()
    nodes: list[spec.NodeSpec] = []
    for number, group in enumerate(text.split("+"), start=1):
        try:
            nodes.extend(_inline_group(group.strip(), allocator, len(nodes)))
        except checking.Invalid as exc:
            where = f"group {number} {checking.excerpt(group.strip())}: " if "+" in text else ""
            raise ClusterSpecError(
                f"inline cluster spec {checking.excerpt(text)}: {where}{exc}; expected {INLINE_FORM}"
            ) from exc
    return spec.ClusterSpec(nodes=tuple(nodes), pods=())


def _inline_group(group: str, allocator: building.NameAllocator, nodes_so_far: int) -> list[spec.NodeSpec]:
    match = _INLINE_GROUP.fullmatch(group)
    if match is None:
        raise checking.Invalid("not NODESxGPUS[xMODEL][:KEY=VALUE,...]" if group else "empty group")
    if len(match[1]) > 9 or len(match[2]) > 9:
        raise checking.Invalid("too many nodes or GPUs")
    node_count, gpu_count, model, overrides = int(match[1]), int(match[2]), match[3], match[4]
    if node_count < 1 or nodes_so_far + node_count > building.MAX_NODES:
        raise checking.Invalid(f"{node_count} nodes; between 1 and {building.MAX_NODES} in all are supported")
    settings = _overrides(overrides)
    parse = checking.parse
    gpu_memory = parse(quantities.parse_bytes, settings["gpumem"], "gpumem") if "gpumem" in settings else None
    gpu_model = building.gpu_group(gpu_count, model.strip() if model is not None else None, gpu_memory)
    default_cpu, default_memory = building.default_node_resources(gpu_count)
    milli_cpu = parse(quantities.parse_millicores, settings["cpu"], "cpu") if "cpu" in settings else default_cpu
    memory = parse(quantities.parse_bytes, settings["mem"], "mem") if "mem" in settings else default_memory
    pods = parse(quantities.parse_count, settings["pods"], "pods") if "pods" in settings else building.DEFAULT_POD_SLOTS
    prefix = settings.get("prefix", building.DEFAULT_NODE_PREFIX)
    nodes = []
    for _ in range(node_count):
        name = allocator.take(prefix)
        checking.check_name(name, "node name")
        nodes.append(
            building.build_node(
                name, milli_cpu=milli_cpu, memory_bytes=memory, pods=pods, gpu_count=gpu_count, model=gpu_model
            )
        )
    return nodes


def _overrides(text: str | None) -> dict[str, str]:
    """The ``KEY=VALUE,...`` after a group's colon, each key known and given once."""
    settings: dict[str, str] = {}
    for item in text.split(",") if text is not None else []:
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key or not value:
            raise checking.Invalid(f"override {item.strip()!r} is not KEY=VALUE")
        if key not in _INLINE_KEYS:
            raise checking.Invalid(
                f"unknown override {key!r}{checking.suggest(key, _INLINE_KEYS)}; accepted: {', '.join(_INLINE_KEYS)}"
            )
        if key in settings:
            raise checking.Invalid(f"override {key!r} given twice")
        settings[key] = value
    return settings

"""Reading composed YAML nodes as the shapes a cluster spec is made of, every failure naming the line and field.

The spec is read from PyYAML's composed node graph, not from ``safe_load``'s Python values, for three reasons: each
node knows its line, so an error says ``cluster.yaml:7: nodes[1].gpus.count: ...``; duplicate keys, which
``safe_load`` silently merges, can be refused; and scalars can be taken as written (``true`` and ``0.50`` stay
text), never re-spelled by YAML's typing. ``ShapeReader`` knows mappings, lists, text, names, quantities and memory
scripts; the schema (which keys a node or a pod has) is its subclass in ``schema``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

import yaml

from common import quantities
from common.clusterspec import checking, memoryscripts
from common.errors import ClusterSpecError

TAG = "tag:yaml.org,2002:"
_TEXT_TAGS = frozenset({TAG + "str", TAG + "int", TAG + "float"})
_SCRIPT_POINT_KEYS = ("at", "memory")


def join(path: str, key: str) -> str:
    """The path of ``key`` under ``path`` (``nodes[0].gpus``), or the key alone at the top."""
    return f"{path}.{key}" if path else key


class ShapeReader:
    """Turns composed YAML nodes into checked values; every failure names the source, the line and the field."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self._source = source
        self._loader = loader

    def fail(self, node: yaml.Node, path: str, message: str) -> NoReturn:
        raise ClusterSpecError(f"{self._source}:{node.start_mark.line + 1}: {path}: {message}")

    def pairs(self, node: yaml.Node, path: str) -> list[tuple[yaml.Node, str, yaml.Node]]:
        """A mapping's (key node, key, value node), merge keys applied, explicit duplicates refused."""
        if not isinstance(node, yaml.MappingNode) or node.tag != TAG + "map":
            self.fail(node, path, f"expected a mapping, got {_kind(node)}")
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == TAG + "merge":
                continue
            key = self.key(key_node, path)
            if key in seen:
                self.fail(key_node, join(path, key), f"duplicate key (first on line {seen[key].start_mark.line + 1})")
            seen[key] = key_node
        self._loader.flatten_mapping(node)
        return [(key_node, self.key(key_node, path), value) for key_node, value in node.value]

    def key(self, node: yaml.Node, path: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag == TAG + "null":
            self.fail(node, path, f"a key must be text, got {_kind(node)}")
        return str(node.value)

    def fields(
        self, node: yaml.Node, path: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> dict[str, yaml.Node]:
        """A mapping whose keys are among ``allowed`` (an unknown one gets a suggestion) and include ``required``."""
        found: dict[str, yaml.Node] = {}
        for key_node, key, value in self.pairs(node, path):
            if key not in allowed:
                self.fail(
                    key_node,
                    join(path, key),
                    f"unknown key{checking.suggest(key, allowed)}; accepted: {', '.join(allowed)}",
                )
            found[key] = value
        for key in required:
            if key not in found:
                self.fail(node, path, f"missing required key {key!r}")
        return found

    def items(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or node.tag != TAG + "seq":
            self.fail(node, path, f"expected a list, got {_kind(node)}")
        return list(node.value)

    def optional_items(self, fields: Mapping[str, yaml.Node], key: str, path: str) -> list[yaml.Node]:
        """The list under ``key``, or none when the key is absent."""
        return self.items(fields[key], join(path, key)) if key in fields else []

    def text(self, node: yaml.Node, path: str, *, allow_bool: bool = False) -> str:
        """A scalar as written: names, label values ("true" stays "true") and quantities ("1.50" stays "1.50")."""
        tags = _TEXT_TAGS | {TAG + "bool"} if allow_bool else _TEXT_TAGS
        if not isinstance(node, yaml.ScalarNode) or node.tag not in tags:
            self.fail(
                node, path, f"expected a value, got {_kind(node)}" + ("; quote it" if node.tag == TAG + "bool" else "")
            )
        return str(node.value)

    def name(self, node: yaml.Node, path: str, check: Callable[[str], None]) -> str:
        text = self.text(node, path)
        try:
            check(text)
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))
        return text

    def number(self, node: yaml.Node, path: str, parser: Callable[[str], int], *, minimum: int = 0) -> int:
        try:
            value = checking.parse(parser, self.text(node, path), path.rpartition(".")[2])
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))
        if value < minimum:
            self.fail(node, path, f"must be at least {minimum}")
        return value

    def string_map(self, node: yaml.Node, path: str, check: Callable[[str, str], None]) -> dict[str, str]:
        result: dict[str, str] = {}
        for key_node, key, value_node in self.pairs(node, path):
            value = self.text(value_node, join(path, key), allow_bool=True)
            try:
                check(key, value)
            except checking.Invalid as exc:
                self.fail(key_node, join(path, key), str(exc))
            result[key] = value
        return result

    def script(self, node: yaml.Node, path: str) -> memoryscripts.MemoryScript:
        """A memory script: its text form, or a list of ``{at: 20s, memory: 30Gi}`` points."""
        try:
            if isinstance(node, yaml.SequenceNode):
                points: list[tuple[int, int]] = []
                for index, item in enumerate(self.items(node, path)):
                    here = f"{path}[{index}]"
                    fields = self.fields(item, here, _SCRIPT_POINT_KEYS, required=("memory",))
                    at = fields.get("at")
                    offset_ns = 0 if at is None else self.number(at, f"{here}.at", quantities.parse_duration_ns)
                    points.append((offset_ns, self.number(fields["memory"], f"{here}.memory", quantities.parse_bytes)))
                return memoryscripts.script_from_points(points)
            return memoryscripts.script_from_text(self.text(node, path))
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == TAG + "null":
        return "nothing"
    return f"{node.tag.removeprefix(TAG)} {checking.excerpt(str(node.value))}"

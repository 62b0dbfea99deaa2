"""Label and field selectors: the query strings of list and watch, and the selector objects inside manifests.

Parsed once per request (or once per watch) into small matchers, since a watch tests every write against its
selectors: hundreds of watchers times hundreds of writes per second. The grammar is the API server's
(``k8s.io/apimachinery/pkg/labels`` and ``fields``): ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
``a``, ``!a``, ``a>1``, ``a<1`` for labels; ``f=v``, ``f==v``, ``f!=v`` for fields, with ``\\`` escapes. A field
the kind does not support is a 400, as on a real server, so a typo in a scheduler's selector shows at once.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

from quotient.emulator import status
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, labels_of


class Op(enum.StrEnum):
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GT = "gt"
    LT = "lt"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op is Op.IN:
            return value is not None and value in self.values
        if self.op is Op.NOT_IN:
            return value is None or value not in self.values
        if self.op is Op.EXISTS:
            return value is not None
        if self.op is Op.DOES_NOT_EXIST:
            return value is None
        if value is None:
            return False
        try:
            number, bound = int(value), int(next(iter(self.values)))
        except (ValueError, StopIteration):
            return False
        return number > bound if self.op is Op.GT else number < bound


@dataclasses.dataclass(frozen=True, slots=True)
class LabelSelector:
    """All requirements must hold; no requirement selects everything (``None`` in a manifest selects nothing)."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.nothing

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        return all(requirement.matches(labels) for requirement in self.requirements)

    def matches_object(self, obj: Obj) -> bool:
        return self.matches(labels_of(obj))


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_COMPARE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=|>|<)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def parse_labels(text: str | None) -> LabelSelector | status.Failure:
    """A ``labelSelector`` query string."""
    if text is None or not text.strip():
        return EVERYTHING
    requirements = []
    for part in _split_top_level(text):
        match = _SET.match(part)
        if match is not None:
            values = frozenset(value.strip() for value in match.group(4).split(",") if value.strip())
            op = Op.IN if match.group(3) == "in" else Op.NOT_IN
            requirements.append(Requirement(key=match.group(1), op=op, values=values))
            continue
        match = _COMPARE.match(part)
        if match is not None:
            key, symbol, value = match.group(1), match.group(3), match.group(4)
            if symbol in (">", "<"):
                if not value.lstrip("-").isdigit():
                    return status.bad_request(
                        f"unable to parse requirement: for 'gt', 'lt' operators, the value "
                        f"must be an integer: {part.strip()}"
                    )
                requirements.append(
                    Requirement(key=key, op=Op.GT if symbol == ">" else Op.LT, values=frozenset({value}))
                )
                continue
            requirements.append(
                Requirement(key=key, op=Op.NOT_IN if symbol == "!=" else Op.IN, values=frozenset({value}))
            )
            continue
        match = _EXISTS.match(part)
        if match is not None:
            op = Op.DOES_NOT_EXIST if match.group(1) else Op.EXISTS
            requirements.append(Requirement(key=match.group(2), op=op))
            continue
        return status.bad_request(
            f"unable to parse requirement: found '{part.strip()}', expected: a label selector "
            "requirement such as key=value, key!=value, key in (a,b), key or !key"
        )
    return LabelSelector(tuple(requirements))


_EXPRESSION_OPS = {
    "In": Op.IN,
    "NotIn": Op.NOT_IN,
    "Exists": Op.EXISTS,
    "DoesNotExist": Op.DOES_NOT_EXIST,
    "Gt": Op.GT,
    "Lt": Op.LT,
}


def from_object(selector: Any) -> LabelSelector:
    """A ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions``); absent selects nothing, ``{}`` all."""
    if not isinstance(selector, dict):
        return NOTHING
    requirements = [
        Requirement(key=str(key), op=Op.IN, values=frozenset({str(value)}))
        for key, value in (selector.get("matchLabels") or {}).items()
    ]
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, dict):
            continue
        op = _EXPRESSION_OPS.get(str(expression.get("operator", "")))
        if op is None:
            return NOTHING
        values = frozenset(str(value) for value in expression.get("values") or [])
        requirements.append(Requirement(key=str(expression.get("key", "")), op=op, values=values))
    return LabelSelector(tuple(requirements))


# --- Field selectors ---


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FieldRequirement:
    path: tuple[str, ...]
    value: str
    negated: bool


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, obj: Obj) -> bool:
        for requirement in self.requirements:
            if (field_value(obj, requirement.path) == requirement.value) == requirement.negated:
                return False
        return True

    def exact(self, label: str) -> str | None:
        """The value an ``=`` requirement on ``label`` demands (a watch of one name), if any."""
        path = _FIELD_PATHS.get(label, tuple(label.split(".")))
        for requirement in self.requirements:
            if requirement.path == path and not requirement.negated:
                return requirement.value
        return None


ALL_FIELDS = FieldSelector()

# Field labels that do not name their path literally.
_FIELD_PATHS: Mapping[str, tuple[str, ...]] = {"source": ("source", "component")}


def field_value(obj: Obj, path: Sequence[str]) -> str:
    value: Any = obj
    for part in path:
        if not isinstance(value, dict):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_fields(text: str | None, kind: Kind) -> FieldSelector | status.Failure:
    """A ``fieldSelector`` query string, checked against the fields ``kind`` supports."""
    if text is None or not text.strip():
        return ALL_FIELDS
    requirements = []
    for part in re.split(r"(?<!\\),", text):
        if not part.strip():
            continue
        match = re.match(r"^(.*?)(==|!=|=)(.*)$", part)
        if match is None:
            return status.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        label, symbol, value = match.group(1).strip(), match.group(2), _unescape(match.group(3))
        if not kind.supports_field(label):
            return status.bad_request(f"field label not supported: {label}")
        path = _FIELD_PATHS.get(label, tuple(label.split(".")))
        requirements.append(FieldRequirement(path=path, value=value, negated=symbol == "!="))
    return FieldSelector(tuple(requirements))


# --- Node affinity (for the kubelet's admission check) ---


def node_selector_term_matches(term: Any, node: Obj) -> bool:
    """One ``nodeSelectorTerm``: all its ``matchExpressions`` on labels and ``matchFields`` on the name hold."""
    if not isinstance(term, dict):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    labels = labels_of(node)
    node_fields = {"metadata.name": str(node.get("metadata", {}).get("name", ""))}
    for source, items in ((labels, expressions), (node_fields, fields)):
        for expression in items:
            if not isinstance(expression, dict):
                return False
            op = _EXPRESSION_OPS.get(str(expression.get("operator", "")))
            if op is None:
                return False
            values = frozenset(str(value) for value in expression.get("values") or [])
            if not Requirement(key=str(expression.get("key", "")), op=op, values=values).matches(source):
                return False
    return True


def pod_fits_node_labels(pod: Obj, node: Obj) -> bool:
    """``nodeSelector`` and required node affinity, as the kubelet re-checks them at admission."""
    spec = pod.get("spec") or {}
    labels = labels_of(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if isinstance(affinity, dict):
        terms = affinity.get("nodeSelectorTerms") or []
        return any(node_selector_term_matches(term, node) for term in terms)
    return True

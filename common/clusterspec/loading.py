"""Where a cluster spec comes from: YAML text, a file, or a command-line argument that is a file or the inline form.

These are the only functions of ``common.clusterspec`` that touch the file system. YAML's own errors (syntax,
unknown tags, a recursive alias) become ``ClusterSpecError`` with the source and line, as the schema's do.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from common.clusterspec import inline, schema, spec
from common.errors import ClusterSpecError


def loads(text: str, source: str = "<string>") -> spec.ClusterSpec:
    """Read a cluster spec from YAML text; ``source`` names it in errors (``cluster.yaml:7: nodes[1]...``)."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"{source}: not valid YAML: {exc}") from exc
    try:
        root = loader.get_single_node()
        if root is None:
            raise ClusterSpecError(f"{source}: empty cluster spec; it needs at least `nodes:`")
        return schema.SpecReader(source, loader).cluster(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        reason = ", ".join(part for part in (exc.context, exc.problem) if part)
        raise ClusterSpecError(f"{source}{line}: not valid YAML: {reason}") from exc
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"{source}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ClusterSpecError(f"{source}: nested too deeply (or a recursive alias)") from exc
    finally:
        loader.dispose()


def load(path: str | Path) -> spec.ClusterSpec:
    """Read a cluster spec file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterSpecError(f"{path}: cannot read the cluster spec: {exc}") from exc
    return loads(text, source=str(path))


def resolve(spec_arg: str) -> spec.ClusterSpec:
    """A command-line argument: the path of an existing file, else the inline form."""
    path = Path(spec_arg)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long for the file system is no file, and may still be the inline form
        is_file = False
    if is_file:
        return load(path)
    if path.suffix in {".yaml", ".yml", ".json"} or "/" in spec_arg:
        raise ClusterSpecError(
            f"{spec_arg}: no such cluster spec file (nor is it the inline form: {inline.INLINE_FORM})"
        )
    return inline.parse_inline(spec_arg)

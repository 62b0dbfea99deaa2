"""Server-side ``Table`` rendering, so ``kubectl get`` shows the familiar columns.

kubectl asks for ``application/json;as=Table;g=meta.k8s.io;v=v1`` and prints the cells exactly as sent; without a
Table it prints only NAME and AGE. Built-in kinds get the API server's printers (``printers.py``: pods' READY,
STATUS, RESTARTS, AGE; nodes; jobs; ...), custom resources their CRD's ``additionalPrinterColumns`` (a small
JSONPath subset, here). AGE is computed at rendering time, as the server does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from quotient.emulator import crds, printers
from quotient.emulator.kinds import Kind, PrinterColumn
from quotient.emulator.objects import Obj, metadata
from quotient.emulator.printers import Cells, Column

# --- Custom resources: additionalPrinterColumns ---

_PATH_PART = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\['([^']+)'\]")


def json_path(obj: Obj, path: str) -> Any:
    """The value at a simple JSONPath (``.spec.a.b``, ``.status.list[0].x``, ``.metadata.labels['a/b']``)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    value: Any = obj
    position = 0
    while position < len(text):
        match = _PATH_PART.match(text, position)
        if match is None:
            return None
        field, index, quoted = match.groups()
        key: str | int = int(index) if index is not None else (field if field is not None else quoted)
        if isinstance(key, int):
            if not isinstance(value, list) or key >= len(value):
                return None
            value = value[key]
        else:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        position = match.end()
    return value


def _custom_cell(column: PrinterColumn, obj: Obj, now: float) -> Any:
    value = json_path(obj, column.json_path)
    if value is None:
        return None
    if column.type == "date":
        return printers.since(value, now)
    if column.type in ("integer", "number", "boolean") and isinstance(value, int | float | bool):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _custom_printer(kind: Kind) -> tuple[Sequence[Column], Cells]:
    columns: list[Column] = [("Name", "string", 0, printers.NAME_DESCRIPTION)]
    if not kind.printer_columns:
        columns.append(("Age", "date", 0, printers.AGE_DESCRIPTION))

        def name_and_age(obj: Obj, now: float) -> list[Any]:
            return [metadata(obj).get("name", ""), printers.age(obj, now)]

        return columns, name_and_age
    columns += [(c.name, c.type, c.priority, c.description) for c in kind.printer_columns]

    def cells(obj: Obj, now: float) -> list[Any]:
        return [metadata(obj).get("name", ""), *(_custom_cell(c, obj, now) for c in kind.printer_columns)]

    return columns, cells


def _printer(kind: Kind) -> tuple[Sequence[Column], Cells]:
    if kind.storage == crds.CRDS:
        columns: Sequence[Column] = (("Name", "string", 0, printers.NAME_DESCRIPTION), ("Created At", "date", 0, ""))
        return columns, lambda obj, now: [metadata(obj).get("name", ""), metadata(obj).get("creationTimestamp", "")]
    if kind.builtin and kind.group != "events.k8s.io":
        found = printers.BUILTIN.get(kind.storage)
        if found is not None:
            return found
        return printers.simple()
    return _custom_printer(kind)


def row_object(obj: Obj, include_object: str, table_version: str) -> Obj | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{table_version}", "metadata": metadata(obj)}


def table(
    kind: Kind,
    objects: Sequence[Obj],
    *,
    now: float,
    resource_version: str | None = None,
    include_object: str = "Metadata",
    table_version: str = "v1",
    headers: bool = True,
) -> Obj:
    """A ``meta.k8s.io`` Table of ``objects`` (in the served form of ``kind``)."""
    columns, cells = _printer(kind)
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj, now)}
        embedded = row_object(obj, include_object, table_version)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    result: Obj = {"kind": "Table", "apiVersion": f"meta.k8s.io/{table_version}", "metadata": {}}
    if resource_version is not None:
        result["metadata"]["resourceVersion"] = resource_version
    if headers:
        result["columnDefinitions"] = [
            {
                "name": name,
                "type": kind_,
                "format": "name" if index == 0 else "",
                "description": text,
                "priority": priority,
            }
            for index, (name, kind_, priority, text) in enumerate(columns)
        ]
    result["rows"] = rows
    return result

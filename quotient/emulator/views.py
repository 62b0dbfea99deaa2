"""How a response renders objects: content negotiation (JSON, Table, metadata only) and the list envelopes.

A client says in its Accept header what it wants: kubectl asks for a ``Table`` (``as=Table;g=meta.k8s.io``),
metadata informers for ``PartialObjectMetadata``, everyone else for plain JSON. A ``View`` records the answer once
per request (or per watch) and renders single objects, lists and watch events accordingly, converting from the
stored form where a kind shares its storage. Every body is served as ``application/json`` exactly.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from quotient.emulator import conversions, selectors, status, tables
from quotient.emulator.kinds import Kind
from quotient.emulator.objects import Obj, encode, metadata

CONTENT_TYPE = "application/json"


class Format(enum.Enum):
    JSON = "json"
    TABLE = "table"
    METADATA = "metadata"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class View:
    kind: Kind
    format: Format = Format.JSON
    meta_version: str = "v1"  # of meta.k8s.io, for Table and PartialObjectMetadata
    include_object: str = "Metadata"  # Table rows: None, Metadata or Object

    def external(self, obj: Obj) -> Obj:
        return conversions.from_storage(self.kind, obj)

    def render(self, obj: Obj, *, now: float, headers: bool = True) -> Obj:
        """One stored object as this view serves it."""
        served = self.external(obj)
        if self.format is Format.TABLE:
            return tables.table(
                self.kind,
                [served],
                now=now,
                resource_version=metadata(served).get("resourceVersion"),
                include_object=self.include_object,
                table_version=self.meta_version,
                headers=headers,
            )
        if self.format is Format.METADATA:
            return _partial(served, self.meta_version)
        return served

    def render_list(self, objects: Sequence[Obj], *, resource_version: int, now: float) -> Obj:
        served = [self.external(obj) for obj in objects]
        if self.format is Format.TABLE:
            return tables.table(
                self.kind,
                served,
                now=now,
                resource_version=str(resource_version),
                include_object=self.include_object,
                table_version=self.meta_version,
            )
        if self.format is Format.METADATA:
            return {
                "kind": "PartialObjectMetadataList",
                "apiVersion": f"meta.k8s.io/{self.meta_version}",
                "metadata": {"resourceVersion": str(resource_version)},
                "items": [_partial(obj, self.meta_version) for obj in served],
            }
        return {
            "kind": self.kind.list_kind,
            "apiVersion": self.kind.api_version,
            "metadata": {"resourceVersion": str(resource_version)},
            "items": served,
        }


def _partial(obj: Obj, meta_version: str) -> Obj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{meta_version}",
        "metadata": metadata(obj),
    }


def event_line(event_type: str, rendered: Obj) -> bytes:
    """One watch event, newline-terminated (the API server's JSON stream framing)."""
    return b'{"type":"' + event_type.encode() + b'","object":' + encode(rendered) + b"}\n"


def negotiate(accept: str | None, kind: Kind, *, include_object: str | None) -> View | status.Failure:
    """The view an Accept header asks for; the first acceptable media range wins, as on the API server."""
    include = include_object if include_object in ("None", "Metadata", "Object") else "Metadata"
    if not accept or not accept.strip():
        return View(kind=kind)
    for media_range in accept.split(","):
        parts = [part.strip() for part in media_range.split(";")]
        media = parts[0].lower()
        params = dict(part.split("=", 1) for part in parts[1:] if "=" in part)
        if media not in ("application/json", "application/*", "*/*", "*"):
            continue
        target = params.get("as")
        version = params.get("v", "v1")
        if target is None:
            return View(kind=kind)
        if params.get("g") != "meta.k8s.io" or version not in ("v1", "v1beta1"):
            continue
        if target == "Table":
            return View(kind=kind, format=Format.TABLE, meta_version=version, include_object=include)
        if target in ("PartialObjectMetadata", "PartialObjectMetadataList"):
            return View(kind=kind, format=Format.METADATA, meta_version=version)
    return status.Failure(
        code=406,
        reason="NotAcceptable",
        message="only the following media types are accepted: application/json, "
        "application/json;as=Table;g=meta.k8s.io;v=v1, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )


def scale(obj: Obj) -> Obj:
    """The ``autoscaling/v1`` Scale of a workload."""
    meta = metadata(obj)
    selector = selectors.from_object((obj.get("spec") or {}).get("selector"))
    text = ",".join(
        f"{r.key}={next(iter(r.values))}"
        for r in selector.requirements
        if r.op is selectors.Op.IN and len(r.values) == 1
    )
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
        "status": {"replicas": (obj.get("status") or {}).get("replicas", 0), "selector": text},
    }

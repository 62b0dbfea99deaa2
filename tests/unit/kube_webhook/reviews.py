"""Pods and AdmissionReviews as the API server sends them, for the webhook's tests."""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]


def pod(
    annotations: dict[str, str] | None = None,
    *,
    name: str | None = "train",
    generate_name: str | None = None,
    scheduler: str | None = "quotient",
    gpus: str | None = None,
    containers: tuple[str, ...] = ("main",),
) -> Obj:
    metadata: Obj = {"namespace": "ml"}
    if name is not None:
        metadata["name"] = name
    if generate_name is not None:
        metadata["generateName"] = generate_name
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: Obj = {"containers": [{"name": c, "image": "nvcr.io/nvidia/pytorch:24.08-py3"} for c in containers]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if gpus is not None:
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review_body(obj: object, *, uid: str = "3b1f0a52-2c11-4d7e-9a4e-1f6c2d9b8e01", operation: str = "CREATE") -> bytes:
    request: Obj = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml",
        "operation": operation,
        "object": obj,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()

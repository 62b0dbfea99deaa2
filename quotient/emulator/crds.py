"""What applying or deleting a CustomResourceDefinition does besides storing it, as the apiextensions server does.

A created CRD is answered as already established (names accepted, no conflicts: the emulator has no controller that
would take a moment to decide), its kinds are served at once (``kinds.Registry.add_crd``), and deleting it deletes
every object of its kinds and stops serving them.
"""

from __future__ import annotations

from quotient.emulator.kinds import Registry
from quotient.emulator.objects import Obj, metadata
from quotient.emulator.store import Store

CRDS = "customresourcedefinitions.apiextensions.k8s.io"


def establish(crd: Obj, *, now: str) -> None:
    """Give a new CRD (the caller's own copy) the status of an accepted, established one."""
    spec = crd.get("spec") or {}
    crd["status"] = {
        "acceptedNames": dict(spec.get("names") or {}),
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ],
        "storedVersions": [
            str(v.get("name")) for v in spec.get("versions") or [] if isinstance(v, dict) and v.get("storage")
        ],
    }


def drop(crd: Obj, *, store: Store, registry: Registry) -> None:
    """Deleting a CRD deletes its objects; its kinds stop being served (unless they are built in)."""
    spec = crd.get("spec") or {}
    storage = f"{(spec.get('names') or {}).get('plural')}.{spec.get('group')}"
    for obj in store.objects(storage):
        store.delete(storage, str(metadata(obj).get("namespace") or ""), str(metadata(obj).get("name")))
    registry.remove_crd(str(metadata(crd).get("name")))

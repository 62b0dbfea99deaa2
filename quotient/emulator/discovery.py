"""Discovery documents: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]``.

kubectl and the client libraries find resources here before any request: kind, scope, verbs and short names
(``kubectl get po``). Only the plain ("legacy") form is served; kubectl asks for aggregated discovery first but
falls back when the answer is a plain ``APIGroupList``, and every kubectl version understands that form. The
documents derive from the kind registry, so a CRD applied at run time appears at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from quotient.emulator.kinds import Kind, Registry
from quotient.emulator.objects import Obj

# kubectl on these machines is a dispatcher that runs the bundled kubectl matching the server's minor version.
VERSION: Obj = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "quotient-emulator",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_SUBRESOURCE_KINDS = {
    "binding": "Binding",
    "eviction": "Eviction",
    "scale": "Scale",
    "token": "TokenRequest",
    "proxy": "PodProxyOptions",
}
_SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "binding": ["create"],
    "eviction": ["create"],
    "token": ["create"],
    "scale": ["get", "patch", "update"],
    "finalize": ["update"],
    "log": ["get"],
    "proxy": ["create", "delete", "get", "patch", "update"],
}


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_obj(name: str, versions: tuple[str, ...]) -> Obj:
    entries = [{"groupVersion": f"{name}/{version}", "version": version} for version in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> Obj:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_obj(group.name, group.versions) for group in registry.groups() if group.name],
    }


def api_group(registry: Registry, name: str) -> Obj | None:
    group = registry.group(name)
    if group is None or not name:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_obj(group.name, group.versions)}


def _resource(kind: Kind) -> list[Obj]:
    main: Obj = {
        "name": kind.plural,
        "singularName": kind.singular,
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": list(kind.verbs),
    }
    if kind.short_names:
        main["shortNames"] = list(kind.short_names)
    if kind.categories:
        main["categories"] = list(kind.categories)
    entries = [main]
    for sub in sorted(kind.subresources):
        entry: Obj = {
            "name": f"{kind.plural}/{sub}",
            "singularName": "",
            "namespaced": kind.namespaced,
            "kind": _SUBRESOURCE_KINDS.get(sub, kind.kind),
            "verbs": _SUBRESOURCE_VERBS.get(sub, ["get"]),
        }
        if sub == "scale":
            entry["group"], entry["version"] = "autoscaling", "v1"
        if sub == "eviction":
            entry["group"], entry["version"] = "policy", "v1"
        if sub == "token":
            entry["group"], entry["version"] = "authentication.k8s.io", "v1"
        entries.append(entry)
    return entries


def api_resource_list(registry: Registry, group: str, version: str) -> Obj | None:
    kinds = registry.resources(group, version)
    if not kinds:
        return None
    resources = [entry for kind in sorted(kinds, key=lambda k: k.plural) for entry in _resource(kind)]
    if group == "" and version == "v1":
        resources.append(
            {"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding", "verbs": ["create"]}
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def is_document(parts: Sequence[str]) -> bool:
    """Whether a GET of these path parts asks for discovery (``/api``, ``/apis``, a group, a group-version)."""
    return parts[:1] in (["api"], ["apis"]) and (len(parts) <= 2 or (len(parts) == 3 and parts[0] == "apis"))


def document(registry: Registry, parts: Sequence[str], *, server_address: str) -> Obj | None:
    """The discovery document at a path ``is_document`` accepts; None when the group or version is not served."""
    if list(parts) == ["api"]:
        return api_versions(server_address)
    if list(parts) == ["apis"]:
        return api_group_list(registry)
    if parts[0] == "api":
        return api_resource_list(registry, "", parts[1])
    if len(parts) == 2:
        return api_group(registry, parts[1])
    return api_resource_list(registry, parts[1], parts[2])

"""The kinds the emulator serves: group, version, plural, kind, scope, short names, subresources, printer columns.

Everything else in the emulator is generic over these records: routing, discovery, OpenAPI, storage, tables and
selectors all read the registry, so serving one more kind is one line below (or one CustomResourceDefinition applied
at run time, which ``Registry.add_crd`` turns into kinds as the real apiextensions server does). Each kind names the
storage it lives in: ``pods`` for core kinds, ``deployments.apps`` for grouped ones, the form the API server uses
in its messages. Two kinds may share a storage (core and ``events.k8s.io`` events); then a converter translates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

from quotient.emulator.objects import Obj, child

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# Field selectors a kind supports beyond metadata.name and metadata.namespace (the apiserver's field label sets).
POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.schedulerName",
        "spec.restartPolicy",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
EVENTS_V1_FIELDS = frozenset(
    {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    }
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PrinterColumn:
    """A column of ``kubectl get`` for a custom resource (a CRD's ``additionalPrinterColumns``)."""

    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Kind:
    """One resource of one group-version."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    field_labels: frozenset[str] = frozenset()
    printer_columns: tuple[PrinterColumn, ...] = ()
    builtin: bool = True
    verbs: tuple[str, ...] = ALL_VERBS
    storage_name: str = ""
    schema: Obj | None = dataclasses.field(default=None, compare=False, repr=False)
    """A custom kind's structural schema (its CRD version's ``openAPIV3Schema``): what ``schemas`` prunes,
    defaults and validates its objects by. None: no schema, any fields (the built-in kinds, whose checks are in
    ``validation``)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage(self) -> str:
        """Where objects of this kind live; also how the API server names the resource in messages."""
        if self.storage_name:
            return self.storage_name
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def strategic_merge(self) -> bool:
        """Built-in kinds take strategic merge patches; custom resources answer 415, as on a real server."""
        return self.builtin

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def supports_field(self, label: str) -> bool:
        return label in ("metadata.name", "metadata.namespace") or label in self.field_labels


def _kind(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    short: Sequence[str] = (),
    categories: Sequence[str] = (),
    sub: Iterable[str] = ("status",),
    fields: frozenset[str] = frozenset(),
    columns: Sequence[PrinterColumn] = (),
    builtin: bool = True,
    storage_name: str = "",
) -> Kind:
    return Kind(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=tuple(short),
        categories=tuple(categories),
        subresources=frozenset(sub),
        field_labels=fields,
        printer_columns=tuple(columns),
        builtin=builtin,
        storage_name=storage_name,
    )


_AGE = PrinterColumn(name="Age", json_path=".metadata.creationTimestamp", type="date")

# fmt: off
BUILTIN_KINDS: tuple[Kind, ...] = (
    # core
    _kind("", "v1", "pods", "Pod", short=("po",), categories=("all",),
          sub=("status", "binding", "eviction", "log", "proxy"), fields=POD_FIELDS),
    _kind("", "v1", "nodes", "Node", namespaced=False, short=("no",), fields=frozenset({"spec.unschedulable"})),
    _kind("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",), sub=("status", "finalize"),
          fields=frozenset({"status.phase"})),
    _kind("", "v1", "configmaps", "ConfigMap", short=("cm",), sub=()),
    _kind("", "v1", "secrets", "Secret", sub=(), fields=frozenset({"type"})),
    _kind("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",), sub=("token",)),
    _kind("", "v1", "services", "Service", short=("svc",), categories=("all",)),
    _kind("", "v1", "events", "Event", short=("ev",), sub=(), fields=EVENT_FIELDS),
    # workloads
    _kind("apps", "v1", "deployments", "Deployment", short=("deploy",), categories=("all",), sub=("status", "scale")),
    _kind("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), categories=("all",), sub=("status", "scale")),
    _kind("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), categories=("all",), sub=("status", "scale")),
    _kind("apps", "v1", "daemonsets", "DaemonSet", short=("ds",), categories=("all",)),
    _kind("batch", "v1", "jobs", "Job", categories=("all",)),
    _kind("batch", "v1", "cronjobs", "CronJob", short=("cj",), categories=("all",)),
    _kind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", builtin=False),
    _kind("kubeflow.org", "v1", "tfjobs", "TFJob", builtin=False),
    _kind("kubeflow.org", "v1", "mpijobs", "MPIJob", builtin=False),
    _kind("ray.io", "v1", "rayclusters", "RayCluster", builtin=False),
    _kind("ray.io", "v1", "rayjobs", "RayJob", builtin=False),
    _kind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", builtin=False),
    _kind("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", short=("lws",), builtin=False),
    # cluster services
    _kind("coordination.k8s.io", "v1", "leases", "Lease", sub=()),
    _kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False, short=("pc",), sub=()),
    _kind("events.k8s.io", "v1", "events", "Event", short=("ev",), sub=(), fields=EVENTS_V1_FIELDS,
          storage_name="events"),
    _kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",)),
    _kind("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
          namespaced=False, sub=()),
    _kind("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
          "ValidatingWebhookConfiguration", namespaced=False, sub=()),
    _kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
          short=("crd", "crds")),
    # Authentication (``tokenreview``): create only, nothing stored
    dataclasses.replace(_kind("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False, sub=()),
                        verbs=("create",)),
    dataclasses.replace(_kind("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview",
                              namespaced=False, sub=()), verbs=("create",)),
    # Authorization (``accessreviews``): create only, nothing stored
    dataclasses.replace(_kind("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview",
                              namespaced=False, sub=()), verbs=("create",)),
    dataclasses.replace(_kind("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview",
                              namespaced=False, sub=()), verbs=("create",)),
    dataclasses.replace(_kind("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                              namespaced=False, sub=()), verbs=("create",)),
    dataclasses.replace(_kind("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview",
                              sub=()), verbs=("create",)),
    # RBAC (``rbac``): what a service account's token may do
    _kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False, sub=()),
    _kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False, sub=()),
    _kind("rbac.authorization.k8s.io", "v1", "roles", "Role", sub=()),
    _kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", sub=()),
    # KAI's custom resources (KAI-COMPAT.md)
    _kind("scheduling.run.ai", "v2", "queues", "Queue", namespaced=False, builtin=False,
          columns=(
              PrinterColumn(name="Priority", json_path=".spec.priority", type="integer"),
              PrinterColumn(name="Parent", json_path=".spec.parentQueue"),
              PrinterColumn(name="Children", json_path=".status.childQueues", priority=1),
              PrinterColumn(name="Display Name", json_path=".spec.displayName", priority=1),
              _AGE,
          )),
    _kind("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", short=("pg",), builtin=False,
          columns=(
              PrinterColumn(name="Min Member", json_path=".spec.minMember", type="integer"),
              PrinterColumn(name="Queue", json_path=".spec.queue"),
              PrinterColumn(name="Phase", json_path=".status.phase"),
              _AGE,
          )),
)
# fmt: on


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    name: str
    versions: tuple[str, ...]  # preferred first


class Registry:
    """The kinds served now: the built-ins plus those of every CustomResourceDefinition created since."""

    def __init__(self, kinds: Iterable[Kind] = BUILTIN_KINDS) -> None:
        self._by_path: dict[tuple[str, str, str], Kind] = {}
        self._by_gvk: dict[tuple[str, str], Kind] = {}
        self._groups: dict[str, list[str]] = {}
        self._crd_kinds: dict[str, list[Kind]] = {}
        for kind in kinds:
            self.add(kind)

    def add(self, kind: Kind) -> None:
        self._by_path[(kind.group, kind.version, kind.plural)] = kind
        self._by_gvk[(kind.api_version, kind.kind)] = kind
        versions = self._groups.setdefault(kind.group, [])
        if kind.version not in versions:
            versions.append(kind.version)

    def remove(self, kind: Kind) -> None:
        self._by_path.pop((kind.group, kind.version, kind.plural), None)
        self._by_gvk.pop((kind.api_version, kind.kind), None)
        if not any(k.group == kind.group and k.version == kind.version for k in self._by_path.values()):
            versions = self._groups.get(kind.group, [])
            if kind.version in versions:
                versions.remove(kind.version)
            if not versions:
                self._groups.pop(kind.group, None)

    def lookup(self, group: str, version: str, plural: str) -> Kind | None:
        return self._by_path.get((group, version, plural))

    def by_gvk(self, api_version: str, kind: str) -> Kind | None:
        return self._by_gvk.get((api_version, kind))

    def by_storage(self, storage: str) -> Kind | None:
        """The canonical kind of a storage (the core one where two share it)."""
        for kind in self._by_path.values():
            if kind.storage == storage and (kind.group == "" or not kind.storage_name):
                return kind
        return None

    def groups(self) -> list[GroupInfo]:
        """Every group with its versions, the core group (``""``) first."""
        ordered = sorted(self._groups.items(), key=lambda item: (item[0] != "", 0))
        return [GroupInfo(name=name, versions=tuple(versions)) for name, versions in ordered if versions]

    def group(self, name: str) -> GroupInfo | None:
        versions = self._groups.get(name)
        return GroupInfo(name=name, versions=tuple(versions)) if versions else None

    def resources(self, group: str, version: str) -> list[Kind]:
        return [kind for kind in self._by_path.values() if kind.group == group and kind.version == version]

    def __iter__(self) -> Iterator[Kind]:
        return iter(list(self._by_path.values()))

    # Custom resource definitions

    def add_crd(self, crd: Obj) -> list[Kind]:
        """Serve the kinds a CRD defines (for its served versions). Kinds Kubernetes itself defines stay as they
        are; a custom kind the emulator knows already (Queue, PodGroup, ...) takes the CRD's definition, keeping the
        emulator's printer columns when the CRD brings none."""
        kinds = kinds_of_crd(crd)
        added: list[Kind] = []
        for kind in kinds:
            existing = self.lookup(kind.group, kind.version, kind.plural)
            if existing is not None and existing.builtin:
                continue
            if existing is not None and not kind.printer_columns:
                kind = dataclasses.replace(kind, printer_columns=existing.printer_columns)
            self.add(kind)
            added.append(kind)
        self._crd_kinds[str(crd.get("metadata", {}).get("name", ""))] = added
        return added

    def remove_crd(self, crd_name: str) -> list[Kind]:
        removed = self._crd_kinds.pop(crd_name, [])
        builtin = {(kind.group, kind.version, kind.plural): kind for kind in BUILTIN_KINDS}
        for kind in removed:
            self.remove(kind)
            original = builtin.get((kind.group, kind.version, kind.plural))
            if original is not None:
                self.add(original)
        return removed


def kinds_of_crd(crd: Obj) -> list[Kind]:
    """The kinds of a CustomResourceDefinition (``apiextensions.k8s.io/v1``), one per served version."""
    spec = child(crd, "spec")
    names = child(spec, "names")
    group, plural, kind = str(spec.get("group", "")), str(names.get("plural", "")), str(names.get("kind", ""))
    if not (group and plural and kind):
        return []
    kinds = []
    for version in spec.get("versions") or []:
        if not isinstance(version, dict) or not version.get("served", True):
            continue
        subresources = child(version, "subresources")
        columns = tuple(
            PrinterColumn(
                name=str(column.get("name", "")),
                json_path=str(column.get("jsonPath", "")),
                type=str(column.get("type", "string")),
                priority=int(column.get("priority", 0) or 0),
                description=str(column.get("description", "")),
            )
            for column in version.get("additionalPrinterColumns") or []
            if isinstance(column, dict)
        )
        kinds.append(
            Kind(
                group=group,
                version=str(version.get("name", "")),
                plural=plural,
                kind=kind,
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(str(name) for name in names.get("shortNames") or []),
                categories=tuple(str(name) for name in names.get("categories") or []),
                subresources=frozenset(str(name) for name in subresources),
                printer_columns=columns,
                builtin=False,
                schema=_schema_of(version),
            )
        )
    return kinds


def _schema_of(version: Obj) -> Obj | None:
    schema = child(version, "schema").get("openAPIV3Schema")
    return schema if isinstance(schema, dict) and schema else None


def default_registry() -> Registry:
    return Registry(BUILTIN_KINDS)

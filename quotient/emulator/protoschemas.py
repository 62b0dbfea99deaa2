"""The protobuf messages the emulator reads (``protobuf``), transcribed from ``k8s.io/api`` and ``k8s.io/apimachinery``.

Each message maps a field number to ``(JSON name, reader)`` or ``(JSON name, reader, KEEP)``, numbers as in the
``generated.proto`` of the kind's group (``core/v1``, ``apps/v1``, ``batch/v1``, ``rbac/v1``, ``policy/v1``,
``scheduling/v1``, ``authentication/v1``, ``authorization/v1``; ``meta/v1``, ``intstr``, ``resource``). Readers:

- scalars: ``"string"``, ``"bytes"`` (base64 in JSON), ``"int"`` (any varint integer), ``"bool"``;
- ``"time"`` (``metav1.Time``, RFC 3339), ``"quantity"`` (``resource.Quantity``), ``"int_or_string"``;
- ``"skip"``: read past whatever it holds (a ``status`` a create ignores, the server-owned ``managedFields``);
- a message (a nested mapping); ``("repeated", reader)``; ``("map", value reader)`` for ``map<string, ...>``
  (``"strings"`` for an ``ExtraValue``); ``("inline", message)`` for a struct Go embeds, whose fields JSON
  flattens into the parent (``ConfigMapKeySelector``'s ``LocalObjectReference``).

``KEEP`` marks a field whose zero value JSON would carry: a pointer (``replicas: 0``, ``automountServiceAccountToken:
false``) or a field without ``omitempty`` (a PriorityClass's ``value``). The coverage is what kubectl's typed
clients send (every ``kubectl create`` subcommand for a kind the emulator serves, ``auth can-i``, ``auth whoami``,
``create token``, ``drain``) plus the pod spec fields a workload commonly carries; volumes, probes, affinity and
security contexts are not transcribed, so a body that holds them is refused with the field's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

KEEP: Final = "keep"
"""A field whose zero value is kept (a pointer, or a field JSON always writes)."""
Schema = Mapping[int, tuple[Any, ...]]

S, N, B = "string", "int", "bool"
STRINGS = ("repeated", S)
LABELS = ("map", S)

# --- meta/v1, intstr, resource ---

OWNER_REFERENCE: Schema = {
    5: ("apiVersion", S),
    1: ("kind", S),
    3: ("name", S),
    4: ("uid", S),
    6: ("controller", B, KEEP),
    7: ("blockOwnerDeletion", B, KEEP),
}
OBJECT_META: Schema = {
    1: ("name", S),
    2: ("generateName", S),
    3: ("namespace", S),
    4: ("selfLink", S),
    5: ("uid", S),
    6: ("resourceVersion", S),
    7: ("generation", N),
    8: ("creationTimestamp", "time"),
    9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", N, KEEP),
    11: ("labels", LABELS),
    12: ("annotations", LABELS),
    13: ("ownerReferences", ("repeated", OWNER_REFERENCE)),
    14: ("finalizers", STRINGS),
    17: ("managedFields", "skip"),  # the server's own bookkeeping
}
SELECTOR_REQUIREMENT: Schema = {1: ("key", S), 2: ("operator", S), 3: ("values", STRINGS)}
LABEL_SELECTOR: Schema = {1: ("matchLabels", LABELS), 2: ("matchExpressions", ("repeated", SELECTOR_REQUIREMENT))}
DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", N, KEEP),
    2: ("preconditions", {1: ("uid", S), 2: ("resourceVersion", S)}),
    3: ("orphanDependents", B, KEEP),
    4: ("propagationPolicy", S),
    5: ("dryRun", STRINGS),
}

# --- core/v1: what a pod template holds ---

LOCAL_OBJECT_REFERENCE: Schema = {1: ("name", S)}
KEY_SELECTOR: Schema = {1: ("", ("inline", LOCAL_OBJECT_REFERENCE)), 2: ("key", S), 3: ("optional", B, KEEP)}
ENV_SOURCE: Schema = {1: ("", ("inline", LOCAL_OBJECT_REFERENCE)), 2: ("optional", B, KEEP)}
ENV_VAR: Schema = {
    1: ("name", S),
    2: ("value", S),
    3: (
        "valueFrom",
        {
            1: ("fieldRef", {1: ("apiVersion", S), 2: ("fieldPath", S)}),
            2: ("resourceFieldRef", {1: ("containerName", S), 2: ("resource", S), 3: ("divisor", "quantity")}),
            3: ("configMapKeyRef", KEY_SELECTOR),
            4: ("secretKeyRef", KEY_SELECTOR),
        },
    ),
}
ENV_FROM_SOURCE: Schema = {1: ("prefix", S), 2: ("configMapRef", ENV_SOURCE), 3: ("secretRef", ENV_SOURCE)}
CONTAINER_PORT: Schema = {
    1: ("name", S),
    2: ("hostPort", N),
    3: ("containerPort", N, KEEP),
    4: ("protocol", S),
    5: ("hostIP", S),
}
RESOURCE_REQUIREMENTS: Schema = {
    1: ("limits", ("map", "quantity")),
    2: ("requests", ("map", "quantity")),
    3: ("claims", ("repeated", {1: ("name", S), 2: ("request", S)})),
}
VOLUME_MOUNT: Schema = {
    1: ("name", S),
    2: ("readOnly", B),
    3: ("mountPath", S),
    4: ("subPath", S),
    5: ("mountPropagation", S),
    6: ("subPathExpr", S),
    7: ("recursiveReadOnly", S),
}
CONTAINER: Schema = {
    1: ("name", S),
    2: ("image", S),
    3: ("command", STRINGS),
    4: ("args", STRINGS),
    5: ("workingDir", S),
    6: ("ports", ("repeated", CONTAINER_PORT)),
    7: ("env", ("repeated", ENV_VAR)),
    8: ("resources", RESOURCE_REQUIREMENTS),
    9: ("volumeMounts", ("repeated", VOLUME_MOUNT)),
    13: ("terminationMessagePath", S),
    14: ("imagePullPolicy", S),
    16: ("stdin", B),
    17: ("stdinOnce", B),
    18: ("tty", B),
    19: ("envFrom", ("repeated", ENV_FROM_SOURCE)),
    20: ("terminationMessagePolicy", S),
    24: ("restartPolicy", S),
}
TOLERATION: Schema = {
    1: ("key", S),
    2: ("operator", S),
    3: ("value", S),
    4: ("effect", S),
    5: ("tolerationSeconds", N, KEEP),
}
POD_SPEC: Schema = {
    2: ("containers", ("repeated", CONTAINER)),
    20: ("initContainers", ("repeated", CONTAINER)),
    3: ("restartPolicy", S),
    4: ("terminationGracePeriodSeconds", N, KEEP),
    5: ("activeDeadlineSeconds", N, KEEP),
    6: ("dnsPolicy", S),
    7: ("nodeSelector", LABELS),
    8: ("serviceAccountName", S),
    9: ("serviceAccount", S),
    21: ("automountServiceAccountToken", B, KEEP),
    10: ("nodeName", S),
    11: ("hostNetwork", B),
    12: ("hostPID", B),
    13: ("hostIPC", B),
    27: ("shareProcessNamespace", B, KEEP),
    15: ("imagePullSecrets", ("repeated", LOCAL_OBJECT_REFERENCE)),
    16: ("hostname", S),
    17: ("subdomain", S),
    19: ("schedulerName", S),
    22: ("tolerations", ("repeated", TOLERATION)),
    24: ("priorityClassName", S),
    25: ("priority", N, KEEP),
    29: ("runtimeClassName", S),
    30: ("enableServiceLinks", B, KEEP),
    31: ("preemptionPolicy", S),
    32: ("overhead", ("map", "quantity")),
    35: ("setHostnameAsFQDN", B, KEEP),
    38: ("schedulingGates", ("repeated", {1: ("name", S)})),
}
POD_TEMPLATE_SPEC: Schema = {1: ("metadata", OBJECT_META), 2: ("spec", POD_SPEC)}
POD: Schema = {1: ("metadata", OBJECT_META), 2: ("spec", POD_SPEC), 3: ("status", "skip")}

# --- core/v1: the other kinds ---

NAMESPACE: Schema = {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", STRINGS)}), 3: ("status", "skip")}
CONFIG_MAP: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("data", LABELS),
    3: ("binaryData", ("map", "bytes")),
    4: ("immutable", B, KEEP),
}
SECRET: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("data", ("map", "bytes")),
    3: ("type", S),
    4: ("stringData", LABELS),
    5: ("immutable", B, KEEP),
}
OBJECT_REFERENCE: Schema = {
    1: ("kind", S),
    2: ("namespace", S),
    3: ("name", S),
    4: ("uid", S),
    5: ("apiVersion", S),
    6: ("resourceVersion", S),
    7: ("fieldPath", S),
}
SERVICE_ACCOUNT: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("secrets", ("repeated", OBJECT_REFERENCE)),
    3: ("imagePullSecrets", ("repeated", LOCAL_OBJECT_REFERENCE)),
    4: ("automountServiceAccountToken", B, KEEP),
}
SERVICE_PORT: Schema = {
    1: ("name", S),
    2: ("protocol", S),
    3: ("port", N, KEEP),
    4: ("targetPort", "int_or_string"),
    5: ("nodePort", N),
    6: ("appProtocol", S),
}
SERVICE: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("ports", ("repeated", SERVICE_PORT)),
            2: ("selector", LABELS),
            3: ("clusterIP", S),
            18: ("clusterIPs", STRINGS),
            4: ("type", S),
            5: ("externalIPs", STRINGS),
            7: ("sessionAffinity", S),
            8: ("loadBalancerIP", S),
            9: ("loadBalancerSourceRanges", STRINGS),
            10: ("externalName", S),
            11: ("externalTrafficPolicy", S),
            12: ("healthCheckNodePort", N),
            13: ("publishNotReadyAddresses", B),
            19: ("ipFamilies", STRINGS),
            17: ("ipFamilyPolicy", S),
            20: ("allocateLoadBalancerNodePorts", B, KEEP),
            21: ("loadBalancerClass", S),
            22: ("internalTrafficPolicy", S),
            23: ("trafficDistribution", S),
        },
    ),
    3: ("status", "skip"),
}

# --- apps/v1, batch/v1 ---

DEPLOYMENT: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("replicas", N, KEEP),
            2: ("selector", LABEL_SELECTOR),
            3: ("template", POD_TEMPLATE_SPEC),
            4: (
                "strategy",
                {
                    1: ("type", S),
                    2: ("rollingUpdate", {1: ("maxUnavailable", "int_or_string"), 2: ("maxSurge", "int_or_string")}),
                },
            ),
            5: ("minReadySeconds", N),
            6: ("revisionHistoryLimit", N, KEEP),
            7: ("paused", B),
            9: ("progressDeadlineSeconds", N, KEEP),
        },
    ),
    3: ("status", "skip"),
}
JOB_SPEC: Schema = {
    1: ("parallelism", N, KEEP),
    2: ("completions", N, KEEP),
    3: ("activeDeadlineSeconds", N, KEEP),
    7: ("backoffLimit", N, KEEP),
    12: ("backoffLimitPerIndex", N, KEEP),
    13: ("maxFailedIndexes", N, KEEP),
    4: ("selector", LABEL_SELECTOR),
    5: ("manualSelector", B, KEEP),
    6: ("template", POD_TEMPLATE_SPEC),
    8: ("ttlSecondsAfterFinished", N, KEEP),
    9: ("completionMode", S),
    10: ("suspend", B, KEEP),
    14: ("podReplacementPolicy", S),
    15: ("managedBy", S),
}
JOB: Schema = {1: ("metadata", OBJECT_META), 2: ("spec", JOB_SPEC), 3: ("status", "skip")}
CRON_JOB: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("schedule", S),
            8: ("timeZone", S),
            2: ("startingDeadlineSeconds", N, KEEP),
            3: ("concurrencyPolicy", S),
            4: ("suspend", B, KEEP),
            5: ("jobTemplate", {1: ("metadata", OBJECT_META), 2: ("spec", JOB_SPEC)}),
            6: ("successfulJobsHistoryLimit", N, KEEP),
            7: ("failedJobsHistoryLimit", N, KEEP),
        },
    ),
    3: ("status", "skip"),
}

# --- rbac/v1, policy/v1, scheduling/v1 ---

POLICY_RULE: Schema = {
    1: ("verbs", STRINGS),
    2: ("apiGroups", STRINGS),
    3: ("resources", STRINGS),
    4: ("resourceNames", STRINGS),
    5: ("nonResourceURLs", STRINGS),
}
ROLE: Schema = {1: ("metadata", OBJECT_META), 2: ("rules", ("repeated", POLICY_RULE))}
CLUSTER_ROLE: Schema = {
    **ROLE,
    3: ("aggregationRule", {1: ("clusterRoleSelectors", ("repeated", LABEL_SELECTOR))}),
}
ROLE_BINDING: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("subjects", ("repeated", {1: ("kind", S), 2: ("apiGroup", S), 3: ("name", S), 4: ("namespace", S)})),
    3: ("roleRef", {1: ("apiGroup", S), 2: ("kind", S), 3: ("name", S)}),
}
POD_DISRUPTION_BUDGET: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("minAvailable", "int_or_string"),
            2: ("selector", LABEL_SELECTOR),
            3: ("maxUnavailable", "int_or_string"),
            4: ("unhealthyPodEvictionPolicy", S),
        },
    ),
    3: ("status", "skip"),
}
EVICTION: Schema = {1: ("metadata", OBJECT_META), 2: ("deleteOptions", DELETE_OPTIONS)}
PRIORITY_CLASS: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("value", N, KEEP),
    3: ("globalDefault", B),
    4: ("description", S),
    5: ("preemptionPolicy", S),
}

# --- authentication/v1, authorization/v1 ---

TOKEN_REQUEST: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("audiences", STRINGS),
            4: ("expirationSeconds", N, KEEP),
            3: ("boundObjectRef", {1: ("kind", S), 2: ("apiVersion", S), 3: ("name", S), 4: ("uid", S)}),
        },
    ),
    3: ("status", "skip"),
}
SELF_SUBJECT_REVIEW: Schema = {1: ("metadata", OBJECT_META), 2: ("status", "skip")}
_SELECTOR_ATTRIBUTES: Schema = {1: ("rawSelector", S), 2: ("requirements", ("repeated", SELECTOR_REQUIREMENT))}
RESOURCE_ATTRIBUTES: Schema = {
    1: ("namespace", S),
    2: ("verb", S),
    3: ("group", S),
    4: ("version", S),
    5: ("resource", S),
    6: ("subresource", S),
    7: ("name", S),
    8: ("fieldSelector", _SELECTOR_ATTRIBUTES),
    9: ("labelSelector", _SELECTOR_ATTRIBUTES),
}
NON_RESOURCE_ATTRIBUTES: Schema = {1: ("path", S), 2: ("verb", S)}
SELF_SUBJECT_ACCESS_REVIEW: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {1: ("resourceAttributes", RESOURCE_ATTRIBUTES), 2: ("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES)},
    ),
    3: ("status", "skip"),
}
SUBJECT_ACCESS_REVIEW: Schema = {
    1: ("metadata", OBJECT_META),
    2: (
        "spec",
        {
            1: ("resourceAttributes", RESOURCE_ATTRIBUTES),
            2: ("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES),
            3: ("user", S),
            4: ("groups", STRINGS),
            5: ("extra", ("map", "strings")),
            6: ("uid", S),
        },
    ),
    3: ("status", "skip"),
}
SELF_SUBJECT_RULES_REVIEW: Schema = {
    1: ("metadata", OBJECT_META),
    2: ("spec", {1: ("namespace", S)}),
    3: ("status", "skip"),
}

KINDS: Mapping[tuple[str, str], Schema] = {
    ("v1", "Namespace"): NAMESPACE,
    ("v1", "ConfigMap"): CONFIG_MAP,
    ("v1", "Secret"): SECRET,
    ("v1", "ServiceAccount"): SERVICE_ACCOUNT,
    ("v1", "Service"): SERVICE,
    ("v1", "Pod"): POD,
    ("apps/v1", "Deployment"): DEPLOYMENT,
    ("batch/v1", "Job"): JOB,
    ("batch/v1", "CronJob"): CRON_JOB,
    ("rbac.authorization.k8s.io/v1", "Role"): ROLE,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): CLUSTER_ROLE,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLE_BINDING,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ROLE_BINDING,
    ("policy/v1", "PodDisruptionBudget"): POD_DISRUPTION_BUDGET,
    ("policy/v1", "Eviction"): EVICTION,
    ("scheduling.k8s.io/v1", "PriorityClass"): PRIORITY_CLASS,
    ("authentication.k8s.io/v1", "TokenRequest"): TOKEN_REQUEST,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): SELF_SUBJECT_REVIEW,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): SELF_SUBJECT_ACCESS_REVIEW,
    ("authorization.k8s.io/v1", "SubjectAccessReview"): SUBJECT_ACCESS_REVIEW,
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): SUBJECT_ACCESS_REVIEW,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): SELF_SUBJECT_RULES_REVIEW,
}

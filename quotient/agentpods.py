"""The agent DaemonSet's pods in the emulator, so each emulated node's agent process has its node's own identity.

In a cluster the agent runs as a DaemonSet pod on each GPU node (``deploy/base/agent/daemonset.yaml``), and its
kubelet projects a ServiceAccount token bound to that pod (audience ``quotient-nats``) into it; the agent sends it to
NATS, whose auth callout (served by the scheduler) grants that node's subjects only. The emulator's kubelets project
tokens the same way (``quotient.emulator.projection``), so ``deploy`` makes what the DaemonSet would: the agent's
ServiceAccount and one pod per node, bound to it, with the same projected volume; and hands back, per node, the file
the pod's kubelet writes the token to. The demo's and the tests' agent processes are started with that file as their
``--nats-token-file``, so each publishes as its own node, exactly as deployed. The pods ask for little (the
DaemonSet's requests) and run nothing: the agent itself is the process beside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

from common import names
from quotient.emulator import status
from quotient.emulator.emulator import Emulator
from quotient.emulator.objects import Obj

NAMESPACE: Final = "quotient-system"
ACCOUNT: Final = "quotient-agent"
"""The DaemonSet's namespace and ServiceAccount, the scheduler's default ``--nats-callout-agent-account``."""
VOLUME: Final = "nats-token"
TOKEN_PATH: Final = "token"
EXPIRATION_S: Final = 3600


def account_object() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": ACCOUNT, "namespace": NAMESPACE},
        "automountServiceAccountToken": False,
    }


def pod_name(node: str) -> str:
    return f"{ACCOUNT}-{node}"


def pod_object(node: str) -> Obj:
    """The DaemonSet's pod for ``node``: bound to it, its account, the projected token volume."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node),
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": ACCOUNT, names.PART_OF_LABEL: names.PRODUCT},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": ACCOUNT,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "agent",
                    "image": "ghcr.io/quotient-sched/quotient:0.1.0",
                    "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
                    "volumeMounts": [{"name": VOLUME, "mountPath": "/var/run/secrets/quotient/nats-token"}],
                }
            ],
            "volumes": [
                {
                    "name": VOLUME,
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "audience": names.NATS_TOKEN_AUDIENCE,
                                    "expirationSeconds": EXPIRATION_S,
                                    "path": TOKEN_PATH,
                                }
                            }
                        ]
                    },
                }
            ],
        },
    }


async def deploy(emulator: Emulator, nodes: Iterable[str]) -> dict[str, Path]:
    """Create the agent's namespace (if missing), ServiceAccount and a pod per node in ``emulator`` (on its loop);
    node -> the file its agent reads its token from (written once the node's kubelet starts the pod)."""
    namespace: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    for obj, name in ((namespace, NAMESPACE), (account_object(), ACCOUNT)):
        if emulator.get(str(obj["apiVersion"]), str(obj["kind"]), name, NAMESPACE) is None:
            _created(await emulator.create(obj))
    files: dict[str, Path] = {}
    for node in nodes:
        _created(await emulator.create(pod_object(node)))
        path = emulator.projected_token_path(NAMESPACE, pod_name(node), VOLUME, TOKEN_PATH)
        assert path is not None  # created just now
        files[node] = path
    return files


def _created(result: Obj | status.Failure) -> None:
    if isinstance(result, status.Failure):
        raise RuntimeError(f"the emulator refused an agent object: {result.message}")

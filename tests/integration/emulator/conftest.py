"""Fixtures for the emulator's tests: an emulator on its own thread, the official clients and kubectl against it.

The emulator runs with short delays (kubelet start, termination, bookmarks) so the tests wait tens of
milliseconds, not the defaults' tenths of seconds. Each kubectl call gets a fresh discovery cache directory, since
kubectl caches discovery per host and port and ports are reused between tests.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from common import clusterspec
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from quotient.emulator.kubelets import KubeletConfig
from quotient.emulator.server import ServerConfig
from tests.conftest import require_tool

# Two small GPU nodes, so admission limits are easy to reach: 16 cores, 64 GiB, 4 GPUs, 20 pod slots each.
SPEC = "2x4xA100-80GB:cpu=16,mem=64Gi,pods=20"
FAST = EmulatorConfig(
    kubelet=KubeletConfig(start_delay_s=0.02, termination_delay_s=0.01, config_retry_s=0.05),
    server=ServerConfig(bookmark_interval_s=0.2),
)


def cluster(spec: str = SPEC) -> clusterspec.ClusterSpec:
    return clusterspec.resolve(spec)


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(cluster(), config=FAST) as running:
        yield running


@pytest.fixture
def api_client(emulator: EmulatorThread) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = emulator.url
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def pod_manifest(name: str, *, namespace: str = "default", **spec_fields: object) -> dict[str, object]:
    """A small pod; keyword arguments go into its spec (``labels`` and ``annotations`` into its metadata)."""
    labels = spec_fields.pop("labels", {})
    annotations = spec_fields.pop("annotations", {})
    resources = spec_fields.pop("resources", {"requests": {"cpu": "100m", "memory": "64Mi"}})
    spec: dict[str, object] = {"containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}]}
    spec.update(spec_fields)
    metadata: dict[str, object] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@dataclasses.dataclass(frozen=True, slots=True)
class Kubectl:
    binary: str
    server: str
    cache_dir: Path

    def __call__(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--server", self.server, "--cache-dir", str(self.cache_dir), *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.binary, "--server", self.server, "--cache-dir", str(self.cache_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture
def kubectl(emulator: EmulatorThread, tmp_path: Path) -> Kubectl:
    return Kubectl(binary=require_tool("kubectl"), server=emulator.url, cache_dir=tmp_path / "kube-cache")

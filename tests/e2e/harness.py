"""End-to-end harness: the emulator (in a background thread, with its test hooks), the real scheduler as a separate
process (``quotient scheduler``), and the real ``kubectl`` against the emulator.

Each test gets a fresh emulated cluster, as each of the seeds' guides ran on a cluster of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from common import clusterspec
from quotient.emulator import status as emulator_status
from quotient.emulator.emulator import EmulatorConfig, EmulatorThread
from quotient.emulator.faults import Fault
from quotient.emulator.kubelets import KubeletConfig
from quotient.emulator.store import Change, EventType
from tests.conftest import REPO, require_tool

SCHEDULER_NAMES = "quotient,kai-scheduler"
STEP_TIMEOUT_S = 20.0
"""How long the tests poll for one step (``tests.polling.until_sync``): a scheduler process syncing, a pod bound
and started, a few kubectl round trips, on a loaded two-core CI machine. Longer steps name their own."""


class Kubectl:
    """The real kubectl against one emulator, with a cache of its own (kubectl caches discovery per host:port)."""

    def __init__(self, server: str) -> None:
        self.binary = require_tool("kubectl")
        self.server = server
        self._cache = tempfile.TemporaryDirectory(prefix="quotient-kubectl-")

    def __call__(self, *args: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--server", self.server, "--cache-dir", self._cache.name, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}{result.stdout}"
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def close(self) -> None:
        self._cache.cleanup()


class SchedulerProcess:
    """``quotient scheduler`` as its own process, logging to a file the test prints on failure."""

    def __init__(
        self,
        server: str,
        *extra: str,
        identity: str = "sched-a",
        leader_elect: bool = False,
        kubeconfig: Path | None = None,
    ) -> None:
        """``kubeconfig``: connect through it (a token's identity, held to RBAC) instead of as the administrator."""
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - the process writes to it for its whole life
            prefix=f"quotient-{identity}-", suffix=".log", delete=False
        )
        args = [
            sys.executable,
            "-m",
            "quotient.cli",
            "scheduler",
            *(("--kubeconfig", str(kubeconfig)) if kubeconfig is not None else ("--kube-server", server)),
            "--scheduler-name",
            SCHEDULER_NAMES,
            "--metrics-port",
            "0",
            "--identity",
            identity,
            "--no-webhook",
            "--cycle-debounce",
            "10ms",
            "--log-level",
            "info",
        ]
        if leader_elect:
            args += [
                "--lease-duration",
                "3s",
                "--renew-deadline",
                "2s",
                "--retry-period",
                "0.5s",
                "--lease-namespace",
                "default",
            ]
        else:
            args.append("--no-leader-elect")
        self.process = subprocess.Popen(
            [*args, *extra],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            Path(self._log.name).unlink()


@contextlib.contextmanager
def cluster(spec: str = "1x4xA100-80GB", *, kubelet_delay_s: float = 0.05) -> Iterator[EmulatorThread]:
    config = EmulatorConfig(kubelet=KubeletConfig(start_delay_s=kubelet_delay_s))
    emulator = EmulatorThread(clusterspec.resolve(spec), config=config).start()
    try:
        yield emulator
    finally:
        emulator.stop()


def pods(kubectl: Kubectl, namespace: str = "default") -> dict[str, dict[str, Any]]:
    listed = kubectl.json("get", "pods", "-n", namespace)
    return {item["metadata"]["name"]: item for item in listed["items"]}


def bound(pod: dict[str, Any]) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


def seeds(*names: str) -> Sequence[Path]:
    from tests.conftest import shared_path

    return [shared_path("seeds", name) for name in names]


# --- Helpers for the workload and fault tests ----------------------------------------------------------------------


def inject(emulator: EmulatorThread, fault: Fault, *, duration_s: float | None = None) -> int:
    """Start an injected fault on the emulator's own loop (the rules are not shared across threads); its id."""
    return emulator.call(lambda: emulator.emulator.inject(fault, duration_s=duration_s))


def remove_fault(emulator: EmulatorThread, rule_id: int) -> None:
    emulator.call(lambda: emulator.emulator.faults.remove(rule_id))


def compact(emulator: EmulatorThread) -> int:
    return emulator.call(emulator.emulator.compact)


def drop_watches(emulator: EmulatorThread) -> int:
    return emulator.call(lambda: emulator.emulator.drop_watches())


def apply_objects(kubectl: Kubectl, directory: Path, name: str, *objects: Mapping[str, Any]) -> None:
    """``kubectl apply -f`` of objects written to a manifest file in ``directory`` (one YAML document each)."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([dict(obj) for obj in objects], sort_keys=False))
    kubectl("apply", "-f", str(path))


def load_seed(name: str) -> dict[str, Any]:
    """One seed manifest as a mapping, to be changed (namespace, owners) before it is applied."""
    (path,) = seeds(name)
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def gpu_pod(
    name: str, *, gpus: int = 1, namespace: str = "default", annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An ownerless pod of ours asking for whole GPUs (no queue label: it goes to ``default-queue``)."""
    resources = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [
                {"name": "main", "image": "ubuntu", "resources": {"requests": resources, "limits": resources}}
            ],
        },
    }


def events_about(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    """The core/v1 Events whose involvedObject is the object ``name`` in ``namespace``."""
    listed = kubectl.json("get", "events", "-n", namespace)
    return [item for item in listed["items"] if (item.get("involvedObject") or {}).get("name") == name]


def lease_holder(emulator: EmulatorThread, namespace: str, name: str) -> str:
    """The holderIdentity of a coordination.k8s.io Lease ("" when absent or released)."""
    lease = emulator.call(lambda: emulator.emulator.get("coordination.k8s.io/v1", "Lease", name, namespace))
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """One pod getting its node, as the emulator's store recorded it."""

    namespace: str
    name: str
    uid: str
    node: str
    at_s: float
    """``time.monotonic()`` when the store recorded it."""


class BindLedger:
    """Every binding that happened in the emulator, and every answer to a ``pods/binding`` request.

    The store's own change feed is the ground truth for "bound": a pod is bound when a write moves its
    ``spec.nodeName`` from empty to a node, so a pod bound twice (or rebound after a restart) would show two entries
    under its uid. The answers (201, 409, 404, ...) to the binding requests that reached the API layer show whether a
    scheduler tried to bind a pod that was bound already. Injected faults are answered before the API layer, so they
    are not counted here. The requests still in the server's hands (``in_flight``) tell when a killed scheduler's
    last bindings have settled.
    """

    def __init__(self, emulator: EmulatorThread) -> None:
        self._emulator = emulator
        self._lock = threading.Lock()
        self._bindings: list[Binding] = []
        self._answers: list[tuple[str, str, str, int]] = []
        api = emulator.emulator.api
        original = api.bind

        def listener(change: Change) -> None:
            if change.storage != "pods" or change.type is not EventType.MODIFIED:
                return
            before = ((change.old or {}).get("spec") or {}).get("nodeName")
            after = (change.obj.get("spec") or {}).get("nodeName")
            if after and not before:
                meta = change.obj.get("metadata") or {}
                binding = Binding(
                    namespace=str(meta.get("namespace")),
                    name=str(meta.get("name")),
                    uid=str(meta.get("uid")),
                    node=str(after),
                    at_s=time.monotonic(),
                )
                with self._lock:
                    self._bindings.append(binding)

        def counting_bind(namespace: str, name: str, body: Any) -> Any:
            result = original(namespace, name, body)
            code = result.code if isinstance(result, emulator_status.Failure) else 201
            uid = str(((body if isinstance(body, dict) else {}).get("metadata") or {}).get("uid") or "")
            with self._lock:
                self._answers.append((namespace, name, uid, code))
            return result

        server = emulator.emulator.server
        handle_resource = server._resource
        self._in_flight = 0

        async def tracking_resource(request: Any, target: Any) -> Any:
            if getattr(target, "subresource", "") != "binding":
                return await handle_resource(request, target)
            with self._lock:
                self._in_flight += 1
            try:
                return await handle_resource(request, target)
            finally:  # also when the client went away and the server cancelled the request
                with self._lock:
                    self._in_flight -= 1

        self._listener = listener
        emulator.call(lambda: emulator.emulator.store.subscribe(listener))
        # Spies on the API layer's bind and on the server's resource requests: same arguments, same results, one
        # line of bookkeeping each.
        emulator.call(lambda: setattr(api, "bind", counting_bind))
        emulator.call(lambda: setattr(server, "_resource", tracking_resource))

    def bindings(self) -> list[Binding]:
        with self._lock:
            return list(self._bindings)

    def bound_names(self, namespace: str = "default") -> set[str]:
        return {binding.name for binding in self.bindings() if binding.namespace == namespace}

    def times_bound(self) -> dict[str, int]:
        """uid -> how many times the store saw that pod get a node."""
        counts: dict[str, int] = {}
        for binding in self.bindings():
            counts[binding.uid] = counts.get(binding.uid, 0) + 1
        return counts

    def in_flight(self) -> int:
        """Binding requests the emulator has received and not answered yet (those an injected delay holds
        included); a request whose client went away is cancelled by the server and leaves the count."""
        with self._lock:
            return self._in_flight

    def answers(self) -> list[tuple[str, str, str, int]]:
        """(namespace, name, uid or "", HTTP code) of every binding request the API layer answered."""
        with self._lock:
            return list(self._answers)

    def assert_each_bound_once(self) -> None:
        twice = {uid: count for uid, count in self.times_bound().items() if count != 1}
        assert not twice, f"pods bound more than once: {twice}; bindings: {self.bindings()}"
        successes: dict[str, int] = {}
        for namespace, name, uid, code in self.answers():
            if code == 201:
                key = uid or f"{namespace}/{name}"  # the scheduler sends the uid as a precondition
                successes[key] = successes.get(key, 0) + 1
        repeated = {key: count for key, count in successes.items() if count != 1}
        assert not repeated, f"binding requests answered 201 more than once: {repeated}"

    def close(self) -> None:
        emulator = self._emulator.emulator

        def restore() -> None:
            emulator.store.unsubscribe(self._listener)
            vars(emulator.api).pop("bind", None)  # the classes' own methods again
            vars(emulator.server).pop("_resource", None)

        self._emulator.call(restore)


class World:
    """A fresh emulated cluster, kubectl, a ledger of bindings, and the scheduler processes a test starts."""

    def __init__(self, emulator: EmulatorThread, directory: Path) -> None:
        self.emulator = emulator
        self.directory = directory
        self.kubectl = Kubectl(emulator.url)
        self.ledger = BindLedger(emulator)
        self.schedulers: dict[str, SchedulerProcess] = {}

    def scheduler(
        self, *extra: str, identity: str, leader_elect: bool = False, kubeconfig: Path | None = None
    ) -> SchedulerProcess:
        process = SchedulerProcess(
            self.emulator.url, *extra, identity=identity, leader_elect=leader_elect, kubeconfig=kubeconfig
        )
        self.schedulers[identity] = process
        return process

    def apply(self, name: str, *objects: Mapping[str, Any]) -> None:
        apply_objects(self.kubectl, self.directory, name, *objects)

    def bound(self, names: Sequence[str]) -> bool:
        current = pods(self.kubectl)
        return all(bound(current.get(name, {})) for name in names)

    def close(self) -> None:
        for process in self.schedulers.values():
            process.close()
        self.ledger.close()
        self.kubectl.close()


@contextlib.contextmanager
def world(spec: str, directory: Path) -> Iterator[World]:
    """A ``World`` on a fresh cluster of ``spec``; on the way out each scheduler's log is printed (pytest shows a
    test's captured output only when it fails: the logs are there exactly then) and everything is stopped."""
    with cluster(spec) as emulator:
        current = World(emulator, directory)
        try:
            yield current
        finally:
            for identity, process in current.schedulers.items():
                print(f"--- scheduler log ({identity})")
                print(process.log()[-8000:])
            current.close()

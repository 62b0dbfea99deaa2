"""The emulator assembled: store, API, watches, controllers, kubelets and HTTP server, plus the test hooks.

``Emulator`` runs on the caller's event loop (``async with Emulator(spec) as emulator``), for tests that are
themselves asynchronous; ``EmulatorThread`` runs one on its own loop in a background thread, for synchronous
clients such as the blocking ``kubernetes`` client or ``kubectl``; ``quotient emulator`` (``app.py``) runs one as
a process. The Python API reaches into the running emulator for what tests need and a real cluster would not
offer: seed objects directly, compact the history (every older watch gets 410), drop every watch, inject errors
and delays (``faults``), read the device plugin's allocations, run pods through a ``ContainerRuntime``, route
admission webhook services and pods' ports (``pods/proxy``) to local addresses, read what containers printed, start a
stand-in kube-scheduler, issue tokens and read what each user was served and refused (``access``: requests with a
token are held to RBAC).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import yaml

from common import clusterspec, logs, tasks
from quotient.emulator import access, authn, cluster, containerlogs, crds, defaulting, projection, status
from quotient.emulator.admission import Webhooks
from quotient.emulator.api import Api
from quotient.emulator.controllers import Controllers
from quotient.emulator.defaultscheduler import DefaultScheduler
from quotient.emulator.faults import Fault, Faults
from quotient.emulator.kinds import Kind, default_registry
from quotient.emulator.kubelets import KubeletConfig, Kubelets
from quotient.emulator.objects import Obj, clone, metadata, set_condition, timestamp
from quotient.emulator.reserving import ReservationAgent
from quotient.emulator.runtime import ContainerRuntime
from quotient.emulator.server import Server, ServerConfig
from quotient.emulator.store import DEFAULT_HISTORY_EVENTS, Store
from quotient.emulator.watching import WatchHub

log = logs.get("emulator")

T = TypeVar("T")


# Quotient's own CustomResourceDefinitions, as `kubectl apply -k deploy/base` installs them.
DEPLOY_CRDS = Path(__file__).resolve().parents[2] / "deploy" / "base" / "crds"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorConfig:
    kubelet: KubeletConfig = dataclasses.field(default_factory=KubeletConfig)
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    history_events: int = DEFAULT_HISTORY_EVENTS
    default_queues: bool = True  # KAI's default-parent-queue and default-queue
    priority_classes: bool = True  # the system classes and KAI's train, build-preemptible, build, inference
    scripted_pods: bool = True  # create the cluster spec's pods at their arrival times
    crds_from: Path | None = DEPLOY_CRDS
    """The CRDs installed at start (their schemas check every Queue and PodGroup written through the API)."""
    default_scheduler: bool = False
    """Run the stand-in for kube-scheduler (``defaultscheduler``): pods naming ``default-scheduler`` get a node."""


class Emulator:
    def __init__(
        self,
        spec: clusterspec.ClusterSpec | None = None,
        *,
        config: EmulatorConfig = EmulatorConfig(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec or clusterspec.ClusterSpec(nodes=(), pods=())
        self.config = config
        self.clock = clock
        self.store = Store(history_events=config.history_events)
        self.registry = default_registry()
        self.webhooks = Webhooks(self.store)
        self.api = Api(store=self.store, registry=self.registry, webhooks=self.webhooks, clock=clock)
        self.hub = WatchHub(self.store, clock)
        self.faults = Faults()
        self.controllers = Controllers(self.api)
        self.default_scheduler = DefaultScheduler(self.api)
        self.kubelets = Kubelets(self.api, config=config.kubelet, gpu_uuids=cluster.gpu_uuids(self.spec))
        # Reservation pods report their device's UUID, as ``quotient reserve`` does on a real node.
        self.reservation_agent = ReservationAgent(self.api)
        self.kubelets.add_runtime(self.reservation_agent)
        self.server = Server(
            api=self.api,
            hub=self.hub,
            faults=self.faults,
            hooks=self,
            config=config.server,
            clock=clock,
            logs=self.kubelets.logs,
        )
        # The kubelets project ServiceAccount tokens bound to their pods (``projection``), issued by the server.
        self.projections = projection.Projections(tokens=self.server.access.tokens, store=self.store, clock=clock)
        self.kubelets.projections = self.projections
        self._tasks = tasks.TaskSet("emulator")
        self._started = False

    # --- Lifecycle ---

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Populate the cluster, start the controllers and listen (port 0: a free one)."""
        self._bootstrap()
        self._tasks.spawn(self.controllers.run(), name="controllers")
        await self.server.start(host, port)
        self._started = True
        if self.config.default_scheduler:
            self.default_scheduler.start()
        if self.config.scripted_pods:
            for pod in self.spec.pods:
                self._tasks.spawn(self._arrive(pod), name=f"pod-{pod.namespace}-{pod.name}")
        log.info("emulator_listening", url=self.url, nodes=len(self.spec.nodes))

    async def stop(self) -> None:
        self.default_scheduler.stop()
        self.kubelets.close()
        self.projections.close()
        await self.reservation_agent.close()
        await self.server.stop()
        await self._tasks.cancel()
        await self.webhooks.close()
        self._started = False

    async def __aenter__(self) -> Emulator:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()

    def _bootstrap(self) -> None:
        for name in (*cluster.SYSTEM_NAMESPACES, *cluster.namespaces_of(self.spec.pods)):
            self.seed(cluster.namespace_object(name))
        for crd in cluster.crd_objects(self.config.crds_from):
            crds.establish(crd, now=timestamp(self.clock()))
            self.seed(crd)
        if self.config.priority_classes:
            for priority_class in cluster.priority_class_objects():
                self.seed(priority_class)
        if self.config.default_queues:
            for queue in cluster.default_queue_objects():
                self.seed(queue)
        for index, node in enumerate(self.spec.nodes):
            self.seed(cluster.node_object(node, index))

    async def _arrive(self, pod: clusterspec.PodSpec) -> None:
        await asyncio.sleep(pod.arrive_ns / 1e9)
        created = await self.create(cluster.pod_object(pod))
        if isinstance(created, status.Failure):
            log.warning("scripted_pod_rejected", pod=f"{pod.namespace}/{pod.name}", message=created.message)

    # --- Objects ---

    def kind_of(self, api_version: str, kind: str) -> Kind:
        found = self.registry.by_gvk(api_version, kind)
        if found is None:
            raise LookupError(f"the emulator serves no {kind} in {api_version}")
        return found

    def seed(self, obj: Obj) -> Obj:
        """Store an object as given (status included), bypassing admission and validation; fills in the identity
        (uid, creationTimestamp, generation; namespace ``default`` for namespaced kinds) and the defaults. Call it
        on the emulator's loop once started (a seeded Running pod is adopted by its node's kubelet). Raises
        ValueError when it exists."""
        kind = self.kind_of(str(obj.get("apiVersion")), str(obj.get("kind")))
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", timestamp(self.clock()))
        meta.setdefault("generation", 1)
        defaulting.apply(kind.storage, obj)
        if self.store.get(kind.storage, str(meta.get("namespace") or ""), str(meta.get("name"))) is not None:
            raise ValueError(f"{kind.storage} {meta.get('namespace', '')}/{meta.get('name')} already exists")
        stored = self.store.create(kind.storage, obj)
        if kind.storage == crds.CRDS:
            self.registry.add_crd(stored)
        return stored

    async def create(self, obj: Obj) -> Obj | status.Failure:
        """Create through the API, as a client would (defaults, admission, webhooks, validation)."""
        kind = self.kind_of(str(obj.get("apiVersion")), str(obj.get("kind")))
        namespace = str(metadata(obj).get("namespace") or ("default" if kind.namespaced else ""))
        return await self.api.create(kind, namespace, clone(obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> Obj | None:
        found = self.kind_of(api_version, kind)
        return self.store.get(found.storage, namespace if found.namespaced else "", name)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        return self.store.objects(self.kind_of(api_version, kind).storage, namespace)

    # --- Test hooks ---

    def compact(self) -> int:
        """Drop the watch history: a watch from any version before now gets 410 Expired. Returns the floor."""
        floor = self.store.compact()
        log.info("history_compacted", floor=floor)
        return floor

    def drop_watches(self, *, abort: bool = False) -> int:
        """End every open watch (``abort``: cut the connections instead of ending the streams)."""
        return self.hub.close_all(abort=abort)

    def inject(self, fault: Fault, *, duration_s: float | None = None, count: int | None = None) -> int:
        """Answer matching requests with an error and/or a delay (see ``faults.Fault``); returns the rule's id."""
        return self.faults.add(fault, duration_s=duration_s, count=count)

    def devices_of(self, namespace: str, name: str) -> tuple[int, ...] | None:
        """The GPU indices the device plugin gave a running pod; None when it is not running on any node."""
        return self.kubelets.devices_of(namespace, name)

    def add_runtime(self, runtime: ContainerRuntime, *, node: str | None = None) -> None:
        self.kubelets.add_runtime(runtime, node=node)

    def route_service(self, namespace: str, name: str, address: str) -> None:
        """Send admission calls for the webhook service ``namespace/name`` to ``host:port``."""
        self.webhooks.route_service(namespace, name, address)

    def start_default_scheduler(self) -> None:
        """From now on, place the pods that name ``default-scheduler`` as kube-scheduler would (``defaultscheduler``);
        call on the emulator's loop."""
        self.default_scheduler.start()

    def route_pod(self, namespace: str, name: str, port: int | str, address: str) -> None:
        """Send ``pods/proxy`` requests for port ``port`` of the pod ``namespace/name`` to ``host:port`` (where the
        process standing in for the pod listens)."""
        self.server.pod_proxy.route(namespace, name, port, address)

    def unroute_pod(self, namespace: str, name: str, port: int | str | None = None) -> None:
        self.server.pod_proxy.unroute(namespace, name, port)

    def logs_of(self, namespace: str, name: str, container: str = "") -> tuple[str, ...]:
        """The lines the pod's container (its first when "") printed so far in its current run."""
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return ()
        chosen = container or next(iter(containerlogs.container_names(pod)), "")
        reading = self.kubelets.logs.read(
            str(metadata(pod).get("uid")), chosen, containerlogs.LogOptions(), now_ns=time.time_ns()
        )
        return tuple(line.text for line in reading.lines)

    def set_node_ready(self, name: str, ready: bool) -> Obj | None:
        node = self.store.get("nodes", "", name)
        if node is None:
            return None
        new_status = clone(node.get("status") or {})
        reason = "KubeletReady" if ready else "NodeStatusUnknown"
        message = "kubelet is posting ready status" if ready else "Kubelet stopped posting node status."
        set_condition(
            new_status,
            {
                "type": "Ready",
                "status": "True" if ready else "Unknown",
                "reason": reason,
                "message": message,
                "lastTransitionTime": timestamp(self.clock()),
            },
        )
        return self.api.write_status(
            self.kind_of("v1", "Node"), "", name, new_status, uid=str(metadata(node).get("uid"))
        )

    # --- Identities and what they asked (``access``) ---

    def service_account_token(
        self, namespace: str, name: str, *, expiration_s: int = authn.DEFAULT_EXPIRATION_S
    ) -> str:
        """A token for the ServiceAccount ``namespace/name``, as its ``TokenRequest`` gives one (valid while the
        account exists); LookupError when there is no such account."""
        issued = self.server.access.token_request(namespace, name, {"spec": {"expirationSeconds": expiration_s}})
        if isinstance(issued, status.Failure):
            raise LookupError(issued.message)
        return str(issued["status"]["token"])

    def projected_token_path(self, namespace: str, pod: str, volume: str, path: str = "token") -> Path | None:
        """Where the pod's kubelet writes ``path`` of its projected token ``volume`` (``projection``): the file a
        process standing in for the pod's container reads; None when there is no such pod. The file exists while
        the pod runs."""
        found = self.store.get("pods", namespace, pod)
        if found is None:
            return None
        return self.projections.path(str(metadata(found).get("uid")), volume, path)

    def static_token(self, user: str, groups: Sequence[str] = ()) -> str:
        """A token for any user name (a service account's too, whether it exists or not), as the API server's
        ``--token-auth-file`` gives."""
        return self.server.access.tokens.issue_static(authn.User(name=user, groups=tuple(groups)))

    def requests_of(self, user: str) -> access.Record:
        """The kinds of request ``user`` was served and refused so far (``access.Record``)."""
        return self.server.access.record_of(user)

    def access_record(self, user: str) -> Obj:
        return self.requests_of(user).as_json()

    def kubeconfig(self, token: str | None = None) -> str:
        """A kubeconfig for this emulator (plain HTTP; the administrator, or the user of ``token``)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "quotient-emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "quotient", "user": {"token": token} if token else {}}],
            "contexts": [
                {"name": "quotient-emulator", "context": {"cluster": "quotient-emulator", "user": "quotient"}}
            ],
            "current-context": "quotient-emulator",
        }
        return yaml.safe_dump(config, sort_keys=False)

    def write_kubeconfig(self, path: str | Path, token: str | None = None) -> Path:
        target = Path(path)
        target.write_text(self.kubeconfig(token))
        return target


class EmulatorThread:
    """An Emulator on its own event loop in a daemon thread. Reach it only through ``call`` and ``run`` (the
    emulator is single-threaded: its kubelets and controllers need its loop); HTTP clients just use ``url``."""

    def __init__(
        self,
        spec: clusterspec.ClusterSpec | None = None,
        *,
        config: EmulatorConfig = EmulatorConfig(),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.emulator = Emulator(spec, config=config)
        self._host, self._port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="quotient-emulator", daemon=True)

    @property
    def url(self) -> str:
        return self.emulator.url

    def start(self, timeout_s: float = 30.0) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the emulator did not start within {timeout_s} s")
        if self._failure is not None:
            raise RuntimeError(f"the emulator failed to start: {self._failure}") from self._failure
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the starting thread, which re-raises it
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self.emulator.start(self._host, self._port)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await self.emulator.stop()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout_s)

    def __enter__(self) -> EmulatorThread:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def call(self, function: Callable[[], T], timeout_s: float = 30.0) -> T:
        """Run ``function`` on the emulator's loop and return its result."""

        async def wrapper() -> T:
            return function()

        return self.run(wrapper, timeout_s)

    def run(self, coroutine: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
        """Await ``coroutine()`` on the emulator's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator thread is not running")

        async def runner() -> T:
            return await coroutine()

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(runner(), self._loop)
        return future.result(timeout_s)

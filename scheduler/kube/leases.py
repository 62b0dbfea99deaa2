"""Leader election over a ``coordination.k8s.io/v1`` Lease: one scheduler replica acts, the others stand by.

The algorithm is client-go's (``tools/leaderelection``), written over :class:`scheduler.kube.client.KubeApi`
because the vendor library enters through one module only:
- A candidate reads the Lease. It takes it when nobody holds it, when it holds it itself, or when the record has
  not changed for ``leaseDurationSeconds`` *as measured on the candidate's own monotonic clock from when it first
  saw that record* (no comparison of wall clocks across machines). The write is a ``PUT`` carrying the record's
  ``resourceVersion``, so of two candidates racing for one expired lease exactly one succeeds (the other gets 409).
- The leader renews every ``retry_period_s``. If no renewal has succeeded for ``renew_deadline_s`` (counted from
  when the last successful renewal was *sent*), it stops leading at once. Since ``renew_deadline_s <
  lease_duration_s``, it has stopped before any standby may consider the lease expired: never two leaders.
- On shutdown the leader releases the lease (empty holder), so a standby takes over at its next retry instead of
  waiting out the lease duration.
Durations are validated (``lease_duration_s > renew_deadline_s > retry_period_s * 1.2``, client-go's rule) with
errors that name the setting: the sync client calls ``sys.exit()`` on bad values, we raise ``ConfigError``.

The pure parts (:func:`may_acquire`, :func:`claimed`, :func:`released`) decide and build records; the
:class:`LeaderElector` only reads, writes and waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from common import logs
from common.errors import ConfigError
from scheduler.kube import kubeapi
from scheduler.kube.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeForbidden, KubeNotFound

log = logs.get("scheduler.kube.leases")

# client-go's JitterFactor: each wait is retry_period * (1 + up to 0.2), and the renew deadline must leave room.
JITTER_FACTOR = 1.2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ElectionConfig:
    """Where the Lease lives, who we are, and the three durations (client-go's defaults: 15 s, 10 s, 2 s)."""

    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    """How long a standby waits, after it last saw the record change, before it may take the lease."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps leading without a successful renewal."""
    retry_period_s: float = 2.0
    """How often a candidate tries to acquire, and the leader to renew."""
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        for field, value in (("namespace", self.namespace), ("name", self.name), ("identity", self.identity)):
            if not value:
                raise ConfigError(f"leader election: {field} must not be empty")
        if self.retry_period_s <= 0:
            raise ConfigError(f"leader election: retry period must be positive, got {self.retry_period_s}s")
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ConfigError(
                f"leader election: the lease duration ({self.lease_duration_s}s) must be longer than the renew "
                f"deadline ({self.renew_deadline_s}s), or a standby could take over while the leader still acts"
            )
        if self.renew_deadline_s <= JITTER_FACTOR * self.retry_period_s:
            raise ConfigError(
                f"leader election: the renew deadline ({self.renew_deadline_s}s) must be longer than "
                f"{JITTER_FACTOR} x the retry period ({self.retry_period_s}s), or one slow retry loses the lease"
            )

    @property
    def lease_duration_seconds(self) -> int:
        """The whole seconds written to the record (the API's field is an integer): rounded up, never shorter."""
        return max(1, math.ceil(self.lease_duration_s))


def _spec(lease: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = lease.get("spec") if lease else None
    return spec if isinstance(spec, dict) else {}


def holder_of(lease: Mapping[str, Any] | None) -> str:
    holder = _spec(lease).get("holderIdentity")
    return holder if isinstance(holder, str) else ""


def may_acquire(
    lease: Mapping[str, Any] | None, *, identity: str, observed_at_s: float, now_s: float, default_duration_s: float
) -> bool:
    """Whether ``identity`` may write itself into ``lease`` now.

    ``observed_at_s`` is when (on our monotonic clock) we first saw this record's current content; the lease has
    expired when it has stayed unchanged for its ``leaseDurationSeconds`` since then.
    """
    holder = holder_of(lease)
    if not holder or holder == identity:
        return True
    duration = _spec(lease).get("leaseDurationSeconds")
    duration_s = float(duration) if isinstance(duration, int) and duration > 0 else default_duration_s
    return now_s >= observed_at_s + duration_s


def claimed(lease: Mapping[str, Any] | None, *, config: ElectionConfig, now: datetime.datetime) -> dict[str, Any]:
    """The Lease with ``config.identity`` as its holder, renewed at ``now``: a new object or the update of one."""
    spec = _spec(lease)
    holder = holder_of(lease)
    stamp = kubeapi.micro_time(now)
    transitions = spec.get("leaseTransitions")
    count = transitions if isinstance(transitions, int) else 0
    new_spec = {
        "holderIdentity": config.identity,
        "leaseDurationSeconds": config.lease_duration_seconds,
        "acquireTime": spec.get("acquireTime", stamp) if holder == config.identity else stamp,
        "renewTime": stamp,
        "leaseTransitions": count + 1 if holder and holder != config.identity else count,
    }
    metadata: dict[str, Any] = {"name": config.name, "namespace": config.namespace}
    if lease is not None:
        metadata = {**lease.get("metadata", {}), **metadata}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": new_spec}


def released(lease: Mapping[str, Any], *, now: datetime.datetime) -> dict[str, Any]:
    """The Lease given up: no holder, so any candidate may take it at once (client-go's release)."""
    stamp = kubeapi.micro_time(now)
    spec = {**_spec(lease), "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": stamp, "acquireTime": stamp}
    return {**lease, "spec": spec}


class LeaderElector:
    """Campaigns for the Lease, runs ``lead`` while holding it, and stops it the moment leadership is in doubt.

    ``run(lead)`` returns (or raises what ``lead`` raised) when leadership ends: lost, or ``lead`` finished. The
    caller decides what follows; the scheduler exits, and its Deployment restarts it as a standby, since state
    must be rebuilt from the API anyway. Cancelling ``run`` cancels ``lead`` and releases the lease.
    """

    def __init__(
        self,
        api: kubeapi.KubeApi,
        config: ElectionConfig,
        *,
        on_new_leader: Callable[[str], None] | None = None,
        on_problem: Callable[[str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._api = api
        self.config = config
        self._monotonic = monotonic
        self._wall = wall
        self._sleep = sleep
        self._uniform = uniform
        self._observed: Mapping[str, Any] | None = None
        self._observed_at_s = 0.0
        self._leading = False
        self._on_new_leader = on_new_leader
        self._on_problem = on_problem
        self._problem = ""
        self.leader: str = ""
        """The holder last seen in the Lease ("" when none)."""

    @property
    def is_leader(self) -> bool:
        return self._leading

    async def run(
        self, lead: Callable[[], Awaitable[None]], *, on_stopped_leading: Callable[[], None] | None = None
    ) -> None:
        """Campaign until elected, then run ``lead`` until leadership ends; see the class docstring."""
        acquired_s = await self._acquire()
        self._leading = True
        log.info("leading_started", lease=f"{self.config.namespace}/{self.config.name}", identity=self.config.identity)
        leading = asyncio.ensure_future(lead())
        renewing = asyncio.ensure_future(self._renew_until_lost(acquired_s))
        try:
            await asyncio.wait({leading, renewing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            renewing.cancel()
            leading.cancel()
            await asyncio.gather(renewing, leading, return_exceptions=True)
            lost = not self._leading
            self._leading = False
            if not lost and self.config.release_on_cancel:
                await self._release()
            log.info("leading_stopped", identity=self.config.identity, lost=lost)
            if on_stopped_leading is not None:
                try:
                    on_stopped_leading()
                except Exception:
                    log.exception("on_stopped_leading_failed")
        if not leading.cancelled():
            failure = leading.exception()
            if failure is not None:
                raise failure

    # --- campaigning and renewing ---

    def _retry_delay_s(self) -> float:
        return self.config.retry_period_s * (1.0 + (JITTER_FACTOR - 1.0) * self._uniform())

    async def _acquire(self) -> float:
        """Try until the lease is ours; when the successful attempt was sent (the lease counts from then)."""
        while True:
            started_s = self._monotonic()
            if await self._try_acquire_or_renew():
                return started_s
            await self._sleep(self._retry_delay_s())

    async def _renew_until_lost(self, acquired_s: float) -> None:
        """Renew every retry period; return when no renewal has succeeded for the renew deadline."""
        last_renewed_s = acquired_s
        while True:
            await self._sleep(self.config.retry_period_s)
            started_s = self._monotonic()
            remaining_s = last_renewed_s + self.config.renew_deadline_s - started_s
            renewed = False
            if remaining_s > 0:
                try:
                    async with asyncio.timeout(remaining_s):
                        renewed = await self._try_acquire_or_renew()
                except TimeoutError:
                    log.warning("lease_renewal_timed_out", identity=self.config.identity)
            if renewed:
                # Counted from when the request was sent: the server may have applied it any time after.
                last_renewed_s = started_s
            elif self.leader not in ("", self.config.identity) or (
                self._monotonic() >= last_renewed_s + self.config.renew_deadline_s
            ):
                # Another holder in the record means someone else leads already: stop now, not at the deadline.
                self._leading = False
                log.warning(
                    "leadership_lost", identity=self.config.identity, renew_deadline_s=self.config.renew_deadline_s
                )
                return

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt; a refusal that only an operator can fix (no rights, no namespace) is said once and passed to
        ``on_problem`` (the replica's ``/readyz``), and cleared at the next attempt that reaches the Lease."""
        config = self.config
        try:
            won = await self._attempt()
        except KubeForbidden as exc:
            self._say(
                f"the scheduler may not use its Lease {config.namespace}/{config.name} ({exc.reason or exc}): the "
                f"namespace {config.namespace!r} or the scheduler's Role in it is missing; apply the deploy manifests "
                "(kubectl apply -k deploy/base) or set --lease-namespace to a namespace where its Role is bound"
            )
            return False
        except KubeNotFound as exc:
            # The lease vanished between the read and the write, or its namespace does not exist: say which.
            self._say(
                f"the scheduler's Lease {config.namespace}/{config.name} cannot be written ({exc.reason or exc}): "
                f"does the namespace {config.namespace!r} exist? (kubectl apply -k deploy/base, or set "
                "--lease-namespace)"
            )
            return False
        self._say("")
        return won

    def _say(self, problem: str) -> None:
        if problem == self._problem:
            return
        if problem:
            log.error("lease_unusable", identity=self.config.identity, problem=problem)
        elif self._problem:
            log.info("lease_usable", identity=self.config.identity)
        self._problem = problem
        if self._on_problem is not None:
            self._on_problem(problem)

    async def _attempt(self) -> bool:
        config = self.config
        try:
            lease = await self._api.get(kubeapi.LEASES, name=config.name, namespace=config.namespace)
            if lease is None:
                created = await self._api.create(
                    kubeapi.LEASES, claimed(None, config=config, now=self._wall()), namespace=config.namespace
                )
                self._observe(created)
                return True
            self._observe(lease)
            if not may_acquire(
                lease,
                identity=config.identity,
                observed_at_s=self._observed_at_s,
                now_s=self._monotonic(),
                default_duration_s=config.lease_duration_s,
            ):
                return False
            updated = await self._api.replace(
                kubeapi.LEASES,
                claimed(lease, config=config, now=self._wall()),
                name=config.name,
                namespace=config.namespace,
            )
            self._observe(updated)
            return True
        except (KubeConflict, KubeAlreadyExists):
            # Another candidate wrote first; read again at the next retry.
            return False
        except (KubeForbidden, KubeNotFound):
            raise  # said by the caller, once
        except KubeError as exc:
            log.warning("lease_attempt_failed", identity=config.identity, error=str(exc))
            return False

    def _observe(self, lease: Mapping[str, Any]) -> None:
        spec = _spec(lease)
        if self._observed is None or _spec(self._observed) != spec:
            self._observed_at_s = self._monotonic()
        self._observed = lease
        holder = holder_of(lease)
        if holder != self.leader:
            self.leader = holder
            log.info("leader_observed", leader=holder or "(none)", identity=self.config.identity)
            if self._on_new_leader is not None:
                try:
                    self._on_new_leader(holder)
                except Exception:
                    log.exception("on_new_leader_failed")

    async def _release(self) -> None:
        """Give the lease up if we still hold it; best effort, bounded by the renew deadline."""
        config = self.config
        try:
            async with asyncio.timeout(config.renew_deadline_s):
                lease = await self._api.get(kubeapi.LEASES, name=config.name, namespace=config.namespace)
                if lease is None or holder_of(lease) != config.identity:
                    return
                await self._api.replace(
                    kubeapi.LEASES, released(lease, now=self._wall()), name=config.name, namespace=config.namespace
                )
                log.info("lease_released", identity=config.identity)
        except (KubeError, TimeoutError) as exc:
            log.warning("lease_release_failed", identity=config.identity, error=str(exc))

"""Every decision of the scheduler as a ``Decision`` message on ``quotient.v1.decisions``: an audit log and a
replayable trace for third parties (DESIGN.md, wire protocol).

Publishing never blocks scheduling: when NATS is down the message is dropped and counted (the Kubernetes Events and
the pods themselves still tell what happened), never queued without bound.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence

from common import logs, messaging, subjects, wire
from common.errors import BusError, WireError

log = logs.get("scheduler.audit")


@dataclasses.dataclass(slots=True)
class AuditCounters:
    published: int = 0
    dropped: int = 0


class DecisionPublisher:
    def __init__(self, bus: messaging.MessageBus, *, identity: str, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._bus = bus
        self._identity = identity[:253] or "quotient-scheduler"
        self._boot = secrets.token_hex(8)
        self._seq = 0
        self._clock_ns = clock_ns
        self.counters = AuditCounters()

    async def publish(
        self,
        *,
        action: wire.DecisionAction,
        namespace: str,
        name: str,
        uid: str,
        node: str | None,
        gpu_indices: Sequence[int] = (),
        gpu_group: str | None = None,
        queue: str | None = None,
        reason: str,
        message: str,
        cycle: int,
    ) -> None:
        if not self._bus.connected:
            self.counters.dropped += 1
            return
        self._seq += 1
        try:
            payload = wire.encode(
                wire.Decision(
                    v=wire.SCHEMA_VERSION,
                    node=self._identity,
                    boot=self._boot,
                    seq=self._seq,
                    ts_ns=self._clock_ns(),
                    action=action,
                    pod_namespace=namespace,
                    pod_name=name,
                    pod_uid=uid,
                    node_name=node,
                    gpu_indices=tuple(gpu_indices),
                    gpu_group=gpu_group,
                    queue=queue,
                    reason=reason[:128] or "Unknown",
                    message=message[:4096],
                    cycle=cycle,
                )
            )
            await self._bus.publish(subjects.DECISIONS, payload)
        except (BusError, WireError) as exc:
            self.counters.dropped += 1
            log.debug("decision_dropped", pod=f"{namespace}/{name}", error=str(exc))
            return
        self.counters.published += 1

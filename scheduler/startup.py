"""What a replica checks before it campaigns: its namespaces exist, its ports are its own.

A scheduler started against a fresh cluster must either work or say, in one line, what is missing and what fixes
it. So before the election every replica makes sure the namespaces it writes into exist (its Lease's and the
reservation pods'; made when its rights allow, ``kube.namespaces``), and while one is missing it logs why once, answers
``/readyz`` with the reason, and tries again every few seconds, so creating the namespace is all it takes. A port that
is in use (metrics, webhook) is a ``ConfigError`` naming the flag: the command prints one line and exits 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection

from common import logs
from common.errors import ConfigError
from scheduler.kube import kubeapi, namespaces, webhook

log = logs.get("scheduler")

RETRY_S = 5.0


@dataclasses.dataclass(slots=True)
class Readiness:
    """Why this replica is not ready, beyond standing by, by the part that found it ("" when nothing is wrong)."""

    problems: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def problem(self) -> str:
        return "; ".join(text for _, text in sorted(self.problems.items()) if text)

    def say(self, part: str, problem: str) -> None:
        """Set (or, with "", clear) what ``part`` finds wrong."""
        if problem:
            self.problems[part] = problem
        else:
            self.problems.pop(part, None)


async def namespaces_ready(
    api: kubeapi.KubeApi,
    needed: Collection[tuple[str, str, str]],
    readiness: Readiness,
    *,
    retry_s: float = RETRY_S,
) -> None:
    """Return once every ``(namespace, purpose, fix)`` in ``needed`` exists; meanwhile say why not, once per reason."""
    said = ""
    while True:
        missing = [
            problem
            for namespace, purpose, fix in needed
            if (problem := await namespaces.ensure(api, namespace, purpose=purpose, fix=fix)) is not None
        ]
        if not missing:
            if said:
                log.info("namespaces_ready")
            readiness.say("namespaces", "")
            return
        text = "; ".join(problem.message for problem in missing)
        if text != said:
            log.error("namespace_missing", problem=text)
            said = text
        readiness.say("namespaces", text)
        await asyncio.sleep(retry_s)


async def start_webhook(
    api: kubeapi.KubeApi,
    settings: webhook.WebhookSettings,
    *,
    scheduler_names: Collection[str],
    on_listening: Callable[[webhook.WebhookServer], None] | None = None,
) -> asyncio.Task[None]:
    """Start serving the admission webhook; return its task once it listens (cancel it to stop), raise
    ``ConfigError`` naming the flag when it cannot start."""
    listening = asyncio.Event()

    def started(server: webhook.WebhookServer) -> None:
        listening.set()
        if on_listening is not None:
            on_listening(server)

    serving = asyncio.ensure_future(webhook.serve(api, settings, scheduler_names=scheduler_names, on_listening=started))
    waiting = asyncio.ensure_future(listening.wait())
    try:
        await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if listening.is_set():
        serving.add_done_callback(_log_stop)
        return serving
    failure = serving.exception() if not serving.cancelled() else None
    raise ConfigError(f"--webhook-port: the admission webhook did not start: {failure or 'it stopped'}")


def _log_stop(serving: asyncio.Task[None]) -> None:
    if not serving.cancelled() and serving.exception() is not None:
        log.error("webhook_stopped", error=str(serving.exception()))

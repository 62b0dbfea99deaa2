"""Injected faults: error answers and delays for the requests a rule matches, for a while or a number of times.

Resync and retry paths are only trustworthy once exercised: "every binding answers 500 for the next 5 s", "every
watch is expired (410)", "lists take 2 s". A rule matches on verb, resource, subresource, namespace and name (each
optional); it lasts ``duration_s`` or ``count`` matching requests, whichever ends first (or until removed). Clocks
are monotonic and injectable, so tests of the rules themselves need no sleeping.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """What to do to matching requests: answer ``code`` (a Status error; for a watch, 410 is an ERROR event in the
    stream, as the server reports expiry) and/or wait ``delay_s`` first. Unset matchers match everything."""

    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    code: int | None = None
    delay_s: float = 0.0
    message: str = "injected fault"

    def matches(self, *, verb: str, resource: str, subresource: str, namespace: str, name: str) -> bool:
        return (
            (self.verb is None or self.verb == verb)
            and (self.resource is None or self.resource == resource)
            and (self.subresource is None or self.subresource == subresource)
            and (self.namespace is None or self.namespace == namespace)
            and (self.name is None or self.name == name)
        )


@dataclasses.dataclass(slots=True)
class _Active:
    fault: Fault
    until: float | None
    remaining: int | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """What the matching rules add up to for one request."""

    delay_s: float = 0.0
    code: int | None = None
    message: str = ""


NO_EFFECT = Effect()


class Faults:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rules: dict[int, _Active] = {}
        self._ids = itertools.count(1)

    def add(self, fault: Fault, *, duration_s: float | None = None, count: int | None = None) -> int:
        """Start a rule; returns its id for ``remove``."""
        if fault.verb is not None and fault.verb not in VERBS:
            raise ValueError(f"unknown verb {fault.verb!r}; one of {', '.join(VERBS)}")
        rule_id = next(self._ids)
        until = None if duration_s is None else self._clock() + duration_s
        self._rules[rule_id] = _Active(fault=fault, until=until, remaining=count)
        return rule_id

    def remove(self, rule_id: int) -> bool:
        return self._rules.pop(rule_id, None) is not None

    def clear(self) -> None:
        self._rules.clear()

    def __len__(self) -> int:
        self._expire()
        return len(self._rules)

    def _expire(self) -> None:
        now = self._clock()
        for rule_id, active in list(self._rules.items()):
            if (active.until is not None and now >= active.until) or active.remaining == 0:
                del self._rules[rule_id]

    def take(self, *, verb: str, resource: str, subresource: str = "", namespace: str = "", name: str = "") -> Effect:
        """The effect on one request; counts it against the rules that match."""
        if not self._rules:
            return NO_EFFECT
        self._expire()
        delay, code, message = 0.0, None, ""
        for active in self._rules.values():
            fault = active.fault
            if not fault.matches(verb=verb, resource=resource, subresource=subresource, namespace=namespace, name=name):
                continue
            if active.remaining is not None:
                active.remaining -= 1
            delay += fault.delay_s
            if code is None and fault.code is not None:
                code, message = fault.code, fault.message
        if not delay and code is None:
            return NO_EFFECT
        return Effect(delay_s=delay, code=code, message=message)

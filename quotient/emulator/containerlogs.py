"""What the emulated containers print, kept as a kubelet keeps container logs, for ``kubectl logs``.

The kubelet writes a line when each container starts (and when it exits); a ``ContainerRuntime`` may print for the
pod too, through the ``ContainerOutput`` its ``PodLaunch`` carries: the emulated GPU nodes print the fake GPU
process's lines, the memory it holds as its script says. A line may be written ahead with the time it is printed at
(a script's later steps): it is not shown before then, and never if the container stops first, so a reader sees
what a process would have printed by now without a timer per line.

Per pod and container the store keeps the current run and the one before it (``kubectl logs --previous``, after a
restart), each bounded to its newest ``max_lines`` (a kubelet rotates its log files), and forgets a pod when it is
deleted. ``read`` applies the options of the ``pods/log`` subresource (``tailLines``, ``sinceSeconds``/``sinceTime``,
``timestamps``, ``limitBytes``); ``podlogs`` serves it. Pure but for the change signal that following readers wait
on; time is an argument.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping

from common import names
from quotient.emulator.objects import Obj, metadata

DEFAULT_MAX_LINES = 5_000
"""Lines kept per container run (the kubelet's default rotation keeps 10 MiB; these lines are short)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LogLine:
    at_ns: int
    text: str


@dataclasses.dataclass(slots=True)
class _Run:
    lines: collections.deque[LogLine]
    ended_ns: int | None = None
    dropped: int = 0
    """Lines rotated out from the front, so a follower's position (counted from the run's first line) holds."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LogOptions:
    """The query of a ``pods/log`` request that shapes its text (the container and ``follow`` are the server's)."""

    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since_ns: int | None = None
    limit_bytes: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """The lines a reader may see now, and what follows: whether the run ended (nothing more will come) and when the
    next line written ahead becomes visible."""

    lines: tuple[LogLine, ...]
    ended: bool
    next_at_ns: int | None


class ContainerLogs:
    def __init__(self, *, max_lines: int = DEFAULT_MAX_LINES) -> None:
        self._max_lines = max_lines
        self._runs: dict[tuple[str, str], tuple[_Run, _Run | None]] = {}
        self._changed: dict[str, asyncio.Event] = {}

    # --- writing (the kubelet, the runtimes) ---

    def start(self, uid: str, container: str) -> None:
        """A new run of the container: the current one becomes the previous."""
        current = self._runs.get((uid, container))
        self._runs[(uid, container)] = (_Run(lines=collections.deque(maxlen=self._max_lines)), current and current[0])
        self._signal(uid)

    def write(self, uid: str, container: str, text: str, *, at_ns: int) -> None:
        """A line (or several, split) of the container's current run, printed at ``at_ns``; ignored when the
        container is not running (a runtime that prints after its pod stopped)."""
        found = self._runs.get((uid, container))
        if found is None or found[0].ended_ns is not None:
            return
        run = found[0]
        for line in text.splitlines() or [""]:
            if len(run.lines) == run.lines.maxlen:
                run.dropped += 1
            run.lines.append(LogLine(at_ns=at_ns, text=line))
        if len(run.lines) > 1 and run.lines[-2].at_ns > at_ns:  # a line written ahead comes later: keep time order
            run.lines = collections.deque(sorted(run.lines, key=lambda item: item.at_ns), maxlen=self._max_lines)
        self._signal(uid)

    def stop(self, uid: str, *, at_ns: int) -> None:
        """The pod's containers stopped at ``at_ns``: lines written ahead of it are never printed."""
        for (pod, _), (current, _) in self._runs.items():
            if pod == uid and current.ended_ns is None:
                current.ended_ns = at_ns
                while current.lines and current.lines[-1].at_ns > at_ns:
                    current.lines.pop()
        self._signal(uid)

    def exited(self, uid: str, *, code: int, at_ns: int) -> None:
        """The last line of each running container of the pod: how it ended."""
        for (pod, container), (current, _) in list(self._runs.items()):
            if pod == uid and current.ended_ns is None:
                self.write(uid, container, f"exited with code {code}", at_ns=at_ns)

    def forget(self, uid: str) -> None:
        """The pod is gone."""
        for key in [key for key in self._runs if key[0] == uid]:
            del self._runs[key]
        self._signal(uid)
        self._changed.pop(uid, None)

    # --- reading ---

    def has_run(self, uid: str, container: str, *, previous: bool = False) -> bool:
        found = self._runs.get((uid, container))
        return found is not None and (not previous or found[1] is not None)

    def read(self, uid: str, container: str, options: LogOptions, *, now_ns: int, after: int = 0) -> Reading:
        """The visible lines of the run ``options`` asks for, from the ``after``-th on (a follower's ``position``)."""
        found = self._runs.get((uid, container))
        run = (found[1] if options.previous else found[0]) if found is not None else None
        if run is None:
            return Reading(lines=(), ended=True, next_at_ns=None)
        visible = [line for line in run.lines if line.at_ns <= now_ns]
        later = [line.at_ns for line in run.lines if line.at_ns > now_ns]
        chosen = visible[max(0, after - run.dropped) :]
        if options.since_ns is not None:
            chosen = [line for line in chosen if line.at_ns >= options.since_ns]
        if options.tail_lines is not None and after == 0:
            chosen = chosen[-options.tail_lines :] if options.tail_lines > 0 else []
        ended = run.ended_ns is not None or options.previous
        return Reading(lines=tuple(chosen), ended=ended and not later, next_at_ns=min(later) if later else None)

    def position(self, uid: str, container: str, *, now_ns: int) -> int:
        """How many lines of the current run are visible now (where a follower goes on from)."""
        found = self._runs.get((uid, container))
        if found is None:
            return 0
        return found[0].dropped + sum(1 for line in found[0].lines if line.at_ns <= now_ns)

    def changed(self, uid: str) -> asyncio.Event:
        """Set when the pod's logs change (a follower clears it before reading again)."""
        return self._changed.setdefault(uid, asyncio.Event())

    def _signal(self, uid: str) -> None:
        event = self._changed.get(uid)
        if event is not None:
            event.set()


def render(lines: tuple[LogLine, ...] | list[LogLine], options: LogOptions) -> bytes:
    """The text of ``lines`` as the kubelet serves it: one line each, RFC 3339 timestamps first when asked."""
    text = "".join(f"{_stamp(line.at_ns)} {line.text}\n" if options.timestamps else f"{line.text}\n" for line in lines)
    return text.encode()


def _stamp(at_ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(at_ns // 1_000_000_000, datetime.UTC)
    return f"{moment.strftime('%Y-%m-%dT%H:%M:%S')}.{at_ns % 1_000_000_000:09d}Z"


class PodOutput:
    """A pod run's ``runtime.ContainerOutput``: lines into its containers' logs ("" is the first container)."""

    def __init__(self, logs: ContainerLogs, uid: str, containers: tuple[str, ...], clock_ns: Callable[[], int]) -> None:
        self.containers = containers
        self._logs, self._uid, self._clock_ns = logs, uid, clock_ns

    @classmethod
    def begin(
        cls,
        logs: ContainerLogs,
        pod: Obj,
        *,
        node: str,
        env: Mapping[str, Mapping[str, str]],
        at_ns: int,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> PodOutput:
        """A new run of the pod's containers, each with the line an emulated container prints first: what it is,
        where it runs, the GPUs it sees, and that its program does not run."""
        uid = str(metadata(pod).get("uid") or "")
        containers = [
            c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict) and c.get("name")
        ]
        output = cls(logs, uid, tuple(str(c["name"]) for c in containers), clock_ns)
        for container in containers:
            name = str(container["name"])
            logs.start(uid, name)
            devices = (env.get(name) or {}).get(names.VISIBLE_DEVICES_ENV, "")
            gpus = f", {names.VISIBLE_DEVICES_ENV}={devices}" if devices else ""
            words = [*(container.get("command") or []), *(container.get("args") or [])]
            command = " ".join(str(word) for word in words)
            runs = f"its command ({command}) does not run" if command else "no program runs in it"
            output.write(
                f"emulated container {name} (image {container.get('image', '')}) started on node {node}{gpus}; "
                f"{runs} in the emulator",
                container=name,
                at_ns=at_ns,
            )
        return output

    def write(self, text: str, *, container: str = "", at_ns: int | None = None) -> None:
        chosen = container or (self.containers[0] if self.containers else "")
        if chosen:
            self._logs.write(self._uid, chosen, text, at_ns=self._clock_ns() if at_ns is None else at_ns)


def container_names(pod: Obj) -> tuple[str, ...]:
    """The pod's containers (not its init containers), in order."""
    return tuple(
        str(container.get("name"))
        for container in (pod.get("spec") or {}).get("containers") or []
        if isinstance(container, dict) and container.get("name")
    )

"""What every long-running ``quotient`` subcommand does around its own work: one preamble, written once.

Settings from flags, environment and file (``common.config``); a configuration error printed as ``quotient NAME:
message`` with exit status 2, and so is a service that refuses to start (a port in use, a certificate that cannot be
made); logging set up from ``--log-level``/``--log-format``; the service run on uvloop until it returns or
SIGTERM/SIGINT cancels it (so its ``finally`` blocks close connections and servers); and a ``QuotientError`` that
escapes it logged as one event (``scheduler_failed``) with exit status 1. The exit statuses are what process
supervisors and the tests read: 0 done or stopped, 1 failed while running, 2 refused to start.

uvloop is imported here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from common import config, logs
from common.config import Setting
from common.errors import ConfigError, QuotientError

P = TypeVar("P")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2


def run_until_signalled(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` on uvloop; SIGTERM or SIGINT cancels it and waits for it to clean up."""
    import uvloop

    async def main_task() -> None:
        task = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    uvloop.run(main_task())


def run_service(
    argv: Sequence[str],
    *,
    prog: str,
    description: str,
    settings: Sequence[Setting[object]],
    prepare: Callable[[Mapping[str, object]], P],
    serve: Callable[[P], Coroutine[Any, Any, None]],
) -> int:
    """Parse ``settings`` from ``argv``, ``prepare`` them (raise ``ConfigError`` to refuse), set up logging and run
    ``serve`` until it ends or a signal stops it. Returns the process's exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    config.add_arguments(parser, settings)
    try:
        values = config.resolve(settings, parser.parse_args(list(argv)))
        prepared = prepare(values)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    logs.setup(level=str(values.get("log_level") or "info"), fmt=str(values.get("log_format") or "logfmt"))
    try:
        run_until_signalled(serve(prepared))
    except ConfigError as exc:
        # Refused while starting (a port in use, a certificate that cannot be made): one line, as for a bad flag.
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except QuotientError as exc:
        name = prog.rsplit(" ", 1)[-1].replace("-", "_")
        logs.get(name).error(f"{name}_failed", error=str(exc))
        return EXIT_FAILED
    return EXIT_OK


def values_as_is(values: Mapping[str, object]) -> Mapping[str, object]:
    """A ``prepare`` for commands whose ``serve`` takes the resolved settings themselves."""
    return values

"""``quotient bench NAME [ARGS]``: run one benchmark (or ``all``) and print exactly one JSON object on stdout.

Progress and logs go to stderr so the output can be piped into ``jq`` or stored as a baseline. Each benchmark is a
module of this package with ``run(argv) -> dict``; only the chosen one is imported.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence

from common import logs

BENCHMARKS: dict[str, str] = {
    "agent": "quotient.bench.agent",
    "engine": "quotient.bench.engine",
    "e2e": "quotient.bench.e2e",
    "telemetry": "quotient.bench.telemetry",
    "chaos": "quotient.bench.chaos",
    "kai-scale": "quotient.bench.kai_scale",
}
NOT_IN_ALL: frozenset[str] = frozenset({"chaos", "kai-scale"})
"""Benchmarks that run for minutes (``chaos --minutes N``, ``kai-scale``): run by name only, never by ``all``."""


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_one(name: str, argv: Sequence[str]) -> dict[str, object]:
    module = importlib.import_module(BENCHMARKS[name])
    result: dict[str, object] = module.run(list(argv))
    return result


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: quotient bench {{{'|'.join([*BENCHMARKS, 'all'])}}} [ARGS...]", file=sys.stderr)
        print(f"  all runs every benchmark but {', '.join(sorted(NOT_IN_ALL))} (they run for minutes)", file=sys.stderr)
        return 0 if args else 2
    logs.setup(level="warning")
    name, rest = args[0], args[1:]
    if name == "all":
        results: dict[str, object] = {"machine": _machine()}
        for bench in (candidate for candidate in BENCHMARKS if candidate not in NOT_IN_ALL):
            print(f"bench {bench} ...", file=sys.stderr)
            results[bench] = run_one(bench, [])
        print(json.dumps(results, sort_keys=True))
        return 0
    if name not in BENCHMARKS:
        print(f"quotient bench: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}, all", file=sys.stderr)
        return 2
    result = run_one(name, rest)
    result.setdefault("machine", _machine())
    print(json.dumps(result, sort_keys=True))
    return 0

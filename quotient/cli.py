"""The ``quotient`` command: one entry point, one module per subcommand, imported only when that subcommand runs.

``quotient agent`` must start fast and small on every GPU node and never load the Kubernetes client, so the table
below names modules, not functions, and only the chosen one is imported. Each module exposes
``main(argv: Sequence[str]) -> int``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent.app", "run the node agent: GPU telemetry over NATS (a DaemonSet on every GPU node)"),
    "scheduler": ("scheduler.app", "run the Kubernetes scheduler (leader-elected; watches, places, binds)"),
    "reserve": ("quotient.reserve", "hold one GPU for a GPU group: the entry point of a reservation pod"),
    "emulator": ("quotient.emulator.app", "run the local Kubernetes API emulator (nodes from a cluster spec)"),
    "nats-keys": (
        "quotient.natskeys",
        "generate the NATS nkey seeds, TLS certificate and CA, and their Secrets, for the agent, scheduler and readers",
    ),
    "nodes": ("quotient.nodes", "run emulated GPU nodes (real agents over fake GPUs) from a cluster spec"),
    "simulate": ("quotient.simulate", "replay a trace or workload through the placement engine"),
    "bench": (
        "quotient.bench.runner",
        "run a benchmark and print one JSON object (agent, engine, e2e, telemetry, all; chaos --minutes N and "
        "kai-scale: not in all)",
    ),
    "demo": ("quotient.demo", "the local demo: embedded NATS, emulated GPU nodes, a live view"),
    "explain": (
        "quotient.explain.plugin",
        "why a pod waits (in numbers), where it runs and what it uses, or who took its place (kubectl quotient)",
    ),
    "docs": ("quotient.docsgen.app", "check or rewrite (--write) the reference pages generated from the code"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: quotient COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run 'quotient COMMAND --help' for the options of a command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    entry = SUBCOMMANDS.get(name)
    if entry is None:
        print(f"quotient: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())

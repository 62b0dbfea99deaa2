"""The commands: ``kubectl quotient explain|queues|top`` (the ``kubectl-quotient`` executable) and ``quotient
explain``.

kubectl runs a plugin with the arguments after its name and nothing else, so the flags kubectl users type are parsed
here, as kubectl parses them: ``-n``/``--namespace``, ``--context``, ``--kubeconfig``, ``-o``/``--output``, and
``--kube-server``/``-s``/``--server`` for a server without a kubeconfig (the scheduler's own flag, and the local
emulator's way). Exit codes: 0 when the command answered (even when the metrics could not be read: the answer says
so), 1 with one line on stderr when the object or the cluster cannot be read, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from common.errors import ConfigError
from quotient.explain import (
    document,
    explaining,
    facts,
    gather,
    kubeconfig,
    queuetable,
    rendering,
    scrape,
    tables,
    toptable,
)
from scheduler.kube import client
from scheduler.placement import status

COMMANDS = ("explain", "queues", "top")
_POD_KINDS = ("pod", "pods", "po")
_GROUP_KINDS = ("podgroup", "podgroups", "pg")


class UsageError(Exception):
    """A command line that cannot be run: said in one line, exit code 2."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    parser.add_argument(
        "-s", "--server", "--kube-server", dest="server", help="the API server URL, without a kubeconfig"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text (default) or json")
    parser.add_argument("--color", action=argparse.BooleanOptionalAction, default=None, help="colour (default: tty)")


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-url", help="read the scheduler's /metrics here instead of through the API server")
    parser.add_argument("--no-metrics", action="store_true", help="do not read the scheduler's /metrics")
    parser.add_argument("--lease-namespace", default="quotient-system", help="where the scheduler's Lease lives")
    parser.add_argument("--lease-name", default="quotient-scheduler", help="the scheduler's Lease")


def parser_for(command: str, prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{prog} {command}", exit_on_error=False)
    _common(parser)
    if command == "explain":
        parser.description = "Why a pod waits, where it runs and what it uses, or who took its place."
        parser.add_argument("target", nargs="+", help="NAMESPACE/POD, NAMESPACE/podgroup/NAME, POD (with -n)")
        parser.add_argument("-n", "--namespace", help="the namespace (default: the context's, else default)")
        _metrics_flags(parser)
    elif command == "queues":
        parser.description = "The queue tree: deserved, fair share, allocated, requested, limit, pending groups."
        parser.add_argument("-r", "--resource", choices=("gpu", "cpu", "memory"), default="gpu")
    else:
        parser.description = "Per node and GPU: allotted against measured memory per pod, health, alerts."
        _metrics_flags(parser)
    return parser


def target_of(words: Sequence[str], namespace: str | None, default_namespace: str) -> gather.Target:
    """``NS/POD``, ``NS/podgroup/NAME``, ``POD``, ``pod/NAME``, ``podgroup/NAME``, or kubectl's ``podgroup NAME``."""
    parts = list(words)
    if len(parts) == 2 and "/" not in parts[0] and "/" not in parts[1]:
        pieces = parts
    elif len(parts) == 1:
        pieces = parts[0].split("/")
    else:
        raise UsageError(f"one pod to explain, got {' '.join(words)!r}")
    if any(not piece for piece in pieces) or len(pieces) > 3:
        raise UsageError(f"cannot read {'/'.join(pieces)!r}: use NAMESPACE/POD or NAMESPACE/podgroup/NAME")
    found_ns: str | None = None
    kind = "pod"
    if len(pieces) == 3:
        found_ns, kind, name = pieces
    elif len(pieces) == 2:
        if pieces[0].lower() in _POD_KINDS + _GROUP_KINDS:
            kind, name = pieces
        else:
            found_ns, name = pieces
    else:
        name = pieces[0]
    kind = kind.lower()
    if kind not in _POD_KINDS + _GROUP_KINDS:
        raise UsageError(f"{kind!r} is not pod or podgroup")
    if found_ns is not None and namespace is not None and found_ns != namespace:
        raise UsageError(f"the namespace is given twice: {found_ns!r} and -n {namespace!r}")
    return gather.Target(namespace=found_ns or namespace or default_namespace, name=name, podgroup=kind in _GROUP_KINDS)


async def _connect(args: argparse.Namespace) -> client.KubeClient:
    if args.server:
        return client.KubeClient.for_server(args.server, request_timeout_s=20.0)
    return await client.KubeClient.from_kubeconfig(args.kubeconfig, context=args.context, request_timeout_s=20.0)


def _metrics_source(args: argparse.Namespace) -> gather.MetricsSource:
    return gather.MetricsSource(
        url=args.metrics_url,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        enabled=not args.no_metrics,
    )


def _emit(payload: object) -> None:
    print(json.dumps(payload, indent=2, sort_keys=False))


async def _explain(api: client.KubeClient, args: argparse.Namespace, style: tables.Style) -> int | str:
    default = kubeconfig.namespace(kubeconfig=args.kubeconfig, context=args.context) if not args.server else "default"
    target = target_of(args.target, args.namespace, default)
    found = await gather.explain_inputs(api, target, metrics=_metrics_source(args), get_text=api.get_text)
    if isinstance(found, gather.Failure):
        return found.message
    explanation = explaining.explain(found)
    if args.output == "json":
        _emit(document.explanation(explanation))
    else:
        print(rendering.explanation(explanation, now_ns=time.time_ns(), style=style))
    return 0


async def _queues(api: client.KubeClient, args: argparse.Namespace, style: tables.Style) -> int | str:
    found = await gather.queue_inputs(api)
    if isinstance(found, gather.Failure):
        return found.message
    rows = queuetable.tree([queue for obj in found.queues if (queue := facts.queue(obj)) is not None])
    if args.output == "json":
        _emit(document.table("QueueTable", queuetable.items(rows), unread=found.unread, source=None))
        return 0
    if not rows:
        print("No queues.")
        return 0
    resource = status.Resource(args.resource)
    print(tables.render(queuetable.HEADER, queuetable.cells(rows, resource, now_ns=time.time_ns()), style))
    print(style.dim(f"({queuetable.unit_note(resource)}; -r cpu|memory for the others)"))
    return 0


async def _top(api: client.KubeClient, args: argparse.Namespace, style: tables.Style) -> int | str:
    found = await gather.top_inputs(api, metrics=_metrics_source(args), get_text=api.get_text)
    if isinstance(found, gather.Failure):
        return found.message
    metrics = found.metrics if isinstance(found.metrics, scrape.Metrics) else None
    unread = [
        *found.unread,
        *([f"metrics: {found.metrics.reason}"] if isinstance(found.metrics, scrape.Unread) else []),
    ]
    rows = toptable.devices(found.nodes, found.pods, metrics)
    if args.output == "json":
        _emit(
            document.table("GpuTable", toptable.items(rows), unread=unread, source=metrics.source if metrics else None)
        )
        return 0
    if rows:
        print(tables.render(toptable.HEADER, toptable.cells(rows), style))
    else:
        print("No GPU nodes.")
    if metrics is None:
        print(style.dim("(allotments from the API only: measured memory, health and alerts need the metrics)"))
    for line in rendering.unread_lines(unread, style):
        print(line)
    return 0


RUNNERS: dict[str, Callable[[client.KubeClient, argparse.Namespace, tables.Style], Awaitable[int | str]]] = {
    "explain": _explain,
    "queues": _queues,
    "top": _top,
}


async def _run(command: str, args: argparse.Namespace) -> int | str:
    style = tables.style_for(sys.stdout, color=args.color)
    try:
        api = await _connect(args)
    except ConfigError as exc:
        return str(exc)
    try:
        return await RUNNERS[command](api, args, style)
    finally:
        await api.close()


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    return first if len(first) <= 300 else first[:299] + "…"


def run_command(command: str, argv: Sequence[str], *, prog: str) -> int:
    parser = parser_for(command, prog)
    try:
        args = parser.parse_args(list(argv))
        outcome = asyncio.run(_run(command, args))
    except (argparse.ArgumentError, UsageError) as exc:
        print(f"{prog} {command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if isinstance(outcome, str):
        print(f"{prog} {command}: error: {_one_line(outcome)}", file=sys.stderr)
        return 1
    return outcome


def _usage(prog: str) -> str:
    return (
        f"usage: {prog} COMMAND [ARGS...]\n\n"
        "commands:\n"
        "  explain  why a pod waits (its numbers), where it runs and what it uses, or who took its place\n"
        "  queues   the queue tree: deserved, fair share, allocated, requested, limit, pending groups\n"
        "  top      per node and GPU: allotted against measured memory per pod, health, alerts\n\n"
        f"Run '{prog} COMMAND --help' for the flags (kubectl's -n, --context, --kubeconfig, -o json among them)."
    )


def plugin_main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-quotient`` executable: ``kubectl quotient COMMAND ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "kubectl quotient"
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(prog))
        return 0
    if args[0] not in COMMANDS:
        print(f"{prog}: unknown command {args[0]!r}\n\n{_usage(prog)}", file=sys.stderr)
        return 2
    return run_command(args[0], args[1:], prog=prog)


def main(argv: Sequence[str]) -> int:
    """``quotient explain ...`` (the ``quotient`` command's subcommand)."""
    return run_command("explain", argv, prog="quotient")

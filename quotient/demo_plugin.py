"""How ``quotient demo`` shows what a user types: ``kubectl quotient ...`` and the guides' ``kubectl get`` views.

The plugin runs from its own installation: through ``kubectl`` when kubectl is on ``PATH`` and the package's
``kubectl-quotient`` executable sits beside the demo's Python (``PATH`` gains that directory, as the ``--keep`` line
tells the user to do), with a kubeconfig for the emulator written into the demo's work directory; otherwise the same
code in this process (``quotient.explain.plugin.plugin_main``, its output captured). The guides' ``kubectl get``
views (the vLLM guide's ``custom-columns``, the reservation pods) run through kubectl likewise, and are rendered
from the API objects in the same columns when kubectl is missing.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import io
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotient.demo_view import meta_of
from quotient.emulator.emulator import Emulator
from quotient.explain import plugin

VENV_BIN = Path(sys.executable).parent
PLUGIN = VENV_BIN / "kubectl-quotient"
GUIDE_README = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "README.md"
GUIDE_COLUMNS = (
    "NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,"
    "GPU-FRACTION:.metadata.annotations.gpu-fraction,GPU-GROUP:.metadata.labels.runai-gpu-group"
)
"""The AI-ready guide's view of its vLLM pods (``kubectl -n ai-workloads get pods -o custom-columns=...``)."""

_captured = threading.Lock()


def guide_columns() -> str:
    """The guide's ``custom-columns`` as the seeds' README quotes it, else the same columns written here."""
    with contextlib.suppress(OSError):
        found = re.search(r'-o custom-columns="([^"]+)"', GUIDE_README.read_text())
        if found is not None:
            return found.group(1)
    return GUIDE_COLUMNS


class Kubectl:
    """``kubectl`` (and ``kubectl quotient``) against the demo's emulator, or their stand-ins in this process."""

    def __init__(self, emulator: Emulator, workdir: Path, *, kubectl: str | None = None) -> None:
        self.emulator = emulator
        self.kubeconfig = emulator.write_kubeconfig(workdir / "kubeconfig")
        found = kubectl if kubectl is not None else shutil.which("kubectl")
        self.kubectl = found if found and PLUGIN.exists() else None
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECACHEDIR": str(workdir / "kubectl-cache"),
            "NO_COLOR": "1",
        }

    @property
    def how(self) -> str:
        """How the plugin runs, in words."""
        if self.kubectl:
            return f"kubectl {self.kubectl} with {PLUGIN} on PATH"
        return "in this process (no kubectl on PATH, or the package's kubectl-quotient is not installed)"

    async def quotient(self, *args: str) -> tuple[int, str]:
        """``kubectl quotient ARGS``: the exit code and what it printed (stdout, then stderr)."""
        if self.kubectl:
            return await self._run(self.kubectl, "quotient", *args, "--no-color")
        return await asyncio.to_thread(_in_process, [*args, "--no-color", "--kubeconfig", str(self.kubeconfig)])

    async def get_pods(self, namespace: str, *, columns: str | None = None) -> tuple[int, str]:
        """``kubectl -n NAMESPACE get pods`` (with ``-o custom-columns=COLUMNS``)."""
        if self.kubectl:
            shape = ["-o", f"custom-columns={columns}"] if columns else []
            return await self._run(self.kubectl, "-n", namespace, "get", "pods", *shape)
        pods = sorted(self.emulator.list("v1", "Pod", namespace), key=lambda pod: str(meta_of(pod).get("name")))
        if not pods:
            return 0, f"No resources found in {namespace} namespace."
        return 0, (render_columns(pods, columns) if columns else render_default(pods, now=time.time()))

    def line(self, *args: str) -> str:
        """The command as the user would type it."""
        return " ".join(("kubectl", *(f'"{arg}"' if "," in arg else arg for arg in args)))

    async def _run(self, *argv: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        except TimeoutError:
            process.kill()
            await process.wait()
            return 124, f"{' '.join(argv)}: no answer within 60 s"
        text = stdout.decode(errors="replace") + stderr.decode(errors="replace")
        return (process.returncode or 0), text.rstrip("\n")


def _in_process(argv: Sequence[str]) -> tuple[int, str]:
    """``plugin_main`` in this process (on a thread: it runs its own event loop), its output captured."""
    buffer = io.StringIO()
    with _captured, contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = plugin.plugin_main(list(argv))
    return code, buffer.getvalue().rstrip("\n")


def _path(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.lstrip(".").split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return "<none>" if value is None or value == "" else str(value)


def render_columns(pods: Sequence[Mapping[str, Any]], columns: str) -> str:
    """kubectl's ``custom-columns`` over the pods: ``HEADER:.json.path`` pairs, ``<none>`` for what is missing."""
    spec = [column.split(":", 1) for column in columns.split(",")]
    rows = [[header for header, _ in spec], *([_path(pod, path) for _, path in spec] for pod in pods)]
    return _table(rows)


def render_default(pods: Sequence[Mapping[str, Any]], *, now: float) -> str:
    """kubectl's default pod columns: NAME, READY, STATUS, RESTARTS, AGE."""
    rows = [["NAME", "READY", "STATUS", "RESTARTS", "AGE"]]
    for pod in pods:
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        ready = sum(1 for item in containers if item.get("ready"))
        total = len((pod.get("spec") or {}).get("containers") or [])
        created = str(meta_of(dict(pod)).get("creationTimestamp") or "")
        rows.append(
            [str(meta_of(dict(pod)).get("name")), f"{ready}/{total}", str(status.get("phase")), "0", _age(created, now)]
        )
    return _table(rows)


def _age(stamp: str, now: float) -> str:
    try:
        seconds = int(now - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return "<unknown>"
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )

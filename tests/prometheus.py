"""A real Prometheus for tests: started on a free loopback port, scraping given targets, evaluating given rules.

Both the rule tests against a served metrics registry (``tests/integration/test_monitoring.py``) and the end-to-end
proof against the scheduler process (``tests/e2e/test_prometheus.py``) need the same things from it: a config of
one scrape job and some rule files, readiness, instant queries, and the alerts API polled with a bound. Prometheus
is Debian's ``prometheus`` package (the one ``.ci/run`` installs); the caller finds the binary with
``tests.conftest.require_tool``, so a machine without it skips, and CI fails.

Scraping and evaluation run every second by default so a test sees a change within two or three seconds. The
scrape keeps the target's labels (``honor_labels``), as the deployed PodMonitor does by dropping the pod labels
that would clash: the scheduler's own ``namespace`` and ``pod`` labels name the pod an alert is about.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from common.natsserver import free_port
from tests import polling

Obj = dict[str, Any]


def rules_without_for(source: Path, into: Path) -> Path:
    """Write ``source``'s rule groups to ``into`` with every ``for`` at 0s, and return ``into``.

    An alert then fires at the first evaluation that sees its series instead of minutes later; the real ``for``
    durations are the promtool unit tests' business."""
    rules: Obj = yaml.safe_load(source.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    into.write_text(yaml.safe_dump(rules, sort_keys=False))
    return into


class Prometheus:
    """One Prometheus process: scrapes ``targets`` (host:port) under ``job`` and evaluates ``rule_files``."""

    def __init__(
        self,
        binary: str,
        *,
        workdir: Path,
        job: str,
        targets: Sequence[str],
        rule_files: Sequence[Path],
        interval_s: int = 1,
    ) -> None:
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": f"{interval_s}s",
                "scrape_timeout": f"{interval_s}s",
                "evaluation_interval": f"{interval_s}s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": job, "honor_labels": True, "static_configs": [{"targets": list(targets)}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.command = [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 20.0) -> None:
        """Start the process and wait until it answers ``/-/ready``; an exit or a timeout raises with its log."""
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        try:
            polling.until_sync(self._ready, timeout_s=timeout_s, what="prometheus ready")
        except AssertionError as exc:
            if self.process.poll() is not None:
                raise  # it exited: the message has its log
            raise AssertionError(f"{exc}: {self.log_tail()}") from None

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited {self.process.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        """Terminate the process (kill it after 10 s); harmless when it never started or already exited."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def get(self, path: str, **params: str) -> Obj:
        """The API's JSON answer, errors included (a bad query answers 400 with status "error")."""
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body: Obj = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read())
        return body

    def query(self, expr: str) -> Obj:
        return self.get("/api/v1/query", query=expr)

    def wait_for(self, expr: str, *, timeout_s: float = 20.0) -> None:
        """Until the instant query ``expr`` returns a series."""

        def series() -> bool:
            answer = self.query(expr)
            return answer["status"] == "success" and bool(answer["data"]["result"])

        polling.until_sync(series, timeout_s=timeout_s, interval_s=0.2, what=f"{expr} to return a series")

    def alerts(self) -> list[Obj]:
        """The active alerts of ``/api/v1/alerts`` (pending and firing; a resolved alert is no longer listed)."""
        alerts: list[Obj] = self.get("/api/v1/alerts")["data"]["alerts"]
        return alerts

    def firing(self) -> list[Obj]:
        return [alert for alert in self.alerts() if alert["state"] == "firing"]

    def wait_for_firing(
        self, until: Callable[[Sequence[Obj]], bool], *, timeout_s: float = 20.0, what: str = "the alerts"
    ) -> list[Obj]:
        """Poll the firing alerts until ``until`` holds for them, and return them; raise after ``timeout_s`` with the
        names of those firing then."""
        firing: list[Obj] = []

        def holds() -> bool:
            nonlocal firing
            firing = self.firing()
            return until(firing)

        try:
            polling.until_sync(holds, timeout_s=timeout_s, interval_s=0.2, what=what)
        except AssertionError as exc:
            names = sorted(alert["labels"].get("alertname", "") for alert in firing)
            raise AssertionError(f"{exc}; firing: {names}") from None
        return firing


@contextlib.contextmanager
def running(
    binary: str,
    *,
    job: str,
    targets: Sequence[str],
    rules: Path,
    interval_s: int = 1,
    timeout_s: float = 20.0,
) -> Iterator[Prometheus]:
    """A started Prometheus in its own temporary directory, evaluating a copy of ``rules`` with every ``for`` at
    0s (``rules_without_for``); stopped, and its directory removed, on the way out. A failed start raises with the
    tail of its log."""
    with tempfile.TemporaryDirectory(prefix="quotient-prometheus-") as tmp:
        workdir = Path(tmp)
        copy = rules_without_for(rules, workdir / rules.name)
        instance = Prometheus(
            binary, workdir=workdir, job=job, targets=targets, rule_files=(copy,), interval_s=interval_s
        )
        try:
            instance.start(timeout_s=timeout_s)
            yield instance
        finally:
            instance.stop()

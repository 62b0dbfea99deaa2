"""``quotient emulator`` as a separate process: it announces its port, serves, takes faults over HTTP, and stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_emulator_process_announces_its_url_serves_the_spec_takes_faults_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quotient.emulator.app",
            "--port",
            "0",
            "--nodes",
            "3x2xL4",
            "--kubeconfig-out",
            str(kubeconfig),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        announced = json.loads(process.stdout.readline())
        url = announced["url"]
        assert url == f"http://127.0.0.1:{announced['port']}"
        assert url in kubeconfig.read_text()
        code, nodes = _call(f"{url}/api/v1/nodes")
        assert code == 200 and [node["metadata"]["name"] for node in nodes["items"]] == ["node-0", "node-1", "node-2"]
        assert nodes["items"][0]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        assert _call(f"{url}/api/v1/namespaces/default/pods", "POST", pod)[0] == 201
        fault = {"verb": "create", "resource": "pods", "subresource": "binding", "code": 503, "count": 1}
        assert _call(f"{url}/_emulator/faults", "POST", fault)[0] == 201
        binding = {"target": {"kind": "Node", "name": "node-2"}}
        code, body = _call(f"{url}/api/v1/namespaces/default/pods/p/binding", "POST", binding)
        assert code == 503 and body["reason"] == "ServiceUnavailable"
        assert _call(f"{url}/api/v1/namespaces/default/pods/p/binding", "POST", binding)[0] == 201
        code, floor = _call(f"{url}/_emulator/compact", "POST")
        assert code == 200 and floor["floor"] > 0
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0, process.stderr.read() if process.stderr else ""

"""`python -m monitor.kit.playground` starts a real server with the scripted model and stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from monitor.kit.sandbox import free_loopback_port

pytestmark = pytest.mark.real_server

REPO = Path(__file__).resolve().parent.parent


def test_playground_serves_until_interrupted(opencode_bin: Path, tmp_path: Path) -> None:
    port = free_loopback_port()
    out = tmp_path / "out.txt"
    environment = {**os.environ, "OPENCODE_BIN": str(opencode_bin)}
    with out.open("w") as stream:
        process = subprocess.Popen(
            [sys.executable, "-m", "monitor.kit.playground", "--port", str(port)],
            cwd=REPO,
            env=environment,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "Ctrl-C here stops" not in out.read_text():
            assert process.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        text = out.read_text()
        url = f"http://127.0.0.1:{port}"
        assert f"opencode-loop-monitor watch --url {url} " in text
        assert f"run --attach {url} --model fake/looper '" in text
        with urllib.request.urlopen(f"{url}/session/status", timeout=10) as response:
            assert json.load(response) == {}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        assert out.read_text().endswith("stopping the server and the model\n")
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/session/status", timeout=2)
    finally:
        if process.poll() is None:
            # SIGINT first: only the playground itself stops the server it started.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

"""`python -m monitor.kit.playground` starts a real server with the scripted model and stops it."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from monitor.kit.sandbox import free_loopback_port

pytestmark = pytest.mark.real_server

REPO = Path(__file__).resolve().parent.parent


PASSWORD = "playground-Secret-42"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()}


def get(url: str, headers: dict[str, str] | None = None) -> object:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_playground_serves_until_interrupted(opencode_bin: Path, tmp_path: Path) -> None:
    port = free_loopback_port()
    out = tmp_path / "out.txt"
    environment = {
        **os.environ,
        "OPENCODE_BIN": str(opencode_bin),
        "OPENCODE_SERVER_PASSWORD": PASSWORD,
    }
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
        assert f".venv/bin/opencode-loop-monitor watch --url {url} " in text
        assert PASSWORD not in text
        # The server runs with the password: refused without it, answered with it.
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(f"{url}/session/status")
        assert refused.value.code == 401
        assert get(f"{url}/session/status", AUTH) == {}
        # Every command is a short line naming a script that carries the password.
        commands = [line.strip() for line in text.splitlines() if line.startswith("  sh ")]
        assert len(commands) == 4 and all(len(command) < 100 for command in commands)
        watch_sh = Path(commands[0].split()[1])
        assert watch_sh.name == "watch.sh"
        assert f"export OPENCODE_SERVER_PASSWORD={PASSWORD}" in watch_sh.read_text()
        assert oct(watch_sh.stat().st_mode & 0o777) == "0o700"
        # The loop script runs the real client from a shell that has no password set.
        without = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
        loop_sh = commands[1].split()[1]
        ran = subprocess.run(
            ["sh", loop_sh], env=without, capture_output=True, text=True, timeout=90
        )
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        [session] = get(f"{url}/session", AUTH)
        messages = get(f"{url}/session/{session['id']}/message", AUTH)
        tools = [p for m in messages for p in m["parts"] if p["type"] == "tool"]
        assert [p["tool"] for p in tools] == ["read", "bash"] * 6
        # Each step the model took shows where the playground runs (issue 32: the client of
        # `loop.sh escalate` leaves at the first stop, before the steps after each feedback).
        steps = [line for line in out.read_text().splitlines() if line.startswith("model: ")]
        assert steps[:2] == [
            "model: loop.sh: call_0 read README.md",
            "model: loop.sh: call_1 bash ls",
        ]
        assert len(steps) == 13 and steps[-1].startswith("model: loop.sh: answers ")
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

"""Stray signals do not end `watch`: SIGHUP and SIGUSR2 are logged and ignored, SIGUSR1 logs
what /status says; SIGTERM still stops it, says so and removes the plugin socket."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from monitor.testing import FakeOpencode, play
from tests.harness import loop_frames
from tests.monitor_process import MonitorProcess

PASSWORD = "pw-never-logged-7f3a"


async def test_hup_usr1_usr2_leave_the_watch_running_and_sigterm_still_cleans_up(
    start_monitor: Callable[..., MonitorProcess], socket_path: Path
) -> None:
    # One session's loop, stopped: a session with an intervention for the status line.
    fake = FakeOpencode(streams=[play(loop_frames("ses_sig", 4))])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        monitor = start_monitor(
            "watch",
            "--url", str(server.make_url("")).rstrip("/"),
            "--log-format", "json",
            "--metrics-addr", "127.0.0.1:0",
            "--plugin-socket", str(socket_path),
            env={"OPENCODE_SERVER_PASSWORD": PASSWORD},
        )  # fmt: skip
        await monitor.wait_event("intervention.outcome")
        [listening] = await monitor.wait_event("metrics.listening")
        assert socket_path.exists()
        pid = monitor.process.pid  # type: ignore[union-attr]

        os.kill(pid, signal.SIGHUP)
        [hup] = await monitor.wait_event("signal.ignored")
        assert hup["signal"] == "SIGHUP" and "restart" in hup["reason"]
        assert hup["level"] == "warning"

        os.kill(pid, signal.SIGUSR1)
        [status] = await monitor.wait_event("monitor.status")
        assert status["stream"]["state"] == "connected"
        assert status["role"] == {"state": "acting"}
        assert status["totals"]["interventions"] == 1
        assert [s["session_id"] for s in status["sessions"]] == ["ses_sig"]
        assert status["plugins"]["endpoint"] == f"unix:{socket_path}"
        line = json.dumps(status)
        assert PASSWORD not in line and "README.md" not in line  # no secret, no argument

        os.kill(pid, signal.SIGUSR2)
        ignored = await monitor.wait_event("signal.ignored", count=2)
        assert ignored[1]["signal"] == "SIGUSR2"

        # Still running and answering.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(f"http://127.0.0.1:{listening['port']}/status") as response:
                assert response.status == 200
                assert (await response.json())["stream"]["state"] == "connected"
        assert monitor.process.poll() is None  # type: ignore[union-attr]

        code, took = await monitor.stop()
        assert code == 0 and took < 5
        [stopped] = monitor.events("monitor.stopped")
        assert stopped["signal"] == "SIGTERM"
        assert not socket_path.exists()
        assert monitor.stderr_path.read_text() == ""
    finally:
        await server.close()

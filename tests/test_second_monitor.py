"""A second `watch` of the same server is the first one's standby (monitor.shell.acting): it
says so, serves no endpoint and acts on nothing; killed, the first is replaced by it within a
poll, endpoint and all, as docs/operations.md says."""

from __future__ import annotations

import tempfile
from pathlib import Path

from aiohttp.test_utils import TestServer

from monitor.testing import FakeOpencode, play

ROOT = Path(__file__).resolve().parents[1]


async def test_a_second_watch_stands_by_and_takes_over_when_the_first_is_killed(start_monitor):
    fake = FakeOpencode(streams=[play(), play(), play()])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    # Short: a Unix socket's path holds at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="olm-", dir="/tmp") as folder:
        socket = f"{folder}/run/plugin.sock"
        args = ("watch", "--url", url, "--log-format", "json", "--plugin-socket", socket)
        started = []
        try:
            first = start_monitor(*args)
            started.append(first)
            await first.wait_event("plugin.listening")
            assert first.events("monitor.acting")
            second = start_monitor(*args)
            started.append(second)
            await second.wait_event("stream.connected")
            [standby] = second.events("monitor.standby")
            assert first.process is not None
            assert (standby["level"], standby["acting_pid"]) == ("warning", first.process.pid)
            assert second.events("plugin.listening") == second.events("monitor.acting") == []
            assert Path(socket).is_socket()  # still the first one's
            first.kill()  # SIGKILL: no goodbye, the kernel releases its lock
            await second.wait_event("monitor.took_over", timeout=10)
            [listening] = await second.wait_event("plugin.listening", timeout=10)
            assert listening["socket"] == socket  # the stale socket of the first, replaced
            assert second.process is not None and second.process.poll() is None
        finally:
            for monitor in started:  # before the server: it waits for open streams to end
                monitor.kill()
            await server.close()
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert "one a live monitor serves is not taken over: the second monitor is" in operations
    assert (
        "`plugin.endpoint_taken`" in operations
        and "exit 78"
        not in operations.split("A socket a crashed monitor left")[1].split("Or on loopback TCP")[0]
    )

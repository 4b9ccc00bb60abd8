"""A second `watch` of the same server finds the plugin endpoint served: it says so and
watches on without one (it does not exit 78), as docs/operations.md says."""

from __future__ import annotations

import tempfile
from pathlib import Path

from aiohttp.test_utils import TestServer

from monitor.testing import FakeOpencode, play

ROOT = Path(__file__).resolve().parents[1]


async def test_a_second_watch_runs_on_without_the_endpoint(start_monitor):
    fake = FakeOpencode(streams=[play(), play()])
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
            second = start_monitor(*args)
            started.append(second)
            await second.wait_event("stream.connected")
            [taken] = await second.wait_event("plugin.endpoint_taken")
            assert taken["level"] == "warning" and socket in taken["reason"]
            assert second.events("plugin.listening") == []
            assert second.process is not None and second.process.poll() is None
            assert Path(socket).is_socket()  # still the first one's
        finally:
            for monitor in started:  # before the server: it waits for open streams to end
                monitor.kill()
            await server.close()
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert "one a live monitor serves is not taken over: the second monitor logs" in operations
    assert (
        "`plugin.endpoint_taken`" in operations
        and "exit 78"
        not in operations.split("A socket a crashed monitor left")[1].split("Or on loopback TCP")[0]
    )

"""The daemon's own surfaces under abuse: what a neighbour can do to them must not reach
detection (issue 20). Stand-in server; the monitor as its own process where a limit of the
process is what is abused."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

from aiohttp.test_utils import TestServer

from monitor.testing import FakeOpencode, frames
from tests import frames_factory as ff
from tests.monitor_process import MonitorProcess

# The monitor's process gets this many descriptors, and the metrics port three times as
# many idle connections: the stand-in for 1,100 connections against systemd's 1,024.
NOFILE = 256
IDLE_CONNECTIONS = 3 * NOFILE
LIMITED = (
    "import resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE})); "
    "from monitor.cli import main; sys.exit(main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def open_idle(port: int, count: int) -> list[asyncio.StreamWriter]:
    """Connections that send nothing, as many as the monitor lets open."""

    async def one() -> asyncio.StreamWriter | None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
        except (OSError, TimeoutError):
            return None
        return writer

    opened = await asyncio.gather(*(one() for _ in range(count)))
    return [writer for writer in opened if writer is not None]


async def test_loop_is_aborted_with_the_metrics_port_flooded_by_idle_connections(
    tmp_path: Path,
) -> None:
    fake = FakeOpencode()
    fake.streams = [fake.live]
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    port = free_port()
    monitor = MonitorProcess(
        [
            "watch",
            "--url",
            str(server.make_url("")).rstrip("/"),
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--log-format",
            "json",
        ],
        tmp_path,
    )
    monitor.args = [sys.executable, "-c", LIMITED, *monitor.args[1:]]
    idle: list[asyncio.StreamWriter] = []
    try:
        monitor.start()
        await monitor.wait_event("stream.resynced")
        idle = await open_idle(port, IDLE_CONNECTIONS)
        await asyncio.sleep(0.5)  # the monitor accepts them all meanwhile
        # Three loops at once: their aborts need connections of their own, not only the one
        # the resync left in the pool.
        sessions = [f"ses_flood{n}" for n in range(3)]
        loops = [ff.envelope(f, "/w") for session in sessions for f in ff.loop_of(session, 4)]
        await fake.push(frames(*loops))
        outcomes = await monitor.wait_event("intervention.outcome", count=3, timeout=20)
        assert sorted((r["session_id"], r["outcome"]) for r in outcomes) == [
            (session, "aborted") for session in sessions
        ]
        assert sorted(r.session_id or "" for r in fake.of("abort")) == sessions
        await monitor.wait_event("feedback.sent", count=3)
        code, _ = await monitor.stop()
        assert code == 0
        # No traceback per failed accept: stderr stays (nearly) empty.
        assert len(monitor.stderr_path.read_bytes()) < 2_000
    finally:
        monitor.kill()
        for writer in idle:
            writer.close()
        fake.close()
        await server.close()


async def test_a_redirected_abort_is_not_followed_and_logged_as_failed() -> None:
    import dataclasses

    from aiohttp import web
    from structlog.testing import capture_logs

    from tests.harness import FAST, events, loop_frames, start, stop, wait_for

    elsewhere = FakeOpencode()
    other = TestServer(elsewhere.app(), host="127.0.0.1")
    await other.start_server()

    @dataclasses.dataclass
    class Redirecting(FakeOpencode):
        async def _action(self, request: web.Request) -> web.StreamResponse:
            await self._record(request)
            raise web.HTTPTemporaryRedirect(str(other.make_url(request.path)))

    from monitor.testing import play

    fake = Redirecting(streams=[play(loop_frames("ses_1", 4))])
    assert FAST.retry.attempts > 1
    with capture_logs() as logs:
        server, watch, task = await start(fake)
        try:
            await wait_for(lambda: events(logs, "intervention.outcome"))
        finally:
            await stop(server, watch, task)
            await other.close()
    [outcome] = events(logs, "intervention.outcome")
    assert outcome["outcome"] == "abort_failed"
    assert outcome["error"] == "POST /session/ses_1/abort: redirected (307), not followed"
    assert elsewhere.requests == [] and events(logs, "feedback.sent") == []
    assert len(fake.of("abort")) == 1

"""The daemon, started as systemd starts it, speaks the notify protocol at the right moments."""

from __future__ import annotations

import asyncio
import socket

from aiohttp.test_utils import TestServer

from monitor.kit.poll import until
from monitor.testing import FakeOpencode, play


async def collect(sock: socket.socket, into: list[tuple[float, bytes]]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        data = await loop.sock_recv(sock, 4096)
        into.append((loop.time(), data))


async def wait_for(received, datagram: bytes, count: int = 1, timeout: float = 15.0) -> float:
    """When the `count`-th `datagram` arrived (the loop's clock)."""

    def arrived() -> float | None:
        times = [at for at, data in received if data == datagram]
        return times[count - 1] if len(times) >= count else None

    try:
        return await until(arrived, timeout, 0.01, f"{count} x {datagram!r}")
    except TimeoutError:
        raise AssertionError(f"not {count} x {datagram!r} in {received}") from None


async def test_ready_status_watchdog_and_stopping(tmp_path, start_monitor):
    fake = FakeOpencode(streams=[play(then="end"), play()])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    path = str(tmp_path / "notify.sock")
    received: list[tuple[float, bytes]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        collector = asyncio.create_task(collect(sock, received))
        monitor = start_monitor(
            "watch",
            "--url",
            str(server.make_url("")).rstrip("/"),
            "--log-format",
            "json",
            env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"},
        )
        ready_at = await wait_for(received, b"READY=1")
        await wait_for(received, b"WATCHDOG=1", count=6)
        stop_requested = asyncio.get_running_loop().time()
        code, took = await monitor.stop()
        stopping_at = await wait_for(received, b"STOPPING=1")
        collector.cancel()
    await server.close()

    datagrams = [data for _, data in received]
    assert ready_at >= fake.requests[0].at  # READY only once the stream answered
    assert datagrams.count(b"READY=1") == 1
    statuses = [d for d in datagrams if d.startswith(b"STATUS=")]
    assert statuses[:3] == [
        b"STATUS=streaming events",
        b"STATUS=reconnecting: stream ended",
        b"STATUS=streaming events",
    ]
    pings = [at for at, data in received if data == b"WATCHDOG=1" and at < stop_requested]
    # WATCHDOG_USEC/2 = 0.2 s between pings, from the start to the stop. The median, not the
    # largest gap: a busy machine may delay one ping, which is what the halving allows for.
    gaps = sorted(b - a for a, b in zip(pings, pings[1:], strict=False))
    assert len(pings) >= 6 and 0.15 < gaps[len(gaps) // 2] < 0.3
    assert stopping_at >= stop_requested and datagrams[-1] == b"STOPPING=1"
    assert code == 0 and took < 5


async def test_sigint_stops_the_daemon_cleanly(start_monitor):
    import os
    import signal
    import time

    fake = FakeOpencode(streams=[play()])
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    monitor = start_monitor(
        "watch", "--url", str(server.make_url("")).rstrip("/"), "--log-format", "json"
    )
    await monitor.wait_event("stream.connected")
    started = time.monotonic()
    os.killpg(monitor.process.pid, signal.SIGINT)
    code = await monitor.wait_exit(5)
    took = time.monotonic() - started
    await server.close()
    assert code == 0 and took < 5
    assert monitor.events("monitor.stopped")
    assert monitor.stderr_path.read_text() == ""  # no traceback


async def test_sigint_before_the_stream_stops_the_daemon_cleanly_as_help_says(start_monitor):
    """Ctrl-C while the server cannot be reached yet is a stop like any other: exit 0, as
    `watch --help` says (it promised 130 there, which only a Ctrl-C during start-up gives)."""
    import os
    import signal

    from monitor.cli import WATCH_EPILOG

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monitor = start_monitor(
        "watch", "--url", f"http://127.0.0.1:{port}", "--log-format", "json",
        "--plugin-socket", "off",
    )  # fmt: skip
    await monitor.wait_event("stream.connect_failed")
    os.killpg(monitor.process.pid, signal.SIGINT)
    assert await monitor.wait_exit(5) == 0
    assert monitor.events("stream.connected") == []
    assert "0 stopped by SIGTERM or SIGINT, also before" in " ".join(WATCH_EPILOG.split())

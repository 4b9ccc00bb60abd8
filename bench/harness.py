"""What the benchmarks that run the monitor share: the stand-in server, the monitor beside it.

`bench.latency`, `bench.permissions` and `bench.soak` are each the server (the stand-in of
`monitor.testing`) and run the monitor as an operator runs it, `python -m monitor watch`,
in a process of its own; they differ only in what they stream and what they count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from monitor.testing import FakeOpencode, Received

QUIET = ("--log-format", "json", "--log-level", "warning")


def monitor_environ() -> dict[str, str]:
    """Our environment without monitor settings or systemd variables that would apply."""
    drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OPENCODE_LOOP_MONITOR_") and key not in drop
    }


@dataclass
class Monitor:
    """The monitor's process; `log` is everything it logged, once it has stopped."""

    process: asyncio.subprocess.Process
    log: str = ""


# What `--client` may name beside the monitor: the floors of `bench.floor`.
FLOORS = ("floor", "floor-read")


@asynccontextmanager
async def watched(
    server: FakeOpencode, *options: str, floor: str | None = None
) -> AsyncIterator[Monitor]:
    """Serve `server` on loopback and run the monitor against it for the `async with` block.

    The monitor runs `watch --url URL *options`, logging JSON at `warning`; with `floor`,
    `bench.floor --url URL --mode floor` runs instead, in the same way. The block starts
    once its event stream is open (a `live` one: `server.push` reaches it). At the end the
    stream closes, the process gets SIGTERM and its log is read.
    """
    server.streams.append(server.live)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        with tempfile.TemporaryDirectory() as tmp:
            log_path = Path(tmp) / "monitor.log"
            with open(log_path, "wb") as log:
                url = f"http://127.0.0.1:{port}"
                command = (
                    ("bench.floor", "--url", url, "--mode", floor)
                    if floor is not None
                    else ("monitor", "watch", "--url", url, *options, *QUIET)
                )
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    *command,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=monitor_environ(),
                )
            monitor = Monitor(process)
            try:
                await asyncio.wait_for(server.live_connected.wait(), 20)
                yield monitor
            finally:
                server.close()
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    # A monitor that ignores SIGTERM must not outlive the benchmark.
                    process.kill()
                    await process.wait()
                    raise
                monitor.log = log_path.read_text(encoding="utf-8")
    finally:
        await runner.cleanup()


def arrivals(server: FakeOpencode, action: str) -> dict[str, list[Received]]:
    """The requests for `action`, in order, by the id in their path (a session's, or a
    permission request's: `/session/ID/abort`, `/permission/ID/reply`)."""
    by_id: dict[str, list[Received]] = {}
    for request in server.of(action):
        by_id.setdefault(request.path.split("/")[2], []).append(request)
    return by_id


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main_of_loops(
    prog: str,
    measure: Callable[[int, int, float, str], Awaitable[dict]],
    loops: int,
    warmup: int,
    interval: float,
    argv: list[str] | None,
) -> None:
    """The command line of a benchmark that plays loops: `--loops`, `--warmup`, `--interval`
    (defaults given) and `--client` (the monitor, or a floor of `bench.floor`), then
    `measure(loops, warmup, interval, client)` printed as JSON."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--loops", type=int, default=loops)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--interval", type=float, default=interval)
    parser.add_argument("--client", choices=("monitor", *FLOORS), default="monitor")
    args = parser.parse_args(argv)
    measured = measure(args.loops, args.warmup, args.interval, args.client)
    print(json.dumps({"client": args.client, **asyncio.run(measured)}))

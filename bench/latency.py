"""Latency: from the server writing the frame that completes a loop to the abort arriving.

    python -m bench.latency [--loops 1000] [--interval 0.005]

This process is the server; the monitor runs as an operator runs it, `python -m monitor
watch`, in a process of its own. Every loop is a new session making the same `read` call
four times (the frames of one recorded call of the real server, with the session and part
ids replaced, sync copies included, on `/global/event` as the daemon reads by default). The
fourth call's `running` update completes the cycle: its time is taken just before it is
written, the abort's when its handler starts, both on this process's clock. One loop every
`interval` seconds; the first `--warmup` loops (connection set-up, imports) are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.corpus import CAPTURES
from monitor.core.frames import iter_sse_data

TEMPLATE = CAPTURES / "loop-abort-feedback.global.sse"
CALLS = 4


def recorded_call(path: Path = TEMPLATE) -> tuple[str, str, list[str]]:
    """Session id, part id and every frame of the first tool call in a recording."""
    with open(path, encoding="utf-8") as lines:
        data = list(iter_sse_data(lines))
    for item in data:
        frame = json.loads(item)
        part = frame.get("payload", frame).get("properties", {}).get("part", {})
        if part.get("type") == "tool":
            session_id, part_id = part["sessionID"], part["id"]
            return session_id, part_id, [item for item in data if part_id in item]
    raise ValueError(f"no tool call in {path}")


def _completes(item: str) -> bool:
    payload = json.loads(item).get("payload", {})
    part = payload.get("properties", {}).get("part", {})
    return payload.get("type") == "message.part.updated" and part["state"]["status"] == "running"


def loop_frames(index: int) -> tuple[str, bytes, bytes, bytes]:
    """Session id; the stream before, at and after the frame completing loop `index`."""
    session_id, part_id, template = _TEMPLATE
    session = f"ses_bench{index:06d}"
    chunks: list[list[str]] = [[], [], []]
    at = 0
    for call in range(CALLS):
        part = f"prt_bench{index:06d}c{call}"
        for item in template:
            item = item.replace(session_id, session).replace(part_id, part)
            if call == CALLS - 1 and at == 0 and _completes(item):
                chunks[1].append(item)
                at = 1
            else:
                chunks[2 if at else 0].append(item)
    encoded = ("".join(f"data: {item}\n\n" for item in chunk).encode() for chunk in chunks)
    return (session, *encoded)  # type: ignore[return-value]


_TEMPLATE = recorded_call()


class LoopServer:
    """Streams loops to whoever connects; notes when each abort arrives."""

    def __init__(self) -> None:
        self.stream: web.StreamResponse | None = None
        self.connected = asyncio.Event()
        self.finished = asyncio.Event()
        self.written: dict[str, float] = {}
        self.aborts: dict[str, list[float]] = {}
        self.prompts = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/global/event", self._stream)
        app.router.add_get("/session/status", self._status)
        app.router.add_post("/session/{id}/abort", self._abort)
        app.router.add_post("/session/{id}/prompt_async", self._prompt)
        return app

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
        self.stream = response
        self.connected.set()
        await self.finished.wait()
        return response

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _abort(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        self.aborts.setdefault(request.match_info["id"], []).append(arrived)
        return web.json_response(True)

    async def _prompt(self, request: web.Request) -> web.Response:
        await request.read()
        self.prompts += 1
        return web.Response(status=204)

    async def play(self, loops: int, interval: float) -> None:
        assert self.stream is not None
        frames = [loop_frames(index) for index in range(loops)]
        started = time.perf_counter()
        for index, (session, before, at, after) in enumerate(frames):
            await self.stream.write(before)
            self.written[session] = time.perf_counter()
            await self.stream.write(at)
            await self.stream.write(after)
            await asyncio.sleep(max(0.0, started + (index + 1) * interval - time.perf_counter()))


def monitor_environ() -> dict[str, str]:
    """Our environment without monitor settings or systemd variables that would apply."""
    drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OPENCODE_LOOP_MONITOR_") and key not in drop
    }


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def measure(loops: int, warmup: int, interval: float) -> dict:
    server = LoopServer()
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "monitor.log"
        with open(log_path, "wb") as log:
            monitor = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "monitor",
                "watch",
                "--url",
                url,
                "--log-format",
                "json",
                "--log-level",
                "warning",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=monitor_environ(),
            )
        try:
            await asyncio.wait_for(server.connected.wait(), 20)
            await server.play(warmup + loops, interval)
            deadline = time.monotonic() + 5
            while len(server.aborts) < warmup + loops and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            server.finished.set()
            monitor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(monitor.wait(), 10)
            await runner.cleanup()
        detected = log_path.read_text(encoding="utf-8").count('"loop.detected"')
    measured = list(server.written)[warmup:]
    latencies = [
        (server.aborts[session][0] - server.written[session]) * 1000
        for session in measured
        if session in server.aborts
    ]
    return {
        "loops": len(measured),
        "aborted": len(latencies),
        "repeated_aborts": sum(len(times) - 1 for times in server.aborts.values()),
        "logged": detected,
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency")
    parser.add_argument("--loops", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.005)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.loops, args.warmup, args.interval))))


if __name__ == "__main__":
    main()

"""Permission answers: from the server writing `permission.asked` to the monitor's reply arriving.

    python -m bench.permissions [--loops 300] [--interval 0.01]

As `bench.latency`, this process is the server and the monitor runs as an operator runs it
(`python -m monitor watch --permissions approve`), in a process of its own. Every loop is a
new session whose calls ask permission the way `opencode serve` with `"permission": {"*":
"ask"}` does (frames shaped like the recording `permission-gate`): the `running` update of a
`bash` call, then its `permission.asked`; calls 1-3 are approved by the monitor, call 4
completes the loop and is refused. The time of each `permission.asked` is taken just before
it is written, the reply's when its handler starts, both on this process's clock. The first
`--warmup` loops are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench.latency import monitor_environ, percentile

CALLS = 4
DIRECTORY = "/bench/project"
INPUT = {"command": "echo again >> loop.txt", "description": "append a line"}


def _frame(event_type: str, properties: dict) -> bytes:
    envelope = {"directory": DIRECTORY, "payload": {"type": event_type, "properties": properties}}
    return f"data: {json.dumps(envelope)}\n\n".encode()


def _part(session: str, index: int, call: int, status: str) -> bytes:
    state: dict = {"status": status, "input": INPUT, "time": {"start": 1}}
    if status == "completed":
        state["output"] = ""
    part = {
        "id": f"prt_b{index:06d}c{call}",
        "sessionID": session,
        "messageID": f"msg_b{index:06d}c{call}",
        "type": "tool",
        "tool": "bash",
        "callID": f"call_{call}",
        "state": state,
    }
    return _frame("message.part.updated", {"sessionID": session, "part": part})


def request_id(index: int, call: int) -> str:
    return f"per_b{index:06d}c{call}"


def _asked(session: str, index: int, call: int) -> bytes:
    return _frame(
        "permission.asked",
        {
            "id": request_id(index, call),
            "sessionID": session,
            "permission": "bash",
            "patterns": [INPUT["command"]],
            "metadata": {},
            "always": ["echo *"],
            "tool": {"messageID": f"msg_b{index:06d}c{call}", "callID": f"call_{call}"},
        },
    )


def _replied(session: str, index: int, call: int) -> bytes:
    props = {"sessionID": session, "requestID": request_id(index, call), "reply": "once"}
    return _frame("permission.replied", props)


class AskingServer:
    """Streams sessions whose calls ask permission; notes when each reply arrives."""

    def __init__(self) -> None:
        self.stream: web.StreamResponse | None = None
        self.connected = asyncio.Event()
        self.finished = asyncio.Event()
        self.written: dict[str, float] = {}
        self.replies: dict[str, list[tuple[float, str]]] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/global/event", self._stream)
        app.router.add_get("/session/status", self._empty_object)
        app.router.add_get("/permission", self._empty_list)
        app.router.add_post("/permission/{id}/reply", self._reply)
        return app

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"payload":{"type":"server.connected","properties":{}}}\n\n')
        self.stream = response
        self.connected.set()
        await self.finished.wait()
        return response

    async def _empty_object(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _empty_list(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def _reply(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        body = await request.json()
        self.replies.setdefault(request.match_info["id"], []).append((arrived, body["reply"]))
        return web.json_response(True)

    async def play(self, loops: int, interval: float) -> None:
        stream = self.stream
        assert stream is not None
        started = time.perf_counter()
        for index in range(loops):
            session = f"ses_b{index:06d}"
            for call in range(CALLS):
                await stream.write(_part(session, index, call, "running"))
                self.written[request_id(index, call)] = time.perf_counter()
                await stream.write(_asked(session, index, call))
                if call < CALLS - 1:
                    # Its approval is the monitor's to give; the call then runs and ends.
                    await stream.write(_replied(session, index, call))
                    await stream.write(_part(session, index, call, "completed"))
            await asyncio.sleep(max(0.0, started + (index + 1) * interval - time.perf_counter()))


async def measure(loops: int, warmup: int, interval: float) -> dict:
    server = AskingServer()
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    args = ["watch", "--url", f"http://127.0.0.1:{port}", "--permissions", "approve"]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "monitor.log"
        with open(log_path, "wb") as log:
            monitor = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "monitor",
                *args,
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
            while len(server.replies) < (warmup + loops) * CALLS and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            server.finished.set()
            monitor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(monitor.wait(), 10)
            await runner.cleanup()
        detected = log_path.read_text(encoding="utf-8").count('"loop.detected"')
    approvals, refusals = [], []
    loop_calls_approved = 0
    for index in range(warmup, warmup + loops):
        for call in range(CALLS):
            answers = server.replies.get(request_id(index, call), [])
            if not answers:
                continue
            arrived, reply = answers[0]
            took = (arrived - server.written[request_id(index, call)]) * 1000
            if call == CALLS - 1:
                loop_calls_approved += reply != "reject"
                refusals.append(took)
            else:
                approvals.append(took)
    everything = approvals + refusals
    return {
        "loops": loops,
        "refused": len(refusals),
        "approved": len(approvals),
        "loop_calls_approved": loop_calls_approved,
        "logged": detected,
        "refusal_p50_ms": statistics.median(refusals),
        "refusal_p99_ms": percentile(refusals, 99),
        "approval_p50_ms": statistics.median(approvals),
        "approval_p99_ms": percentile(approvals, 99),
        "p99_ms": percentile(everything, 99),
        "max_ms": max(everything),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.permissions")
    parser.add_argument("--loops", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--interval", type=float, default=0.01)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.loops, args.warmup, args.interval))))


if __name__ == "__main__":
    main()

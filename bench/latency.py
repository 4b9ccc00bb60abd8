"""Latency: from the server writing the frame that completes a loop to the abort arriving.

    python -m bench.latency [--loops 1000] [--interval 0.005]

This process is the server (the stand-in of `monitor.testing`); the monitor runs as an
operator runs it, `python -m monitor watch`, in a process of its own. Every loop is a new
session making the same `read` call four times (the frames of one recorded call of the real
server, with the session and part ids replaced, sync copies included, on `/global/event` as
the daemon reads by default). The fourth call's `running` update completes the cycle: its
time is taken just before it is written, the abort's when its handler starts, both on this
process's event loop clock. One loop every `interval` seconds; the first `--warmup` loops
(connection set-up, imports) are not counted. `--client floor` runs `bench.floor --mode
abort` instead of the monitor (the same frames, the same abort), `--client floor-read` its
variant that first reads the session's newest messages, as the monitor does.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from contextlib import suppress
from pathlib import Path

from bench.corpus import CAPTURES
from bench.harness import arrivals, main_of_loops, percentile, watched
from monitor.core.frames import iter_sse_data
from monitor.kit.poll import until
from monitor.testing import FakeOpencode

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


async def play(server: FakeOpencode, loops: int, interval: float) -> dict[str, float]:
    """Push `loops` loops, one every `interval` s; when each loop's completing frame went out."""
    clock = asyncio.get_running_loop().time
    frames = [loop_frames(index) for index in range(loops)]
    written: dict[str, float] = {}
    started = clock()
    for index, (session, before, at, after) in enumerate(frames):
        await server.push(before)
        written[session] = clock()
        await server.push(at)
        await server.push(after)
        await asyncio.sleep(max(0.0, started + (index + 1) * interval - clock()))
    return written


async def measure(loops: int, warmup: int, interval: float, client: str = "monitor") -> dict:
    server = FakeOpencode(answers={"prompt_async": [204]})
    floor = {"floor": "abort", "floor-read": "abort-read"}.get(client)
    async with watched(server, floor=floor) as monitor:
        written = await play(server, warmup + loops, interval)
        # Late aborts still count; missing ones are reported, not waited for without end.
        with suppress(TimeoutError):
            await until(
                lambda: len(arrivals(server, "abort")) >= warmup + loops, 5, what="every abort"
            )
    detected = monitor.log.count('"loop.detected"')
    arrived = arrivals(server, "abort")
    measured = list(written)[warmup:]
    latencies = [
        (arrived[session][0].at - written[session]) * 1000
        for session in measured
        if session in arrived
    ]
    return {
        "loops": len(measured),
        "aborted": len(latencies),
        "repeated_aborts": sum(len(requests) - 1 for requests in arrived.values()),
        "logged": detected,
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


def main(argv: list[str] | None = None) -> None:
    main_of_loops("python -m bench.latency", measure, 1000, 50, 0.005, argv)


if __name__ == "__main__":
    main()

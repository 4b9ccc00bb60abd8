"""Soak: the daemon under steady load for minutes; its memory, its CPU, and every loop stopped
exactly once.

    python -m bench.soak [--seconds 300] [--rate 3000] [--loops-per-s 5] [--delay 0.05]

This process is a stand-in server; the monitor runs as an operator runs it, `python -m
monitor watch`, in a process of its own. The stream carries `rate` frames a second on
`/global/event`: sessions that make 8 different `write` calls and go idle, a heartbeat now
and then, and `loops-per-s` sessions a second that call `read` with the same arguments 4
times, each of which must be stopped once. Every abort and feedback request answers after
`delay` seconds, like a server with work to do.

Every 5 s the monitor's resident size (/proc/PID/statm) and CPU time (/proc/PID/stat) are
sampled. At the end: the loops streamed, the sessions aborted and given feedback, and those
lost (a loop with no abort or no feedback) or duplicated (a second abort or feedback for
one session). The last output line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import Counter

from bench.harness import arrivals, watched
from bench.memory import tool_update
from monitor.testing import FakeOpencode

CALLS_PER_SESSION = 8
LOOP_CALLS = 4
SAMPLE_EVERY_S = 5.0
# Chunks written per second: the stream arrives in bursts, as from a busy server.
TICKS_PER_S = 20
# Stands for the tick's number in the ids of a background block: one block is built once
# and each tick writes it with its own number, so every tick's sessions are new.
TICK = b"QQQQQQQQ"
HEARTBEAT = json.dumps({"payload": {"type": "server.heartbeat", "properties": {}}})


def _sse(frames: list[object]) -> bytes:
    return "".join(f"data: {json.dumps(frame)}\n\n" for frame in frames).encode()


def _idle(session: str) -> dict:
    return {"payload": {"type": "session.idle", "properties": {"sessionID": session}}}


def background_block(frames: int) -> bytes:
    """About `frames` frames of sessions that never loop, with `TICK` in their ids."""
    out: list[object] = []
    session_no = 0
    while len(out) < frames:
        session = f"ses_bg{TICK.decode()}s{session_no:04d}"
        for call in range(CALLS_PER_SESSION):
            part = f"prt_{session[4:]}c{call}"
            args = {"filePath": f"src/{call}.py", "content": f"version {call}"}
            out += [tool_update(session, part, "running", args)]
            out += [tool_update(session, part, "completed", args)]
        out.append(_idle(session))
        out.append(json.loads(HEARTBEAT))
        session_no += 1
    return _sse(out)


def loop_block(session: str) -> bytes:
    frames = []
    for call in range(LOOP_CALLS):
        part = f"prt_{session[4:]}c{call}"
        args = {"filePath": "README.md"}
        for status in ("running", "completed"):
            frame = tool_update(session, part, status, args)
            frame["payload"]["properties"]["part"]["tool"] = "read"
            frames.append(frame)
    return _sse(frames)


async def play(
    server: FakeOpencode, seconds: float, rate: int, loops_per_s: float
) -> tuple[list[str], int]:
    """Stream for `seconds`; the looping sessions, in order, and the frames written."""
    block = background_block(rate // TICKS_PER_S)
    per_block = block.count(b"\n\n")
    loops: list[str] = []
    frames = 0
    started = time.perf_counter()
    for tick in range(round(seconds * TICKS_PER_S)):
        chunk = block.replace(TICK, f"{tick:08d}".encode())
        due = round((tick + 1) * loops_per_s / TICKS_PER_S) - len(loops)
        for _ in range(due):
            session = f"ses_loop{len(loops):08d}"
            loops.append(session)
            chunk += loop_block(session)
        await server.push(chunk)
        frames += per_block + due * LOOP_CALLS * 2
        pause = started + (tick + 1) / TICKS_PER_S - time.perf_counter()
        await asyncio.sleep(max(0.0, pause))
    return loops, frames


def sample(pid: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user + system) of process `pid`."""
    with open(f"/proc/{pid}/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return rss, ticks / os.sysconf("SC_CLK_TCK")


async def sampler(pid: int, samples: list[tuple[float, int, float]]) -> None:
    started = time.monotonic()
    while True:
        rss, cpu = sample(pid)
        samples.append((time.monotonic() - started, rss, cpu))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def measure(seconds: float, rate: int, loops_per_s: float, delay: float) -> dict:
    server = FakeOpencode(
        answers={"prompt_async": [204]}, delays={"abort": delay, "prompt_async": delay}
    )
    samples: list[tuple[float, int, float]] = []
    sampling = None
    async with watched(server) as monitor:
        try:
            sampling = asyncio.create_task(sampler(monitor.process.pid, samples))
            started = time.perf_counter()
            loops, frames = await play(server, seconds, rate, loops_per_s)
            streamed_s = time.perf_counter() - started
            # The last interventions finish, for as long as they make progress.
            progress, deadline = -1, time.monotonic()
            while (
                len(fed_back := arrivals(server, "prompt_async")) < len(loops)
                and time.monotonic() < deadline + 10
            ):
                if len(fed_back) > progress:
                    progress, deadline = len(fed_back), time.monotonic()
                await asyncio.sleep(0.1)
            samples.append((samples[-1][0] + 1, *sample(monitor.process.pid)))
        finally:
            if sampling is not None:
                sampling.cancel()
    records = [json.loads(line) for line in monitor.log.splitlines()]
    logged = Counter(record["event"] for record in records)
    logged["cancelled"] = sum(record.get("outcome") == "cancelled" for record in records)
    aborts = Counter({s: len(r) for s, r in arrivals(server, "abort").items()})
    prompts = Counter({s: len(r) for s, r in arrivals(server, "prompt_async").items()})
    expected = set(loops)
    strays = (set(aborts) | set(prompts)) - expected
    lost = sum(1 for s in loops if aborts[s] == 0 or prompts[s] == 0)
    duplicated = sum(max(0, n - 1) for n in [*aborts.values(), *prompts.values()])
    warm = [s for s in samples if s[0] >= 10] or samples
    rss_mib = [rss / 2**20 for _, rss, _ in warm]
    cpu_s = samples[-1][2] - samples[0][2]
    return {
        "seconds": round(streamed_s, 1),
        "frames": frames,
        "frames_per_s": round(frames / streamed_s),
        "loops": len(loops),
        "aborted": sum(1 for s in loops if aborts[s]),
        "fed_back": sum(1 for s in loops if prompts[s]),
        "lost": lost,
        "duplicated": duplicated,
        "stray_sessions": len(strays),
        "loop_detected_logged": logged["loop.detected"],
        "outcomes_logged": logged["intervention.outcome"],
        "cancelled_at_stop": logged["cancelled"],
        "rss_mib_after_10s": round(rss_mib[0], 1),
        "rss_mib_end": round(rss_mib[-1], 1),
        "rss_mib_max": round(max(rss_mib), 1),
        "rss_mib_median": round(statistics.median(rss_mib), 1),
        "cpu_percent": round(100 * cpu_s / (samples[-1][0] - samples[0][0]), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--loops-per-s", type=float, default=5)
    parser.add_argument("--delay", type=float, default=0.05)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.seconds, args.rate, args.loops_per_s, args.delay))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

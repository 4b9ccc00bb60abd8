"""What one log line costs the event loop: writing it to the file at once (structlog's
`PrintLogger`, as `watch` logged until issue 46) against handing it to the `LogWriter`'s
queue (as it logs now), for a `loop.detected`-sized line.

    python -m bench.log_line [--lines 20000] [--rounds 5]

Each path logs `lines` lines to a file in a temporary folder, `rounds` times in turn; the
figure is the best round's time per line on the logging thread (`time.thread_time`: the
writer thread's own work is not the event loop's) and in wall time, and for the queue, the
time until the writer has written them all. Not part of `bench.run`: the log path is on the
hot path only once per decision, and `bench.latency` measures that with the daemon whole.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import structlog

from monitor.shell.logs import LogWriter, configure_logging

# The fields of a `loop.detected` line (docs/logs.md), at their usual sizes.
FIELDS: dict[str, object] = {
    "session_id": "ses_2f0c6a1b5ffeW0zfzd0Khw7LU2",
    "directory": "/home/dev/projects/app",
    "rule": "cycle",
    "cycle_length": 2,
    "repetitions": 3,
    "tools": ["read", "bash"],
    "part_id": "prt_2f0c6a1b6001aBcDeFgHiJkLmN",
    "call_position": 6,
    "escalated": False,
    "action": "stop",
    "plan": "stop",
    "channel": "abort",
}


def direct(stream: TextIO, lines: int) -> Callable[[], object]:
    configure_logging("json", "info", stream=stream, environ={})
    return lambda: None


def queued(stream: TextIO, lines: int) -> Callable[[], object]:
    # Room for every line: what is timed is the hand-over, never a drop.
    writer = LogWriter(stream, capacity=lines + 1).start()
    configure_logging("json", "info", environ={}, writer=writer)
    return lambda: writer.close(60)


PATHS = {"direct": direct, "queued": queued}


def run(lines: int, finish: Callable[[], object]) -> tuple[float, float, float]:
    """CPU and wall seconds a line on the logging thread, and wall seconds a line until
    `finish` returned (everything written)."""
    log = structlog.get_logger("bench")
    wall, cpu = time.perf_counter(), time.thread_time()
    for n in range(lines):
        log.warning("loop.detected", n=n, **FIELDS)
    cpu, logged = time.thread_time() - cpu, time.perf_counter() - wall
    finish()
    written = time.perf_counter() - wall
    return cpu / lines, logged / lines, written / lines


def measure(lines: int, rounds: int) -> dict[str, object]:
    best: dict[str, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            for name, configure in PATHS.items():
                path = Path(folder) / f"{name}.log"
                with path.open("w", encoding="utf-8") as stream:
                    result = run(lines, configure(stream, lines))
                structlog.reset_defaults()
                assert len(path.read_text(encoding="utf-8").splitlines()) == lines, name
                if name not in best or result[0] < best[name][0]:
                    best[name] = result
    us = {name: [round(value * 1e6, 2) for value in values] for name, values in best.items()}
    return {
        "lines": lines,
        "rounds": rounds,
        "direct_cpu_us": us["direct"][0],
        "direct_wall_us": us["direct"][1],
        "queued_cpu_us": us["queued"][0],
        "queued_wall_us": us["queued"][1],
        "queued_written_wall_us": us["queued"][2],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.log_line")
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.lines, args.rounds)))


if __name__ == "__main__":
    main()

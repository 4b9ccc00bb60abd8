"""A stop after a reconnect: from the new stream's connect to the abort of a loop in its first
frames, while the resync asks about every directory the monitor follows.

    python -m bench.reconnect [--directories 10000] [--rounds 3]

This process is the server (the stand-in of `monitor.testing`); the monitor runs as an
operator runs it, `python -m monitor watch`, in a process of its own. Its first stream
carries a call under way in each of `directories` sessions, one per directory, then ends;
the monitor reconnects and resyncs (a status read per directory, none busy: every run ended
while it was away). As the new stream opens, it carries a new session's four identical
`read` calls (the frames of a recorded call, as `bench.latency` plays them). Measured, on
this process's clock: the connect (the second stream request's start) to the abort's
arrival, and to the resync's first and last status reads. The floor, in the same run: the
same with no directory followed (one status read). Rounds alternate loaded and floor; the
medians, and the ratio of the loaded abort to the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from bench.harness import watched
from bench.latency import loop_frames
from monitor.kit.poll import until
from monitor.testing import FakeOpencode, frames, play
from tests.frames_factory import call, envelope


def followed(directories: int) -> bytes:
    """The first stream: a call under way in each of `directories` directories."""
    return frames(
        *(
            envelope(frame, f"/d{n}")
            for n in range(directories)
            for frame in call(f"ses_d{n:06d}", "p", "read", {})[:2]
        )
    )


async def measure(directories: int) -> dict[str, float]:
    server = FakeOpencode(streams=[play(followed(directories), then="end")])
    session, before, at, after = loop_frames(0)
    async with watched(server):
        await server.push(before + at + after)
        await until(lambda: server.of("abort"), 60, what="the abort")
        # The resync's status reads after the connect: one per directory and the server's own
        # (checked seldom: a check reads every request, in this process, which serves them).
        await until(lambda: len(reads(server)) >= directories + 1, 120, 1.0, what="the resync")
    connect = server.of("event")[1].at
    [abort] = server.of("abort")
    assert abort.session_id == session
    return {
        "abort_s": abort.at - connect,
        "first_read_s": min(r.at for r in reads(server)) - connect,
        "resync_s": max(r.at for r in reads(server)) - connect,
        "reads_before_abort": sum(r.at < abort.at for r in reads(server)),
    }


def reads(server: FakeOpencode) -> list:
    second = server.requests.index(server.of("event")[1])
    return [r for r in server.requests[second:] if r.path == "/session/status"]


async def rounds(directories: int, count: int) -> dict[str, object]:
    loaded, floor = [], []
    for _ in range(count):
        loaded.append(await measure(directories))
        floor.append(await measure(0))

    def median(runs: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 3)

    return {
        "directories": directories,
        "rounds": count,
        "abort_s": median(loaded, "abort_s"),
        "first_read_s": median(loaded, "first_read_s"),
        "resync_s": median(loaded, "resync_s"),
        "reads_before_abort": median(loaded, "reads_before_abort"),
        "floor_abort_s": median(floor, "abort_s"),
        "ratio": round(median(loaded, "abort_s") / median(floor, "abort_s"), 2),
        "runs": loaded,
        "floor_runs": floor,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconnect")
    parser.add_argument("--directories", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(rounds(args.directories, args.rounds))))


if __name__ == "__main__":
    main()
